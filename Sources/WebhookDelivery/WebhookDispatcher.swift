public import Foundation
import HTTPClient
public import Postgres
public import QueueConsumer
public import ServiceSupport
import Synchronization
import Webhooks

/// Sends each change of `siwa.changes` to the webhook endpoints it fanned out to
/// (`siwa.webhook_deliveries`), signed as Standard Webhooks, at least once, in change order per user
/// and endpoint.
///
/// An ``Outbox`` of `configuration.calls.concurrency` lanes (``OutboxLanes``), each with its own connection,
/// listening on `siwa_webhooks` (the fan-out trigger and replays notify it). No lock and no
/// transaction is held across the network: `siwa.claim_webhook_deliveries` commits leases on up to
/// `batchSize` due queue heads of one endpoint (distinct users) and returns their change rows, the lane
/// builds each body from its row, signs it with every live key (`v1` for a whsec_ secret, `v1a` for a
/// whsk_ ed25519 key) and POSTs them one after another under the outbound policy (one deadline, no
/// redirects, https or http to a loopback literal, the answer's body capped) with no transaction open —
/// on the lane's own keep-alive connection to the endpoint when it has one (an ``OutboundHTTP/Session``
/// per lane: N lanes keep at most N connections to one endpoint) —, then `siwa.record_webhook_attempts`
/// records the attempts and the deliveries' new states, each if its lease is still the lane's. After a
/// failed attempt the rest of the batch is released unattempted. A 2xx is `delivered`; anything else is
/// retried with exponential backoff and jitter until `giveUpAfter` has passed since the first attempt,
/// then `dead`. The claim counts each attempt and leases each delivery for the attempt's deadline, the
/// batch window and a margin (``CallLease``). A process killed mid-batch leaves its leases to
/// expire; the next claim after that takes a delivery over (exactly one claimer does) and sends it again
/// with the same `webhook-id`: receivers dedupe on it.
///
/// Isolation: the claim rotates between the endpoints with due work (the least recently claimed first)
/// and never gives one endpoint more than `max_in_flight` lanes across every worker, one while it is
/// failing, nor more than its share of this process's lanes (at most `concurrency − 1`, about
/// `concurrency / E` with E endpoints due), so an endpoint that hangs never holds every lane. After 3
/// consecutive failures the endpoint is backed off as a whole (on the same schedule as a delivery's
/// retries, by its run of failures): the next attempt after the backoff probes it for every user.
public final class WebhookDispatcher: Outbox {
    /// The dispatcher's settings.
    public struct Configuration: Sendable {
        /// The database, the lanes (attempts in flight at once over all endpoints), the batch (deliveries
        /// of one endpoint a lane sends one after another on its connection), an attempt's deadline,
        /// the retries' delays, the poll interval, the HTTP client's environment.
        public var calls: OutboxCalls
        /// A delivery failing for this long since its first attempt is `dead` (default 26 h: the schedule
        /// spans more than a day).
        public var giveUpAfter: Duration
        /// The largest answer body read; a larger one fails the attempt.
        public var maxResponseBodyBytes: Int
        /// How long a claimed delivery stays leased to its lane (``OutboxCalls/lease(callsPerRow:)``).
        public var lease: Duration { calls.lease() }

        /// The defaults of the settings (siwa-worker's flags show and use these, but for its lanes).
        public static let defaultTimeout: Duration = .seconds(10)
        public static let defaultRetryBaseDelay: Duration = .seconds(5)
        public static let defaultMaxRetryDelay: Duration = .seconds(3600)
        public static let defaultGiveUpAfter: Duration = .seconds(26 * 3600)
        public static let defaultPollInterval: Duration = .seconds(1)

        /// Settings; every duration must be positive and `concurrency` at least 1.
        public init(
            database: PostgresConfiguration, concurrency: Int = 4, batchSize: Int = 16,
            timeout: Duration = Configuration.defaultTimeout,
            retryBaseDelay: Duration = Configuration.defaultRetryBaseDelay,
            maxRetryDelay: Duration = Configuration.defaultMaxRetryDelay,
            giveUpAfter: Duration = Configuration.defaultGiveUpAfter,
            pollInterval: Duration = Configuration.defaultPollInterval,
            maxResponseBodyBytes: Int = 64 << 10, environment: [String: String] = [:]
        ) throws {
            calls = try OutboxCalls(
                "the webhook settings", database: database, concurrency: concurrency, batchSize: batchSize,
                timeout: timeout, retryBaseDelay: retryBaseDelay, maxRetryDelay: maxRetryDelay,
                pollInterval: pollInterval, environment: environment)
            guard giveUpAfter > .zero, maxResponseBodyBytes > 0 else {
                throw ConfigurationError("the webhook give-up time and answer size must be positive")
            }
            self.giveUpAfter = giveUpAfter
            self.maxResponseBodyBytes = maxResponseBodyBytes
        }
    }

