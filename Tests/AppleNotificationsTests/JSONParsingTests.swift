import AppleNotifications
import Foundation
import TestSupport
import Testing

/// The strict JSON reader, observed through header parsing and signed claims.
@Suite("Strict JSON in headers and claims")
struct JSONParsingTests {
    private func header(_ json: String) throws(NotificationError) -> CompactJWS {
        try CompactJWS(Base64URL.encode(Data(json.utf8)) + ".e30.AAAA")
    }

    @Test("reads whitespace, escapes and surrogate pairs")
    func readsEscapes() throws {
        let jws = try header(
            " {\n\t\"kid\" : \"\\u0041\\/b\\ud83d\\ude00\\n\", \"alg\":\"RS256\", \"x\":[1.5e3,-0,true,null]} "
        )
        #expect(jws.keyID == "A/b\u{1F600}\n")
        #expect(jws.algorithm == "RS256")
    }

    @Test(
        "refuses JSON that is invalid or ambiguous",
        arguments: [
            #"{"alg":"RS256","alg":"none"}"#, #"{"alg":"RS256",}"#, #"{'alg':'RS256'}"#, #"{"a":01}"#,
            #"{"a":NaN}"#, #"{"a":1.}"#, #"{"a":.5}"#, #"{"a":1e}"#, #"{"a":"\ud800"}"#, #"{"a":"\x"}"#,
            "{\"a\":\"tab\there\"}", #"{}x"#, #"{"a":tru}"#, #"{"a" 1}"#, #"{"a":1e400}"#, " ",
            String(repeating: #"{"a":"#, count: 33) + "1" + String(repeating: "}", count: 33),
        ])
    func refusesInvalid(json: String) {
        do {
            _ = try header(json)
            Issue.record("accepted invalid JSON")
        } catch {
            #expect(error.kind == .malformed)
            #expect(error.code == .badJSON)
        }
    }

    @Test("refuses bytes that are not UTF-8 inside a string")
    func refusesInvalidUTF8() {
        let bytes = Data(#"{"kid":""#.utf8) + Data([0xC3, 0x28]) + Data(#"","alg":"RS256"}"#.utf8)
        #expect(throws: NotificationError.self) { try CompactJWS(Base64URL.encode(bytes) + ".e30.AAAA") }
    }

    @Test("accepts nesting up to the documented depth")
    func acceptsModerateNesting() throws {
        let nested = String(repeating: "[", count: 31) + String(repeating: "]", count: 31)
        _ = try header(#"{"alg":"RS256","x":"# + nested + "}")
    }

    @Test("refuses signed claims with a duplicated aud, after the signature check")
    func duplicateClaim() throws {
        let claims = Data(
            #"{"iss":"https://appleid.apple.com","aud":"com.attacker","aud":"\#(TestSigning.audience)"}"#.utf8
        )
        let token = try TestSigning.apple.sign(headerJSON: json(appleHeader), claimsJSON: claims)
        let error = rejection(token)
        #expect(error?.kind == .malformed)
        #expect(error?.code == .badJSON)
    }
}
