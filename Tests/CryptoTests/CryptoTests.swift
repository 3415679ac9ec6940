import Crypto
import Foundation
import Testing

/// The bytes of a hexadecimal string.
private func bytes(_ hex: String) -> [UInt8] {
    var out: [UInt8] = []
    var index = hex.startIndex
    while index < hex.endIndex {
        let next = hex.index(index, offsetBy: 2)
        out.append(UInt8(hex[index..<next], radix: 16)!)
        index = next
    }
    return out
}

/// A throwaway P-256 key made for these tests (`openssl genpkey -algorithm EC`); it signs nothing real.
private let p256PEM = """
    -----BEGIN PRIVATE KEY-----
    MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgbIcw34z1PoDshdWB
    Zd/ACkfroDxswg+iCQK8DRdo8PehRANCAARApOAP/cV6DVrBdifnX1YhDhQzlQm4
    QW0FiGjHO8hF9jipMg4AiHctExNFo0JiWq48FpC33/BF5iawV8ePjmz5
    -----END PRIVATE KEY-----

    """

@Suite struct DigestTests {
    @Test func sha256OfABC() {
        // FIPS 180-2, appendix B.1.
        let expected = bytes("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(Digest.sha256(Array("abc".utf8)) == expected)
        #expect(Digest.sha256("abc") == expected)
        #expect(Digest.sha256(Data("abc".utf8)) == Data(expected))
    }

    @Test func hmacSHA256RFC4231() {
        // RFC 4231, test cases 1 and 2.
        #expect(
            HMACSHA256.authenticationCode(
                key: [UInt8](repeating: 0x0b, count: 20), message: Array("Hi There".utf8))
                == bytes("b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"))
        #expect(
            HMACSHA256.authenticationCode(
                key: Array("Jefe".utf8), message: Array("what do ya want for nothing?".utf8))
                == bytes("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"))
    }

    @Test func constantTimeEquals() {
        #expect(ConstantTime.equals([1, 2, 3], [1, 2, 3]))
        #expect(!ConstantTime.equals([1, 2, 3], [1, 2, 4]))
        #expect(!ConstantTime.equals([1, 2, 3], [1, 2]))
    }

    @Test func randomBytes() throws {
        let first = try SecureRandom.bytes(count: 32)
        #expect(first.count == 32)
        #expect(try SecureRandom.bytes(count: 32) != first)
    }
}

@Suite struct Ed25519Tests {
    @Test func rfc8032Test1() throws {
        // RFC 8032 § 7.1, TEST 1: the empty message.
        let key = try Ed25519.PrivateKey(
            seed: bytes("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"))
        #expect(
            key.publicKey.rawRepresentation
                == bytes("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"))
        let signature = bytes(
            "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
        )
        #expect(key.signature(for: []) == signature)
        #expect(key.publicKey.isValidSignature(signature, for: []))
        #expect(!key.publicKey.isValidSignature(signature, for: [0]))
    }

    @Test func generatedKeySignsAndRefusesTampering() throws {
        let key = try Ed25519.PrivateKey.generate()
        let message = Array("id.1700000000.{}".utf8)
        let signature = key.signature(for: message)
        #expect(key.publicKey.isValidSignature(signature, for: message))
        #expect(!key.publicKey.isValidSignature(signature, for: message + [0]))
        #expect(throws: CryptoError.self) { try Ed25519.PrivateKey(seed: [1, 2, 3]) }
    }
}

