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
        let bytes = token.utf8
        guard bytes.count <= Self.maximumLength else { throw .malformed(.tooLarge, "token over 16 KiB") }
        let segments = bytes.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard segments.count == 3 else { throw .malformed(.badSegments, "expected three segments") }
        let headerText = String(decoding: segments[0], as: UTF8.self)
        let payloadText = String(decoding: segments[1], as: UTF8.self)
        guard !headerText.isEmpty, !payloadText.isEmpty else {
            throw .malformed(.badSegments, "empty header or payload")
        }
        header = try Base64URL.decode(headerText)
        payload = try Base64URL.decode(payloadText)
        signature = try Base64URL.decode(String(decoding: segments[2], as: UTF8.self))
        signingInput = Data(headerText.utf8) + Data([UInt8(ascii: ".")]) + Data(payloadText.utf8)
        let object = try JSONValue.object(from: header, what: "header")
        headerNames = Set(object.keys)
        keyID = object["kid"]?.stringValue
        algorithm = object["alg"]?.stringValue
    }
}
