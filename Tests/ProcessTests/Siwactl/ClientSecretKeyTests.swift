import Foundation
import TestSupport
import Testing

@Suite("siwactl client-secret check-key")
struct ClientSecretKeyTests {
    /// A P-256 key from openssl, copied to `name` with `mode`.
    func key(named name: String = "AuthKey_ABCDE12345.p8", mode: Int = 0o600, options: [String]? = nil) throws
        -> (OpenSSLKey, URL)
    {
        let generated = try options.map { try OpenSSLKey($0) } ?? OpenSSLKey()
        let file = generated.directory.appendingPathComponent(name)
        try FileManager.default.copyItem(at: generated.privateKey, to: file)
        #expect(chmod(file.path, mode_t(mode)) == 0)
        return (generated, file)
    }

    @Test("a private, well-named P-256 key matching its public half passes")
    func passes() throws {
        let (generated, file) = try key()
        defer { generated.remove() }
        let result = try siwactl([
            "client-secret", "check-key", "--key", file.path, "--key-id", "ABCDE12345", "--team-id",
            "TEAM123456",
            "--public-key", generated.publicKey.path,
        ])
        #expect(result.status == 0, "\(result.standardOutput)")
        #expect(result.standardOutput.contains("ok: mode 600"))
        #expect(result.standardOutput.contains("ok: matches the public key"))
        #expect(result.standardOutput.hasSuffix("verdict: ok\n"))
        #expect(
            !result.standardOutput.contains("PRIVATE KEY") && !result.standardOutput.contains("PUBLIC KEY"))
    }

    @Test("a key readable by group or others fails", arguments: [0o644, 0o640, 0o604, 0o660])
    func mode(mode: Int) throws {
        let (generated, file) = try key(mode: mode)
        defer { generated.remove() }
        let result = try siwactl(["client-secret", "check-key", "--key", file.path])
        #expect(result.status == 1)
        #expect(result.standardOutput.contains("FAIL: mode \(String(mode, radix: 8))"))
        #expect(result.standardOutput.contains("chmod 600"))
        #expect(result.standardOutput.hasSuffix("verdict: FAIL (1 check failed)\n"))
    }

    @Test(
        "a key that is not P-256 fails",
        arguments: [
            ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"], ["-algorithm", "ED25519"],
            ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
        ])
    func notP256(options: [String]) throws {
        let (generated, file) = try key(options: options)
        defer { generated.remove() }
        let result = try siwactl(["client-secret", "check-key", "--key", file.path])
        #expect(result.status == 1)
        #expect(result.standardOutput.contains("FAIL: not a P-256 key"))
    }

    @Test("a malformed key ID or team ID, another public key, or a missing file fails")
    func otherFailures() throws {
        let (generated, file) = try key()
        let other = try OpenSSLKey()
        defer {
            generated.remove()
            other.remove()
        }
        let result = try siwactl([
            "client-secret", "check-key", "--key", file.path, "--key-id", "abcde12345", "--team-id", "TEAM",
            "--public-key", other.publicKey.path,
        ])
        #expect(result.status == 1)
        #expect(result.standardOutput.contains("FAIL: key ID 'abcde12345'"))
        #expect(result.standardOutput.contains("warn: the file name says key ID ABCDE12345"))
        #expect(result.standardOutput.contains("FAIL: team ID 'TEAM'"))
        #expect(result.standardOutput.contains("FAIL: does not match the public key"))
        #expect(result.standardOutput.hasSuffix("verdict: FAIL (3 checks failed)\n"))

        let missing = try siwactl(["client-secret", "check-key", "--key", file.path + ".absent"])
        #expect(missing.status == 1)
        #expect(missing.standardOutput.contains("FAIL: cannot stat"))
        #expect(try siwactl(["client-secret", "check-key"]).status == 2)
    }

    @Test("the key and IDs come from SIWA_APPLE_KEY_FILE, SIWA_APPLE_KEY_ID and SIWA_APPLE_TEAM_ID")
    func environment() throws {
        let (generated, file) = try key(named: "service.p8")
        defer { generated.remove() }
        let result = try siwactl(
            ["client-secret", "check-key"],
            environment: [
                "SIWA_APPLE_KEY_FILE": file.path, "SIWA_APPLE_KEY_ID": "KEY1234567",
                "SIWA_APPLE_TEAM_ID": "bad",
            ])
        #expect(result.status == 1)
        #expect(result.standardOutput.contains("ok: key ID KEY1234567 is well formed"))
        #expect(result.standardOutput.contains("FAIL: team ID 'bad'"))
    }

    @Test("a key owned by another user is reported, as the check should run as the service's user")
    func owner() throws {
        try #require(geteuid() == 0, "needs root to chown")
        let (generated, file) = try key()
        defer { generated.remove() }
        #expect(chown(file.path, 65534, 65534) == 0)
        let result = try siwactl(["client-secret", "check-key", "--key", file.path])
        #expect(result.status == 0)
        #expect(result.standardOutput.contains("warn: owned by uid 65534"))
    }
}
