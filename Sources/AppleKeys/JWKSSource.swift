public import Foundation
public import HTTPClient
import ServiceSupport

/// Where Apple's signing keys come from: an HTTPS URL (Apple's, by default), and how they are fetched.
///
/// The network is not trusted beyond TLS. The fetch is one request through ``OutboundHTTP`` (libcurl
/// under a policy; not URLSession, whose libcurl inflates and buffers an answer before any delegate
/// can refuse it):
/// - the URL must be `https` (TLS 1.2 or later, certificate chain and host name verified); plain
///   `http` only to a loopback address: an IPv4 literal in 127.0.0.0/8, `::1`, or exactly
///   `localhost` (a local stand-in such as `siwactl fake-apple`), so a network attacker can never
///   supply keys;
/// - redirects are refused (Apple's key URL does not redirect; following one would hand the choice
///   of key server to whoever answers first);
/// - the request asks for `Accept-Encoding: identity`, and an answer with any `Content-Encoding` is
///   refused before its body is read, so no compressed body is ever inflated;
/// - a `Content-Length` above ``maxBytes`` is refused before the body is read, and a body is cut
///   off as soon as more than ``maxBytes`` have arrived (chunked or not), so memory stays bounded;
/// - only status 200 is accepted, and the whole fetch (name resolution included) is bounded by
///   ``timeout``;
/// - `https_proxy`/`HTTPS_PROXY` (with `no_proxy`) are honoured; TLS stays end to end through the
///   proxy's `CONNECT`, so a proxy can block the fetch but not change the keys.
public struct JWKSSource: Sendable, CustomStringConvertible {
    /// Apple's published key set.
    public static let appleURL = URL(string: "https://appleid.apple.com/auth/keys")!

    /// The key set's URL.
    public let url: URL
    /// How long one fetch may take.
    public var timeout: TimeInterval
    /// The largest key set accepted, in bytes.
    public var maxBytes: Int
    /// Where the fetch's proxy (`https_proxy`/`HTTPS_PROXY`, `no_proxy`/`NO_PROXY`) and CA file
    /// (`SSL_CERT_FILE`) come from: the executable's environment, handed in (libraries read none).
    /// Empty: a direct connection, and the system's CA bundle.
    public var environment: [String: String]

    /// Validates the URL: `https`, or `http` to a loopback address (see the type's documentation).
    /// - Throws: ``ConfigurationError`` otherwise, or when `maxBytes` is not positive.
    public init(
        url: URL = JWKSSource.appleURL, timeout: TimeInterval = 10, maxBytes: Int = 1 << 20,
        environment: [String: String] = [:]
    ) throws {
        guard let scheme = url.scheme?.lowercased(), let host = url.host, !host.isEmpty else {
            throw ConfigurationError(
                "JWKS URL must be absolute: \(OutboundHTTP.loggable(url.absoluteString))")
        }
        guard scheme == "https" || (scheme == "http" && Self.isLoopback(host: host)) else {
            throw ConfigurationError(
                "JWKS URL must use https (http only for 127.0.0.0/8, ::1 or localhost): \(OutboundHTTP.loggable(url.absoluteString))"
            )
        }
        guard maxBytes > 0, timeout > 0 else {
            throw ConfigurationError("JWKS fetch limits must be positive")
        }
        self.url = url
        self.timeout = timeout
        self.maxBytes = maxBytes
        self.environment = environment
    }

    /// Whether `host` (as in a URL, IPv6 possibly in brackets) is a loopback address: an IPv4 literal
    /// in 127.0.0.0/8, the IPv6 literal `::1`, or the name `localhost`. No other name qualifies, so
    /// `127.attacker.example` does not. (The rule is ``OutboundHTTP/isLoopback(host:)``.)
    public static func isLoopback(host: String) -> Bool {
        OutboundHTTP.isLoopback(host: host)
    }

    /// The URL as logged: scheme, host, port and path (``OutboundHTTP/loggable(_:)``), never the
    /// userinfo or query a staging key set's URL may carry credentials in.
    public var description: String { OutboundHTTP.loggable(url.absoluteString) }

    /// The transport policy of a fetch: this source's limits, encoded answers refused.
    public var policy: OutboundHTTP.Policy {
        OutboundHTTP.Policy(
            timeout: .milliseconds(Int64((timeout * 1000).rounded(.up))), maxResponseBodyBytes: maxBytes,
            refusesContentEncoding: true)
    }

    /// Fetches the key set's bytes, blocking the calling thread for at most ``timeout`` (name
    /// resolution included).
    /// - Throws: ``JWKSFetchError`` saying why (never containing key material).
    public func fetch() throws -> Data {
        let response: OutboundHTTP.Response
        do {
            response = try OutboundHTTP.Client(policy: policy, environment: environment).perform(
                OutboundHTTP.Request(url: url, headers: [OutboundHTTP.Header("Accept", "application/json")]))
        } catch {
            throw JWKSFetchError(error.description)
        }
        if (300..<400).contains(response.status) {
            throw JWKSFetchError("refused a redirect (HTTP status \(response.status))")
        }
        guard response.status == 200 else { throw JWKSFetchError("HTTP status \(response.status)") }
        return response.data
    }
}

/// A key set could not be fetched; the message says why (never containing key material).
public struct JWKSFetchError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
