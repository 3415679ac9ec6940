import Foundation
import HTTPClient
import Postgres
import ServiceSupport
import Synchronization
import Webhooks

/// Sends each change of `siwa.changes` to the webhook endpoints it fanned out to
/// (`siwa.webhook_deliveries`), signed as Standard Webhooks, at least once, in change order per user
/// and endpoint.
///
/// Each of `configuration.concurrency` lanes is a thread with its own connection, listening on
/// `siwa_webhooks` (the fan-out trigger and replays notify it) and polling. One attempt is one
/// transaction: claim a due delivery (FOR UPDATE SKIP LOCKED) whose user has no earlier pending
/// delivery to that endpoint, take one of the endpoint's `max_in_flight` slots (FOR UPDATE SKIP
/// LOCKED; none free: the endpoint is skipped until the next pass), build the body from the change
/// row, sign it with every live secret, POST it under the outbound policy (one deadline, no
/// redirects, https or http to a loopback literal, the answer's body capped), then record the attempt
/// and the delivery's new state and commit. A 2xx is `delivered`; anything else is retried with
/// exponential backoff and jitter until `giveUpAfter` has passed since the first attempt, then `dead`.
/// A process killed mid-attempt leaves the delivery pending (its transaction never committed), so it
/// is sent again with the same `webhook-id`: receivers dedupe on it.
public final class WebhookDispatcher: Sendable {
    /// The dispatcher's settings.
    public struct Configuration: Sendable {
        /// The database (the role needs `siwa_worker`).
        public var database: PostgresConfiguration
        /// Lanes: attempts in flight at once from this process, over all endpoints.
        public var concurrency: Int
        /// The deadline of one attempt, from name resolution to the last byte of the answer.
        public var timeout: Duration
        /// First retry delay; doubles per attempt, with jitter (×0.5 to 1), at most ``maxRetryDelay``.
        public var retryBaseDelay: Duration
        /// The longest retry delay.
        public var maxRetryDelay: Duration
        /// A delivery failing for this long since its first attempt is `dead` (default 26 h: the schedule
        /// spans more than a day).
        public var giveUpAfter: Duration
        /// Look for due deliveries at least this often (NOTIFY wakes the lanes sooner).
        public var pollInterval: Duration
        /// The largest answer body read; a larger one fails the attempt.
        public var maxResponseBodyBytes: Int
        /// Where `SSL_CERT_FILE` and `https_proxy`/`no_proxy` are read (the executable's environment).
        public var environment: [String: String]

        /// Settings; every duration must be positive and `concurrency` at least 1.
        public init(
            database: PostgresConfiguration, concurrency: Int = 4, timeout: Duration = .seconds(10),
            retryBaseDelay: Duration = .seconds(5), maxRetryDelay: Duration = .seconds(3600),
            giveUpAfter: Duration = .seconds(26 * 3600), pollInterval: Duration = .seconds(1),
            maxResponseBodyBytes: Int = 64 << 10, environment: [String: String] = [:]
        ) throws {
            guard concurrency >= 1, timeout > .zero, retryBaseDelay > .zero, maxRetryDelay >= retryBaseDelay,
                giveUpAfter > .zero, pollInterval > .zero, maxResponseBodyBytes > 0
            else {
                throw ConfigurationError("the webhook settings must be positive (max delay ≥ base delay)")
            }
            self.database = database
            self.concurrency = concurrency
            self.timeout = timeout
            self.retryBaseDelay = retryBaseDelay
            self.maxRetryDelay = maxRetryDelay
            self.giveUpAfter = giveUpAfter
            self.pollInterval = pollInterval
            self.maxResponseBodyBytes = maxResponseBodyBytes
            self.environment = environment
        }
    }

    /// What one attempt ended as.
    public struct Outcome: Sendable, Equatable {
        /// The delivery's id.
        public var delivery: Int
        /// `delivered`, `retry` or `dead`.
        public var state: String
        /// The HTTP status answered, nil when none.
        public var status: Int?
    }

    /// The channel the fan-out trigger and replays notify.
    public static let channel = "siwa_webhooks"

    /// The settings.
    public let configuration: Configuration
    private let logger: Logger
    private let stopRequested = Atomic<Bool>(false)
    private let client: OutboundHTTP.Client
    private let attempts: [String: Counter]
    private let latency: Histogram?

