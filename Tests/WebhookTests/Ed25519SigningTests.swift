import Foundation
import TestSupport
import Testing
import Webhooks

private func hex(_ text: String) -> [UInt8] {
    var bytes: [UInt8] = []
    var index = text.startIndex
    while index < text.endIndex {
        let next = text.index(index, offsetBy: 2)
        bytes.append(UInt8(text[index..<next], radix: 16)!)
        index = next
    }
    return bytes
}

/// A copy of `delivery` with one byte of its body flipped.
private func flipped(_ delivery: ReceivedDelivery) -> ReceivedDelivery {
    var copy = delivery
    copy.body[copy.body.count / 2] ^= 0x01
    return copy
}

@Suite("Standard Webhooks ed25519 signing (v1a)")
struct Ed25519SigningTests {
    @Test("RFC 8032 test vectors 1 and 2: the public key and the signature are the RFC's")
    func rfc8032Vectors() throws {
        let vectors: [(seed: String, publicKey: String, message: String, signature: String)] = [
            (
                "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
                "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
                "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
            ),
            (
                "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
                "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
                "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"
            ),
        ]
        for vector in vectors {
            let key = try StandardWebhooks.Ed25519SigningKey(seed: hex(vector.seed))
            #expect(key.publicKey.bytes == hex(vector.publicKey))
            #expect(key.sign(hex(vector.message)) == hex(vector.signature))
            #expect(key.publicKey.isValidSignature(hex(vector.signature), of: hex(vector.message)))
        }
    }

    @Test(
        "a generated key is whsk_ and 32 bytes of base64, parses back, is redacted; its public key is whpk_")
    func generatedKey() throws {
        let key = StandardWebhooks.Ed25519SigningKey.generate()
        #expect(key.text.hasPrefix("whsk_") && key.text.count == 5 + 44)
        #expect(try StandardWebhooks.Ed25519SigningKey(key.text) == key)
        #expect("\(key)" == "whsk_…(redacted)")
        #expect("\(StandardWebhooks.SigningKey.ed25519(key))" == "whsk_…(redacted)")
        #expect(key.publicKey.text.hasPrefix("whpk_") && key.publicKey.text.count == 5 + 44)
        #expect(try StandardWebhooks.Ed25519PublicKey(key.publicKey.text) == key.publicKey)
        #expect(try StandardWebhooks.SigningKey(key.text).scheme == "v1a")
        #expect(try StandardWebhooks.SigningKey(StandardWebhooks.Secret.generate().text).scheme == "v1")
        #expect(StandardWebhooks.Ed25519SigningKey.generate() != key)
    }

    @Test("the 64-byte form (seed, then public key) is accepted only with its own public key")
    func sixtyFourByteForm() throws {
        let key = StandardWebhooks.Ed25519SigningKey.generate()
        let other = StandardWebhooks.Ed25519SigningKey.generate()
        let long = "whsk_" + Data(key.seed + key.publicKey.bytes).base64EncodedString()
        #expect(try StandardWebhooks.Ed25519SigningKey(long) == key)
        let mismatched = "whsk_" + Data(key.seed + other.publicKey.bytes).base64EncodedString()
        #expect(throws: StandardWebhooks.Error.self) { try StandardWebhooks.Ed25519SigningKey(mismatched) }
    }

    @Test(
        "keys that are not whsk_/whpk_ and 32 bytes of base64 are refused",
        arguments: [
            "", "whsk_", "whpk_", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsk_not base64!!",
            "whsk_" + Data(repeating: 1, count: 31).base64EncodedString(),
            "whsk_" + Data(repeating: 1, count: 33).base64EncodedString(),
            "whpk_" + Data(repeating: 1, count: 32).base64EncodedString(),
        ])
    func refusedKeys(text: String) {
        #expect(throws: StandardWebhooks.Error.self) { try StandardWebhooks.Ed25519SigningKey(text) }
        if !text.hasPrefix("whpk_") || text.count != 5 + 44 {
            #expect(throws: StandardWebhooks.Error.self) { try StandardWebhooks.Ed25519PublicKey(text) }
        }
    }

