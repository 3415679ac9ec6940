import Foundation
public import HTTPClient

/// One adapter's admin API client, used by one lane at a time: the base URL, a kept connection, the
/// bearer token (obtained when first needed, again shortly before it expires or once after a 401), and
/// the one reading of every answer a platform does not read itself
/// (``send(_:_:endpoint:query:json:form:expecting:)``).
public final class HostedAPI: @unchecked Sendable {
    /// How many timeouts one event's calls may take together: no call starts after
    /// ``eventDeadline``, set that many timeouts less one after the event's start, so a hosted row's
    /// lease covers its event whatever the number of calls.
    public static let eventBudget = 10

    /// The platform whose API this is.
    public let platform: any HostedPlatform
    /// Whether changes are left unsent (`siwactl adapters test`): ``write(_:_:endpoint:query:json:)``
    /// answers as if they succeeded, and only reads reach the platform.
    public let dryRun: Bool
    /// The calls sent to the platform so far (token requests included).
    public private(set) var calls = 0
    /// Starts an event: its calls must start within ``eventBudget`` − 1 timeouts from now.
    public func beginEvent() { eventDeadline = ContinuousClock.now + timeout * (Self.eventBudget - 1) }

    /// The session of every request; its policy's timeout bounds each.
    public let http: OutboundHTTP.Session
    private var token: BearerToken?
    /// When set, a call after it throws `unavailable` instead of starting (the event is retried).
    public var eventDeadline: ContinuousClock.Instant?
    private let timeout: Duration

    /// A client of `platform`'s admin API, each request bounded by `timeout`.
    public init(
        platform: any HostedPlatform, timeout: Duration, dryRun: Bool = false,
        environment: [String: String] = [:]
    ) {
        self.platform = platform
        self.dryRun = dryRun
        self.timeout = timeout
        http = OutboundHTTP.Session(
            client: OutboundHTTP.Client(
                policy: OutboundHTTP.Policy(timeout: timeout, refusesContentEncoding: true),
                environment: environment))
    }

    /// A call that only reads (a lookup), sent in a dry run too.
    @discardableResult
    public func read(
        _ path: String, method: String = "GET", endpoint: String, query: [(String, String)] = [],
        json: Any? = nil, expecting: Set<Int> = [200]
    ) throws(HostedCallError) -> HostedResponse {
        try send(method, path, endpoint: endpoint, query: query, json: json, expecting: expecting)
    }

    /// A call that changes something; in a dry run it is not sent and answers the first of `expecting`.
    @discardableResult
    public func write(
        _ method: String, _ path: String, endpoint: String, query: [(String, String)] = [], json: Any? = nil,
        expecting: Set<Int> = [200, 201, 204]
    ) throws(HostedCallError) -> HostedResponse {
        if dryRun { return HostedResponse(status: expecting.min() ?? 204, body: []) }
        return try send(method, path, endpoint: endpoint, query: query, json: json, expecting: expecting)
    }

    /// Sends a request to `baseURL` + `path` (its segments already escaped with ``segment(_:)``) with
    /// the bearer token, and returns the answer when its status is one of `expecting`. Otherwise it
    /// throws: no answer or 5xx `unavailable`; 429 `rateLimited` (with the wait its headers give); 401
    /// after a fresh token and 403 `credentialsRefused` (unless expected: a platform that reads its 403s);
    /// 404 from a call about one user (`{id}`, `{user_id}` in `endpoint`) `userGone`; any other status
    /// `callFailed` (never the body).
    @discardableResult
    public func send(
        _ method: String, _ path: String, endpoint: String, query: [(String, String)] = [], json: Any? = nil,
        form: [(String, String)]? = nil, expecting: Set<Int>
    ) throws(HostedCallError) -> HostedResponse {
        if let eventDeadline, ContinuousClock.now >= eventDeadline {
            throw HostedCallError(
                .unavailable, platform: platform.name, endpoint: "\(method) \(endpoint)",
                cause: "the event's calls outlasted \(Self.eventBudget - 1) timeouts; it is tried again")
        }
        var fresh = false
        if token == nil || token!.expiresAt.map({ $0.timeIntervalSinceNow < 60 }) == true {
            token = try platform.obtainToken(http)
            calls += 1
            fresh = true
        }
        var headers = [OutboundHTTP.Header("Accept", "application/json")] + platform.headers
        var body: [UInt8]?
        if let json {
            headers.append(OutboundHTTP.Header("Content-Type", "application/json"))
            body = Array((try? JSONSerialization.data(withJSONObject: json)) ?? Data("{}".utf8))
        } else if let form {
            headers.append(OutboundHTTP.Header("Content-Type", "application/x-www-form-urlencoded"))
            body = Array(Self.formEncoded(form).utf8)
        }
        let url = platform.baseURL + path + (query.isEmpty ? "" : "?" + Self.formEncoded(query))
        let response = try perform(
            OutboundHTTP.Request(
                method: method, url: url,
                headers: headers + [OutboundHTTP.Header("Authorization", "Bearer \(token!.value)")],
                body: body),
            endpoint: "\(method) \(endpoint)")
        if response.status == 401 && !fresh {
            // The token was revoked or expired early: one fresh token, one more try.
            token = nil
            return try send(
                method, path, endpoint: endpoint, query: query, json: json, form: form, expecting: expecting)
        }
        switch response.status {
        case 401,
            403 where !expecting.contains(response.status):
            token = nil
            throw HostedCallError(
                .credentialsRefused, platform: platform.name, endpoint: "\(method) \(endpoint)",
                status: response.status,
                cause: response.status == 401
                    ? "the credentials were refused: rotate them in the credentials file"
                    : "the credentials lack the permission this call needs (docs/adapters.md)")
        case let status where expecting.contains(status):
            return HostedResponse(status: status, body: response.body)
        case 404 where endpoint.contains("/{id}") || endpoint.contains("/{user_id}"):
            throw HostedCallError(
                .userGone, platform: platform.name, endpoint: "\(method) \(endpoint)", status: 404,
                cause: "the user is no longer there")
        default:
            throw HostedCallError(
                .callFailed, platform: platform.name, endpoint: "\(method) \(endpoint)",
                status: response.status,
                cause: "unexpected answer")
        }
    }

