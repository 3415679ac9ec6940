public import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Outbound HTTP under a policy: one blocking request at a time, by libcurl (Debian's, with
/// OpenSSL), bounded in time and size, never following redirects and never decoding bodies.
///
/// Everything that leaves the service over HTTP goes through here: Apple's key set today, Apple's
/// token endpoints, webhook deliveries and endpoint probes tomorrow. The parsing of URLs, of HTTP and
/// of TLS is libcurl's; what is allowed is decided in Swift, by ``Policy``, before and while a
/// transfer runs:
/// - `https` always (TLS 1.2 or later, the peer's certificate chain and its name verified: these
///   checks cannot be turned off); plain `http` only to a loopback host (``isLoopback(host:)``),
///   judged on the host as libcurl itself parsed it;
/// - one total deadline per request, name resolution and connecting included;
/// - the response body capped: a larger `Content-Length` ends the transfer before the body is read,
///   and a chunked or connection-delimited body is cut off as soon as it passes the cap; the response
///   headers are capped too;
/// - a redirect (3xx) is returned as it is, never followed;
/// - `Accept-Encoding: identity` is sent and nothing is ever inflated: a `Content-Encoding` answer is
///   delivered raw, or refused before its body is read (``Policy/refusesContentEncoding``);
/// - `https_proxy`/`HTTPS_PROXY` (and `no_proxy`) from the environment the executable hands in are
///   honoured for `https` URLs (TLS stays end to end through `CONNECT`); loopback is never proxied;
/// - no cookies, no authentication negotiation, no other protocol than http and https.
///
/// A ``Client`` opens a new connection for each request and closes it after; a ``Session`` keeps its
/// connections open between requests (HTTP/1.1 keep-alive, TLS session reuse), under the same policy
/// for every request on a reused connection.
public enum OutboundHTTP {
    /// `url` as it may be logged or shown: scheme, host, port and path only. Userinfo
    /// (`user:password@`), the query and the fragment — where credentials and tokens travel — are left
    /// out; a URL that does not parse is shown as `(not a URL)`.
    public static func loggable(_ url: String) -> String {
        guard let components = URLComponents(string: url), let scheme = components.scheme,
            let host = components.percentEncodedHost
        else { return "(not a URL)" }
        var text = scheme + "://" + (host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host)
        if let port = components.port { text += ":\(port)" }
        return text + components.percentEncodedPath
    }

    /// Whether `host` (as in a URL, IPv6 possibly in brackets) is a loopback address: an IPv4 literal
    /// in 127.0.0.0/8, the IPv6 literal `::1`, or the name `localhost` (any case). No other name
    /// qualifies, so `127.attacker.example` and `localhost.attacker.example` do not.
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

    /// What a request may do and how much it may take.
    public struct Policy: Sendable {
        /// The longest a request may take, from name resolution to the last byte of the body.
        public var timeout: Duration
        /// The largest response body accepted, in bytes.
        public var maxResponseBodyBytes: Int
        /// The most bytes of response headers accepted (status line included).
        public var maxHeaderBytes: Int
        /// Whether plain `http` is allowed to a loopback host (``isLoopback(host:)``); `https` is
        /// always allowed, every other scheme never.
        public var allowsPlainHTTPToLoopback: Bool
        /// Whether an answer with a `Content-Encoding` other than `identity` is refused (with
        /// ``Error/Code/contentEncoding``) once its headers are in, before its body is read. When
        /// `false` such a body is delivered raw; it is never inflated either way.
        public var refusesContentEncoding: Bool
        /// Whether `https_proxy`/`HTTPS_PROXY` and `no_proxy`/`NO_PROXY` from the client's
        /// ``Client/environment`` apply to `https` URLs. Loopback is never proxied. (libcurl's own
        /// reading of proxy variables is always overridden.)
        public var usesProxyFromEnvironment: Bool
        /// A PEM file of CA certificates to trust instead of the system's bundle; `nil` means the
        /// client's environment's `SSL_CERT_FILE` if set (OpenSSL's convention), else the system's
        /// bundle.
        public var caFile: String?
        /// The `User-Agent` sent.
        public var userAgent: String

        /// A policy; every limit must be positive (checked when a request is made).
        public init(
            timeout: Duration = .seconds(10), maxResponseBodyBytes: Int = 1 << 20,
            maxHeaderBytes: Int = 16 << 10,
            allowsPlainHTTPToLoopback: Bool = true, refusesContentEncoding: Bool = false,
            usesProxyFromEnvironment: Bool = true, caFile: String? = nil,
            userAgent: String = "siwa-notifications"
        ) {
            self.timeout = timeout
            self.maxResponseBodyBytes = maxResponseBodyBytes
            self.maxHeaderBytes = maxHeaderBytes
            self.allowsPlainHTTPToLoopback = allowsPlainHTTPToLoopback
            self.refusesContentEncoding = refusesContentEncoding
            self.usesProxyFromEnvironment = usesProxyFromEnvironment
            self.caFile = caFile
            self.userAgent = userAgent
        }
    }

    /// A header field, as sent or received.
    public struct Header: Sendable, Equatable {
        /// The field name (as the peer spelled it, for received headers).
        public var name: String
        /// The field value, without surrounding whitespace.
        public var value: String

        /// A header field.
        public init(_ name: String, _ value: String) {
            self.name = name
            self.value = value
        }
    }

    /// A request: method, absolute URL, extra header fields and a body.
    ///
    /// `Host`, `Content-Length`, `Transfer-Encoding`, `Accept-Encoding`, `Expect` and `Connection`
    /// belong to the transport and may not be given; nor may a name or value hold CR, LF or NUL.
    public struct Request: Sendable {
        /// The method, e.g. `GET` or `POST` (upper-case letters only).
        public var method: String
        /// The absolute URL, as text (parsed by libcurl, which is the parse that is policy-checked).
        public var url: String
        /// Extra header fields, sent in order.
        public var headers: [Header]
        /// The body; `nil` sends none.
        public var body: [UInt8]?

        /// A request.
        public init(method: String = "GET", url: String, headers: [Header] = [], body: [UInt8]? = nil) {
            self.method = method
            self.url = url
            self.headers = headers
            self.body = body
        }

        /// A request to a Foundation `URL`.
        public init(method: String = "GET", url: URL, headers: [Header] = [], body: [UInt8]? = nil) {
            self.init(method: method, url: url.absoluteString, headers: headers, body: body)
        }
    }

    /// A response: the status (a redirect is one too), the final response's header fields, and the
    /// body exactly as received (never decoded).
    public struct Response: Sendable {
        /// The HTTP status code.
        public var status: Int
        /// The header fields of the final response (not those of `1xx` answers or of a proxy), in order.
        public var headers: [Header]
        /// The body bytes as they came (a `Content-Encoding` is not undone).
        public var body: [UInt8]

        /// A response.
        public init(status: Int, headers: [Header], body: [UInt8]) {
            self.status = status
            self.headers = headers
            self.body = body
        }

        /// The values of the header fields named `name` (case-insensitive), in order.
        public func values(of name: String) -> [String] {
            let wanted = name.lowercased()
            return headers.filter { $0.name.lowercased() == wanted }.map(\.value)
        }

        /// The first value of the header field named `name` (case-insensitive).
        public func value(of name: String) -> String? { values(of: name).first }

        /// The body as `Data`.
        public var data: Data { Data(body) }
    }

    /// A request failed or was refused. The description says why in general terms: it never holds
    /// the response body, the URL (so no userinfo or query secrets), header values or proxy
    /// credentials.
    public struct Error: Swift.Error, CustomStringConvertible, Sendable {
        /// The kind of failure; an open set (new codes may be added).
        public struct Code: Hashable, Sendable, CustomStringConvertible {
            /// The code's name.
            public let rawValue: String
            /// A code.
            public init(_ rawValue: String) { self.rawValue = rawValue }
            public var description: String { rawValue }

            /// The request was not allowed by the policy (scheme, host, method, header, limits).
            public static let policy = Code("policy")
            /// The deadline passed (resolving, connecting, sending or receiving).
            public static let timeout = Code("timeout")
            /// The response body or headers passed their cap.
            public static let tooLarge = Code("tooLarge")
            /// A `Content-Encoding` answer was refused (``Policy/refusesContentEncoding``).
            public static let contentEncoding = Code("contentEncoding")
            /// TLS failed: untrusted or misnamed certificate, handshake, protocol version.
            public static let tls = Code("tls")
            /// The host's name could not be resolved.
            public static let resolve = Code("resolve")
            /// No connection could be made.
            public static let connect = Code("connect")
            /// The proxy could not be used.
            public static let proxy = Code("proxy")
            /// The answer was not well-formed HTTP.
            public static let malformed = Code("malformed")
            /// The connection failed during the exchange, or the answer was cut short.
            public static let transfer = Code("transfer")
            /// libcurl could not be set up or failed in another way.
            public static let `internal` = Code("internal")
        }

        /// The kind of failure.
        public let code: Code
        /// Why, in general terms (see the type's documentation).
        public let description: String
        /// libcurl's result code, when libcurl reported the failure.
        public let curlCode: Int?
        /// OpenSSL's verification result (`X509_V_ERR_…`, e.g. 18 for a self-signed certificate, 10 for
        /// an expired one, 62 for a name mismatch), when the peer's certificate failed verification.
        public let certificateVerifyResult: Int?

        init(_ code: Code, _ description: String, curlCode: Int? = nil, certificateVerifyResult: Int? = nil) {
            self.code = code
            self.description = description
            self.curlCode = curlCode
            self.certificateVerifyResult = certificateVerifyResult
        }
    }

    /// Makes requests under one policy. A value type: copy it freely and use it from any thread; each
    /// request has a libcurl handle of its own.
    public struct Client: Sendable {
        /// The policy every request is held to.
        public var policy: Policy
        /// Where `https_proxy`/`HTTPS_PROXY`, `no_proxy`/`NO_PROXY` and `SSL_CERT_FILE` are read: the
        /// executable's environment, handed in (libraries read none). Empty by default: no proxy, and
        /// the system's CA bundle.
        public var environment: [String: String]

        /// A client.
        public init(
            policy: Policy = Policy(), environment: [String: String] = [:]
        ) {
            self.policy = policy
            self.environment = environment
        }

        /// Performs `request`, blocking the calling thread for at most the policy's timeout.
        /// - Returns: the response, whatever its status (a 3xx included).
        /// - Throws: ``OutboundHTTP/Error``.
        public func perform(_ request: Request) throws(OutboundHTTP.Error) -> Response {
            try Transfer(request: request, policy: policy, environment: environment).run()
        }
    }

    /// A client that keeps its connections open between requests: consecutive requests to one origin
    /// (scheme, host, port, proxy) reuse one connection (HTTP/1.1 keep-alive), and a new connection to
    /// an origin it has spoken to resumes the TLS session. What libcurl keeps is bounded: at most 5
    /// idle connections (the oldest is closed first), none reused after 118 s idle.
    ///
    /// Every request is held to the client's policy exactly as on a new connection: its own deadline
    /// (a peer that stops answering on a reused connection fails at it), no redirects, the scheme and
    /// loopback rule, the caps, the proxy rule — each request's handle starts from no options at all
    /// and is configured afresh. A connection is given up when the peer closes it (after an answer,
    /// half-closed, or with `Connection: close`), and after any failure or refusal (timeout, an answer
    /// past the cap cut off); a request sent on a kept connection the peer had closed meanwhile, and
    /// answered with nothing, is sent once more on a new connection (libcurl's retry, within the same
    /// deadline), so such a request may reach the peer twice.
    ///
    /// One request at a time reuses the connections: a request made while another thread's request is
    /// in flight on the same session gets a connection of its own (closed after it). Give each thread
    /// its session.
    public final class Session: @unchecked Sendable {
        // `kept` is touched only by the request holding `inUse`.
        private let kept = ReusableHandle()
        private let inUse = Atomic<Bool>(false)
        private let opened = Atomic<Int>(0)

        /// The policy and environment of every request.
        public let client: Client

        /// A session making `client`'s requests; no connection is opened before the first request.
        public init(client: Client) { self.client = client }

        /// How many connections this session's requests have opened so far (a reused one is not
        /// counted again).
        public var connectionsOpened: Int { opened.load(ordering: .relaxed) }

        /// Performs `request` on a kept connection when there is one to its origin, blocking the calling
        /// thread for at most the policy's timeout.
        /// - Returns: the response, whatever its status (a 3xx included).
        /// - Throws: ``OutboundHTTP/Error``.
        public func perform(_ request: Request) throws(OutboundHTTP.Error) -> Response {
            let owns = inUse.compareExchange(expected: false, desired: true, ordering: .acquiring).exchanged
            defer { if owns { inUse.store(false, ordering: .releasing) } }
            let transfer = Transfer(
                request: request, policy: client.policy, environment: client.environment,
                reusing: owns ? kept : nil)
            defer { opened.add(transfer.connectionsOpened, ordering: .relaxed) }
            return try transfer.run()
        }
    }
}

extension OutboundHTTP.Response {
    /// How long the peer asks us to wait: `Retry-After` (seconds or an HTTP date), else
    /// `ratelimit-reset` (seconds, the IETF draft's), else `X-RateLimit-Reset` (a Unix time, or seconds
    /// when too small to be one); nil when none parses. Never negative, at most a day.
    public func retryAfter(now: Date = Date()) -> Duration? {
        func bounded(_ seconds: Double) -> Duration { .seconds(min(max(seconds, 0), 86_400)) }
        if let value = value(of: "Retry-After")?.trimmingCharacters(in: .whitespaces) {
            if let seconds = Double(value) { return bounded(seconds) }
            let format = DateFormatter()
            format.locale = Locale(identifier: "en_US_POSIX")
            format.timeZone = TimeZone(identifier: "GMT")
            format.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
            if let date = format.date(from: value) { return bounded(date.timeIntervalSince(now)) }
        }
        if let value = value(of: "ratelimit-reset"),
            let seconds = Double(value.trimmingCharacters(in: .whitespaces))
        {
            return bounded(seconds)
        }
        if let value = value(of: "X-RateLimit-Reset"),
            let number = Double(value.trimmingCharacters(in: .whitespaces))
        {
            // A Unix time is past 10^9 (2001); a smaller number is a count of seconds.
            return bounded(number > 1_000_000_000 ? number - now.timeIntervalSince1970 : number)
        }
        return nil
    }
}
