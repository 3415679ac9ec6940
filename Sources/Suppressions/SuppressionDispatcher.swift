public import Foundation
import HTTPClient
public import Postgres
public import QueueConsumer
public import ServiceSupport

/// Keeps the configured providers' suppression lists in step with `siwa.suppression_outbox`, in order
/// per provider and address, at least once.
///
/// An ``Outbox`` of one lane per provider (``OutboxLanes``: a thread and connection of its own,
/// listening on `siwa_suppressions`), so a provider that hangs or is down holds up no other. No lock and
/// no transaction is held across the network: `siwa.claim_suppressions` commits leases on up to
/// ``Configuration/batchSize`` due queue heads (distinct addresses; ``CallLease``), the lane calls the
/// provider for each with no transaction open, then `siwa.record_suppression_attempts` records the
/// outcomes, each if its lease is still its own (after a failed call the rest are released uncalled).
/// 429 and 5xx, timeouts and transport failures are retried after `siwa.retry_delay`, never before the
/// provider's retry-after; the row is dead after ``Configuration/maxAttempts``.
public final class SuppressionDispatcher: Outbox {
    /// The dispatcher's settings.
    public struct Configuration: Sendable {
        /// The database, a lane per provider, the batch (rows of one provider a lane calls one after
        /// another, distinct addresses), a call's deadline, the retries' delays, the poll interval, the
        /// HTTP client's environment.
        public var calls: OutboxCalls
        /// The providers this process delivers for, by `siwa.suppression_providers.name`.
        public var providers: [String: any SuppressionProvider]
        /// A row still failing after this many attempts is dead (`gave_up`).
        public var maxAttempts: Int
        /// Finished rows older than this are pruned (each address's latest kept: ``SuppressionDispatcher/prune()``).
        public var retention: Duration
        /// How long a claimed row stays leased: two calls each (the read, then the add or an SES remove)
        /// (``OutboxCalls/lease(callsPerRow:)``).
        public var lease: Duration { calls.lease(callsPerRow: 2) }

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
            retention: Duration = Configuration.defaultRetention, batchSize: Int = 16,
            environment: [String: String] = [:]
        ) throws {
            calls = try OutboxCalls(
                "the suppression settings", database: database, concurrency: max(providers.count, 1),
                batchSize: batchSize, timeout: timeout, retryBaseDelay: retryBaseDelay,
                maxRetryDelay: maxRetryDelay, pollInterval: pollInterval, environment: environment)
            guard maxAttempts >= 1, retention > .zero else {
                throw ConfigurationError("the suppression attempts and retention must be positive")
            }
            self.providers = providers
            self.maxAttempts = maxAttempts
            self.retention = retention
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
    /// One lane per provider (named by it), on `siwa_suppressions`.
    public let lanes: OutboxLanes
    var logger: Logger { lanes.logger }
    /// One per provider: each lane keeps its connection to its provider open between calls.
    private let sessions: [String: OutboundHTTP.Session]
    private let attempts: [String: Counter]

    /// A dispatcher; `metrics`, when given, gets `siwa_suppression_attempts_total{outcome}`.
    public init(configuration: Configuration, logger: Logger, metrics: MetricsRegistry? = nil) {
        self.configuration = configuration
        lanes = OutboxLanes(
            name: "suppressions", channel: Self.channel, database: configuration.calls.database,
            lanes: configuration.providers.keys.sorted(),
            pollInterval: min(configuration.calls.pollInterval, .milliseconds(500)), logger: logger)
        let client = OutboundHTTP.Client(
            policy: OutboundHTTP.Policy(
                timeout: configuration.calls.timeout, maxResponseBodyBytes: 64 << 10,
                allowsPlainHTTPToLoopback: true,
                userAgent: "siwa-notifications-suppressions"),
            environment: configuration.calls.environment)
        sessions = configuration.providers.mapValues { _ in OutboundHTTP.Session(client: client) }
        var attempts: [String: Counter] = [:]
        for outcome in ["done", "already_there", "not_there", "not_ours", "retry", "permanent"] {
            attempts[outcome] = metrics?.counter(
                "siwa_suppression_attempts_total", help: "Calls to the ESPs' suppression APIs, by outcome.",
                labels: [("outcome", outcome)])
        }
        self.attempts = attempts
    }

    /// The first lane's pruning.
    public var maintenance: [PeriodicTask<PostgresConnection>] { [pruning] }

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
        let connection = try PostgresConnection(configuration: configuration.calls.database)
        defer { connection.close() }
        return try prune(on: connection)
    }