    /// What one attempt ended as.
    public struct Outcome: Sendable, Equatable {
        /// The delivery's id.
        public var delivery: Int
        /// What became of the delivery.
        public var state: State
        /// The HTTP status answered, nil when none.
        public var status: Int?

        /// What one attempt left the delivery as.
        public enum State: String, Sendable, CaseIterable {
            /// A 2xx: the delivery is done.
            case delivered
            /// It failed and is scheduled again.
            case retry
            /// It failed past the give-up time: no further attempt.
            case dead
            /// The lease expired and another lane took the delivery over before this attempt was
            /// recorded: nothing of it was written.
            case lost
        }
    }

    /// The channel the fan-out trigger and replays notify.
    public static let channel = "siwa_webhooks"
    /// How often lane 0 runs the webhook maintenance (``maintenance``).
    static let repairInterval: Duration = .seconds(60)

    /// The settings.
    public let configuration: Configuration
    /// The lanes (``Configuration/concurrency``), on `siwa_webhooks`.
    public let lanes: OutboxLanes
    var logger: Logger { lanes.logger }
    /// One per lane: each keeps its connections to the endpoints open between attempts.
    private let sessions: [OutboundHTTP.Session]
    private let connectionsOpened: Counter?
    private let attempts: [Outcome.State: Counter]
    private let latency: Histogram?

    /// A dispatcher; `metrics`, when given, gets `siwa_webhook_attempts_total{outcome}` and the attempts' latency.
    public init(configuration: Configuration, logger: Logger, metrics: MetricsRegistry? = nil) {
        self.configuration = configuration
        lanes = OutboxLanes(
            name: "webhooks", channel: Self.channel, database: configuration.calls.database,
            count: configuration.calls.concurrency,
            pollInterval: min(configuration.calls.pollInterval, .milliseconds(500)),
            logger: logger)
        let client = OutboundHTTP.Client(
            policy: OutboundHTTP.Policy(
                timeout: configuration.calls.timeout,
                maxResponseBodyBytes: configuration.maxResponseBodyBytes,
                allowsPlainHTTPToLoopback: true, userAgent: "siwa-notifications-webhooks"),
            environment: configuration.calls.environment)
        sessions = (0..<configuration.calls.concurrency).map { _ in OutboundHTTP.Session(client: client) }
        connectionsOpened = metrics?.counter(
            "siwa_webhook_connections_opened_total",
            help: "Connections the webhook lanes opened (each lane keeps its own open between attempts).")
        var attempts: [Outcome.State: Counter] = [:]
        for outcome in [Outcome.State.delivered, .retry, .dead] {
            attempts[outcome] = metrics?.counter(
                "siwa_webhook_attempts_total", help: "Webhook attempts, by outcome.",
                labels: [("outcome", outcome.rawValue)])
        }
        self.attempts = attempts
        latency = metrics?.histogram(
            "siwa_webhook_attempt_seconds", help: "Seconds per webhook attempt (the HTTP exchange).")
    }

    /// The webhook maintenance that lane 0 runs between its drains (and ``drainOnce()`` once, first).
    public var maintenance: [PeriodicTask<PostgresConnection>] { [readyRepair, expiredEndpointRemoval] }
    public var drainOnceRunsMaintenance: Bool { true }

    /// Leases up to ``Configuration/batchSize`` due queue heads of one endpoint (distinct users) to the
    /// lane, never more of this process's lanes to one endpoint than its share (`lane.count`).
    public func claim(on connection: PostgresConnection, lane: OutboxLane, dueBy: Date) throws
        -> OutboxClaim<LeasedDelivery>
    {
        let claims = try connection.rows(
            ClaimedDelivery.self,
            [
                .text(lane.owner), .double(configuration.lease.inSeconds),
                .int(Int64(configuration.calls.batchSize)),
                .date(dueBy), .int(Int64(lane.count)),
            ])
        guard let first = claims.first else { return .nothing }
        guard first.delivery != nil else { return .saturated }
        return .leased(claims.compactMap(\.delivery))
    }

