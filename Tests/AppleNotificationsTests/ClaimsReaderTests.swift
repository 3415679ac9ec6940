import Foundation
import Testing

@testable import AppleNotifications

/// The claims reader (``SignedClaims``, ``SignedEvent``), which takes the members the verifier judges
/// straight from the bytes, against the dictionary the verifier used to build with ``JSONValue/object(from:what:)``:
/// for every input both must refuse, or both accept and agree on every member the verifier reads.
@Suite("Claims reader against the dictionary decoder")
struct ClaimsReaderTests {
    static let corpus = packageRoot.appendingPathComponent("Fuzz/corpus")

    /// The claims as the dictionary decoder reads them, in the reader's shape (`nil`: refused).
    static func reference(_ bytes: [UInt8]) -> Reference? {
        guard let object = try? JSONValue.object(from: bytes, what: "claims") else { return nil }
        return Reference(
            issuerIsApple: object["iss"]?.stringValue == NotificationVerifier.issuer,
            audience: object["aud"], issuedAt: object["iat"], expiresAt: object["exp"], jti: object["jti"],
            events: object["events"])
    }

    struct Reference {
        var issuerIsApple: Bool
        var audience, issuedAt, expiresAt, jti, events: JSONValue?
    }

    /// The `events` object as the dictionary decoder reads it (`nil`: refused).
    static func referenceEvent(_ object: [String: JSONValue]) -> [JSONValue?] {
        [object["type"], object["sub"], object["email"], object["is_private_email"], object["event_time"]]
    }

    static func members(_ event: SignedEvent) -> [JSONValue?] {
        [event.type, event.subject, event.email, event.isPrivateEmail, event.eventTime]
    }

