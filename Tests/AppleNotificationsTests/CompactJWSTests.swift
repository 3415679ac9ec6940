import AppleNotifications
import Foundation
import TestSupport
import Testing

@Suite("Compact JWS parsing")
struct CompactJWSTests {
    private func parseError(_ token: String) -> NotificationError? {
        do {
            _ = try CompactJWS(token)
            return nil
        } catch {
            return error
        }
    }

    @Test("splits a well-formed token into header, payload and signature")
    func parsesToken() throws {
        let jws = try CompactJWS(appleToken())
        #expect(jws.keyID == TestSigning.apple.keyID)
        #expect(jws.algorithm == "RS256")
        #expect(jws.headerNames == ["kid", "alg"])
        #expect(jws.signature.count == 256)
        #expect(
            String(decoding: jws.header, as: UTF8.self)
                == #"{"kid":"\#(TestSigning.apple.keyID)","alg":"RS256"}"#)
    }

    @Test("refuses two segments")
    func twoSegments() {
        let parts = appleToken().split(separator: ".")
        let error = parseError("\(parts[0]).\(parts[1])")
        #expect(error?.kind == .malformed)
        #expect(error?.code == .badSegments)
    }

    @Test("refuses four segments")
    func fourSegments() {
        let error = parseError(appleToken() + ".AAAA")
        #expect(error?.kind == .malformed)
        #expect(error?.code == .badSegments)
    }

    @Test("refuses padding, + and / in a segment", arguments: ["=", "+", "/"])
    func nonURLBase64(character: String) {
        var parts = appleToken().split(separator: ".").map(String.init)
        parts[2] = String(parts[2].dropLast()) + character
        let error = parseError(parts.joined(separator: "."))
        #expect(error?.kind == .malformed)
        #expect(error?.code == .badBase64)
    }

    @Test("refuses a header that is JSON but not an object", arguments: ["[1,2]", "\"RS256\"", "42", "null"])
    func headerNotObject(header: String) {
        let token = Base64URL.encode(Data(header.utf8)) + "." + Base64URL.encode(Data("{}".utf8)) + ".AAAA"
        let error = parseError(token)
        #expect(error?.kind == .malformed)
        #expect(error?.code == .badJSON)
    }

    @Test("refuses a header that is not JSON")
    func headerNotJSON() {
        let token = Base64URL.encode(Data("{kid:".utf8)) + "." + Base64URL.encode(Data("{}".utf8)) + ".AAAA"
        #expect(parseError(token)?.code == .badJSON)
    }

    @Test("refuses a 1 MB token by size, before decoding anything")
    func hugeToken() {
        let huge = String(repeating: "A", count: 1_000_000) + "." + "A" + "." + "A"
        let error = parseError(huge)
        #expect(error?.kind == .malformed)
        #expect(error?.code == .tooLarge)  // the size bound, checked before any decoding
    }

    @Test("refuses a 1 MB run of base64 garbage without a dot")
    func hugeGarbage() {
        #expect(parseError(String(repeating: "!", count: 1_000_000))?.code == .tooLarge)
    }

    @Test("refuses a deeply nested header without crashing")
    func deeplyNestedHeader() {
        let header = String(repeating: "[", count: 5000) + String(repeating: "]", count: 5000)
        let token = Base64URL.encode(Data(header.utf8)) + ".e30.AAAA"
        let error = parseError(token)
        #expect(error?.kind == .malformed)
    }

    @Test("describes errors in one line without the token")
    func descriptionIsSafe() {
        let token = appleToken() + ".x"
        let error = parseError(token)
        let text = error.map { String(describing: $0) } ?? ""
        #expect(!text.isEmpty)
        #expect(!text.contains("\n"))
        #expect(!text.contains(token.prefix(20)))
    }
}
