import AppleNotifications
import Foundation
import HTTPServer
import TestSupport
import Testing

/// fake-apple with its token endpoints: Apple's RSA key from keygen, a team key from openssl.
struct TokenFixture {
    static let teamID = "TEAM123456"
    static let keyID = "KEY1234567"
    static let clientID = "com.example.app"

    let apple: GeneratedKey
    let team: OpenSSLKey
    var settings: [String] {
        [
            "--team-id", Self.teamID, "--key-id", Self.keyID, "--team-key", team.publicKey.path,
            "--client-id",
            Self.clientID, "--client-id", "com.example.web",
        ]
    }

    init() throws {
        apple = try GeneratedKey(kid: "token-test")
        team = try OpenSSLKey()
    }

    func start(_ extra: [String] = []) throws -> FakeApple {
        try FakeApple(keys: apple.directory, extra: settings + extra)
    }

    /// A valid client secret for `clientID`, made by `siwactl client-secret`.
    func secret(clientID: String = TokenFixture.clientID) throws -> String {
        let result = try siwactl([
            "client-secret", "--team-id", Self.teamID, "--key-id", Self.keyID, "--client-id", clientID,
            "--key",
            team.privateKey.path,
        ])
        guard result.status == 0 else { throw ExecutableError("client-secret: \(result.standardError)") }
        return result.standardOutput.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func remove() {
        try? FileManager.default.removeItem(at: apple.directory)
        team.remove()
    }
}

extension FakeApple {
    var base: String { "http://127.0.0.1:\(url.port!)" }

    /// POSTs a form-encoded body to `path`.
    func form(
        _ path: String, _ fields: [(String, String)],
        contentType: String = "application/x-www-form-urlencoded"
    )
        throws -> TestHTTPResponse
    {
        let body = fields.map {
            "\($0.0)=\($0.1.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")"
        }.joined(separator: "&")
        return try TestHTTPClient.post(
            base + path, body: Array(body.utf8), headers: [("Content-Type", contentType)])
    }
}

@Suite("siwactl fake-apple token endpoints")
struct FakeAppleTokenTests {
    @Test("listens on loopback only", arguments: ["0.0.0.0:0", ":0", "192.0.2.1:0"])
    func loopbackOnly(listen: String) throws {
        let key = try GeneratedKey(kid: "loopback")
        defer { try? FileManager.default.removeItem(at: key.directory) }
        let result = try siwactl(["fake-apple", "--listen", listen, "--keys", key.directory.path])
        #expect(result.status == 2)
        #expect(result.standardError.contains("loopback"))
    }

    @Test("the token endpoints need all four settings; without any, they answer 404")
    func settingsAllOrNothing() throws {
        let fixture = try TokenFixture()
        defer { fixture.remove() }
        let partial = try siwactl([
            "fake-apple", "--listen", "127.0.0.1:0", "--keys", fixture.apple.directory.path, "--team-id", "T",
        ])
        #expect(partial.status == 2)
        #expect(partial.standardError.contains("--key-id, --team-key, --client-id"))
        let plain = try FakeApple(keys: fixture.apple.directory)
        #expect(try plain.form("/auth/token", [("grant_type", "refresh_token")]).status == 404)
    }

