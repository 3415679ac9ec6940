import AppleNotifications
import Foundation
import TestSupport
import Testing

@Suite("JSON Web Key Set")
struct JSONWebKeySetTests {
    /// The shared Apple test key as a JWK dictionary, to alter.
    private var appleJWK: [String: String] { TestSigning.apple.publicKey().jwk(keyID: "k1") }

    private func keySet(_ keys: [[String: String]]) throws -> JSONWebKeySet {
        try JSONWebKeySet(jsonData: json(["keys": keys]))
    }

    @Test("reads the signer's published JWKS and finds the key by kid")
    func readsSignerJWKS() throws {
        let set = try JSONWebKeySet(jsonData: TestSigning.apple.jwksJSON())
        #expect(set.keyIDs == [TestSigning.apple.keyID])
        #expect(set.skipped.isEmpty)
        let key = try #require(set.key(id: TestSigning.apple.keyID))
        #expect(key.bits == 2048)
        #expect(set.key(id: "nope") == nil)
    }

    @Test("reads Apple's real key-set shape with several keys")
    func readsSeveral() throws {
        var second = TestSigning.other.publicKey().jwk(keyID: "k2")
        second["alg"] = nil
        second["use"] = nil
        let set = try keySet([appleJWK, second])
        #expect(set.keyIDs == ["k1", "k2"])
    }

    @Test("skips keys whose kty is not RSA", arguments: ["EC", "oct", "OKP"])
    func skipsNonRSA(kty: String) throws {
        var jwk = appleJWK
        jwk["kty"] = kty
        let set = try keySet([jwk])
        #expect(set.keyIDs.isEmpty)
        #expect(set.key(id: "k1") == nil)
        #expect(set.skipped == [JSONWebKeySet.SkippedKey(keyID: "k1", reason: "kty is not RSA")])
    }

    @Test("skips a 1024-bit RSA key")
    func skipsShortKey() throws {
        var jwk = appleJWK
        let modulus = try Base64URL.decode(jwk["n"]!)
        jwk["n"] = Base64URL.encode(modulus.prefix(128))
        let set = try keySet([jwk])
        #expect(set.keyIDs.isEmpty)
        #expect(set.skipped.first?.reason == "modulus shorter than 2048 bits")
    }

    @Test("skips a key declared for another algorithm", arguments: ["RS384", "RS512", "PS256", "ES256"])
    func skipsOtherAlgorithm(alg: String) throws {
        var jwk = appleJWK
        jwk["alg"] = alg
        let set = try keySet([jwk])
        #expect(set.keyIDs.isEmpty)
        #expect(set.skipped.first?.reason == "alg is not RS256")
    }

    @Test("skips a key declared for encryption")
    func skipsEncryptionKey() throws {
        var jwk = appleJWK
        jwk["use"] = "enc"
        let set = try keySet([jwk])
        #expect(set.keyIDs.isEmpty)
        #expect(set.skipped.first?.reason == "use is not sig")
    }

    @Test("skips a key without kid and a key with broken n")
    func skipsIncomplete() throws {
        var noKid = appleJWK
        noKid["kid"] = nil
        var brokenN = appleJWK
        brokenN["kid"] = "k3"
        brokenN["n"] = "not+base64url"
        let set = try keySet([noKid, brokenN])
        #expect(set.keyIDs.isEmpty)
        #expect(set.skipped.map(\.reason) == ["missing kid", "n or e missing or not base64url"])
    }

    @Test("treats a duplicated kid as ambiguous and uses neither key")
    func duplicateKid() throws {
        let impostor = TestSigning.other.publicKey().jwk(keyID: "k1")
        let set = try keySet([appleJWK, impostor])
        #expect(set.key(id: "k1") == nil)
        #expect(set.skipped.map(\.reason) == ["duplicate kid", "duplicate kid"])
    }

    @Test("refuses a document without a keys array", arguments: [#"{}"#, #"{"keys":{}}"#, #"[]"#, "nope"])
    func refusesBadDocument(document: String) {
        #expect(throws: NotificationError.self) { try JSONWebKeySet(jsonData: Data(document.utf8)) }
    }

    @Test("refuses a 1 MB document by size")
    func refusesHuge() {
        let huge =
            Data(#"{"keys":["#.utf8) + Data(repeating: UInt8(ascii: " "), count: 1_000_000) + Data("]}".utf8)
        do {
            _ = try JSONWebKeySet(jsonData: huge)
            Issue.record("a 1 MB key set was accepted")
        } catch {
            #expect(error.code == .tooLarge)
        }
    }
}
