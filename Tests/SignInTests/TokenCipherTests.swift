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

    @Test(
        "a ciphertext names its key, is not the token, and decrypts only for its own row (client and token_sha256), whatever the row's sub"
    )
    func roundTrip() throws {
        let cipher = try TokenCipher(keyFile: writeKeyFile([("k1", randomKey())], in: directory))
        let token = "r.secret-refresh-token-0123456789"
        let row = TokenCipher.Row(clientID: "com.example.app", tokenSHA256: TokenCipher.sha256(of: token))
        let sealed = try cipher.encrypt(token, clientID: "com.example.app")
        #expect(TokenCipher.keyID(of: sealed) == "k1")
        #expect(TokenCipher.format(of: sealed) == 2)
        #expect(!String(decoding: sealed, as: UTF8.self).contains("secret-refresh"))
        #expect(try cipher.decrypt(sealed, for: row) == token)
        // No sub is bound: a team transfer rewrites the row's sub, and the ciphertext still decrypts.
        var transferred = row
        transferred.subs = ["002.after-transfer"]
        #expect(try cipher.decrypt(sealed, for: transferred) == token)
        // Two encryptions differ (fresh nonce).
        #expect(try cipher.encrypt(token, clientID: "com.example.app") != sealed)
        // Bound to its row: another row's token_sha256 or client does not decrypt; nor does a flipped bit,
        // nor a row without token_sha256.
        #expect(throws: TokenCipherError.self) {
            try cipher.decrypt(
                sealed,
                for: TokenCipher.Row(
                    clientID: "com.example.app", tokenSHA256: TokenCipher.sha256(of: "other")))
        }
        #expect(throws: TokenCipherError.self) {
            try cipher.decrypt(
                sealed, for: TokenCipher.Row(clientID: "com.example.web", tokenSHA256: row.tokenSHA256))
        }
        #expect(throws: TokenCipherError.self) {
            try cipher.decrypt(sealed, for: TokenCipher.Row(clientID: "com.example.app", tokenSHA256: nil))
        }
        var flipped = sealed
        flipped[flipped.count - 20] ^= 1
        #expect(throws: TokenCipherError.self) { try cipher.decrypt(flipped, for: row) }
    }

    @Test(
        "schema version 4's ciphertexts (format 1, bound to the sub) still decrypt under the sub they were stored with, also after a transfer replaced it, and only for their own sub and client"
    )
    func format1() throws {
        let cipher = try TokenCipher(keyFile: writeKeyFile([("k1", randomKey())], in: directory))
        let token = "r.secret-refresh-token-0123456789"
        let sealed = try cipher.encryptInFormat1(token, sub: "001.a", clientID: "com.example.app")
        #expect(TokenCipher.keyID(of: sealed) == "k1")
        #expect(TokenCipher.format(of: sealed) == 1)
        #expect(!String(decoding: sealed, as: UTF8.self).contains("secret-refresh"))
        let hash = TokenCipher.sha256(of: token)
        #expect(
            try cipher.decrypt(
                sealed, for: TokenCipher.Row(clientID: "com.example.app", tokenSHA256: hash, subs: ["001.a"]))
                == token)
        // After a transfer: the row's sub is the new one, the stored sub is among the replaced ones.
        #expect(
            try cipher.decrypt(
                sealed,
                for: TokenCipher.Row(
                    clientID: "com.example.app", tokenSHA256: hash, subs: ["002.new", "001.a"]))
                == token)
        // Bound to its row: another sub or client does not decrypt; nor does a flipped bit.
        #expect(throws: TokenCipherError.self) {
            try cipher.decrypt(
                sealed, for: TokenCipher.Row(clientID: "com.example.app", tokenSHA256: hash, subs: ["001.b"]))
        }
        #expect(throws: TokenCipherError.self) {
            try cipher.decrypt(
                sealed, for: TokenCipher.Row(clientID: "com.example.web", tokenSHA256: hash, subs: ["001.a"]))
        }
        var flipped = sealed
        flipped[flipped.count - 20] ^= 1
        #expect(throws: TokenCipherError.self) {
            try cipher.decrypt(
                flipped, for: TokenCipher.Row(clientID: "com.example.app", tokenSHA256: hash, subs: ["001.a"])
            )
        }
        // Not ours at all: no format, and a clear refusal.
        #expect(TokenCipher.format(of: Array("app-own-format:0123456789abcdef0123456789".utf8)) == nil)
    }

    @Test(
        "after a rotation the new key encrypts and the old one still decrypts; dropping it is refused clearly"
    )
    func rotation() throws {
        let old = randomKey()
        let new = randomKey()
        let row1 = TokenCipher.Row(clientID: "c", tokenSHA256: TokenCipher.sha256(of: "token-1"), subs: ["s"])
        let row2 = TokenCipher.Row(clientID: "c", tokenSHA256: TokenCipher.sha256(of: "token-2"), subs: ["s"])
        let before = try TokenCipher(keyFile: writeKeyFile([("2025", old)], in: directory))
        let sealedBefore = try before.encrypt("token-1", clientID: "c")
        let rotated = try TokenCipher(keyFile: writeKeyFile([("2026", new), ("2025", old)], in: directory))
        #expect(try rotated.decrypt(sealedBefore, for: row1) == "token-1")
        let sealedAfter = try rotated.encrypt("token-2", clientID: "c")
        #expect(TokenCipher.keyID(of: sealedAfter) == "2026")
        let onlyNew = try TokenCipher(keyFile: writeKeyFile([("2026", new)], in: directory))
        #expect(try onlyNew.decrypt(sealedAfter, for: row2) == "token-2")
        do {
            _ = try onlyNew.decrypt(sealedBefore, for: row1)
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