    /// Checks one input; returns whether the reader accepted it.
    @discardableResult
    static func agree(_ bytes: [UInt8], _ sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
        let expected = reference(bytes)
        let read = try? SignedClaims(Data(bytes))
        guard let expected, let read else {
            #expect(
                (expected == nil) == (read == nil),
                "accepted by one reader only: \(String(decoding: bytes, as: UTF8.self))",
                sourceLocation: sourceLocation)
            return false
        }
        #expect(read.issuerIsApple == expected.issuerIsApple, sourceLocation: sourceLocation)
        #expect(read.audience == expected.audience, sourceLocation: sourceLocation)
        #expect(read.issuedAt == expected.issuedAt, sourceLocation: sourceLocation)
        #expect(read.expiresAt == expected.expiresAt, sourceLocation: sourceLocation)
        #expect(read.jti == expected.jti, sourceLocation: sourceLocation)
        switch (read.events, expected.events) {
        case (.missing, nil), (.other, .null?), (.other, .bool?), (.other, .number?), (.other, .array?): break
        case (.object(let event), .object(let object)?):
            #expect(members(event) == referenceEvent(object), sourceLocation: sourceLocation)
        case (.string(let text), .string(let string)?):
            #expect(Array(text) == Array(string.utf8), sourceLocation: sourceLocation)
            let event = try? SignedEvent(json: text)
            let object = try? JSONValue.object(from: Array(string.utf8), what: "events")
            #expect(
                (event == nil) == (object == nil), "events string: \(string)", sourceLocation: sourceLocation)
            if let event, let object {
                #expect(members(event) == referenceEvent(object), sourceLocation: sourceLocation)
            }
        default:
            Issue.record(
                "events differ: \(read.events) vs \(String(describing: expected.events))",
                sourceLocation: sourceLocation)
        }
        return true
    }

    static let captured = #"""
        {"iss":"https://appleid.apple.com","aud":"com.example.app","iat":1630085453,"exp":1630171853,"jti":"Wf1YfAn-YDCJ1E8kPhNmqQ","events":"{\"type\":\"email-disabled\",\"sub\":\"001234.a1b2c3d4e5f6.0001\",\"email\":\"abc123@privaterelay.appleid.com\",\"is_private_email\":\"true\",\"event_time\":1630085453000}"}
        """#

    @Test(
        "agrees on accepted and refused claims, member by member",
        arguments: [
            captured,
            #"{"iss":"https://appleid.apple.com","aud":["x","com.example.app"],"iat":1.5,"jti":"j","events":{"type":"consent-revoked","sub":"s","event_time":1}}"#,
            #" {"iss" : "https:\/\/appleid.apple.com" , "aud":"a","iat":1,"jti":"j","events":{}} "#,
            // A name spelled with an escape is the same name.
            #"{"\u0069ss":"https://appleid.apple.com","iss":"x"}"#,
            #"{"iss":"https://appleid.apple.com","iss":"https://appleid.apple.com"}"#,
            #"{"aud":1,"aud":2}"#, #"{"x":1,"x":2}"#, #"{"x":{"y":1,"y":2}}"#,
            #"{"events":{"type":"a","type":"b"}}"#,
            #"{"events":{"x":[1,{"x":1}],"x":2}}"#, #"{"\u212A":1,"K":2}"#, #"{"e\u0301":1,"\u00e9":2}"#,
            #"{"events":"{\"type\":\"a\",\"type\":\"b\"}"}"#, #"{"events":"[]"}"#, #"{"events":"{"}"#,
            #"{"events":"{\"sub\":\"\\ud800\"}"}"#, #"{"events":"  {\"sub\":1}  "}"#, #"{"events":null}"#,
            #"{"events":[1]}"#, #"{"events":true}"#, #"{"events":1e3}"#, #"{"exp":null,"iat":"1"}"#,
            #"{"iss":1}"#, #"{"iss":"https://appleid.apple.co"}"#, #"{"iss":"https://appleid.apple.comm"}"#,
            #"{"jti":"\u00e9\ud83d\ude00"}"#, #"{"jti":"\ud800"}"#, #"{"jti":"\udc00"}"#,
            #"{"jti":"a\u0000b"}"#,
            "{\"jti\":\"\u{00e9}\"}", "{\"jti\":\"\t\"}", "{}", "[]", "\"x\"", "1", "", " ", "{", "}",
            "{\"a\"}",
            #"{"a":1,}"#, #"{,"a":1}"#, #"{"a":01}"#, #"{"a":-}"#, #"{"a":1.}"#, #"{"a":.5}"#, #"{"a":1e}"#,
            #"{"a":tru}"#, #"{"a":nul}"#, #"{"a":[1,]}"#, #"{"a":"\x"}"#, #"{"a":"\u12"}"#, "{\"a\":1} x",
            String(repeating: "{\"a\":", count: 40) + "1" + String(repeating: "}", count: 40),
            #"{"events":{"a":"#, "\u{FEFF}{}",
        ])
    func cases(input: String) {
        Self.agree(Array(input.utf8))
    }

    @Test("agrees on invalid UTF-8 in names, values and the events string")
    func invalidUTF8() {
        for bad: [UInt8] in [
            [0x80], [0xC3], [0xC3, 0x28], [0xED, 0xA0, 0x80], [0xF8, 0x88, 0x80, 0x80, 0x80], [0xFF],
        ] {
            Self.agree(Array(#"{"jti":""#.utf8) + bad + Array(#""}"#.utf8))
            Self.agree(Array(#"{""#.utf8) + bad + Array(#"":1}"#.utf8))
            Self.agree(Array(#"{"events":"{\"sub\":\""#.utf8) + bad + Array(#"\"}"}"#.utf8))
            Self.agree(Array(#"{"jti":"\u00e9"#.utf8) + bad + Array(#""}"#.utf8))
        }
    }

    @Test("agrees on every prefix and on single-byte changes of captured and documented claims")
    func mutations() throws {
        var seeds = [Array(Self.captured.utf8)]
        for name in ["captured", "documented", "escapes", "aud-array", "wrong-types"] {
            seeds.append([UInt8](try Data(contentsOf: Self.corpus.appendingPathComponent("claims/\(name)"))))
        }
        var accepted = 0
        for seed in seeds {
            #expect(Self.agree(seed), "the seed itself is read")
            for end in 0..<seed.count where Self.agree(Array(seed[..<end])) { accepted += 1 }
            for position in seed.indices {
                for byte in Array(#""\{}[],: x1-.e"#.utf8) + [0x80, 0x00] where byte != seed[position] {
                    var changed = seed
                    changed[position] = byte
                    if Self.agree(changed) { accepted += 1 }
                }
            }
        }
        #expect(accepted > 100, "the mutations reach accepted inputs too")
    }

    @Test("agrees on the JSON fuzz corpus")
    func jsonCorpus() throws {
        let directory = Self.corpus.appendingPathComponent("json")
        for name in try FileManager.default.contentsOfDirectory(atPath: directory.path) {
            Self.agree([UInt8](try Data(contentsOf: directory.appendingPathComponent(name))))
        }
    }
}