    @Test("v1a signs id.timestamp.body; a flipped byte of the body, id or timestamp, or another key, fails")
    func signAndVerify() throws {
        let key = StandardWebhooks.Ed25519SigningKey.generate()
        let body = Array(#"{"type":"siwa.consent_revoked"}"#.utf8)
        let now = Date()
        let timestamp = Int(now.timeIntervalSince1970)
        let signature = StandardWebhooks.signature(
            id: "msg_1_1", timestamp: timestamp, body: body, key: .ed25519(key))
        #expect(signature.hasPrefix("v1a,"))
        #expect(Data(base64Encoded: String(signature.dropFirst(4)))?.count == 64)
        // The signature is over exactly the specification's signed content.
        let content = Array("msg_1_1.\(timestamp).".utf8) + body
        #expect(
            key.publicKey.isValidSignature(
                Array(Data(base64Encoded: String(signature.dropFirst(4)))!), of: content))
        try StandardWebhooks.verify(
            id: "msg_1_1", timestamp: String(timestamp), signature: signature, body: body,
            publicKeys: [key.publicKey], now: now)
        var changed = body
        changed[3] ^= 0x01
        for (id, stamp, message, keys) in [
            ("msg_1_1", timestamp, changed, [key.publicKey]), ("msg_1_2", timestamp, body, [key.publicKey]),
            ("msg_1_1", timestamp + 1, body, [key.publicKey]),
            ("msg_1_1", timestamp, body, [StandardWebhooks.Ed25519SigningKey.generate().publicKey]),
        ] {
            #expect(throws: StandardWebhooks.Error("no matching signature")) {
                try StandardWebhooks.verify(
                    id: id, timestamp: String(stamp), signature: signature, body: message, publicKeys: keys,
                    now: now)
            }
        }
        #expect(throws: StandardWebhooks.Error("webhook-timestamp too old")) {
            try StandardWebhooks.verify(
                id: "msg_1_1", timestamp: String(timestamp), signature: signature, body: body,
                publicKeys: [key.publicKey], now: now.addingTimeInterval(301))
        }
        // A v1 (HMAC) signature never passes as v1a.
        let hmac = StandardWebhooks.signature(
            id: "msg_1_1", timestamp: timestamp, body: body, key: .hmac(.generate()))
        #expect(throws: StandardWebhooks.Error.self) {
            try StandardWebhooks.verify(
                id: "msg_1_1", timestamp: String(timestamp), signature: hmac, body: body,
                publicKeys: [key.publicKey], now: now)
        }
    }

    @Test("a header with a v1 and a v1a key holds both signatures, each verifiable by its own scheme")
    func mixedHeader() throws {
        let secret = StandardWebhooks.Secret.generate()
        let key = StandardWebhooks.Ed25519SigningKey.generate()
        let body = Array("{}".utf8)
        let now = Date()
        let timestamp = Int(now.timeIntervalSince1970)
        let header = StandardWebhooks.signatureHeader(
            id: "msg_2_1", timestamp: timestamp, body: body, keys: [.ed25519(key), .hmac(secret)])
        let parts = header.split(separator: " ")
        #expect(parts.count == 2 && parts[0].hasPrefix("v1a,") && parts[1].hasPrefix("v1,"))
        try StandardWebhooks.verify(
            id: "msg_2_1", timestamp: String(timestamp), signature: header, body: body, secrets: [secret],
            now: now)
        try StandardWebhooks.verify(
            id: "msg_2_1", timestamp: String(timestamp), signature: header, body: body,
            publicKeys: [key.publicKey], now: now)
    }

    @Test("signatures made here verify with pyca cryptography's Ed25519; a flipped body byte does not")
    func independentVerifier() throws {
        let key = StandardWebhooks.Ed25519SigningKey.generate()
        let body = Array(#"{"data":{"sub":"001234.x"},"type":"siwa.account_deleted"}"#.utf8)
        let timestamp = Int(Date().timeIntervalSince1970)
        let delivery = ReceivedDelivery(
            id: "msg_3_1", timestamp: String(timestamp),
            signature: StandardWebhooks.signatureHeader(
                id: "msg_3_1", timestamp: timestamp, body: body, keys: [.ed25519(key)]),
            body: body, status: 204, at: .now)
        let verdicts = try ReferenceVerifier.verify([delivery, flipped(delivery)], publicKey: key.publicKey)
        #expect(verdicts.first == "ok")
        #expect(verdicts.last?.hasPrefix("fail") == true)
        let otherKey = StandardWebhooks.Ed25519SigningKey.generate().publicKey
        #expect(
            try ReferenceVerifier.verify([delivery], publicKey: otherKey).first?.hasPrefix("fail") == true)
    }
}
