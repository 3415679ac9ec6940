public import Foundation
public import HTTPServer
public import RelayMail
public import ServiceSupport

/// The HTTP check: `GET /v1/relay-mail/decision?address=…` and `POST /v1/relay-mail/decisions`
/// (`{"addresses": [...]}`, at most ``maximumAddresses``, answers in the same order).
///
/// Every call needs `Authorization: Bearer <token>` (compared in constant time). Answers are JSON with
/// `Cache-Control: no-store`; refusals are `{"error": "<word>"}`, counted, and logged without the address.
public final class DecisionAPI: Sendable {
    /// The most addresses one bulk call may carry.
    public static let maximumAddresses = 10_000
    /// The longest address looked up (RFC 5321's path limit is 256; a longer one answers malformed).
    static let maximumAddressBytes = 1024

    private let bearerToken: String
    private let resolver: VerdictResolver
    private let bulk: @Sendable ([String?]) throws -> [RelayMailAnswer]
    private let lookupTimeout: Duration
    private let metrics: MailGateMetrics
    private let logger: Logger

    /// - Parameters:
    ///   - resolver: answers single lookups (with the cache).
    ///   - bulk: answers a whole list in one database call.
    ///   - lookupTimeout: how long a single lookup may wait for the database before 503.
    public init(
        bearerToken: String, resolver: VerdictResolver,
        bulk: @escaping @Sendable ([String?]) throws -> [RelayMailAnswer],
        lookupTimeout: Duration = .seconds(5), metrics: MailGateMetrics, logger: Logger
    ) {
        self.bearerToken = bearerToken
        self.resolver = resolver
        self.bulk = bulk
        self.lookupTimeout = lookupTimeout
        self.metrics = metrics
        self.logger = logger
    }

    /// Answers one request, counts it and logs it (a refusal as a warning); never logs an address.
    public func handle(_ request: HTTPRequest) -> HTTPResponse {
        let endpoint =
            switch request.path {
            case "/v1/relay-mail/decision": "decision"
            case "/v1/relay-mail/decisions": "decisions"
            default: "other"
            }
        var response = answer(request, endpoint: endpoint)
        response.headers.replaceOrAdd(name: "Cache-Control", value: "no-store")
        metrics.httpAnswered(endpoint: endpoint, status: response.status, error: response.errorWord)
        let fields = request.callLogFields(endpoint: endpoint, response: response)
        if (400..<500).contains(response.status) {
            logger.warning("relay-mail check refused a call", fields)
        } else if response.status >= 500 {
            logger.error("relay-mail check could not answer", fields)
        } else {
            logger.debug("relay-mail check call", fields)
        }
        return response
    }

    private func answer(_ request: HTTPRequest, endpoint: String) -> HTTPResponse {
        guard endpoint != "other" else { return .error(status: 404, "not_found") }
        guard request.carriesBearer(bearerToken) else { return .bearerRequired }
        switch (endpoint, request.method) {
        case ("decision", "GET"): return single(request)
        case ("decisions", "POST"): return list(request)
        default: return .error(status: 405, "method_not_allowed")
        }
    }

    private func single(_ request: HTTPRequest) -> HTTPResponse {
        let items = URLComponents(string: "/?" + (request.query ?? ""))?.queryItems ?? []
        guard let address = items.first(where: { $0.name == "address" })?.value, !address.isEmpty else {
            return .error(status: 400, "address_missing")
        }
        guard address.utf8.count <= Self.maximumAddressBytes else {
            return .error(status: 400, "address_too_long")
        }
        let lookup =
            address.utf8.contains(0)
            ? .decided(RelayMailAnswer(decision: .unknown, reason: .malformed, since: nil))
            : resolver.lookup(address, deadline: .now + lookupTimeout)
        metrics.decided(lookup, source: "http")
        switch lookup {
        case .decided(let verdict):
            var body = ""
            Self.append(address, verdict, to: &body)
            return .json(Data(body.utf8))
        case .timedOut: return .error(status: 503, "database_timeout")
        case .unavailable: return .error(status: 503, "database_unavailable")
        }
    }

    private func list(_ request: HTTPRequest) -> HTTPResponse {
        guard let object = try? JSONSerialization.jsonObject(with: request.data) as? [String: Any] else {
            return .error(status: 400, "body_is_not_a_json_object")
        }
        guard let elements = object["addresses"] as? [Any] else {
            return .error(status: 400, "addresses_missing")
        }
        guard elements.count <= Self.maximumAddresses else {
            return .error(status: 400, "too_many_addresses")
        }
        var addresses: [String?] = []
        addresses.reserveCapacity(elements.count)
        for element in elements {
            if let text = element as? String {
                addresses.append(text)
            } else if element is NSNull {
                addresses.append(nil)
            } else {
                return .error(status: 400, "address_is_not_a_string")
            }
        }
        let verdicts: [RelayMailAnswer]
        do {
            // Over-long elements are asked as NULL: the contract answers them unknown/malformed.
            verdicts = try bulk(
                addresses.map { $0.flatMap { $0.utf8.count <= Self.maximumAddressBytes ? $0 : nil } })
        } catch {
            logger.warning("relay-mail bulk lookup failed", ["error": .string("\(error)")])
            metrics.databaseErrors.increment()
            return .error(status: 503, "database_unavailable")
        }
        var body = #"{"decisions":["#
        body.reserveCapacity(addresses.count * 96)
        for (index, (address, verdict)) in zip(addresses, verdicts).enumerated() {
            if index > 0 { body += "," }
            Self.append(address, verdict, to: &body)
            metrics.decided(.decided(verdict), source: "http")
        }
        body += "]}"
        return .json(Data(body.utf8))
    }

    /// `{"address":…,"decision":…,"reason":…,"since":…|null}`.
    static func append(_ address: String?, _ verdict: RelayMailAnswer, to body: inout String) {
        body += #"{"address":"#
        body += address.map(JSONText.quoted) ?? "null"
        body += #","decision":""#
        body += verdict.decision.rawValue
        body += #"","reason":"#
        body += JSONText.quoted(verdict.reason.rawValue)
        body += #","since":"#
        body += verdict.since.map { JSONText.quoted(timestamp($0)) } ?? "null"
        body += "}"
    }

    /// RFC 3339 in UTC with milliseconds (`2026-05-01T09:30:00.000Z`), without a formatter: a list of
    /// 10,000 answers spent most of its time in Foundation's.
    public static func timestamp(_ date: Date) -> String {
        let milliseconds = Int64((date.timeIntervalSince1970 * 1000).rounded(.down))
        var seconds = time_t(milliseconds >= 0 ? milliseconds / 1000 : (milliseconds - 999) / 1000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func digits(_ value: Int32, _ width: Int) -> String {
            let text = String(value)
            return String(repeating: "0", count: max(0, width - text.count)) + text
        }
        let fraction = Int32(milliseconds - Int64(seconds) * 1000)
        return digits(parts.tm_year + 1900, 4) + "-" + digits(parts.tm_mon + 1, 2) + "-"
            + digits(parts.tm_mday, 2)
            + "T" + digits(parts.tm_hour, 2) + ":" + digits(parts.tm_min, 2) + ":" + digits(parts.tm_sec, 2)
            + "."
            + digits(fraction, 3) + "Z"
    }

}
