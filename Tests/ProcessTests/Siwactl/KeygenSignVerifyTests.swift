import AppleNotifications
import Foundation
import TestSupport
import Testing

/// Runs the built `siwactl` (built by `swift build`, which precedes `swift test`).
@Suite("siwactl keygen, sign and verify")
struct KeygenSignVerifyTests {
    /// What a run printed and how it ended.
    struct Output {
        var status: Int32
        var stdout: String
        var stderr: String
    }

    private func siwactl(_ arguments: [String], stdin: Data? = nil, environment: [String: String] = [:])
        throws -> Output
    {
        let result = try TestSupport.siwactl(arguments, environment: environment, input: stdin)
        return Output(status: result.status, stdout: result.standardOutput, stderr: result.standardError)
    }

    @Test("keygen, sign and verify round-trip through the binary")
    func roundTrip() throws {
        let directory = try scratchDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let keygen = try siwactl(["keygen", "--out", directory.path])
        #expect(keygen.status == 0)
        let kid = keygen.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(!kid.isEmpty)
        let keyPath = directory.appendingPathComponent("private-key.pem").path
        let attributes = try FileManager.default.attributesOfItem(atPath: keyPath)
        #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o600)

        let sign = try siwactl([
            "sign", "--key", keyPath, "--kid", kid, "--audience", "com.example.app", "--type",
            "email-disabled",
            "--sub", "001.abc", "--email", "x@privaterelay.appleid.com",
        ])
        #expect(sign.status == 0)
        let body = try #require(
            try JSONSerialization.jsonObject(with: Data(sign.stdout.utf8)) as? [String: String])
        #expect(body.keys.sorted() == ["payload"])

        let jwks = directory.appendingPathComponent("jwks.json").path
        let verify = try siwactl(
            ["verify", "--jwks", jwks, "--audience", "com.other", "--audience", "com.example.app", "-"],
            stdin: Data(sign.stdout.utf8))
        #expect(verify.status == 0, "stderr: \(verify.stderr)")
        let output = try #require(
            try JSONSerialization.jsonObject(with: Data(verify.stdout.utf8)) as? [String: Any])
        #expect(output["type"] as? String == "email-disabled")
        #expect(output["sub"] as? String == "001.abc")
        #expect(output["email"] as? String == "x@privaterelay.appleid.com")
        #expect(output["is_private_email"] as? Bool == true)
        #expect(output["aud"] as? String == "com.example.app")
        #expect((output["event_time"] as? String)?.hasSuffix("Z") == true)

        // A bare token as an argument, verified as of a past instant: a day and a half later it has expired.
        let token = try #require(body["payload"])
        let later = ISO8601DateFormatter().string(from: Date().addingTimeInterval(36 * 3600))
        let expired = try siwactl([
            "verify", "--jwks", jwks, "--audience", "com.example.app", "--at", later, token,
        ])
        #expect(expired.status == 1)
        #expect(expired.stderr.contains("expired"))
    }

    @Test("a tampered token exits 1 with a one-line reason that does not echo the token")
    func tamperedToken() throws {
        let directory = try scratchDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        #expect(try siwactl(["keygen", "--out", directory.path, "--kid", "k1"]).status == 0)
        let sign = try siwactl([
            "sign", "--key", directory.appendingPathComponent("private-key.pem").path, "--kid", "k1",
            "--audience", "com.example.app", "--type", "consent-revoked", "--sub", "001.abc",
        ])
        let body = try #require(
            try JSONSerialization.jsonObject(with: Data(sign.stdout.utf8)) as? [String: String])
        var parts = try #require(body["payload"]).split(separator: ".").map(String.init)
        parts[2] = String(parts[2].reversed())
        let tampered = parts.joined(separator: ".")
        let verify = try siwactl([
            "verify", "--jwks", directory.appendingPathComponent("jwks.json").path, "--audience",
            "com.example.app",
            tampered,
        ])
        #expect(verify.status == 1)
        #expect(verify.stdout.isEmpty)
        let lines = verify.stderr.split(separator: "\n")
        #expect(lines.count == 1)
        #expect(verify.stderr.contains("bad_signature") || verify.stderr.contains("bad_base64"))
        #expect(!verify.stderr.contains(parts[1]))
    }

    @Test("usage errors exit 2 and --help lists the verbs")
    func usage() throws {
        let help = try siwactl(["--help"])
        #expect(help.status == 0)
        for verb in ["keygen", "sign", "verify"] { #expect(help.stdout.contains(verb)) }
        #expect(try siwactl(["verify", "--jwks", "x.json", "token"]).status == 2)
        #expect(try siwactl(["verify", "--bogus"]).status == 2)
        #expect(try siwactl(["frobnicate"]).status == 2)
        let verbHelp = try siwactl(["sign", "--help"])
        #expect(verbHelp.status == 0)
        #expect(verbHelp.stdout.contains("--audience AUD"))
    }

    @Test("signs Apple's exact header and reads the JWKS and audiences from SIWA_* variables")
    func appleShapeAndEnvironment() throws {
        let directory = try scratchDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        #expect(try siwactl(["keygen", "--out=\(directory.path)", "--kid", "apple-like"]).status == 0)
        let sign = try siwactl([
            "sign", "--key", directory.appendingPathComponent("private-key.pem").path, "--kid=apple-like",
            "--audience", "com.example.app", "--type", "account-delete", "--sub", "001.abc",
        ])
        let body = try #require(
            try JSONSerialization.jsonObject(with: Data(sign.stdout.utf8)) as? [String: String])
        let jws = try CompactJWS(try #require(body["payload"]))
        #expect(String(decoding: jws.header, as: UTF8.self) == #"{"kid":"apple-like","alg":"RS256"}"#)

        let environment = [
            "SIWA_JWKS_URL": directory.appendingPathComponent("jwks.json").path,
            "SIWA_AUDIENCES": "com.other, com.example.app",
        ]
        let verify = try siwactl(["verify", "-"], stdin: Data(sign.stdout.utf8), environment: environment)
        #expect(verify.status == 0, "stderr: \(verify.stderr)")
        #expect(verify.stdout.contains(#""type":"account-delete""#))
    }
}
