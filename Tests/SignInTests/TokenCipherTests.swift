import AppleID
import AppleNotifications
import Foundation
import SignIn
import TestSupport
import Testing
import TokenVault

@Suite("Refresh tokens encrypted at rest")
struct TokenCipherTests {
    let directory: URL = {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent(
            "token-cipher-\(UUID().uuidString)")
        try? FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        return url
    }()

    @Test("a ciphertext names its key, is not the token, and decrypts only for its own sub and client")
    func roundTrip() throws {
        let cipher = try TokenCipher(keyFile: writeKeyFile([("k1", randomKey())], in: directory))
        let token = "r.secret-refresh-token-0123456789"
        let sealed = try cipher.encrypt(token, sub: "001.a", clientID: "com.example.app")
        #expect(TokenCipher.keyID(of: sealed) == "k1")
        #expect(!String(decoding: sealed, as: UTF8.self).contains("secret-refresh"))
        #expect(try cipher.decrypt(sealed, sub: "001.a", clientID: "com.example.app") == token)
        // Two encryptions differ (fresh nonce).
        #expect(try cipher.encrypt(token, sub: "001.a", clientID: "com.example.app") != sealed)
        // Bound to its row: another sub or client does not decrypt; nor does a flipped bit.
        #expect(throws: TokenCipherError.self) {
            try cipher.decrypt(sealed, sub: "001.b", clientID: "com.example.app")
        }
        #expect(throws: TokenCipherError.self) {
            try cipher.decrypt(sealed, sub: "001.a", clientID: "com.example.web")
        }
        var flipped = sealed
        flipped[flipped.count - 20] ^= 1
        #expect(throws: TokenCipherError.self) {
            try cipher.decrypt(flipped, sub: "001.a", clientID: "com.example.app")
        }
    }

    @Test(
        "after a rotation the new key encrypts and the old one still decrypts; dropping it is refused clearly"
    )
    func rotation() throws {
        let old = randomKey()
        let new = randomKey()
        let before = try TokenCipher(keyFile: writeKeyFile([("2025", old)], in: directory))
        let sealedBefore = try before.encrypt("token-1", sub: "s", clientID: "c")
        let rotated = try TokenCipher(keyFile: writeKeyFile([("2026", new), ("2025", old)], in: directory))
        #expect(try rotated.decrypt(sealedBefore, sub: "s", clientID: "c") == "token-1")
        let sealedAfter = try rotated.encrypt("token-2", sub: "s", clientID: "c")
        #expect(TokenCipher.keyID(of: sealedAfter) == "2026")
        let onlyNew = try TokenCipher(keyFile: writeKeyFile([("2026", new)], in: directory))
        #expect(try onlyNew.decrypt(sealedAfter, sub: "s", clientID: "c") == "token-2")
        do {
            _ = try onlyNew.decrypt(sealedBefore, sub: "s", clientID: "c")
            Issue.record("decrypted with a key it does not hold")
        } catch {
            #expect(error.description.contains("2025"))
        }
    }

    @Test("a key file readable by others, without keys, or with a short key is refused")
    func badKeyFiles() throws {
        let path = try writeKeyFile([("k1", randomKey())], in: directory)
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: path)
        #expect(throws: TokenCipherError.self) { try TokenCipher(keyFile: path) }
        #expect(throws: TokenCipherError.self) { try TokenCipher(keyFile: writeKeyFile([], in: directory)) }
        #expect(throws: TokenCipherError.self) {
            try TokenCipher(keyFile: writeKeyFile([("k1", Array(randomKey().prefix(16)))], in: directory))
        }
        #expect(throws: TokenCipherError.self) {
            try TokenCipher(keyFile: writeKeyFile([("k1", randomKey()), ("k1", randomKey())], in: directory))
        }
    }
}

@Suite("id_token checks")
struct IdentityTokenTests {
    @Test("an expired id_token, or one issued in the future, is refused")
    func expiry() throws {
        let apple = try LocalApple()
        let nonce = Nonce()
        let token = try apple.authorize(sub: "001.time", nonce: nonce.hashed).idToken
        let keySet = try JSONWebKeySet(
            jsonData: Data(contentsOf: apple.keysDirectory.appendingPathComponent("jwks.json")))
        let verifier = IdentityTokenVerifier(audiences: [LocalApple.clientID])
        let lookup: (String) throws(NotificationError) -> RSAPublicKey = { kid throws(NotificationError) in
            guard let key = keySet.key(id: kid) else {
                throw NotificationError(.verificationFailed, .unknownKeyID, "x")
            }
            return key
        }
        #expect(try verifier.verify(token, rawNonce: nonce.raw, key: lookup).sub == "001.time")
        #expect(throws: IdentityTokenVerifier.Failure("id_token_expired")) {
            try verifier.verify(
                token, rawNonce: nonce.raw, now: Date().addingTimeInterval(2 * 86400), key: lookup)
        }
        #expect(throws: IdentityTokenVerifier.Failure("id_token_issued_in_future")) {
            try verifier.verify(
                token, rawNonce: nonce.raw, now: Date().addingTimeInterval(-3600), key: lookup)
        }
        #expect(throws: IdentityTokenVerifier.Failure("nonce_mismatch")) {
            try verifier.verify(token, rawNonce: "other", key: lookup)
        }
        #expect(throws: IdentityTokenVerifier.Failure("id_token_wrong_audience")) {
            try IdentityTokenVerifier(audiences: ["com.example.other"]).verify(
                token, rawNonce: nonce.raw, key: lookup)
        }
    }
}