    public func failed(_ call: Attempt) -> Bool { call.failure != nil }

    /// How soon the next delivery is due: of the enabled endpoints, the earliest due queue head not in
    /// flight, or a lease's end, but not before the endpoint's backoff.
    public func nextDue(on connection: PostgresConnection, lane: OutboxLane) throws -> Duration? {
        try connection.value(WebhookQueries.nextDue, as: Double?.self).map { .untilDue(seconds: $0) }
    }

    /// What one attempt came to, as `siwa.record_webhook_attempts` takes it.
    public struct Attempt {
        var delivery: LeasedDelivery
        var started: Date
        var elapsed: Duration
        var status: Int?
        var failure: String?
        var state: Outcome.State
        var retryIn: Double?
    }

    /// Records the attempts and releases `unsent` in one statement (`siwa.record_webhook_attempts`),
    /// each if its lease is still the lane's; the endpoint's backoff as a whole (from its 3rd consecutive
    /// failure) follows the same schedule.
    public func record(
        _ made: [Attempt], unsent: [LeasedDelivery], lane: OutboxLane, on connection: PostgresConnection
    ) throws -> [Outcome] {
        var parameters: [[PostgresData?]] = Array(repeating: [], count: 7)
        for attempt in made {
            parameters[0].append(.int(Int64(attempt.delivery.id)))
            parameters[1].append(.date(attempt.started))
            parameters[2].append(.int(Int64(attempt.elapsed.wholeMilliseconds)))
            parameters[3].append(attempt.status.map { .int(Int64($0)) })
            parameters[4].append(.text(attempt.state.rawValue))
            parameters[5].append(attempt.retryIn.map { .double($0) })
            parameters[6].append(attempt.failure.map { .text(String($0.prefix(300))) })
        }
        for delivery in unsent {
            parameters[0].append(.int(Int64(delivery.id)))
            for column in 1..<7 { parameters[column].append(column == 4 ? .text("released") : nil) }
        }
        let recorded = Set(
            try connection.query(
                WebhookQueries.recordAttempts,
                [.text(lane.owner)] + parameters.map { .array($0) } + [
                    .double(configuration.calls.retrySchedule.base.inSeconds),
                    .double(configuration.calls.retrySchedule.maximum.inSeconds),
                ]
            ).map { row throws(PostgresError) in try row[0, as: Int.self] })
        return made.map { report($0, recorded: recorded.contains($0.delivery.id)) }
    }

    /// Signs and POSTs one claimed delivery on the lane's session; what came of it, and when to try again.
    public func call(_ delivery: LeasedDelivery, lane: OutboxLane, on _: PostgresConnection) -> Attempt {
        let body = delivery.change.body
        let secrets = delivery.secrets.compactMap { try? StandardWebhooks.SigningKey($0) }
        let started = Date()
        let clock = ContinuousClock.now
        var status: Int?
        var failure: String?
        let webhookID = "msg_\(delivery.change.changeID)_\(delivery.endpoint)"
        if let problem = StandardWebhooks.endpointProblem(delivery.url) {
            failure = "policy: \(problem)"
        } else if secrets.isEmpty {
            failure = "no live secret: rotate one in (siwactl webhooks rotate-secret)"
        } else {
            let timestamp = Int(started.timeIntervalSince1970)
            let request = OutboundHTTP.Request(
                method: "POST", url: delivery.url,
                headers: [
                    .init("Content-Type", "application/json"), .init("webhook-id", webhookID),
                    .init("webhook-timestamp", String(timestamp)),
                    .init(
                        "webhook-signature",
                        StandardWebhooks.signatureHeader(
                            id: webhookID, timestamp: timestamp, body: body, keys: secrets)),
                ], body: body)
            let session = sessions[lane.index % sessions.count]
            let openedBefore = session.connectionsOpened
            defer { connectionsOpened?.increment(by: session.connectionsOpened - openedBefore) }
            do {
                let response = try session.perform(request)
                status = response.status
                if !(200...299).contains(response.status) { failure = "HTTP \(response.status)" }
            } catch {
                failure = "\(error.code): \(error.description)"
            }
        }
        let elapsed = ContinuousClock.now - clock
        latency?.observe(elapsed.inSeconds)
        var attempt = Attempt(
            delivery: delivery, started: started, elapsed: elapsed, status: status, failure: failure,
            state: .delivered)
        if failure == nil {
            return attempt
        } else if Date().timeIntervalSince(delivery.firstAttemptAt ?? started)
            >= configuration.giveUpAfter.inSeconds
        {
            attempt.state = .dead
        } else {
            attempt.state = .retry
            attempt.retryIn =
                configuration.calls.retrySchedule.delay(afterAttempt: delivery.attempt).inSeconds
        }
        return attempt
    }