    /// A dispatcher; `metrics`, when given, gets `siwa_webhook_attempts_total{outcome}` and the attempts' latency.
    public init(configuration: Configuration, logger: Logger, metrics: MetricsRegistry? = nil) {
        self.configuration = configuration
        self.logger = logger
        client = OutboundHTTP.Client(
            policy: OutboundHTTP.Policy(
                timeout: configuration.timeout, maxResponseBodyBytes: configuration.maxResponseBodyBytes,
                allowsPlainHTTPToLoopback: true, userAgent: "siwa-notifications-webhooks"),
            environment: configuration.environment)
        var attempts: [String: Counter] = [:]
        for outcome in ["delivered", "retry", "dead"] {
            attempts[outcome] = metrics?.counter(
                "siwa_webhook_attempts_total", help: "Webhook attempts, by outcome.",
                labels: [("outcome", outcome)])
        }
        self.attempts = attempts
        latency = metrics?.histogram(
            "siwa_webhook_attempt_seconds", help: "Seconds per webhook attempt (the HTTP exchange).")
    }

    /// Runs every lane until ``stop()``; each finishes the attempt in hand (or leaves it pending).
    public func run() {
        logger.info("webhooks started", ["concurrency": .int(configuration.concurrency)])
        let group = DispatchGroup()
        for index in 0..<configuration.concurrency {
            group.enter()
            let thread = Thread { [self] in
                runLane(index)
                group.leave()
            }
            thread.name = "siwa-webhooks-\(index)"
            thread.start()
        }
        group.wait()
        logger.info("webhooks stopped")
    }

    /// Asks ``run()`` to return once the attempts in hand are recorded. Safe from any thread.
    public func stop() { stopRequested.store(true, ordering: .sequentiallyConsistent) }

    private var isStopping: Bool { stopRequested.load(ordering: .sequentiallyConsistent) }

    /// Attempts every delivery due now, one after another on one connection; returns the outcomes.
    /// Retries it schedules are not waited for.
    public func drainOnce() throws -> [Outcome] {
        let connection = try PostgresConnection(configuration: configuration.database)
        defer { connection.close() }
        var outcomes: [Outcome] = []
        var saturated: Set<Int> = []
        try sweep(on: connection)
        let start = try connection.query("SELECT now()")[0][0, as: Date.self]
        while let step = try attemptOne(on: connection, saturated: &saturated, dueBy: start) {
            if let outcome = step { outcomes.append(outcome) }
        }
        return outcomes
    }

    private func runLane(_ index: Int) {
        while !isStopping {
            do {
                let connection = try PostgresConnection(configuration: configuration.database)
                defer { connection.close() }
                try connection.listen(Self.channel)
                var lastSweep = ContinuousClock.now
                while !isStopping {
                    if index == 0, ContinuousClock.now - lastSweep >= Self.sweepInterval {
                        lastSweep = ContinuousClock.now
                        try sweep(on: connection)
                    }
                    var saturated: Set<Int> = []
                    while !isStopping, try attemptOne(on: connection, saturated: &saturated) != nil {}
                    if isStopping { break }
                    // Sleep until a NOTIFY, the next retry due, or the poll interval, whichever is first.
                    let due = try connection.query(
                        """
                        SELECT extract(epoch FROM min(d.next_attempt_at) - clock_timestamp())::float8
                          FROM siwa.webhook_deliveries d JOIN siwa.webhook_endpoints e ON e.id = d.endpoint_id
                         WHERE d.state = 'pending' AND d.ready AND d.next_attempt_at > now() AND e.enabled
                        """)[0][0, as: Double?.self]
                    var wait = min(configuration.pollInterval, .milliseconds(500))
                    if !saturated.isEmpty { wait = min(wait, .milliseconds(20)) }
                    if let due { wait = min(wait, .milliseconds(max(5, Int64((due * 1000).rounded(.up))))) }
                    _ = try connection.waitForNotifications(timeout: wait)
                }
            } catch {
                let code = (error as? PostgresError).map { $0.sqlState ?? $0.code.description } ?? "unknown"
                var fields: [String: Logger.Value] = ["lane": .int(index), "error": .string(code)]
                if let reason = (error as? PostgresError)?.connectionFailureReason {
                    fields["reason"] = .string(reason)
                }
                logger.warning("webhooks: database failure; connecting again", fields)
                let deadline = ContinuousClock.now + .seconds(1)
                while !isStopping, ContinuousClock.now < deadline { Thread.sleep(forTimeInterval: 0.05) }
            }
        }
    }

    /// How often lane 0 looks for deliveries whose `ready` hint was missed (see ``sweep(on:)``).
    static let sweepInterval: Duration = .seconds(5)