    /// Sends a request without the bearer token (a token endpoint's), classifying no answer, 5xx and
    /// 429 as ``send(_:_:endpoint:query:json:form:expecting:)`` does; other statuses are returned.
    public func perform(_ request: OutboundHTTP.Request, endpoint: String) throws(HostedCallError)
        -> OutboundHTTP.Response
    {
        calls += 1
        return try Self.perform(request, endpoint: endpoint, platform: platform.name, http: http)
    }

    /// ``perform(_:endpoint:)`` on `http`, for a platform's ``HostedPlatform/obtainToken(_:)``.
    public static func perform(
        _ request: OutboundHTTP.Request, endpoint: String, platform: String, http: OutboundHTTP.Session
    ) throws(HostedCallError) -> OutboundHTTP.Response {
        let response: OutboundHTTP.Response
        do {
            response = try http.perform(request)
        } catch {
            throw HostedCallError(
                .unavailable, platform: platform, endpoint: endpoint,
                cause: "no answer (\(error.code))")
        }
        switch response.status {
        case 429:
            throw HostedCallError(
                .rateLimited, platform: platform, endpoint: endpoint, status: 429, cause: "rate limited",
                retryAfter: response.retryAfter() ?? .seconds(1))
        case 500...599:
            throw HostedCallError(
                .unavailable, platform: platform, endpoint: endpoint, status: response.status,
                cause: "the platform failed", retryAfter: response.retryAfter())
        default:
            return response
        }
    }

    /// A bearer token from a token endpoint's OAuth 2.0 answer (RFC 6749 §5.1: `access_token`,
    /// `expires_in`); any other answer is `credentialsRefused` with `refusal` as its cause.
    public static func requestToken(
        _ request: OutboundHTTP.Request, endpoint: String, platform: String, http: OutboundHTTP.Session,
        refusal: String
    ) throws(HostedCallError) -> BearerToken {
        let response = try perform(request, endpoint: endpoint, platform: platform, http: http)
        let object = (try? JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any]) ?? [:]
        guard response.status == 200, let token = object["access_token"] as? String else {
            throw HostedCallError(
                .credentialsRefused, platform: platform, endpoint: endpoint, status: response.status,
                cause: refusal)
        }
        let lifetime = (object["expires_in"] as? NSNumber)?.doubleValue ?? 60
        return BearerToken(value: token, expiresAt: Date(timeIntervalSinceNow: lifetime))
    }

    /// `value` as one path segment: everything but unreserved characters percent-encoded.
    public static func segment(_ value: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return value.addingPercentEncoding(withAllowedCharacters: allowed) ?? value
    }

    /// `pairs` as `application/x-www-form-urlencoded` (a query string or a form body).
    public static func formEncoded(_ pairs: [(String, String)]) -> String {
        pairs.map { "\(segment($0.0))=\(segment($0.1))" }.joined(separator: "&")
    }
}

/// An admin API's answer, for the platform to read.
public struct HostedResponse: Sendable {
    /// The HTTP status.
    public var status: Int
    /// The body.
    public var body: [UInt8]

    /// An answer.
    public init(status: Int, body: [UInt8]) {
        self.status = status
        self.body = body
    }

    /// The body as JSON (nil when it is not).
    public var json: Any? {
        try? JSONSerialization.jsonObject(with: Data(body), options: [.fragmentsAllowed])
    }
    /// The body as a JSON object (empty when it is not one).
    public var object: [String: Any] { json as? [String: Any] ?? [:] }
    /// The body as a JSON array of objects (empty when it is not one).
    public var objects: [[String: Any]] { json as? [[String: Any]] ?? [] }
}
