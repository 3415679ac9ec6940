import AppleID
import AppleNotifications
import Foundation
import TestSupport
import Testing

/// TEST-ONLY keys made with the openssl CLI at test time, never stored.
struct OpenSSLKey {
    let directory: URL
    let privateKey: URL
    let publicKey: URL

    /// `algorithm` options for `openssl genpkey`, e.g. `["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]`.
    init(_ options: [String] = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]) throws {
        directory = try scratchDirectory()
        privateKey = directory.appendingPathComponent("AuthKey_TEST.p8")
        publicKey = directory.appendingPathComponent("public.pem")
        try openssl(["genpkey"] + options + ["-out", privateKey.path])
        try openssl(["pkey", "-in", privateKey.path, "-pubout", "-out", publicKey.path])
    }

    func remove() { try? FileManager.default.removeItem(at: directory) }
}

/// DER `SEQUENCE { INTEGER r, INTEGER s }` from JOSE's 64-byte `r||s` (written here, independently of
/// the code under test).
func derSignature(_ raw: [UInt8]) -> [UInt8] {
    func integer(_ bytes: ArraySlice<UInt8>) -> [UInt8] {
        var value = Array(bytes.drop(while: { $0 == 0 }))
        if value.isEmpty { value = [0] }
        if value[0] & 0x80 != 0 { value.insert(0, at: 0) }
        return [0x02, UInt8(value.count)] + value
    }
    let body = integer(raw[0..<32]) + integer(raw[32..<64])
    return [0x30, UInt8(body.count)] + body
}

@Suite("siwactl client-secret")
struct ClientSecretTests {
    static let base = ["--team-id", "TEAM123456", "--key-id", "KEY1234567", "--client-id", "com.example.web"]

    func make(_ key: OpenSSLKey, days: String? = nil) throws -> ExecutableLocator.Result {
        try siwactl(
            ["client-secret", "--key", key.privateKey.path] + Self.base + (days.map { ["--days", $0] } ?? []))
    }