    @Test("answers malformed calls exactly as Apple does")
    func appleErrors() throws {
        let fixture = try TokenFixture()
        defer { fixture.remove() }
        let fake = try fixture.start()
        let secret = try fixture.secret()
        let client = [("client_id", TokenFixture.clientID), ("client_secret", secret)]
        let cases: [(String, [(String, String)], String, String)] = [
            ("/auth/token", client, "application/json", "invalid_request"),
            (
                "/auth/token", [("client_id", TokenFixture.clientID), ("grant_type", "authorization_code")],
                "application/x-www-form-urlencoded", "invalid_request"
            ),
            (
                "/auth/token", client + [("grant_type", "password")], "application/x-www-form-urlencoded",
                "unsupported_grant_type"
            ),
            (
                "/auth/token", client + [("grant_type", "authorization_code")],
                "application/x-www-form-urlencoded",
                "invalid_request"
            ),
            (
                "/auth/token", client + [("grant_type", "authorization_code"), ("code", "c.unknown")],
                "application/x-www-form-urlencoded", "invalid_grant"
            ),
            (
                "/auth/token", client + [("grant_type", "refresh_token"), ("refresh_token", "r.unknown")],
                "application/x-www-form-urlencoded", "invalid_grant"
            ),
            (
                "/auth/token", client + [("grant_type", "refresh_token"), ("grant_type", "refresh_token")],
                "application/x-www-form-urlencoded", "invalid_request"
            ),
            // A secret whose sub is the app, sent as the web client: the bundle ID vs Services ID mix-up.
            (
                "/auth/token",
                [
                    ("client_id", "com.example.web"), ("client_secret", secret),
                    ("grant_type", "refresh_token"),
                    ("refresh_token", "r"),
                ], "application/x-www-form-urlencoded", "invalid_client"
            ),
            (
                "/auth/token",
                [
                    ("client_id", TokenFixture.clientID), ("client_secret", "a.b.c"),
                    ("grant_type", "refresh_token"),
                    ("refresh_token", "r"),
                ], "application/x-www-form-urlencoded", "invalid_client"
            ),
            ("/auth/revoke", client, "application/x-www-form-urlencoded", "invalid_request"),
            (
                "/auth/revoke", client + [("token", "t"), ("token_type_hint", "id_token")],
                "application/x-www-form-urlencoded", "invalid_request"
            ),
            (
                "/auth/revoke",
                [("client_id", TokenFixture.clientID), ("client_secret", secret + "x"), ("token", "t")],
                "application/x-www-form-urlencoded", "invalid_client"
            ),
        ]
        for (path, fields, contentType, error) in cases {
            let response = try fake.form(path, fields, contentType: contentType)
            #expect(response.status == 400, "\(path) \(fields.map(\.0))")
            #expect(response.text == #"{"error":"\#(error)"}"#, "\(path) \(fields.map(\.0))")
            #expect(response.headers["Content-Type"] == "application/json")
        }
        #expect(try fake.form("/auth/revoke", client + [("token", "junk")]).status == 200)
        #expect(try TestHTTPClient.get(fake.base + "/auth/token").status == 405)
        // The log says why a client was refused, without the secret.
        #expect(fake.log.contains("invalid_client (sub is not the client_id)"))
        #expect(!fake.log.contains(secret))
    }

