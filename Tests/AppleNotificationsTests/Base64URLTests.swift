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

    @Test(
        "decodes the canonical forms of those near misses to their bytes",
        arguments: [("AA", [0x00]), ("QUI", [0x41, 0x42]), ("-_8", [0xFB, 0xFF])] as [(String, [UInt8])])
    func acceptsCanonical(text: String, bytes: [UInt8]) throws {
        #expect(try Base64URL.decode(text) == Data(bytes))
    }

    @Test(
        "encodes and decodes RFC 4648's test vectors (section 10, without padding)",
        arguments: [
            ("", ""), ("f", "Zg"), ("fo", "Zm8"), ("foo", "Zm9v"), ("foob", "Zm9vYg"), ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ])
    func rfc4648Vectors(plain: String, encoded: String) throws {
        #expect(Base64URL.encode(Data(plain.utf8)) == encoded)
        #expect(try Base64URL.decode(encoded) == Data(plain.utf8))
    }

    @Test("decodes every byte value at every position of a 3-byte group")
    func everyByte() throws {
        // Standard base64 (Foundation, a second implementation) with the URL alphabet and no padding.
        for value in 0...255 {
            for position in 0..<3 {
                var bytes: [UInt8] = [0x5A, 0xA5, 0x3C]
                bytes[position] = UInt8(value)
                let encoded = Data(bytes).base64EncodedString()
                    .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
                #expect(try Base64URL.decode(encoded) == Data(bytes), "\(bytes)")
                #expect(Base64URL.encode(bytes) == encoded)
            }
        }
    }
}