    /// Counts and logs one recorded attempt (or one whose lease was lost); its outcome.
    private func report(_ attempt: Attempt, recorded: Bool) -> Outcome {
        let delivery = attempt.delivery
        let fields: [String: Logger.Value] = [
            "delivery": .int(delivery.id), "endpoint": .int(delivery.endpoint),
            "attempt": .int(delivery.attempt),
        ]
        guard recorded else {
            logger.warning(
                "webhook attempt not recorded: its lease expired and another lane took the delivery over",
                fields)
            return Outcome(delivery: delivery.id, state: .lost, status: attempt.status)
        }
        attempts[attempt.state]?.increment()
        if attempt.state != .delivered {
            logger.warning(
                attempt.state == .dead ? "webhook delivery dead" : "webhook attempt failed; will retry",
                fields.merging(["status": attempt.status.map { .int($0) } ?? .string("none")]) { $1 })
        }
        return Outcome(delivery: delivery.id, state: attempt.state, status: attempt.status)
    }
}

/// A row of `siwa.claim_webhook_deliveries`' answer: a delivery claimed under a lease, or (a single row)
/// none to claim now because every endpoint with due work is at its cap.
struct ClaimedDelivery: PostgresRowDecodable {
    /// The claimed delivery; nil when the answer is `saturated`.
    var delivery: LeasedDelivery?

    static let statement = """
        SELECT outcome, delivery_id, change_id, endpoint_id, attempt, first_attempt_at, url, secrets,
               type, sub, event_time, applied_at, jti, audience, sessions_revoked,
               refresh_tokens_revoked, email, is_private_email, old_sub
          FROM siwa.claim_webhook_deliveries($1, $2::float8 * interval '1 second', $3::integer, $4, $5::integer)
        """
    static let columns: PostgresColumns = """
        outcome text, delivery_id bigint, change_id bigint, endpoint_id bigint, attempt integer, \
        first_attempt_at timestamp with time zone, url text, secrets text[], type text, sub text, \
        event_time timestamp with time zone, applied_at timestamp with time zone, jti text, audience text, \
        sessions_revoked integer, refresh_tokens_revoked integer, email text, is_private_email boolean, \
        old_sub text
        """

    init(row: PostgresRow) throws(PostgresError) {
        guard try row[0, as: String.self] == "claimed" else {
            delivery = nil
            return
        }
        // A text[] of whsec_/whsk_ keys ({a,b}): their alphabet has no comma, quote or brace to escape.
        let secrets = try row[7, as: String.self].trimmingCharacters(in: CharacterSet(charactersIn: "{}"))
            .split(separator: ",").map(String.init)
        delivery = LeasedDelivery(
            id: try row[1, as: Int.self], endpoint: try row[3, as: Int.self],
            attempt: try row[4, as: Int.self],
            firstAttemptAt: try row[5, as: Date?.self], url: try row[6, as: String.self], secrets: secrets,
            change: WebhookChange(
                type: try row[8, as: String.self], changeID: try row[2, as: Int.self],
                sub: try row[9, as: String.self], eventTime: try row[10, as: Date.self],
                appliedAt: try row[11, as: Date.self], jti: try row[12, as: String.self],
                audience: try row[13, as: String?.self], sessionsRevoked: try row[14, as: Int.self],
                refreshTokensRevoked: try row[15, as: Int.self], email: try row[16, as: String?.self],
                isPrivateEmail: try row[17, as: Bool?.self], oldSub: try row[18, as: String?.self]))
    }
}

/// A delivery this lane now holds: where to POST, with which keys, and the change it carries.
public struct LeasedDelivery: Sendable {
    var id: Int
    var endpoint: Int
    /// This attempt's number (1 for the first).
    var attempt: Int
    var firstAttemptAt: Date?
    var url: String
    /// The endpoint's live whsec_ secrets and whsk_ ed25519 keys; each signs with its own scheme.
    var secrets: [String]
    /// The change row as the claim read it (an erased email is gone).
    var change: WebhookChange
}
