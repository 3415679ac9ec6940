import RelayMail
public import ServiceSupport

/// The gate's series on `/metrics`: every handle is made once here, so names and help live in one place.
public final class MailGateMetrics: Sendable {
    /// The registry they are in.
    public let registry: MetricsRegistry
    /// Lookups answered from the cache.
    public let cacheHits: Counter
    /// Lookups that had to ask the database.
    public let cacheMisses: Counter
    /// Failed database calls (each may have carried many addresses).
    public let databaseErrors: Counter
    /// Lookups failed at once because too many were already waiting.
    public let lookupsRefused: Counter
    /// Addresses per database call.
    public let batchSize: Histogram
    /// The database call's duration.
    public let databaseSeconds: Histogram
    /// Policy requests from reading their last line to writing the answer.
    public let policySeconds: Histogram
    /// Policy connections open now.
    public let policyConnections: Gauge
    /// Policy connections accepted.
    public let policyConnectionsAccepted: Counter

    public init(registry: MetricsRegistry = MetricsRegistry()) {
        self.registry = registry
        cacheHits = registry.counter(
            "siwa_mailgate_cache_hits_total", help: "Relay-mail lookups answered from the cache.")
        cacheMisses = registry.counter(
            "siwa_mailgate_cache_misses_total", help: "Relay-mail lookups that asked the database.")
        databaseErrors = registry.counter(
            "siwa_mailgate_database_errors_total",
            help:
                "Database calls for relay-mail decisions that failed (connection refused or lost, an error).")
        lookupsRefused = registry.counter(
            "siwa_mailgate_lookups_refused_total",
            help: "Lookups failed at once because too many were waiting for the database.")
        batchSize = registry.histogram(
            "siwa_mailgate_database_batch_addresses", help: "Addresses asked per database call.",
            buckets: [1, 2, 5, 10, 20, 50, 100, 200, 500])
        databaseSeconds = registry.histogram(
            "siwa_mailgate_database_seconds", help: "Duration of the database calls for decisions.")
        policySeconds = registry.histogram(
            "siwa_mailgate_policy_seconds",
            help: "Policy requests: from the request's last line read to its answer written.")
        policyConnections = registry.gauge(
            "siwa_mailgate_policy_connections", help: "Policy connections open now.")
        policyConnectionsAccepted = registry.counter(
            "siwa_mailgate_policy_connections_total", help: "Policy connections accepted.")
    }

    /// Counts one decision: `decision` allow/block/unknown, or `none` with reason `timeout` or
    /// `database_error`; `source` policy or http.
    public func decided(_ lookup: Lookup, source: String) {
        let (decision, reason) =
            switch lookup {
            case .decided(let verdict): (verdict.decision.rawValue, verdict.reason.rawValue)
            case .timedOut: ("none", "timeout")
            case .unavailable: ("none", "database_error")
            }
        registry.counter(
            "siwa_mailgate_decisions_total",
            help:
                "Relay-mail decisions by source (policy, http), decision (allow, block, unknown; none when the database did not answer) and reason.",
            labels: [("source", source), ("decision", decision), ("reason", Self.reasonLabel(reason))]
        ).increment()
    }

    /// Counts one policy request by its protocol state's class (rcpt, other) and the action's first word.
    public func policyAnswered(state: String, action: String) {
        let verb = action.split(separator: " ", maxSplits: 1).first.map(String.init) ?? ""
        let kind =
            switch verb {
            case "DUNNO": "dunno"
            case "DEFER_IF_PERMIT": "defer_if_permit"
            default: verb.first == "5" ? "reject" : "other"
            }
        registry.counter(
            "siwa_mailgate_policy_requests_total",
            help:
                "Policy requests answered, by protocol state (rcpt, other) and action (dunno, reject, defer_if_permit).",
            labels: [("state", state == "RCPT" ? "rcpt" : "other"), ("action", kind)]
        ).increment()
    }

    /// Counts one policy connection closed without an answer: malformed, oversized or connection_limit.
    public func policyRefused(_ reason: String) {
        registry.counter(
            "siwa_mailgate_policy_refused_total",
            help:
                "Policy connections closed without an answer: malformed, oversized, or over the connection limit.",
            labels: [("reason", reason)]
        ).increment()
    }

    /// Counts one HTTP answer by endpoint, status and error word (none: success).
    public func httpAnswered(endpoint: String, status: Int, error: String) {
        registry.counter(
            "siwa_mailgate_http_responses_total",
            help:
                "Answers of the HTTP check by endpoint (decision, decisions, other), status and error word (none: success).",
            labels: [("endpoint", endpoint), ("status", String(status)), ("error", error)]
        ).increment()
    }

    /// Reason words as labels: the contract's, or `other`, so a label set stays bounded.
    static func reasonLabel(_ reason: String) -> String {
        knownReasons.contains(reason) ? reason : "other"
    }

    static let knownReasons: Set<String> = [
        "forwarding_on", "never_turned_off", "forwarding_off", "account_deleted", "consent_revoked",
        "not_ours", "looks_like_relay", "malformed", "timeout", "database_error",
    ]
}
