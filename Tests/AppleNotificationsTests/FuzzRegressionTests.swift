import AppleNotifications
import Foundation
import TestSupport
import Testing

/// The fuzzing seed corpus (Fuzz/corpus) replayed through the public API, with the outcome each seed
/// must have. This keeps the seeds meaningful: a seed token that stopped verifying would leave the
/// claims and `events` parsers unreached by `make fuzz` without anyone noticing. Inputs that crashed a
/// fuzz target belong here too, fed through the same public entry points.
@Suite("Fuzz corpus regressions")
struct FuzzRegressionTests {
    /// The fixed "now" of the fuzz harnesses, just after the seed tokens' `iat`.
    static let fuzzNow = Date(timeIntervalSince1970: 1_630_085_500)
    static let corpus = packageRoot.appendingPathComponent("Fuzz/corpus")

    static func seed(_ target: String, _ name: String) throws -> Data {
        try Data(contentsOf: corpus.appendingPathComponent(target).appendingPathComponent(name))
    }

    static let verifier = try! NotificationVerifier(audiences: ["com.example.app", "com.example.web"])

    /// The TEST-ONLY fixture key, as the `one-key` JWKS seed publishes it under kid `fixture`.
    static func fixtureKeys() throws -> JSONWebKeySet {
        try JSONWebKeySet(jsonData: seed("jwks", "one-key"))
    }

    /// The seed tokens (signed by openssl with the fixture key) and the event each must yield.
    @Test(
        "seed tokens signed outside Swift verify at the harnesses' fixed time",
        arguments: [
            ("captured", "email-disabled"), ("documented", "account-delete"), ("aud-array", "future-type"),
        ])
    func seedTokensVerify(name: String, eventType: String) throws {
        let token = String(decoding: try Self.seed("jws", name), as: UTF8.self)
        let notification = try Self.verifier.verify(token: token, keys: Self.fixtureKeys(), now: Self.fuzzNow)
        #expect(notification.eventType.rawValue == eventType)
        #expect(!notification.subject.isEmpty)
    }

    @Test("the captured-shape seed reads events from a string with event_time in milliseconds")
    func capturedSeedDetails() throws {
        let token = String(decoding: try Self.seed("jws", "captured"), as: UTF8.self)
        let notification = try Self.verifier.verify(token: token, keys: Self.fixtureKeys(), now: Self.fuzzNow)
        #expect(notification.isPrivateEmail == true)
        #expect(notification.email?.hasSuffix("@privaterelay.appleid.com") == true)
        #expect(notification.eventTime == Date(timeIntervalSince1970: 1_630_085_403.648))
        #expect(notification.expiresAt == Date(timeIntervalSince1970: 1_630_085_403 + 86_400))
    }

    @Test("the documented-shape seed has no exp, and an aud array matches its configured member")
    func documentedAndAudienceArraySeeds() throws {
        let documented = String(decoding: try Self.seed("jws", "documented"), as: UTF8.self)
        let first = try Self.verifier.verify(token: documented, keys: Self.fixtureKeys(), now: Self.fuzzNow)
        #expect(first.expiresAt == nil)
        #expect(first.eventType == .accountDelete)
        let array = String(decoding: try Self.seed("jws", "aud-array"), as: UTF8.self)
        let second = try Self.verifier.verify(token: array, keys: Self.fixtureKeys(), now: Self.fuzzNow)
        #expect(second.audience == "com.example.web")
        #expect(second.audiences == ["com.other", "com.example.web"])
        #expect(!second.eventType.isKnown)
        #expect(second.jti == "\u{E9}\u{2603}\u{1F600}")
    }

    /// Claims seeds as the `claims` harness sees them: signed as they are, then verified.
    @Test(
        "claims seeds reach the outcome the claims target starts from",
        arguments: [
            ("captured", "email-disabled"), ("documented", "account-delete"), ("aud-array", "future-type"),
            ("escapes", "consent-revoked"), ("wrong-types", "wrong_issuer"),
        ])
    func claimsSeeds(name: String, expected: String) throws {
        let claims = try Self.seed("claims", name)
        let header = Data(#"{"kid":"\#(TestSigning.apple.keyID)","alg":"RS256"}"#.utf8)
        let token = try TestSigning.apple.sign(headerJSON: header, claimsJSON: claims)
        do {
            let notification = try Self.verifier.verify(
                token: token, keys: TestSigning.appleKeySet, now: Self.fuzzNow)
            #expect(notification.eventType.rawValue == expected)
        } catch {
            #expect(error.code.rawValue == expected)
        }
    }

    @Test(
        "JWS seeds parse, or are refused as malformed with the expected code",
        arguments: [
            ("captured", nil), ("alg-none", nil), ("crit", nil), ("dots", "bad_segments"),
        ] as [(String, String?)])
    func jwsSeeds(name: String, refusal: String?) throws {
        let token = String(decoding: try Self.seed("jws", name), as: UTF8.self)
        do {
            let jws = try CompactJWS(token)
            #expect(refusal == nil)
            #expect(jws.keyID != nil)
        } catch {
            #expect(error.kind == .malformed)
            #expect(error.code.rawValue == refusal)
        }
    }

    @Test("the Apple-shaped key-set seed keeps the two usable keys and says why it skipped the rest")
    func keySetSeed() throws {
        let set = try JSONWebKeySet(jsonData: Self.seed("jwks", "apple-shape"))
        #expect(set.keyIDs == ["YuyXoY", "fh6Bs8C"])
        #expect(
            Set(set.skipped.map(\.reason)) == [
                "kty is not RSA", "modulus shorter than 2048 bits", "use is not sig",
                "invalid RSA parameters",
                "entry is not an object",
            ])
    }

    @Test("a key-set seed naming one kid twice uses neither entry")
    func duplicateKeyIDSeed() throws {
        let set = try JSONWebKeySet(jsonData: Self.seed("jwks", "duplicate-kid"))
        #expect(set.keyIDs.isEmpty)
        #expect(set.key(id: "fixture") == nil)
        #expect(set.skipped.filter { $0.reason == "duplicate kid" }.count == 2)
    }

    /// Nesting at the bound is read; one level more, or tens of thousands (as fuzzing tries), is refused
    /// as malformed without exhausting the stack.
    @Test("JSON nesting is bounded at 32 levels", arguments: [(32, true), (33, false), (60_000, false)])
    func nestingBound(depth: Int, accepted: Bool) {
        // {"keys": …} is one level; the array of entries and the arrays inside it make up the rest.
        let inner = depth - 1
        let document = Data(
            (#"{"keys":"# + String(repeating: "[", count: inner) + String(repeating: "]", count: inner) + "}")
                .utf8)
        do {
            let set = try JSONWebKeySet(jsonData: document)
            #expect(accepted)
            #expect(set.keyIDs.isEmpty)
        } catch {
            #expect(!accepted)
            #expect(error.code == .badJSON)
        }
    }
}
