import Foundation
public import HTTPClient
public import Postgres
public import QueueConsumer
public import ServiceSupport

/// Keeps the configured providers' suppression lists in step with `siwa.suppression_outbox`, in order
/// per provider and address, at least once.
///
/// One lane per provider (a ``ConsumerLoop`` on a thread and connection of its own, listening on
/// `siwa_suppressions`), so a provider that hangs or is down holds up no other. One attempt holds no lock
/// and no transaction across the network: `siwa.claim_suppressions` commits a lease on a due queue head
/// (``CallLease``: the call's deadline plus a margin), the lane calls the provider with no transaction
/// open, then `siwa.record_suppression_attempt` records the outcome if the lease is still its own. 429
/// and 5xx, timeouts and transport failures are retried after `siwa.retry_delay`, never before the
/// provider's retry-after; the row is dead after ``Configuration/maxAttempts``.
public final class SuppressionDispatcher: Sendable {
    /// The dispatcher's settings.
    public struct Configuration: Sendable {
        /// The database (the role needs `siwa_worker`).
        public var database: PostgresConfiguration
        /// The providers this process delivers for, by `siwa.suppression_providers.name`.
        public var providers: [String: any SuppressionProvider]
        /// The deadline of one call.
        public var timeout: Duration
        /// First retry delay; doubles per attempt, with jitter, at most ``maxRetryDelay``.
        public var retryBaseDelay: Duration
        /// The longest retry delay.
        public var maxRetryDelay: Duration
        /// A row still failing after this many attempts is dead (`gave_up`).
        public var maxAttempts: Int
        /// Look for due rows at least this often (NOTIFY wakes the lanes sooner).
        public var pollInterval: Duration
        /// Finished rows older than this are pruned (each address's latest kept: ``SuppressionDispatcher/prune()``).
        public var retention: Duration
        /// Where `SSL_CERT_FILE` and `https_proxy`/`no_proxy` are read (the executable's environment).
        public var environment: [String: String]
        /// How long a claimed row stays leased: two calls (the read, then the add or an SES remove), each up to
        /// ``timeout``, plus ``CallLease/margin``.
        public var lease: Duration { CallLease.covering(timeout * 2) }

        public static let defaultTimeout: Duration = .seconds(10)
        public static let defaultRetryBaseDelay: Duration = .seconds(5)
        public static let defaultMaxRetryDelay: Duration = .seconds(3600)
        public static let defaultMaxAttempts = 30
        public static let defaultPollInterval: Duration = .seconds(1)
        public static let defaultRetention: Duration = .seconds(30 * 86_400)

        /// Settings; every duration must be positive and `maxAttempts` at least 1.
        public init(
            database: PostgresConfiguration, providers: [String: any SuppressionProvider],
            timeout: Duration = Configuration.defaultTimeout,
            retryBaseDelay: Duration = Configuration.defaultRetryBaseDelay,
            maxRetryDelay: Duration = Configuration.defaultMaxRetryDelay,
            maxAttempts: Int = Configuration.defaultMaxAttempts,
            pollInterval: Duration = Configuration.defaultPollInterval,
            retention: Duration = Configuration.defaultRetention, environment: [String: String] = [:]
        ) throws {
            guard timeout > .zero, retryBaseDelay > .zero, maxRetryDelay >= retryBaseDelay, maxAttempts >= 1,
                pollInterval > .zero, retention > .zero
            else {
                throw ConfigurationError("the suppression settings must be positive (max delay ≥ base delay)")
            }
            self.database = database
            self.providers = providers
            self.timeout = timeout
            self.retryBaseDelay = retryBaseDelay
            self.maxRetryDelay = maxRetryDelay
            self.maxAttempts = maxAttempts
            self.pollInterval = pollInterval
            self.retention = retention
            self.environment = environment
        }
    }

    /// What one attempt ended as.
    public struct Outcome: Sendable, Equatable {
        /// The row's id.
        public var id: Int
        /// The provider's name.
        public var provider: String
        /// What was asked.
        public var action: SuppressionAction
        /// What the provider's answer came to (`retryable` also when it ran out of attempts: see ``recorded``).
        public var outcome: SuppressionOutcome
        /// The HTTP status answered, nil when none.
        public var status: Int?
        /// Whether the record found the lease still this lane's.
        public var recorded: Bool
    }

