import AppleNotifications
import Foundation
import TestSupport
import Testing

/// `siwactl verify` fetches keys as the receiver does, and bounds tokens without `exp` the same way.
@Suite("siwactl verify applies the receiver's key-fetch policy and token age")
struct VerifyPolicyTests {
    static let audience = TestSigning.audience

    static func tokenWithoutExp(issuedAt: Date, signer: NotificationSigner = TestSigning.apple) throws
        -> String
    {
        var claims = signer.claims(
            type: "consent-revoked", subject: "001.verify", audience: audience, email: nil,
            isPrivateEmail: nil,
            eventTime: issuedAt, issuedAt: issuedAt, jti: UUID().uuidString)
        claims["exp"] = nil
        return try signer.sign(claims: claims)
    }

    @Test("verify --jwks refuses a redirect: a token signed by the redirect target's key is not accepted")
    func redirectRefused() throws {
        let target = try JWKSTestServer(body: TestSigning.other.jwksJSON())
        defer { target.stop() }
        let redirector = try ScriptedHTTPServer { _, write in
            _ = write(
                Array(
                    "HTTP/1.1 302 Found\r\nLocation: \(target.url.absoluteString)\r\nContent-Length: 0\r\n\r\n"
                        .utf8))
        }
        let token = TestSigning.token(signer: TestSigning.other)
        let result = try siwactl([
            "verify", "--jwks", redirector.url().absoluteString, "--audience", Self.audience, token,
        ])
        #expect(result.status == 1)
        #expect(result.standardOutput.isEmpty)
        #expect(result.standardError.contains("redirect"), "\(result.standardError)")
        #expect(target.requestCount == 0)
    }

    @Test("verify --jwks refuses http to a host that merely starts with 127.")
    func nonLoopbackHTTPRefused() throws {
        let result = try siwactl([
            "verify", "--jwks", "http://127.attacker.example/auth/keys", "--audience", Self.audience,
            TestSigning.token(),
        ])
        #expect(result.status == 1)
        #expect(result.standardError.contains("must use https"), "\(result.standardError)")
    }

    @Test("verify --jwks refuses a key set over the limit before reading it")
    func oversizedKeySetRefused() throws {
        let server = try ScriptedHTTPServer { _, write in
            _ = write(Array("HTTP/1.1 200 OK\r\nContent-Length: \(64 << 20)\r\n\r\n".utf8))
        }
        let result = try siwactl([
            "verify", "--jwks", server.url().absoluteString, "--audience", Self.audience, TestSigning.token(),
        ])
        #expect(result.status == 1)
        #expect(result.standardError.contains("Content-Length"), "\(result.standardError)")
    }