    @Test("makes an ES256 secret with Apple's header and claims that openssl verifies")
    func verifiedByOpenSSL() throws {
        let key = try OpenSSLKey()
        defer { key.remove() }
        let result = try make(key, days: "90")
        #expect(result.status == 0, "\(result.standardError)")
        let token = result.standardOutput.trimmingCharacters(in: .whitespacesAndNewlines)
        let parts = token.split(separator: ".").map(String.init)
        try #require(parts.count == 3)

        let header = try #require(
            try JSONSerialization.jsonObject(with: Base64URL.decode(parts[0])) as? [String: Any])
        #expect(header.count == 2)
        #expect(header["alg"] as? String == "ES256")
        #expect(header["kid"] as? String == "KEY1234567")
        let claims = try #require(
            try JSONSerialization.jsonObject(with: Base64URL.decode(parts[1])) as? [String: Any])
        #expect(claims["iss"] as? String == "TEAM123456")
        #expect(claims["sub"] as? String == "com.example.web")
        #expect(claims["aud"] as? String == "https://appleid.apple.com")
        let iat = try #require(claims["iat"] as? Int)
        let exp = try #require(claims["exp"] as? Int)
        #expect(exp - iat == 90 * 86400)
        #expect(abs(Double(iat) - Date().timeIntervalSince1970) < 60)

        let signature = try Base64URL.decode(parts[2])
        #expect(signature.count == 64)
        let input = key.directory.appendingPathComponent("input")
        let der = key.directory.appendingPathComponent("signature.der")
        try Data((parts[0] + "." + parts[1]).utf8).write(to: input)
        try Data(derSignature([UInt8](signature))).write(to: der)
        let verified = try Subprocess.run(
            "/usr/bin/openssl",
            ["dgst", "-sha256", "-verify", key.publicKey.path, "-signature", der.path, input.path])
        #expect(verified.status == 0)
        #expect(verified.standardOutput.contains("Verified OK"))

        // The same signature over different claims must not verify (the check above can fail).
        try Data((parts[0] + "." + parts[1] + "x").utf8).write(to: input)
        let tampered = try Subprocess.run(
            "/usr/bin/openssl",
            ["dgst", "-sha256", "-verify", key.publicKey.path, "-signature", der.path, input.path])
        #expect(tampered.status != 0)
    }

    @Test("the lifetime is 1 to 180 days", arguments: [("180", 0), ("1", 0), ("181", 2), ("0", 2), ("x", 2)])
    func lifetime(days: String, status: Int32) throws {
        let key = try OpenSSLKey()
        defer { key.remove() }
        #expect(try make(key, days: days).status == status)
    }

    @Test(
        "refuses keys that are not P-256",
        arguments: [
            ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"], ["-algorithm", "ED25519"],
            ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024"],
        ])
    func refusesOtherKeys(options: [String]) throws {
        let key = try OpenSSLKey(options)
        defer { key.remove() }
        let result = try make(key)
        #expect(result.status == 1)
        #expect(result.standardError.contains("P-256"))
        #expect(result.standardOutput.isEmpty)
    }

    @Test(
        "check passes or fails by the days left",
        arguments: [("90", "30", 0), ("90", "89.9", 0), ("90", "90.1", 1), ("10", "30", 1), ("10", "0", 0)])
    func checkThreshold(days: String, minimumDays: String, status: Int32) throws {
        let key = try OpenSSLKey()
        defer { key.remove() }
        let token = try make(key, days: days).standardOutput
        let result = try siwactl(
            ["client-secret", "check", "--min-days", minimumDays, "-"], input: Data(token.utf8))
        #expect(result.status == status, "\(result.standardError)")
        #expect(result.standardOutput.contains("iss (team ID): TEAM123456"))
        let signature = try #require(
            token.trimmingCharacters(in: .whitespacesAndNewlines).split(separator: ".").last)
        #expect(!result.standardOutput.contains(signature))
        #expect(!result.standardError.contains(signature))
    }

    @Test("check fails for an expired secret and for a signature from another key")
    func checkExpiredAndForeign() throws {
        let key = try OpenSSLKey()
        let other = try OpenSSLKey()
        defer {
            key.remove()
            other.remove()
        }
        let signer = try ClientSecretSigner(
            privateKeyPEM: String(contentsOf: key.privateKey, encoding: .utf8))
        let expired = try signer.sign(
            teamID: "T", keyID: "K", clientID: "C", issuedAt: Date().addingTimeInterval(-2 * 86400),
            lifetime: 86400)
        let result = try siwactl(["client-secret", "check", expired, "--min-days", "0"])
        #expect(result.status == 1)
        #expect(result.standardError.contains("expired"))
        // Says what is true: how long ago, without a negative count.
        #expect(result.standardOutput.contains("(expired 1.0 days ago)"), "\(result.standardOutput)")
        #expect(!result.standardOutput.contains("-1.0"), "\(result.standardOutput)")

        let fresh = try make(key).standardOutput.trimmingCharacters(in: .whitespacesAndNewlines)
        let good = try siwactl(["client-secret", "check", fresh, "--key", key.privateKey.path])
        #expect(good.status == 0, "\(good.standardError)")
        #expect(good.standardOutput.contains("signature: valid"))
        let foreign = try siwactl(["client-secret", "check", fresh, "--key", other.privateKey.path])
        #expect(foreign.status == 1)
        #expect(foreign.standardOutput.contains("signature: INVALID"))
    }

    @Test("check refuses what is not a client secret", arguments: ["garbage", "a.b.c", "e30.e30.e30"])
    func checkMalformed(token: String) throws {
        let result = try siwactl(["client-secret", "check", token])
        #expect(result.status == 1)
    }

    @Test("the library refuses lifetimes beyond Apple's 15777000 seconds")
    func libraryLifetime() throws {
        let key = try OpenSSLKey()
        defer { key.remove() }
        let signer = try ClientSecretSigner(
            privateKeyPEM: String(contentsOf: key.privateKey, encoding: .utf8))
        #expect(throws: ClientSecretError.self) {
            try signer.sign(teamID: "T", keyID: "K", clientID: "C", lifetime: 15_777_001)
        }
        let token = try signer.sign(teamID: "T", keyID: "K", clientID: "C", lifetime: 15_777_000)
        let claims = try ClientSecretClaims(decoding: token)
        #expect(claims.expiresAt.timeIntervalSince(claims.issuedAt) == 15_777_000)
        #expect(signer.verifySignature(of: token))
    }
}
