import AppleNotifications
import Foundation
import TestSupport
import Testing

/// Tokens signed by `openssl dgst -sha256 -sign` (Tests/Fixtures/openssl-sign.sh) with the
/// TEST ONLY fixture key: proves the verifier accepts RS256 produced by another implementation.
@Suite("Interoperability with tokens signed outside Swift")
struct InteroperabilityTests {
    private let script = fixturesDirectory.appendingPathComponent("openssl-sign.sh")
    private let privateKey = fixturesDirectory.appendingPathComponent("TEST-ONLY-rsa-2048-private-key.pem")

    /// Signs header and claims JSON (exact bytes) with the openssl fixture script.
    private func opensslSign(header: String, claims: String) throws -> String {
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-interop-\(UUID())")
        try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: scratch) }
        let headerFile = scratch.appendingPathComponent("header.json")
        let claimsFile = scratch.appendingPathComponent("claims.json")
        try Data(header.utf8).write(to: headerFile)
        try Data(claims.utf8).write(to: claimsFile)
        let result = try runProcess(
            URL(fileURLWithPath: "/bin/sh"), [script.path, headerFile.path, claimsFile.path, privateKey.path])
        try #require(result.status == 0, "openssl-sign.sh failed: \(result.stderr)")
        return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// The fixture key's public half, published under `kid` in a JWKS built from the PEM.
    private func fixtureKeys(kid: String) throws -> JSONWebKeySet {
        let pem = try String(contentsOf: privateKey, encoding: .utf8)
        let signer = try NotificationSigner(privateKeyPEM: pem, keyID: kid)
        return try JSONWebKeySet(jsonData: signer.jwksJSON())
    }

    private let claims = """
        {"iss":"https://appleid.apple.com","aud":"\(TestSigning.audience)","iat":1700000000,\
        "exp":1700086400,"jti":"openssl-1","events":"{\\"type\\":\\"email-disabled\\",\\"sub\\":\
        \\"001026.16112b36378440d995af22b268f00984.1744\\",\\"event_time\\":1699999999123,\
        \\"email\\":\\"abc@privaterelay.appleid.com\\",\\"is_private_email\\":\\"true\\"}"}
        """

    @Test("verifies a token signed by openssl in Apple's exact shape")
    func opensslSignedToken() throws {
        let token = try opensslSign(header: #"{"kid":"fixture-1","alg":"RS256"}"#, claims: claims)
        let notification = try TestSigning.verifier.verify(
            token: token, keys: try fixtureKeys(kid: "fixture-1"), now: fixedNow)
        #expect(notification.eventType == .emailDisabled)
        #expect(notification.subject == "001026.16112b36378440d995af22b268f00984.1744")
        #expect(notification.isPrivateEmail == true)
        #expect(notification.eventTime == Date(timeIntervalSince1970: 1_699_999_999.123))
        #expect(notification.jti == "openssl-1")
    }

    @Test("refuses an openssl-signed token whose payload was altered afterwards")
    func opensslSignedTampered() throws {
        let token = try opensslSign(header: #"{"kid":"fixture-1","alg":"RS256"}"#, claims: claims)
        var parts = token.split(separator: ".").map(String.init)
        parts[1] = Base64URL.encode(
            Data(claims.replacingOccurrences(of: "openssl-1", with: "openssl-2").utf8))
        let keys = try fixtureKeys(kid: "fixture-1")
        do {
            _ = try TestSigning.verifier.verify(
                token: parts.joined(separator: "."), keys: keys, now: fixedNow)
            Issue.record("a tampered token verified")
        } catch {
            #expect(error.code == .badSignature)
        }
    }

    @Test("Swift and openssl produce the same RS256 signature for the same bytes")
    func sameSignature() throws {
        let header = #"{"kid":"fixture-1","alg":"RS256"}"#
        let opensslToken = try opensslSign(header: header, claims: claims)
        let pem = try String(contentsOf: privateKey, encoding: .utf8)
        let signer = try NotificationSigner(privateKeyPEM: pem, keyID: "fixture-1")
        let swiftToken = try signer.sign(headerJSON: Data(header.utf8), claimsJSON: Data(claims.utf8))
        #expect(swiftToken == opensslToken)
    }
}