    @Test("verify reads a body as the receiver does: a payload named twice is refused, one payload verifies")
    func bodyReadAsTheReceiverReadsIt() throws {
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        func verify(_ body: String) throws -> ExecutableLocator.Result {
            try siwactl(
                ["verify", "--jwks", jwks.url.absoluteString, "--audience", Self.audience, "-"],
                input: Data(body.utf8))
        }
        let good = TestSigning.token()
        let forged = TestSigning.token(signer: TestSigning.other)
        let single = try verify(#"{"payload":"\#(good)"}"#)
        #expect(single.status == 0, "\(single.standardError)")
        // Two readers could pick different members of an ambiguous body; the receiver refuses it.
        let twice = try verify(#"{"payload":"\#(forged)","payload":"\#(good)"}"#)
        #expect(twice.status == 1)
        #expect(twice.standardOutput.isEmpty)
        #expect(twice.standardError.contains("bad_body"), "\(twice.standardError)")
    }

    @Test("verify refuses a token without exp older than --max-token-age as of --at, and accepts it within")
    func maxTokenAge() throws {
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let issued = Date(timeIntervalSince1970: 1_700_000_000)
        let token = try Self.tokenWithoutExp(issuedAt: issued)
        func verify(at seconds: Int, _ extra: [String] = []) throws -> ExecutableLocator.Result {
            let at = ISO8601DateFormatter().string(from: issued.addingTimeInterval(TimeInterval(seconds)))
            return try siwactl(
                ["verify", "--jwks", jwks.url.absoluteString, "--audience", Self.audience, "--at", at] + extra
                    + [token])
        }
        let old = try verify(at: 86_400 + 61)
        #expect(old.status == 1)
        #expect(old.standardError.contains("too_old"), "\(old.standardError)")
        #expect(try verify(at: 86_400 - 60).status == 0)
        let strict = try verify(at: 700, ["--max-token-age", "600"])
        #expect(strict.status == 1)
        #expect(strict.standardError.contains("too_old"))
        // The environment twin, as in the receiver's configuration.
        let at = ISO8601DateFormatter().string(from: issued.addingTimeInterval(700))
        let fromEnvironment = try siwactl(
            ["verify", "--jwks", jwks.url.absoluteString, "--audience", Self.audience, "--at", at, token],
            environment: ["SIWA_MAX_TOKEN_AGE": "600"])
        #expect(fromEnvironment.status == 1)
    }

    @Test("verify --jwks goes through https_proxy for a remote https URL, as a CONNECT tunnel")
    func httpsProxyHonoured() throws {
        let proxy = try ScriptedHTTPServer { _, write in
            _ = write(Array("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n".utf8))
        }
        let result = try siwactl(
            [
                "verify", "--jwks", "https://keys.example.invalid/auth/keys", "--audience", Self.audience,
                TestSigning.token(),
            ],
            environment: ["https_proxy": "http://127.0.0.1:\(proxy.port)", "no_proxy": ""])
        #expect(result.status == 1)
        #expect(result.standardError.contains("proxy refused"), "\(result.standardError)")
        #expect(proxy.requestHeads.first?.hasPrefix("CONNECT keys.example.invalid:443 ") == true)
    }

    @Test("verify --jwks over https checks the certificate chain and the host name")
    func httpsCertificateChecks() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-tls-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        // TEST ONLY: a throwaway CA and a certificate for "localhost" (no IP address in it).
        try makeLocalhostCertificate(in: directory)
        try TestSigning.apple.jwksJSON().write(to: directory.appendingPathComponent("jwks.json"))
        // Port 0: s_server prints "ACCEPT 127.0.0.1:PORT" once it listens.
        let output = directory.appendingPathComponent("s_server.out")
        let server = try Subprocess(
            "/usr/bin/openssl",
            ["s_server", "-accept", "127.0.0.1:0", "-cert", "server.pem", "-key", "server.key", "-WWW"],
            standardOutput: output.path, workingDirectory: directory.path)
        defer {
            server.send(SIGKILL)
            _ = server.wait(timeout: .seconds(5))
        }
        let port = try ListenAddresses.printedPort("ACCEPT", in: output, of: server)

        let token = TestSigning.token()
        let trustedCA = ["SSL_CERT_FILE": directory.appendingPathComponent("ca.pem").path]
        func verify(_ url: String, _ environment: [String: String]) throws -> ExecutableLocator.Result {
            try siwactl(
                ["verify", "--jwks", url, "--audience", Self.audience, token], environment: environment)
        }
        let good = try verify("https://localhost:\(port)/jwks.json", trustedCA)
        #expect(good.status == 0, "\(good.standardError)")
        let untrusted = try verify("https://localhost:\(port)/jwks.json", [:])
        #expect(untrusted.status == 1)
        #expect(untrusted.standardError.contains("certificate"), "\(untrusted.standardError)")
        let wrongName = try verify("https://127.0.0.1:\(port)/jwks.json", trustedCA)
        #expect(wrongName.status == 1)
        #expect(wrongName.standardError.contains("certificate"), "\(wrongName.standardError)")
    }
}