    /// Marks ready every pending delivery with no pending delivery of its endpoint and sub ahead of it: a
    /// fan-out that ran while the delivery ahead was ending may have seen that one still pending, and the
    /// worker that ended it did not yet see the new one. Returns how many it marked.
    @discardableResult
    func sweep(on connection: PostgresConnection) throws -> Int {
        try connection.execute(
            """
            UPDATE siwa.webhook_deliveries d SET ready = true
             WHERE d.state = 'pending' AND NOT d.ready
               AND NOT EXISTS (
                   SELECT 1 FROM siwa.webhook_deliveries p
                    WHERE p.endpoint_id = d.endpoint_id AND p.sub = d.sub AND p.state = 'pending'
                      AND p.change_id < d.change_id)
            """)
    }

    /// One attempt in one transaction. Returns nil when nothing is claimable now, `.some(nil)` when the
    /// claimed delivery's endpoint had no free slot (added to `saturated`, skipped until the next pass).
    /// With `dueBy`, only deliveries due by then are claimed (a drain does not retry what it just tried).
    func attemptOne(on connection: PostgresConnection, saturated: inout Set<Int>, dueBy: Date? = nil) throws
        -> Outcome??
    {
        let skip = "{" + saturated.map(String.init).joined(separator: ",") + "}"
        return try connection.transaction { connection -> Outcome?? in
            let claimed = try connection.query(
                """
                SELECT d.id, d.change_id, d.endpoint_id, d.attempts, d.first_attempt_at, e.url, e.max_in_flight,
                       d.sub
                  FROM siwa.webhook_deliveries d
                  JOIN siwa.webhook_endpoints e ON e.id = d.endpoint_id
                 WHERE d.state = 'pending' AND d.ready
                   AND d.next_attempt_at <= coalesce($2::timestamptz, now()) AND e.enabled
                   AND d.endpoint_id <> ALL ($1::bigint[])
                   AND NOT EXISTS (
                       SELECT 1 FROM siwa.webhook_deliveries p
                        WHERE p.endpoint_id = d.endpoint_id AND p.sub = d.sub AND p.state = 'pending'
                          AND p.change_id < d.change_id)
                 ORDER BY d.next_attempt_at, d.id
                 LIMIT 1
                   FOR UPDATE OF d SKIP LOCKED
                """, [.text(skip), dueBy.map { .date($0) }])
            guard let row = claimed.first else { return nil }
            let delivery = try row[0, as: Int.self]
            let change = try row[1, as: Int.self]
            let endpoint = try row[2, as: Int.self]
            let attempt = try row[3, as: Int.self] + 1
            let firstAttempt = try row[4, as: Date?.self]
            let url = try row[5, as: String.self]
            let maxInFlight = try row[6, as: Int.self]
            let sub = try row[7, as: String.self]
            let slot = try connection.query(
                """
                SELECT slot FROM siwa.webhook_slots WHERE endpoint_id = $1 AND slot < $2
                 ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED
                """, [.int(Int64(endpoint)), .int(Int64(maxInFlight))])
            guard !slot.isEmpty else {
                saturated.insert(endpoint)
                return .some(nil)  // the transaction ends, the delivery's lock with it
            }
            let body = try self.body(change: change, on: connection)
            let secrets = try connection.query(
                """
                SELECT secret FROM siwa.webhook_secrets
                 WHERE endpoint_id = $1 AND (expires_at IS NULL OR expires_at > now()) ORDER BY id DESC
                """, [.int(Int64(endpoint))]
            ).compactMap { try? StandardWebhooks.Secret(try $0[0, as: String.self]) }

            let started = Date()
            let clock = ContinuousClock.now
            var status: Int?
            var failure: String?
            let webhookID = "msg_\(change)_\(endpoint)"
            if let problem = StandardWebhooks.endpointProblem(url) {
                failure = "policy: \(problem)"
            } else if secrets.isEmpty {
                failure = "no live secret: rotate one in (siwactl webhooks rotate-secret)"
            } else {
                let timestamp = Int(started.timeIntervalSince1970)
                let request = OutboundHTTP.Request(
                    method: "POST", url: url,
                    headers: [
                        .init("Content-Type", "application/json"), .init("webhook-id", webhookID),
                        .init("webhook-timestamp", String(timestamp)),
                        .init(
                            "webhook-signature",
                            StandardWebhooks.signatureHeader(
                                id: webhookID, timestamp: timestamp, body: body, secrets: secrets)),
                    ], body: body)
                do {
                    let response = try client.perform(request)
                    status = response.status
                    if !(200...299).contains(response.status) { failure = "HTTP \(response.status)" }
                } catch let refused as OutboundHTTP.Error {
                    failure = "\(refused.code): \(refused.description)"
                } catch {
                    failure = "internal"
                }
            }
            let elapsed = ContinuousClock.now - clock
            latency?.observe(elapsed.inSeconds)
            let outcome: String
            var delay: Double?
            if failure == nil {
                outcome = "delivered"
            } else if Date().timeIntervalSince(firstAttempt ?? started) >= configuration.giveUpAfter.inSeconds
            {
                outcome = "dead"
            } else {
                outcome = "retry"
                delay = backoff(attempt: attempt)
            }
            let boundedError = failure.map { String($0.prefix(300)) }
            try connection.execute(
                """
                INSERT INTO siwa.webhook_attempts
                    (delivery_id, attempt, started_at, latency_ms, status, outcome, next_attempt_at, error)
                VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp() + make_interval(secs => $7), $8)
                """,
                [
                    .int(Int64(delivery)), .int(Int64(attempt)), .date(started),
                    .int(Int64(elapsed.wholeMilliseconds)), status.map { .int(Int64($0)) }, .text(outcome),
                    delay.map { .double($0) }, boundedError.map { .text($0) },
                ])
            try connection.execute(
                """
                UPDATE siwa.webhook_deliveries
                   SET state = CASE WHEN $2 = 'retry' THEN 'pending' ELSE $2 END, attempts = $3,
                       first_attempt_at = coalesce(first_attempt_at, $4), last_attempt_at = $4,
                       next_attempt_at = CASE WHEN $2 = 'retry' THEN clock_timestamp() + make_interval(secs => $5)
                                              ELSE next_attempt_at END,
                       delivered_at = CASE WHEN $2 = 'delivered' THEN clock_timestamp() END,
                       last_status = $6, last_error = $7
                 WHERE id = $1
                """,
                [
                    .int(Int64(delivery)), .text(outcome), .int(Int64(attempt)), .date(started),
                    .double(delay ?? 0), status.map { .int(Int64($0)) }, boundedError.map { .text($0) },
                ])
            if outcome != "retry" {
                // The next change of this sub to this endpoint heads the queue now.
                try connection.execute(
                    """
                    UPDATE siwa.webhook_deliveries SET ready = true
                     WHERE id = (SELECT id FROM siwa.webhook_deliveries
                                  WHERE endpoint_id = $1 AND sub = $2 AND state = 'pending'
                                  ORDER BY change_id LIMIT 1)
                       AND NOT ready
                    """, [.int(Int64(endpoint)), .text(sub)])
            }
            attempts[outcome]?.increment()
            if outcome != "delivered" {
                logger.warning(
                    outcome == "dead" ? "webhook delivery dead" : "webhook attempt failed; will retry",
                    [
                        "delivery": .int(delivery), "endpoint": .int(endpoint), "attempt": .int(attempt),
                        "status": status.map { .int($0) } ?? .string("none"),
                    ])
            }
            return .some(Outcome(delivery: delivery, state: outcome, status: status))
        }
    }

