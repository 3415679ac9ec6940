import Foundation

/// An `Authorization` header's scheme and credentials (RFC 9110 § 11.6.2); the one parser of every
/// listener that takes a bearer token (RFC 6750 § 2.1) or Basic credentials (RFC 7617).
public struct AuthorizationHeader: Sendable, Equatable {
    /// The scheme, lowercased: schemes are case-insensitive (RFC 9110 § 11.1).
    public var scheme: String
    /// What follows the scheme and its spaces, as sent.
    public var credentials: String

    /// Nil unless `value` is `scheme 1*SP credentials`, the scheme a token and the credentials non-empty.
    public init?(_ value: String?) {
        guard let value else { return nil }
        let bytes = Array(value.utf8)
        guard let space = bytes.firstIndex(of: UInt8(ascii: " ")), space > 0,
            bytes[..<space].allSatisfy(Self.isTokenCharacter)
        else { return nil }
        var start = space
        while start < bytes.count, bytes[start] == UInt8(ascii: " ") { start += 1 }
        guard start < bytes.count else { return nil }
        scheme = String(decoding: bytes[..<space], as: UTF8.self).lowercased()
        credentials = String(decoding: bytes[start...], as: UTF8.self)
    }

    /// The token of a `Bearer` header, any case; nil for another scheme or none.
    public static func bearerToken(_ value: String?) -> String? {
        guard let header = AuthorizationHeader(value), header.scheme == "bearer" else { return nil }
        return header.credentials
    }

    /// The user id and password of a `Basic` header, any case (RFC 7617 § 2: base64 of UTF-8 `id:password`,
    /// split at the first colon); nil for another scheme, bad base64 or no colon.
    public static func basicCredentials(_ value: String?) -> (user: String, password: String)? {
        guard let header = AuthorizationHeader(value), header.scheme == "basic",
            let data = Data(base64Encoded: header.credentials),
            let text = String(data: data, encoding: .utf8),
            let colon = text.firstIndex(of: ":")
        else { return nil }
        return (String(text[..<colon]), String(text[text.index(after: colon)...]))
    }

    /// RFC 9110 § 5.6.2 `tchar`.
    private static func isTokenCharacter(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        default: return Array("!#$%&'*+-.^_`|~".utf8).contains(byte)
        }
    }
}
