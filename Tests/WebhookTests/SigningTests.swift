import Foundation
import TestSupport
import Testing
import Webhooks

@Suite("Standard Webhooks signing")
struct SigningTests {
    @Test("a generated secret is whsec_ and 32 bytes of standard base64, and parses back")
    func generatedSecret() throws {
        let secret = StandardWebhooks.Secret.generate()
        #expect(secret.text.hasPrefix("whsec_"))
        #expect(secret.key.count == 32)
        #expect(try StandardWebhooks.Secret(secret.text) == secret)
        #expect("\(secret)" == "whsec_…(redacted)")
    }

    @Test(
        "secrets that are not whsec_ and 24 to 64 bytes of base64 are refused",
        arguments: [
            "", "whsec_", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_c2hvcnQ=", "whsec_not base64!!",
            "whsec_" + Data(repeating: 1, count: 65).base64EncodedString(),
        ])
    func refusedSecrets(text: String) {
        #expect(throws: StandardWebhooks.Error.self) { try StandardWebhooks.Secret(text) }
    }

    @Test("the signature matches the specification's example")
    func specificationExample() throws {
        // The example of the Standard Webhooks specification (spec/standard-webhooks.md).
        let secret = try StandardWebhooks.Secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        let body = Array(#"{"test": 2432232314}"#.utf8)
        #expect(
            StandardWebhooks.signature(
                id: "msg_p5jXN8AQM9LWM0D4loKWxJek", timestamp: 1_614_265_330, body: body, secret: secret)
                == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
    }

    @Test("the signature equals openssl's HMAC-SHA256 of id.timestamp.body")
    func matchesOpenSSL() throws {
        let secret = StandardWebhooks.Secret.generate()
        let body = Array(#"{"type":"siwa.consent_revoked","data":{"sub":"001.a"}}"#.utf8)
        let content = Array("msg_1_2.1700000000.".utf8) + body
        let hexKey = secret.key.map { String(format: "%02x", $0) }.joined()
        let result = try Subprocess.run(
            "/usr/bin/openssl", ["dgst", "-sha256", "-mac", "HMAC", "-macopt", "hexkey:\(hexKey)", "-r"],
            input: Data(content))
        #expect(result.status == 0)
        let hex = result.standardOutput.split(separator: " ").first.map(String.init)
        let ours = StandardWebhooks.hmacSHA256(key: secret.key, message: content).map {
            String(format: "%02x", $0)
        }
        .joined()
        #expect(hex == ours)
    }

    @Test("verification accepts any live secret, refuses a wrong one, a stale or future timestamp")
    func verification() throws {
        let old = StandardWebhooks.Secret.generate()
        let new = StandardWebhooks.Secret.generate()
        let body = Array("{}".utf8)
        let now = Date()
        let timestamp = Int(now.timeIntervalSince1970)
        let header = StandardWebhooks.signatureHeader(
            id: "msg_1_1", timestamp: timestamp, body: body, secrets: [new, old])
        #expect(header.split(separator: " ").count == 2)
        try StandardWebhooks.verify(
            id: "msg_1_1", timestamp: "\(timestamp)", signature: header, body: body, secrets: [old])
        try StandardWebhooks.verify(
            id: "msg_1_1", timestamp: "\(timestamp)", signature: header, body: body, secrets: [new])
        #expect(throws: StandardWebhooks.Error("no matching signature")) {
            try StandardWebhooks.verify(
                id: "msg_1_1", timestamp: "\(timestamp)", signature: header, body: body,
                secrets: [.generate()])
        }
        #expect(throws: StandardWebhooks.Error("no matching signature")) {
            try StandardWebhooks.verify(
                id: "msg_1_2", timestamp: "\(timestamp)", signature: header, body: body, secrets: [old])
        }
        #expect(throws: StandardWebhooks.Error("webhook-timestamp too old")) {
            try StandardWebhooks.verify(
                id: "msg_1_1", timestamp: "\(timestamp)", signature: header, body: body, secrets: [old],
                now: now.addingTimeInterval(301))
        }
        #expect(throws: StandardWebhooks.Error("webhook-timestamp too new")) {
            try StandardWebhooks.verify(
                id: "msg_1_1", timestamp: "\(timestamp)", signature: header, body: body, secrets: [old],
                now: now.addingTimeInterval(-301))
        }
    }

    @Test(
        "endpoint URLs: https, or http only to a loopback IP literal; no credentials",
        arguments: [
            ("https://hooks.example.com/siwa", true), ("http://127.0.0.1:8080/x", true),
            ("http://[::1]:9/x", true),
            ("http://localhost:8080/x", false), ("http://127.attacker.example/x", false),
            ("http://10.0.0.1/x", false), ("https://user:pw@example.com/x", false),
            ("ftp://example.com/", false),
            ("https://example.com/a b", false), ("example.com", false),
        ])
    func endpointPolicy(url: String, allowed: Bool) {
        #expect((StandardWebhooks.endpointProblem(url) == nil) == allowed)
    }
}