    /// The channel the fan-out trigger and retries notify.
    public static let channel = "siwa_suppressions"

    /// The settings.
    public let configuration: Configuration
    let logger: Logger
    private let stopSignal = StopSignal()
    /// One per provider: each lane keeps its connection to its provider open between calls.
    private let sessions: [String: OutboundHTTP.Session]
    private let attempts: [String: Counter]
    /// This dispatcher's lease owner prefix: host, process and a random part (a lane adds its provider).
    private let owner = "\(ProcessInfo.processInfo.hostName):\(getpid()):\(UUID().uuidString.prefix(8))"

    /// A dispatcher; `metrics`, when given, gets `siwa_suppression_attempts_total{outcome}`.
    public init(configuration: Configuration, logger: Logger, metrics: MetricsRegistry? = nil) {
        self.configuration = configuration
        self.logger = logger
        let client = OutboundHTTP.Client(
            policy: OutboundHTTP.Policy(
                timeout: configuration.timeout, maxResponseBodyBytes: 64 << 10,
                allowsPlainHTTPToLoopback: true,
                userAgent: "siwa-notifications-suppressions"),
            environment: configuration.environment)
        sessions = configuration.providers.mapValues { _ in OutboundHTTP.Session(client: client) }
        var attempts: [String: Counter] = [:]
        for outcome in ["done", "already_there", "not_there", "not_ours", "retry", "permanent"] {
            attempts[outcome] = metrics?.counter(
                "siwa_suppression_attempts_total", help: "Calls to the ESPs' suppression APIs, by outcome.",
                labels: [("outcome", outcome)])
        }
        self.attempts = attempts
    }

    /// Runs one lane per provider until ``stop()``; each finishes the call in hand.
    public func run() {
        let names = configuration.providers.keys.sorted()
        logger.info("suppressions started", ["providers": .string(names.joined(separator: ","))])
        let lanes = names.map { name in
            JoinableThread(name: "siwa-suppressions-\(name)") { [self] in runLane(name) }
        }
        for lane in lanes { lane.join() }
        logger.info("suppressions stopped")
    }

    /// Asks ``run()`` to return once the calls in hand are recorded. Safe from any thread.
    public func stop() { stopSignal.stop() }

    /// Attempts every row due now, provider after provider, on one connection; returns the outcomes.
    /// Retries it schedules are not waited for.
    public func drainOnce() throws -> [Outcome] {
        let connection = try PostgresConnection(configuration: configuration.database)
        defer { connection.close() }
        var outcomes: [Outcome] = []
        for name in configuration.providers.keys.sorted() {
            _ = try drain(on: connection, provider: name, into: &outcomes)
        }
        return outcomes
    }

    /// How often the first lane prunes finished rows.
    static let pruneInterval: Duration = .seconds(3600)

    /// The first lane's periodic task: ``prune(on:)`` until a call deletes less than a batch.
    var pruning: PeriodicTask<PostgresConnection> {
        PeriodicTask("suppression pruning", every: Self.pruneInterval) { [self] connection in
            ["suppressions_pruned": try prune(on: connection)]
        }
    }

    /// Deletes the finished rows past ``Configuration/retention`` (each provider-and-address's latest
    /// kept unless erased), 10,000 a statement; returns how many.
    @discardableResult
    public func prune() throws -> Int {
        let connection = try PostgresConnection(configuration: configuration.database)
        defer { connection.close() }
        return try prune(on: connection)
    }

    func prune(on connection: PostgresConnection) throws -> Int {
        var total = 0
        for _ in 0..<100 where !stopSignal.isStopped {
            let count = try connection.value(
                "SELECT siwa.prune_suppressions($1::float8 * interval '1 second', 10000)",
                [.double(configuration.retention.inSeconds)], as: Int.self)
            total += count
            if count < 10000 { break }
        }
        return total
    }

    private func runLane(_ name: String) {
        var tasks = PeriodicTasks(name == configuration.providers.keys.min() ? [pruning] : [])
        var loop = ConsumerLoop.listening(
            on: Self.channel, database: configuration.database,
            state: ConsumerLoopState(pollInterval: min(configuration.pollInterval, .milliseconds(500))),
            stop: stopSignal, logger: logger, failure: "suppressions: database failure; connecting again",
            fields: ["provider": .string(name)]
        ) { [self] connection in
            _ = try tasks.runDue(on: connection)
            var outcomes: [Outcome] = []
            return try drain(on: connection, provider: name, into: &outcomes)
        }
        try? loop.run()
    }