    func prune(on connection: PostgresConnection) throws -> Int {
        var total = 0
        for _ in 0..<100 where !isStopping {
            let count = try connection.value(
                SuppressionQueries.prune,
                [.double(configuration.retention.inSeconds)], as: Int.self)
            total += count
            if count < 10000 { break }
        }
        return total
    }

    /// Leases up to ``Configuration/batchSize`` due queue heads of the lane's provider
    /// (`siwa.claim_suppressions`).
    public func claim(on connection: PostgresConnection, lane: OutboxLane, dueBy _: Date) throws
        -> OutboxClaim<ClaimedSuppression>
    {
        let claims = try connection.rows(
            ClaimedSuppression.self,
            [
                .text(lane.owner), .double(configuration.lease.inSeconds),
                .int(Int64(configuration.calls.batchSize)),
                .text(lane.name),
            ])
        return claims.isEmpty ? .nothing : .leased(claims)
    }

    /// How soon the provider's next queue head is due (a retry's time, a lease's end, an erasure's wait).
    public func nextDue(on connection: PostgresConnection, lane: OutboxLane) throws -> Duration? {
        try connection.value(SuppressionQueries.nextDue, [.text(lane.name)], as: Double?.self)
            .map { .untilDue(seconds: $0) }
    }

    /// A provider that failed (a 429, a 5xx, no answer) is not called again in this batch.
    public func failed(_ attempt: Attempt) -> Bool {
        if case .retryable = attempt.outcome { return true }
        return false
    }

    /// What one row's calls came to.
    public struct Attempt {
        var claim: ClaimedSuppression
        var outcome: SuppressionOutcome
        var status: Int?
        /// Retryable or refused for good.
        var failed: Bool { outcome.recordedName == "retry" || outcome.recordedName == "permanent" }
    }

