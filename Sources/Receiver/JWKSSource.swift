import Foundation
import ServiceSupport

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Where Apple's signing keys come from: an HTTPS URL (Apple's, by default), and how they are fetched.
///
/// The network is not trusted beyond TLS (the fetch is ``KeySetDownload``, not URLSession, whose
/// libcurl buffers and inflates an answer faster than any delegate can refuse it):
/// - the URL must be `https` (certificates checked by the platform's TLS stack); plain `http` only
///   to a loopback address: an IPv4 literal in 127.0.0.0/8, `::1`, or exactly `localhost` (a local
///   stand-in such as `siwactl fake-apple`), so a network attacker can never supply keys;
/// - redirects are refused (Apple's key URL does not redirect; following one would hand the choice
///   of key server to whoever answers first);
/// - the request asks for `Accept-Encoding: identity`, and an answer with any `Content-Encoding` is
///   refused before its body is read, so no compressed body is ever inflated;
/// - a `Content-Length` above ``maxBytes`` is refused before the body is read, and a body is cut
///   off as soon as more than ``maxBytes`` have arrived (chunked or not), so memory stays bounded;
/// - only status 200 is accepted, and the whole fetch is bounded by ``timeout``.
public struct JWKSSource: Sendable, CustomStringConvertible {
    /// Apple's published key set.
    public static let appleURL = URL(string: "https://appleid.apple.com/auth/keys")!

    /// The key set's URL.
    public let url: URL
    /// How long one fetch may take.
    public var timeout: TimeInterval
    /// The largest key set accepted, in bytes.
    public var maxBytes: Int

    /// Validates the URL: `https`, or `http` to a loopback address (see the type's documentation).
    /// - Throws: ``ConfigurationError`` otherwise, or when `maxBytes` is not positive.
    public init(url: URL = JWKSSource.appleURL, timeout: TimeInterval = 10, maxBytes: Int = 1 << 20) throws {
        guard let scheme = url.scheme?.lowercased(), let host = url.host, !host.isEmpty else {
            throw ConfigurationError("JWKS URL must be absolute: \(url.absoluteString)")
        }
        guard scheme == "https" || (scheme == "http" && Self.isLoopback(host: host)) else {
            throw ConfigurationError(
                "JWKS URL must use https (http only for 127.0.0.0/8, ::1 or localhost): \(url.absoluteString)"
            )
        }
        guard maxBytes > 0, timeout > 0 else {
            throw ConfigurationError("JWKS fetch limits must be positive")
        }
        self.url = url
        self.timeout = timeout
        self.maxBytes = maxBytes
    }

    /// Whether `host` (as in a URL, IPv6 possibly in brackets) is a loopback address: an IPv4 literal
    /// in 127.0.0.0/8, the IPv6 literal `::1`, or the name `localhost`. No other name qualifies, so
    /// `127.attacker.example` does not.
    public static func isLoopback(host: String) -> Bool {
        var literal = host
        if literal.hasPrefix("["), literal.hasSuffix("]") { literal = String(literal.dropFirst().dropLast()) }
        if literal.lowercased() == "localhost" { return true }
        var v4 = in_addr()
        if inet_pton(AF_INET, literal, &v4) == 1 {
            return UInt32(bigEndian: v4.s_addr) >> 24 == 127
        }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, literal, &v6) == 1 {
            return withUnsafeBytes(of: &v6) { bytes in
                bytes.prefix(15).allSatisfy { $0 == 0 } && bytes[15] == 1
            }
        }
        return false
    }

    public var description: String { url.absoluteString }

    /// Fetches the key set's bytes, blocking the calling thread for at most ``timeout`` (name
    /// resolution included). Proxy variables (`HTTPS_PROXY`) are not used: the host is reached directly.
    /// - Throws: ``JWKSFetchError`` saying why (never containing key material).
    public func fetch() throws -> Data {
        try KeySetDownload(url: url, maxBytes: maxBytes, timeout: timeout).run()
    }
}

/// A key set could not be fetched; the message says why (never containing key material).
public struct JWKSFetchError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