@Suite struct AESGCMTests {
    @Test func nistTestCase16() throws {
        // McGrew & Viega, "The Galois/Counter Mode of Operation", test case 16 (AES-256, with AAD).
        let key = bytes("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308")
        let nonce = bytes("cafebabefacedbaddecaf888")
        let plaintext = bytes(
            "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39"
        )
        let aad = bytes("feedfacedeadbeeffeedfacedeadbeefabaddad2")
        let ciphertext = bytes(
            "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"
        )
        let tag = bytes("76fc6ece0f4e1768cddf8853bb2d551b")
        let sealed = try AESGCM.seal(plaintext, key: key, nonce: nonce, authenticating: aad)
        #expect(sealed.ciphertext == ciphertext)
        #expect(sealed.tag == tag)
        #expect(
            try AESGCM.open(ciphertext, tag: tag, key: key, nonce: nonce, authenticating: aad) == plaintext)
    }

    @Test func refusesAlteredInput() throws {
        let key = [UInt8](repeating: 7, count: 32)
        let nonce = [UInt8](repeating: 1, count: 12)
        let sealed = try AESGCM.seal(Array("token".utf8), key: key, nonce: nonce, authenticating: [1])
        var altered = sealed.ciphertext
        altered[0] ^= 1
        #expect(throws: CryptoError.self) {
            try AESGCM.open(altered, tag: sealed.tag, key: key, nonce: nonce, authenticating: [1])
        }
        #expect(throws: CryptoError.self) {
            try AESGCM.open(sealed.ciphertext, tag: sealed.tag, key: key, nonce: nonce, authenticating: [2])
        }
        #expect(throws: CryptoError.self) {
            try AESGCM.seal([1], key: [1, 2], nonce: nonce, authenticating: [])
        }
    }
}

@Suite struct SignatureTests {
    @Test func rsaSignThenVerify() throws {
        let key = try RSA.PrivateKey.generate()
        let publicKey = try key.publicKey()
        #expect(publicKey.bits == 2048)
        let message = Data("header.claims".utf8)
        let signature = try key.sha256Signature(for: message)
        #expect(publicKey.isValidSHA256Signature(signature, for: message))
        #expect(publicKey.isValidSignature([UInt8](signature), for: [UInt8](message), digest: .sha256))
        #expect(!publicKey.isValidSHA256Signature(signature, for: Data("header.claimz".utf8)))
        #expect(!publicKey.isValidSignature([UInt8](signature), for: [UInt8](message), digest: .sha1))
        // The same key rebuilt from n and e (a JWK's) and from the PKCS#8 PEM.
        let rebuilt = try RSA.PublicKey(modulus: publicKey.modulus, exponent: publicKey.exponent)
        #expect(rebuilt.isValidSHA256Signature(signature, for: message))
        let reloaded = try RSA.PrivateKey(pem: key.pkcs8PEM())
        #expect(publicKey.isValidSHA256Signature(try reloaded.sha256Signature(for: message), for: message))
        #expect(throws: CryptoError.self) { try RSA.PublicKey(modulus: Data([1, 2]), exponent: Data([2])) }
    }

    @Test func ecdsaP256SignThenVerify() throws {
        let key = try P256.PrivateKey(pem: p256PEM)
        let message = Array("header.claims".utf8)
        let raw = try key.rawSignature(for: message)
        #expect(raw.count == 64)
        #expect(key.publicKey.isValidSignature(raw: raw, for: message))
        #expect(!key.publicKey.isValidSignature(raw: raw, for: Array("header.claimz".utf8)))
        // DER <-> raw, and the public key read back from its PEM.
        let der = try #require(P256.derSignature(raw: raw))
        #expect(P256.rawSignature(der: der) == raw)
        let publicKey = try P256.PublicKey(pem: key.publicKey.pem)
        #expect(publicKey.isValidSignature(der: der, for: message))
        #expect(!publicKey.isValidSignature(der: der, for: message + [0]))
        let base64 = key.publicKey.pem.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
        let spkiBytes = try #require(Data(base64Encoded: base64))
        let spki = try #require(P256.PublicKey(subjectPublicKeyInfo: [UInt8](spkiBytes)))
        #expect(spki.isValidSignature(der: der, for: message))
    }

    @Test func keysOfTheWrongType() throws {
        let rsa = try RSA.PrivateKey.generate().pkcs8PEM()
        #expect(throws: CryptoError(.wrongKeyType, "the key is not an EC key on P-256 (ES256)")) {
            try P256.PrivateKey(pem: rsa)
        }
        #expect(throws: CryptoError(.wrongKeyType, "private key is not RSA of at least 2048 bits")) {
            try RSA.PrivateKey(pem: p256PEM)
        }
        #expect(throws: CryptoError.self) { try P256.PrivateKey(pem: "not a key") }
    }
}
