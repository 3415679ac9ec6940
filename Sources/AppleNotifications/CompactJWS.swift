import Foundation

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
    public let headerNames: Set<String>
    /// The decoded header bytes (a JSON object).
    public let header: Data
    /// The decoded payload bytes (unverified claims).
    public let payload: Data
    /// The bytes the signature covers: ASCII `base64url(header) "." base64url(payload)`.
    public let signingInput: Data
    /// The decoded signature.
    public let signature: Data

    /// Splits and decodes a compact JWS; throws ``NotificationError/Kind/malformed`` errors only.
    public init(_ token: some StringProtocol) throws(NotificationError) {
        try self.init(String(token))
    }

    /// Splits and decodes a compact JWS; throws ``NotificationError/Kind/malformed`` errors only. Works
    /// over the token's UTF-8 bytes, without intermediate strings.
    public init(_ token: String) throws(NotificationError) {
        guard token.utf8.count <= Self.maximumLength else { throw .malformed(.tooLarge, "token over 16 KiB") }
        let bytes = Array(token.utf8)
        let dot = UInt8(ascii: ".")
        guard let first = bytes.firstIndex(of: dot),
            let second = bytes[(first + 1)...].firstIndex(of: dot),
            !bytes[(second + 1)...].contains(dot)
        else { throw .malformed(.badSegments, "expected three segments") }
        guard first > 0, second > first + 1 else { throw .malformed(.badSegments, "empty header or payload") }
        header = try Base64URL.decode(bytes: bytes[..<first])
        payload = try Base64URL.decode(bytes: bytes[(first + 1)..<second])
        signature = try Base64URL.decode(bytes: bytes[(second + 1)...])
        signingInput = Data(bytes[..<second])
        let object = try JSONValue.object(from: header, what: "header")
        headerNames = Set(object.keys)
        keyID = object["kid"]?.stringValue
        algorithm = object["alg"]?.stringValue
    }
}