    /// One row's calls to its provider, with no transaction open: a read first where it decides (an add,
    /// an SES remove), then the change.
    public func call(_ claim: ClaimedSuppression, lane: OutboxLane, on connection: PostgresConnection)
        -> Attempt
    {
        guard let provider = configuration.providers[lane.name], let client = sessions[lane.name] else {
            return Attempt(
                claim: claim, outcome: .retryable(after: nil, reason: "no such provider"), status: nil)
        }
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
                sentBefore = try connection.value(
                    SuppressionQueries.addSent, [.int(Int64(claim.id)), .text(lane.owner), .bool(listed)],
                    as: Bool.self)
            }
            // A remove reads first where the provider's entries say who listed them (SES).
            var entry = SuppressionEntry.ours
            if claim.action == .remove, let check = provider.removalCheck(address: claim.address) {
                let answer = try client.perform(check)
                status = answer.status
                let addedAt = try connection.value(
                    SuppressionQueries.addedAt, [.text(claim.provider), .text(claim.address)], as: Date?.self)
                guard let read = provider.entry(answer, addedAt: addedAt) else {
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
        return Attempt(claim: claim, outcome: outcome, status: status)
    }

    /// Records the attempts and releases `unsent` in one statement (`siwa.record_suppression_attempts`),
    /// each if its lease is still the lane's.
    public func record(
        _ made: [Attempt], unsent: [ClaimedSuppression], lane: OutboxLane, on connection: PostgresConnection
    ) throws -> [Outcome] {
        var parameters: [[PostgresData?]] = Array(repeating: [], count: 5)
        for attempt in made {
            var retryAfter: Double?
            var error: String?
            switch attempt.outcome {
            case .retryable(let after, let reason):
                retryAfter = after?.inSeconds
                error = reason
            case .permanent(let reason): error = reason
            default: break
            }
            parameters[0].append(.int(Int64(attempt.claim.id)))
            parameters[1].append(.text(attempt.outcome.recordedName))
            parameters[2].append(attempt.status.map { .int(Int64($0)) })
            parameters[3].append(error.map { .text(String($0.prefix(300))) })
            parameters[4].append(retryAfter.map { .double($0) })
        }
        for claim in unsent {
            parameters[0].append(.int(Int64(claim.id)))
            parameters[1].append(.text("released"))
            for column in 2..<5 { parameters[column].append(nil) }
        }
        let recorded = Set(
            try connection.query(
                SuppressionQueries.recordAttempts,
                [.text(lane.owner)] + parameters.map { .array($0) } + [
                    .int(Int64(configuration.maxAttempts)),
                    .double(configuration.calls.retrySchedule.base.inSeconds),
                    .double(configuration.calls.retrySchedule.maximum.inSeconds),
                ]
            ).map { row throws(PostgresError) in try row[0, as: Int.self] })
        return made.map { report($0, recorded: recorded.contains($0.claim.id), lane: lane) }
    }

    /// Counts and logs one attempt (or one whose lease was lost); its outcome.
    private func report(_ attempt: Attempt, recorded: Bool, lane: OutboxLane) -> Outcome {
        let claim = attempt.claim
        if recorded { attempts[attempt.outcome.recordedName]?.increment() }
        if !recorded {
            logger.warning(
                "suppression attempt not recorded: its lease expired and another lane took the row over",
                ["row": .int(claim.id), "provider": .string(lane.name)])
        } else if attempt.failed {
            logger.warning(
                "suppression call failed",
                [
                    "row": .int(claim.id), "provider": .string(lane.name),
                    "action": .string(claim.action.rawValue),
                    "attempt": .int(claim.attempt), "outcome": .string(attempt.outcome.recordedName),
                    "status": attempt.status.map { .int($0) } ?? .string("none"),
                ])
        }
        return Outcome(
            id: claim.id, provider: lane.name, action: claim.action, outcome: attempt.outcome,
            status: attempt.status, recorded: recorded)
    }
}

/// A lookup whose answer decided the attempt's outcome (a 429, a 5xx, a refusal).
private struct LookupFailure: Error {
    var outcome: SuppressionOutcome
}

/// A row `siwa.claim_suppressions` leased to a lane: what to ask of which provider.
public struct ClaimedSuppression: PostgresRowDecodable, Sendable {
    var id: Int
    var provider: String
    var kind: String
    var action: SuppressionAction
    var address: String
    /// This attempt's number (1 for the first).
    var attempt: Int

    // The claim's commit does not wait for the WAL flush: a claim a crash loses is claimed again (its
    // record then finds the lease gone), so at-least-once holds, one fsync per row cheaper.
    public static let statement = """
        WITH asynchronous AS (SELECT set_config('synchronous_commit', 'off', true))
        SELECT c.id, c.provider, c.kind, c.action, c.address, c.attempts
          FROM asynchronous, siwa.claim_suppressions($1, $2::float8 * interval '1 second', $3::integer, $4) AS c
        """
    public static let columns: PostgresColumns =
        "id bigint, provider text, kind text, action text, address text, attempts integer"

    public init(row: PostgresRow) throws(PostgresError) {
        id = try row[0, as: Int.self]
        provider = try row[1, as: String.self]
        kind = try row[2, as: String.self]
        action = try row[3, as: String.self] == "remove" ? .remove : .add
        address = try row[4, as: String.self]
        attempt = try row[5, as: Int.self]
    }
}
