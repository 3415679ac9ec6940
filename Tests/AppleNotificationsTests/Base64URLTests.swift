import AppleNotifications
import Foundation
import Testing

@Suite("Base64URL")
struct Base64URLTests {
    @Test("round-trips every length without padding", arguments: 0..<40)
    func roundTrip(length: Int) throws {
        let bytes = Data((0..<length).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 250) })
        let encoded = Base64URL.encode(bytes)
        #expect(!encoded.contains("="))
        #expect(!encoded.contains("+"))
        #expect(!encoded.contains("/"))
        #expect(try Base64URL.decode(encoded) == bytes)
    }

    @Test("uses - and _ where standard base64 has + and /")
    func alphabet() throws {
        #expect(Base64URL.encode([0xFB, 0xFF]) == "-_8")
        #expect(try Base64URL.decode("-_8") == Data([0xFB, 0xFF]))
    }

    @Test(
        "refuses padding, +, /, whitespace, impossible lengths and non-canonical trailing bits",
        arguments: ["-_8=", "+/8", "ab+c", "ab/c", "ab c", "abc\n", "a", "abcde", "-_9", "AB", "QUJ"])
    func rejects(text: String) {
        #expect(throws: NotificationError.self) { try Base64URL.decode(text) }
        do {
            _ = try Base64URL.decode(text)
        } catch {
            #expect(error.kind == .malformed)
            #expect(error.code == .badBase64)
        }
    }

    @Test("accepts the canonical forms of those near misses", arguments: ["AA", "QUI", "-_8"])
    func acceptsCanonical(text: String) throws {
        _ = try Base64URL.decode(text)
    }
}
