import Foundation

/// Strict, unpadded base64url (RFC 4648 §5) as JWS compact serialisation requires (RFC 7515 §2).
///
/// Decoding refuses padding, `+`, `/`, whitespace, impossible lengths and non-canonical trailing
/// bits, so every byte string has exactly one accepted encoding.
public enum Base64URL {
    /// Encodes bytes without padding.
    public static func encode(_ bytes: some Sequence<UInt8>) -> String {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
        let input = Array(bytes)
        var output: [UInt8] = []
        output.reserveCapacity((input.count * 4 + 2) / 3)
        var index = 0
        while index + 3 <= input.count {
            let chunk = UInt32(input[index]) << 16 | UInt32(input[index + 1]) << 8 | UInt32(input[index + 2])
            output.append(alphabet[Int(chunk >> 18 & 63)])
            output.append(alphabet[Int(chunk >> 12 & 63)])
            output.append(alphabet[Int(chunk >> 6 & 63)])
            output.append(alphabet[Int(chunk & 63)])
            index += 3
        }
        switch input.count - index {
        case 1:
            let chunk = UInt32(input[index]) << 16
            output.append(alphabet[Int(chunk >> 18 & 63)])
            output.append(alphabet[Int(chunk >> 12 & 63)])
        case 2:
            let chunk = UInt32(input[index]) << 16 | UInt32(input[index + 1]) << 8
            output.append(alphabet[Int(chunk >> 18 & 63)])
            output.append(alphabet[Int(chunk >> 12 & 63)])
            output.append(alphabet[Int(chunk >> 6 & 63)])
        default:
            break
        }
        return String(decoding: output, as: UTF8.self)
    }

    /// Decodes strict unpadded base64url; throws ``NotificationError/Code/badBase64`` otherwise.
    public static func decode(_ text: some StringProtocol) throws(NotificationError) -> Data {
        try decode(bytes: Array(text.utf8)[...])
    }

    /// Decodes strict unpadded base64url from ASCII bytes; throws ``NotificationError/Code/badBase64``
    /// otherwise.
    static func decode(bytes input: ArraySlice<UInt8>) throws(NotificationError) -> Data {
        if input.count % 4 == 1 { throw .malformed(.badBase64, "impossible length") }
        var output: [UInt8] = []  // appended byte by byte: an array, not Data, keeps that cheap
        output.reserveCapacity(input.count * 3 / 4)
        var accumulator: UInt32 = 0
        var bits = 0
        for byte in input {
            guard let value = sextet(byte) else {
                throw .malformed(.badBase64, "character outside base64url")
            }
            accumulator = accumulator << 6 | UInt32(value)
            bits += 6
            if bits >= 8 {
                bits -= 8
                output.append(UInt8(truncatingIfNeeded: accumulator >> UInt32(bits)))
                accumulator &= (1 << UInt32(bits)) - 1
            }
        }
        // Leftover bits (2 or 4) must be zero in the canonical encoding.
        if accumulator != 0 { throw .malformed(.badBase64, "non-canonical trailing bits") }
        return Data(output)
    }

    private static func sextet(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"): byte - UInt8(ascii: "A")
        case UInt8(ascii: "a")...UInt8(ascii: "z"): byte - UInt8(ascii: "a") + 26
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0") + 52
        case UInt8(ascii: "-"): 62
        case UInt8(ascii: "_"): 63
        default: nil
        }
    }
}
