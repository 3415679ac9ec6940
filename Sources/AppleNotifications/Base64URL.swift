public import Foundation

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
        let bytes = Array(text.utf8)
        return try bytes.withUnsafeBufferPointer { input throws(NotificationError) in try decode(bytes: input)
        }
    }

    /// Decodes strict unpadded base64url from ASCII bytes straight into the `Data` it returns; throws
    /// ``NotificationError/Code/badBase64`` otherwise.
    static func decode(bytes input: UnsafeBufferPointer<UInt8>) throws(NotificationError) -> Data {
        if input.count % 4 == 1 { throw .malformed(.badBase64, "impossible length") }
        let count = input.count / 4 * 3 + max(0, input.count % 4 - 1)
        var output = Data(count: count)
        let valid = output.withUnsafeMutableBytes { raw -> Bool in
            let out = raw.bindMemory(to: UInt8.self)
            var accumulator: UInt32 = 0
            var bits: UInt32 = 0
            var written = 0
            var bad: UInt8 = 0
            for byte in input {
                let value = sextets[Int(byte)]
                bad |= value  // 0x40 marks a byte outside the alphabet
                accumulator = accumulator << 6 | UInt32(value & 63)
                bits += 6
                if bits >= 8 {
                    bits -= 8
                    out[written] = UInt8(truncatingIfNeeded: accumulator >> bits)
                    written += 1
                    accumulator &= (1 << bits) - 1
                }
            }
            // Leftover bits (2 or 4) must be zero in the canonical encoding.
            if bad & 0x40 != 0 { return false }
            return accumulator == 0
        }
        guard valid else {
            // Which reason: only on this error path is the input scanned again.
            if input.contains(where: { sextets[Int($0)] & 0x40 != 0 }) {
                throw .malformed(.badBase64, "character outside base64url")
            }
            throw .malformed(.badBase64, "non-canonical trailing bits")
        }
        return output
    }

    /// Each byte's value in the base64url alphabet, or 0x40 for a byte outside it.
    private static let sextets: [UInt8] = (0...255).map { byte -> UInt8 in
        switch UInt8(byte) {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"): UInt8(byte) - UInt8(ascii: "A")
        case UInt8(ascii: "a")...UInt8(ascii: "z"): UInt8(byte) - UInt8(ascii: "a") + 26
        case UInt8(ascii: "0")...UInt8(ascii: "9"): UInt8(byte) - UInt8(ascii: "0") + 52
        case UInt8(ascii: "-"): 62
        case UInt8(ascii: "_"): 63
        default: 0x40
        }
    }
}