    @Test("authorize prints a code and an id_token that openssl verifies with the served key")
    func authorize() throws {
        let fixture = try TokenFixture()
        defer { fixture.remove() }
        let fake = try fixture.start()
        let result = try siwactl([
            "fake-apple", "authorize", "--url", fake.url.absoluteString, "--sub", "001.cli", "--email",
            "cli@example.com", "--nonce", "n0nce", "--real-user-status", "1",
        ])
        #expect(result.status == 0, "\(result.standardError)")
        let object = try #require(
            try JSONSerialization.jsonObject(with: Data(result.standardOutput.utf8)) as? [String: String])
        let code = try #require(object["code"])
        let idToken = try #require(object["id_token"])
        let parts = idToken.split(separator: ".").map(String.init)
        try #require(parts.count == 3)
        let header = try #require(
            try JSONSerialization.jsonObject(with: Base64URL.decode(parts[0])) as? [String: String])
        #expect(header == ["kid": "token-test", "alg": "RS256"])
        let publicKey = fixture.team.directory.appendingPathComponent("apple.pub")
        try openssl(["pkey", "-in", fixture.apple.keyFile.path, "-pubout", "-out", publicKey.path])
        let input = fixture.team.directory.appendingPathComponent("id-input")
        let signature = fixture.team.directory.appendingPathComponent("id-signature")
        try Data((parts[0] + "." + parts[1]).utf8).write(to: input)
        try Base64URL.decode(parts[2]).write(to: signature)
        let verified = try Subprocess.run(
            "/usr/bin/openssl",
            ["dgst", "-sha256", "-verify", publicKey.path, "-signature", signature.path, input.path])
        #expect(verified.standardOutput.contains("Verified OK"))
        let claims = try #require(
            try JSONSerialization.jsonObject(with: Base64URL.decode(parts[1])) as? [String: Any])
        #expect(claims["sub"] as? String == "001.cli")
        #expect(claims["aud"] as? String == TokenFixture.clientID)
        #expect(claims["nonce"] as? String == "n0nce")
        #expect(claims["is_private_email"] as? Bool == false)
        #expect(claims["real_user_status"] as? Int == 1)

        // The code is exchanged once over plain form posts, as any client would.
        let exchange = [
            ("client_id", TokenFixture.clientID), ("client_secret", try fixture.secret()),
            ("grant_type", "authorization_code"), ("code", code),
        ]
        let first = try fake.form("/auth/token", exchange)
        #expect(first.status == 200)
        let tokens = try #require(try JSONSerialization.jsonObject(with: first.data) as? [String: Any])
        #expect(
            Set(tokens.keys) == ["access_token", "token_type", "expires_in", "refresh_token", "id_token"])
        #expect(try fake.form("/auth/token", exchange).text == #"{"error":"invalid_grant"}"#)

        let unknown = try siwactl([
            "fake-apple", "authorize", "--url", fake.base, "--sub", "s", "--client-id", "com.example.unknown",
        ])
        #expect(unknown.status == 1)
        #expect(unknown.standardError.contains("unknown client_id"))
        let remote = try siwactl(["fake-apple", "authorize", "--url", "http://192.0.2.1:8081", "--sub", "s"])
        #expect(remote.status == 1)
        #expect(remote.standardError.contains("loopback"))
    }

    @Test("fails on demand from flags, from the environment, and from 'fake-apple fault'")
    func faults() throws {
        let fixture = try TokenFixture()
        defer { fixture.remove() }
        let refresh = { (fake: FakeApple) throws -> TestHTTPResponse in
            try fake.form(
                "/auth/token",
                [
                    ("client_id", TokenFixture.clientID), ("client_secret", try fixture.secret()),
                    ("grant_type", "refresh_token"), ("refresh_token", "r"),
                ])
        }
        let flagged = try fixture.start(["--fail-with", "invalid_client"])
        #expect(try refresh(flagged).text == #"{"error":"invalid_client"}"#)
        #expect(try refresh(flagged).text == #"{"error":"invalid_client"}"#)  // every call

        let fromEnvironment = try FakeApple(
            keys: fixture.apple.directory,
            environment: [
                "SIWA_APPLE_TEAM_ID": TokenFixture.teamID, "SIWA_APPLE_KEY_ID": TokenFixture.keyID,
                "SIWA_FAKE_APPLE_TEAM_KEY": fixture.team.privateKey.path,
                "SIWA_AUDIENCES": TokenFixture.clientID,
                "SIWA_FAKE_APPLE_FAIL_WITH": "502",
            ])
        #expect(try refresh(fromEnvironment).status == 502)

        let fake = try fixture.start()
        #expect(try refresh(fake).text == #"{"error":"invalid_grant"}"#)
        let set = try siwactl([
            "fake-apple", "fault", "--url", fake.base, "--fail-with", "500", "--times", "2",
        ])
        #expect(set.status == 0, "\(set.standardError)")
        #expect(try refresh(fake).status == 500)
        #expect(try refresh(fake).status == 500)
        #expect(try refresh(fake).text == #"{"error":"invalid_grant"}"#)

        #expect(
            try siwactl(["fake-apple", "fault", "--url", fake.base, "--fail-with", "teapot"]).status == 1)
        #expect(
            try siwactl([
                "fake-apple", "--listen", "127.0.0.1:0", "--keys", fixture.apple.directory.path,
                "--fail-with",
                "418",
            ]).status == 2)
    }
}
