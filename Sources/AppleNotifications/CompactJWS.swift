public import Foundation

/// A JWS in compact serialisation (`header.payload.signature`), split and decoded but not verified.
///
/// Parsing checks only shape: the size bound (before any decoding), exactly three segments,
/// strict base64url and a header that is a JSON object. Nothing here is trusted yet.
public struct CompactJWS: Sendable {
    /// The largest token accepted, in bytes; Apple's are about 1 KiB.
    public static let maximumLength = 16 * 1024

    /// The `kid` header, if it is a string.
    public let keyID: String?
    /// The `alg` header, if it is a string.
    public let algorithm: String?
    /// The names of all header members (e.g. to see `crit`, `jku`, `jwk`).
    public var headerNames: Set<String> { Set(names) }
    /// Whether the header has a `crit` member.
    public let hasCriticalHeader: Bool
    /// The decoded header bytes (a JSON object).
    public let header: Data
    /// The decoded payload bytes (unverified claims).
    public let payload: Data
    /// The bytes the signature covers: ASCII `base64url(header) "." base64url(payload)`.
    public let signingInput: Data
    /// The decoded signature.
    public let signature: Data
    private let names: [String]

    /// Splits and decodes a compact JWS; throws ``NotificationError/Kind/malformed`` errors only.
    public init(_ token: some StringProtocol) throws(NotificationError) {
        try self.init(String(token))
    }

    /// Splits and decodes a compact JWS; throws ``NotificationError/Kind/malformed`` errors only. Works
    /// over the token's UTF-8 bytes, without intermediate strings.
    public init(_ token: String) throws(NotificationError) {
        guard token.utf8.count <= Self.maximumLength else { throw .malformed(.tooLarge, "token over 16 KiB") }
        var token = token
        let parts = token.withUTF8 { bytes in
            Result { () throws(NotificationError) in try Self.decode(bytes) }
        }
        (header, payload, signature, signingInput) = try parts.get()
        // The header's few members, read without a dictionary (as strictly: a member named twice is refused).
        var keyID: String?
        var algorithm: String?
        var names: [String] = []
        var seen = SeenMembers()
        try JSONValue.readObject(from: [UInt8](header), what: "header") {
            name, parser throws(JSONParser.Failure) in
            let text = String(decoding: name, as: UTF8.self)
            names.append(text)
            let string: String?
            switch text {
            case "kid": try seen.first(0)
            case "alg": try seen.first(1)
            default: return false
            }
            if try parser.peek() == UInt8(ascii: "\"") {
                string = String(decoding: try parser.stringBytes(), as: UTF8.self)
            } else {
                _ = try parser.value()
                string = nil
            }
            if text == "kid" { keyID = string } else { algorithm = string }
            return true
        }
        self.keyID = keyID
        self.algorithm = algorithm
        self.names = names
        hasCriticalHeader = names.contains("crit")
    }

    private static func decode(
        _ bytes: UnsafeBufferPointer<UInt8>
    ) throws(NotificationError) -> (header: Data, payload: Data, signature: Data, signingInput: Data) {
        let dot = UInt8(ascii: ".")
        guard let first = bytes.firstIndex(of: dot),
            let second = bytes[(first + 1)...].firstIndex(of: dot),
            !bytes[(second + 1)...].contains(dot)
        else { throw .malformed(.badSegments, "expected three segments") }
        guard first > 0, second > first + 1 else { throw .malformed(.badSegments, "empty header or payload") }
        let base = bytes.baseAddress!  // not empty: it holds two dots
        return (
            try Base64URL.decode(bytes: UnsafeBufferPointer(start: base, count: first)),
            try Base64URL.decode(
                bytes: UnsafeBufferPointer(start: base + first + 1, count: second - first - 1)),
            try Base64URL.decode(
                bytes: UnsafeBufferPointer(start: base + second + 1, count: bytes.count - second - 1)),
            Data(UnsafeBufferPointer(start: base, count: second))
        )
    }
}