    /// Claims and attempts the provider's due rows one after another; returns how soon its next queue
    /// head is due (a retry's time, a lease's end, an erasure's wait).
    private func drain(
        on connection: PostgresConnection, provider name: String, into outcomes: inout [Outcome]
    )
        throws -> Duration?
    {
        while !stopSignal.isStopped, let outcome = try attemptOne(on: connection, provider: name) {
            outcomes.append(outcome)
        }
        // Queue heads only (a row behind another of its address waits for it), of an enabled provider;
        // an erased account's pending row is due at its erase_by too.
        let due = try connection.value(
            """
            SELECT extract(epoch FROM min(least(CASE WHEN r.lease_expires_at > clock_timestamp()
                                                     THEN r.lease_expires_at ELSE r.next_attempt_at END,
                                                r.erase_by)) - clock_timestamp())::float8
              FROM siwa.suppression_outbox r
              JOIN siwa.suppression_providers p ON p.name = r.provider AND p.enabled
             WHERE r.state = 'pending' AND r.provider = $1
               AND NOT EXISTS (SELECT 1 FROM siwa.suppression_outbox q
                                WHERE q.provider = r.provider AND q.address_key = r.address_key
                                  AND q.state = 'pending' AND q.id < r.id)
            """, [.text(name)], as: Double?.self)
        return due.map { .milliseconds(max(0, Int64(($0 * 1000).rounded(.up)))) }
    }

    /// One attempt: claim (committed), call with no transaction open, record. Nil when nothing is due.
    func attemptOne(on connection: PostgresConnection, provider name: String) throws -> Outcome? {
        guard let provider = configuration.providers[name], let client = sessions[name] else { return nil }
        let owner = "\(owner):\(name)"
        guard
            let claim = try connection.rows(
                ClaimedSuppression.self, [.text(owner), .double(configuration.lease.inSeconds), .text(name)]
            ).first
        else { return nil }

        // No transaction is open from here to the record: the row is held by its lease only.
        var status: Int?
        let outcome: SuppressionOutcome
        do {
            // An add reads first: an address the list holds already is not ours (never removed later).
            var listed = false
            var sentBefore = false
            if claim.action == .add {
                let answer = try client.perform(provider.lookup(address: claim.address))
                status = answer.status
                listed = provider.listed(answer) ?? false
                if provider.listed(answer) == nil {
                    throw LookupFailure(
                        outcome: SuppressionAnswer.failure(answer)
                            ?? .retryable(
                                after: nil, reason: "HTTP \(answer.status): a lookup answer that says nothing"
                            ))
                }
                // Listed after an earlier attempt of this row sent the add (and died before its record):
                // that add was ours. Otherwise the row says so before this attempt sends it.
                sentBefore = try addSent(claim, owner: owner, listed: listed, on: connection)
            }
            // A remove reads first where the provider's entries say who listed them (SES).
            var entry = SuppressionEntry.ours
            if claim.action == .remove, let check = provider.removalCheck(address: claim.address) {
                let answer = try client.perform(check)
                status = answer.status
                guard let read = provider.entry(answer, addedAt: try addedAt(claim, on: connection)) else {
                    throw LookupFailure(
                        outcome: SuppressionAnswer.failure(answer)
                            ?? .retryable(
                                after: nil, reason: "HTTP \(answer.status): a lookup answer that says nothing"
                            ))
                }
                entry = read
            }
            if listed {
                outcome = sentBefore ? .done : .alreadyThere
            } else if entry == .absent {
                outcome = .notThere
            } else if entry == .notOurs {
                outcome = .notOurs
            } else {
                let response = try client.perform(provider.request(claim.action, address: claim.address))
                status = response.status
                outcome = provider.outcome(of: claim.action, response: response)
            }
        } catch let failure as LookupFailure {
            outcome = failure.outcome
        } catch let error as OutboundHTTP.Error {
            outcome = .retryable(after: nil, reason: "\(error.code)")
        } catch {
            outcome = .retryable(after: nil, reason: "transport")
        }
        var retryAfter: Double?
        var error: String?
        switch outcome {
        case .retryable(let after, let reason):
            retryAfter = after?.inSeconds
            error = reason
        case .permanent(let reason): error = reason
        default: break
        }
        let recorded = try connection.value(
            """
            SELECT siwa.record_suppression_attempt($1, $2, $3, $4::integer, $5, $6::float8, $7::integer,
                                                   $8::float8 * interval '1 second', $9::float8 * interval '1 second')
            """,
            [
                .int(Int64(claim.id)), .text(owner), .text(outcome.recordedName),
                status.map { .int(Int64($0)) },
                error.map { .text(String($0.prefix(300))) }, retryAfter.map { .double($0) },
                .int(Int64(configuration.maxAttempts)), .double(configuration.retryBaseDelay.inSeconds),
                .double(configuration.maxRetryDelay.inSeconds),
            ], as: Bool.self)
        if recorded { attempts[outcome.recordedName]?.increment() }
        if !recorded {
            logger.warning(
                "suppression attempt not recorded: its lease expired and another lane took the row over",
                ["row": .int(claim.id), "provider": .string(name)])
        } else if error != nil {
            logger.warning(
                "suppression call failed",
                [
                    "row": .int(claim.id), "provider": .string(name),
                    "action": .string(claim.action.rawValue),
                    "attempt": .int(claim.attempt), "outcome": .string(outcome.recordedName),
                    "status": status.map { .int($0) } ?? .string("none"),
                ])
        }
        return Outcome(
            id: claim.id, provider: name, action: claim.action, outcome: outcome, status: status,
            recorded: recorded)
    }
}

