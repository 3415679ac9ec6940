import AppleNotifications
import Foundation
import TestSupport
import Testing

/// The transmitter API as deployed: `siwactl ssf keygen` and `receivers add`, then `siwa-receiver` with the
/// SIWA_SSF_* twins, its own siwa_ssf login and a listener on port 0.
@Suite("siwa-receiver --ssf-listen with siwactl ssf receivers")
struct SharedSignalsAPIProcessTests {
    static func siwactl(_ arguments: [String]) throws -> (status: Int32, out: String, err: String) {
        let result = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwactl"), arguments: arguments, environment: [:],
            timeout: .seconds(60))
        return (result.status, result.standardOutput, result.standardError)
    }

    @Test("the secret is printed once and stored hashed; its token reads the metadata and creates a stream")
    func deployed() throws {
        let database = try TestDatabase()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("ssf-api-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let keyFile = directory.appendingPathComponent("ssf-key.pem").path
        #expect(try Self.siwactl(["ssf", "keygen", "--out", keyFile]).status == 0)
        let added = try Self.siwactl(["ssf", "receivers", "add", "okta", "--database-url", database.url])
        #expect(added.status == 0, "\(added.err)")
        let lines = added.out.split(separator: "\n")
        let clientID = try #require(lines.first { $0.hasPrefix("client_id: ") }).dropFirst(
            "client_id: ".count)
        let secret = try #require(lines.first { $0.hasPrefix("client_secret: ") }).dropFirst(
            "client_secret: ".count)
        let stored = try database.value(
            "SELECT r::text FROM siwa.ssf_receivers r WHERE name = 'okta'", as: String.self)
        #expect(!stored.contains(String(secret)))
        let listed = try Self.siwactl(["ssf", "receivers", "list", "--database-url", database.url])
        #expect(listed.out.contains(String(clientID)) && !listed.out.contains(String(secret)))
        #expect(
            try Self.siwactl([
                "ssf", "receivers", "add", "okta", "--scopes", "ssf.all", "--database-url", database.url,
            ]).status != 0)

        let keys = try StaticHTTPServer(body: TestSigning.apple.jwksJSON())
        let (process, listeners, addresses, log) = try ListenAddressFileTests.start(
            "siwa-receiver", ["--listen", "127.0.0.1:0", "--audience", TestSigning.audience],
            environment: [
                "SIWA_DATABASE_URL": try database.url(asMemberOf: "siwa_receiver"),
                "SIWA_JWKS_URL": keys.url.absoluteString, "SIWA_SSF_LISTEN": "127.0.0.1:0",
                "SIWA_SSF_DATABASE_URL": try database.url(asMemberOf: "siwa_ssf"),
                "SIWA_SSF_KEY_FILE": keyFile,
                "SIWA_SSF_ISSUER": "https://ssf.example.test",
            ])
        defer { process.send(SIGKILL) }
        #expect(Set(listeners.keys) == ["notifications", "ssf"], "\(listeners)")
        let base = try "http://" + ListenAddresses.address("ssf", in: listeners)
        let metadata = try TestHTTPClient.get(base + "/.well-known/ssf-configuration")
        #expect(metadata.status == 200 && metadata.text.contains(#""issuer":"https://ssf.example.test""#))
        let basic = Data("\(clientID):\(secret)".utf8).base64EncodedString()
        let token = try TestHTTPClient.post(
            base + "/ssf/token", body: Array("grant_type=client_credentials".utf8),
            headers: [
                ("Authorization", "Basic " + basic), ("Content-Type", "application/x-www-form-urlencoded"),
            ])
        #expect(token.status == 200, "\(token.text)")
        let access = try #require(
            (try JSONSerialization.jsonObject(with: token.data) as? [String: Any])?["access_token"] as? String
        )
        let created = try TestHTTPClient.post(
            base + "/ssf/streams", body: Data(#"{"delivery":{"method":"urn:ietf:rfc:8936"}}"#.utf8),
            headers: [("Authorization", "Bearer " + access), ("Content-Type", "application/json")])
        #expect(created.status == 201, "\(created.text)")
        // Neither the secret nor the token reaches the log.
        #expect(!log().contains(String(secret)) && !log().contains(access))
        ListenAddressFileTests.stop(process, addresses)
        #expect(
            try Self.siwactl(["ssf", "receivers", "remove", "okta", "--database-url", database.url]).status
                == 0)
        #expect(try database.value("SELECT count(*)::int FROM siwa.ssf_streams", as: Int.self) == 0)
    }

    @Test("--ssf-listen needs its own login, the key file and the issuer (usage, exit 2)")
    func refusals() throws {
        let result = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwa-receiver"),
            arguments: [
                "--database-url", "postgresql:///nowhere", "--audience", TestSigning.audience, "--ssf-listen",
                "127.0.0.1:0",
            ], environment: [:])
        #expect(result.status == 2)
        #expect(result.standardError.contains("--ssf-database-url"), "\(result.standardError)")
    }
}