    /// The Standard Webhooks body of change `change`, built from its row now (an erased email is gone).
    func body(change: Int, on connection: PostgresConnection) throws -> [UInt8] {
        let rows = try connection.query(
            """
            SELECT type, sub, event_time, applied_at, jti, audience, sessions_revoked, refresh_tokens_revoked,
                   email, is_private_email
              FROM siwa.changes WHERE id = $1
            """, [.int(Int64(change))])
        guard let row = rows.first else { throw ConfigurationError("change \(change) is gone") }
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        let eventTime = formatter.string(from: try row[2, as: Date.self])
        var data: [String: Any] = [
            "change_id": change, "sub": try row[1, as: String.self], "event_time": eventTime,
            "applied_at": formatter.string(from: try row[3, as: Date.self]),
            "jti": try row[4, as: String.self],
            "sessions_revoked": try row[6, as: Int.self], "refresh_tokens_revoked": try row[7, as: Int.self],
        ]
        if let audience = try row[5, as: String?.self] { data["audience"] = audience }
        if let email = try row[8, as: String?.self] { data["email"] = email }
        if let isPrivate = try row[9, as: Bool?.self] { data["is_private_email"] = isPrivate }
        let object: [String: Any] = [
            "type": try row[0, as: String.self], "timestamp": eventTime, "data": data,
        ]
        return [UInt8](
            try JSONSerialization.data(
                withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes]))
    }

    /// The delay before attempt `attempt + 1`: base × 2^(attempt-1), at most the maximum, times a random
    /// factor in [0.5, 1] so that an endpoint's failures do not all retry in step.
    func backoff(attempt: Int) -> Double {
        let base = configuration.retryBaseDelay.inSeconds
        let delay = min(base * pow(2, Double(min(attempt - 1, 40))), configuration.maxRetryDelay.inSeconds)
        return delay * Double.random(in: 0.5...1.0)
    }
}