/// Whether an earlier attempt of the claimed add sent it, when the address is `listed`; else marks
/// the row as sent by this attempt (before the call) and returns false.
private func addSent(
    _ claim: ClaimedSuppression, owner: String, listed: Bool, on connection: PostgresConnection
) throws -> Bool {
    if listed {
        return try connection.value(
            "SELECT add_sent_at IS NOT NULL FROM siwa.suppression_outbox WHERE id = $1",
            [.int(Int64(claim.id))],
            as: Bool?.self) ?? false
    }
    // Without waiting for the WAL flush: a mark a crash of the server loses only makes the retry's
    // answer already_there, as without it.
    _ = try connection.execute(
        """
        WITH asynchronous AS (SELECT set_config('synchronous_commit', 'off', true))
        UPDATE siwa.suppression_outbox SET add_sent_at = coalesce(add_sent_at, clock_timestamp())
          FROM asynchronous WHERE id = $1 AND lease_owner = $2
        """, [.int(Int64(claim.id)), .text(owner)])
    return false
}

/// When we recorded adding the claimed row's address (nil when we hold no record of it).
private func addedAt(_ claim: ClaimedSuppression, on connection: PostgresConnection) throws -> Date? {
    try connection.value(
        """
        SELECT extract(epoch FROM added_at)::float8 FROM siwa.suppressions_we_added
         WHERE provider = $1 AND address_key = siwa.mail_address_key($2)
        """, [.text(claim.provider), .text(claim.address)], as: Double?.self
    ).map { Date(timeIntervalSince1970: $0) }
}

/// A lookup whose answer decided the attempt's outcome (a 429, a 5xx, a refusal).
private struct LookupFailure: Error {
    var outcome: SuppressionOutcome
}

/// A row `siwa.claim_suppressions` leased to a lane: what to ask of which provider.
struct ClaimedSuppression: PostgresRowDecodable {
    var id: Int
    var provider: String
    var kind: String
    var action: SuppressionAction
    var address: String
    /// This attempt's number (1 for the first).
    var attempt: Int

    // The claim's commit does not wait for the WAL flush: a claim a crash loses is claimed again (its
    // record then finds the lease gone), so at-least-once holds, one fsync per row cheaper.
    static let statement = """
        WITH asynchronous AS (SELECT set_config('synchronous_commit', 'off', true))
        SELECT c.id, c.provider, c.kind, c.action, c.address, c.attempts
          FROM asynchronous, siwa.claim_suppressions($1, $2::float8 * interval '1 second', 1, $3) AS c
        """
    static let columns: PostgresColumns =
        "id bigint, provider text, kind text, action text, address text, attempts integer"

    init(row: PostgresRow) throws(PostgresError) {
        id = try row[0, as: Int.self]
        provider = try row[1, as: String.self]
        kind = try row[2, as: String.self]
        action = try row[3, as: String.self] == "remove" ? .remove : .add
        address = try row[4, as: String.self]
        attempt = try row[5, as: Int.self]
    }
}
