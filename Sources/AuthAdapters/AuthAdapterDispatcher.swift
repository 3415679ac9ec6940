public import AuthPlatforms
public import Foundation
import HostedPlatforms
public import Postgres
public import QueueConsumer
public import ServiceSupport
import Synchronization

/// Applies each change of `siwa.changes` in the auth systems of `siwa.auth_adapters`
/// (`siwa.auth_adapter_events`, schema/76-auth-adapters.sql): at least once, in order per user and
/// adapter, each event one transaction on the auth system's own database (``AuthPlatform``), or a few
/// calls of a hosted platform's admin API (`HostedPlatform`: docs/adapters.md "Hosted platforms").
///
/// An ``Outbox`` of one lane per adapter (``OutboxLanes``: its own thread, connection to siwa and
/// connection to the auth database), so an auth system that is slow, down or refuses holds up no other
/// and never the notification queue. No lock and no transaction of siwa is held across the call:
/// `siwa.claim_auth_adapter_events` commits leases on up to ``OutboxCalls/batchSize`` rows of distinct
/// users, the lane applies each (its transaction on the auth database bounded by
/// ``OutboxCalls/timeout`` through `statement_timeout` and `lock_timeout`), then
/// `siwa.record_auth_adapter_events` records them: done (with what changed, counts only), no_user (the
/// sub links no user there: finished, never retried), or retry on the one schedule (dead after
/// ``Configuration/maxAttempts``). After a failed call the rest of the batch is released uncalled. The
/// auth database's URL is read from the adapter's `connection_ref` file (owner-only mode) at connect
/// time and again before each call: a rotated file reconnects, and the URL is never logged or stored.
public final class AuthAdapterDispatcher: Outbox {
    /// The dispatcher's settings.
    public struct Configuration: Sendable {
        /// siwa's database (the role needs `siwa_worker`), a lane per adapter, the batch, one event's
        /// deadline in the auth database, the retries' delays and the poll interval.
        public var calls: OutboxCalls
        /// The adapters this process serves, by name and id (``AuthAdapterDispatcher/adapters(in:)``).
        public var adapters: [Adapter]
        /// A row still failing after this many attempts is dead.
        public var maxAttempts: Int
        /// How long a claimed row of a database adapter stays leased (``OutboxCalls/lease(callsPerRow:)``:
        /// one transaction).
        public var lease: Duration { calls.lease() }
        /// How long a claimed row of a hosted adapter stays leased: its event's calls, together at most
        /// ``HostedAPI/eventBudget`` timeouts.
        public var hostedLease: Duration { calls.lease(callsPerRow: HostedAPI.eventBudget) }

        /// Settings; durations positive, at least one attempt.
        public init(
            database: PostgresConfiguration, adapters: [Adapter], batchSize: Int = 16,
            timeout: Duration = .seconds(10),
            retryBaseDelay: Duration = .seconds(5), maxRetryDelay: Duration = .seconds(3600),
            maxAttempts: Int = 30,
            pollInterval: Duration = .seconds(1), environment: [String: String] = [:]
        ) throws {
            calls = try OutboxCalls(
                "the auth adapter settings", database: database, concurrency: max(adapters.count, 1),
                batchSize: batchSize, timeout: timeout, retryBaseDelay: retryBaseDelay,
                maxRetryDelay: maxRetryDelay,
                pollInterval: pollInterval, environment: environment)
            guard maxAttempts >= 1 else {
                throw ConfigurationError("the auth adapter attempts must be at least 1")
            }
            self.adapters = adapters
            self.maxAttempts = maxAttempts
        }
    }

    /// An adapter of `siwa.auth_adapters`: the lane's name and the claim's id.
    public struct Adapter: Sendable, Hashable {
        /// Its name (`siwactl adapters`), the lane's name in logs.
        public var name: String
        /// Its id.
        public var id: Int
        /// Whether its platform is hosted (``AdapterSettings/isHosted``): its rows get the longer lease.
        public var isHosted: Bool
        /// An adapter.
        public init(name: String, id: Int, isHosted: Bool = false) {
            self.name = name
            self.id = id
            self.isHosted = isHosted
        }
    }

    /// What one row ended as.
    public struct Outcome: Sendable, Equatable {
        /// The row's id in `siwa.auth_adapter_events`.
        public var id: Int
        /// The adapter's name.
        public var adapter: String
        /// `done`, `no_user`, `retry` (due again on the schedule), `dead` (failed its last attempt),
        /// `rate_limited` (given back uncounted, the lane paused), or `lost` (the lease was taken over
        /// before the record: nothing written).
        public var state: String
        /// What changed (zero for no_user and failures).
        public var counts: AuthCounts
    }

    /// The channel the fan-out trigger and the operator's retries notify.
    public static let channel = "siwa_auth_adapters"

    /// The settings.
    public let configuration: Configuration
    /// One lane per adapter, on `siwa_auth_adapters`.
    public let lanes: OutboxLanes
    var logger: Logger { lanes.logger }
    private let adapters: [String: Adapter]
    /// Each lane's connection to its auth database, opened at its first call and kept; only the lane's
    /// own thread uses its entry.
    private let connections = Mutex<[String: AuthConnection]>([:])
    /// Each hosted adapter lane's admin API client, by lane.
    private let hosted = Mutex<[String: HostedClient]>([:])
    /// Lanes a platform's 429 paused, until when.
    private let pauses = Mutex<[String: ContinuousClock.Instant]>([:])
    private let calls: MetricsRegistry?

    /// A dispatcher; `metrics`, when given, gets `siwa_auth_adapter_events_total{adapter,outcome}`.
    public init(configuration: Configuration, logger: Logger, metrics: MetricsRegistry? = nil) {
        self.configuration = configuration
        lanes = OutboxLanes(
            name: "auth adapters", channel: Self.channel, database: configuration.calls.database,
            lanes: configuration.adapters.map(\.name),
            pollInterval: min(configuration.calls.pollInterval, .seconds(1)),
            logger: logger)
        adapters = Dictionary(uniqueKeysWithValues: configuration.adapters.map { ($0.name, $0) })
        calls = metrics
    }

    deinit { connections.withLock { $0.values.forEach { $0.connection.close() } } }

    /// The enabled adapters of `siwa.auth_adapters`, by name.
    public static func adapters(in database: PostgresConfiguration) throws -> [Adapter] {
        let connection = try PostgresConnection(configuration: database)
        defer { connection.close() }
        return try adapters(on: connection)
    }

    /// The enabled adapters of `siwa.auth_adapters`, by name, read on `connection`.
    public static func adapters(on connection: PostgresConnection) throws -> [Adapter] {
        try connection.query(AuthAdapterQueries.enabledAdapters).map { row throws(PostgresError) in
            Adapter(
                name: try row[0, as: String.self], id: try row[1, as: Int.self],
                isHosted: AdapterSettings.hostedPlatforms.contains(try row[2, as: String.self]))
        }
    }

    /// Leases up to ``OutboxCalls/batchSize`` rows of the lane's adapter due by `dueBy` (distinct users).
    public func claim(on connection: PostgresConnection, lane: OutboxLane, dueBy: Date) throws
        -> OutboxClaim<ClaimedAdapterEvent>
    {
        guard let adapter = adapters[lane.name], pause(of: lane) == nil else { return .nothing }
        let lease = adapter.isHosted ? configuration.hostedLease : configuration.lease
        let rows = try connection.rows(
            ClaimedAdapterEvent.self,
            [
                .text(lane.owner), .double(lease.inSeconds),
                .int(Int64(configuration.calls.batchSize)),
                .int(Int64(adapter.id)), .date(dueBy),
            ])
        return rows.isEmpty ? .nothing : .leased(rows)
    }

    /// How soon the adapter's next row is due (a retry's time, or a lease's end).
    public func nextDue(on connection: PostgresConnection, lane: OutboxLane) throws -> Duration? {
        if let pause = pause(of: lane) { return pause }
        guard let adapter = adapters[lane.name] else { return nil }
        return try connection.value(AuthAdapterQueries.nextDue, [.int(Int64(adapter.id))], as: Double?.self)
            .map { .untilDue(seconds: $0) }
    }

    /// How much longer the lane waits after a platform's 429; nil when it does not.
    private func pause(of lane: OutboxLane) -> Duration? {
        pauses.withLock { pauses in
            guard let until = pauses[lane.name] else { return nil }
            let remaining = until - ContinuousClock.now
            if remaining <= .zero { pauses[lane.name] = nil }
            return remaining > .zero ? remaining : nil
        }
    }

    /// What one row's call came to.
    public struct Attempt: Sendable {
        var event: ClaimedAdapterEvent
        /// done, no_user, retry, or released (rate limited: the lane waits, the attempt is not counted).
        var outcome: String
        var counts: AuthCounts
        /// Our own words (the platform, the table, the cause), never data.
        var error: String?
    }

    public func failed(_ attempt: Attempt) -> Bool {
        attempt.outcome == "retry" || attempt.outcome == "released"
    }

    /// Applies one event in the adapter's auth database, in one transaction there, or through a hosted
    /// platform's admin API; no transaction of siwa is open.
    public func call(_ event: ClaimedAdapterEvent, lane: OutboxLane, on _: PostgresConnection) -> Attempt {
        if event.adapter.isHosted { return callHosted(event, lane: lane) }
        do {
            let platform = try event.adapter.makePlatform()
            let connection = try authConnection(lane: lane.name, reference: event.adapter.connectionReference)
            let change: AuthChange
            do {
                change = try platform.apply(
                    event.event, sub: event.sub, policy: event.adapter.policy, on: connection)
            } catch {
                if error.isRetryable { forget(lane: lane.name) }
                throw error
            }
            switch change {
            case .noUser: return Attempt(event: event, outcome: "no_user", counts: AuthCounts())
            case .applied(let counts): return Attempt(event: event, outcome: "done", counts: counts)
            }
        } catch let error as AuthPlatformError {
            return Attempt(event: event, outcome: "retry", counts: AuthCounts(), error: error.description)
        } catch let error as ConfigurationError {
            return Attempt(event: event, outcome: "retry", counts: AuthCounts(), error: error.message)
        } catch let error as PostgresError {
            forget(lane: lane.name)
            return Attempt(
                event: event, outcome: "retry", counts: AuthCounts(),
                error: "cannot connect to the auth database: \(error.sqlState ?? error.code.description)"
                    + (error.connectionFailureReason.map { " (\($0))" } ?? ""))
        } catch {
            return Attempt(event: event, outcome: "retry", counts: AuthCounts(), error: "unexpected failure")
        }
    }

    /// Applies one event through the hosted platform's admin API. A 429 pauses the lane for the wait the
    /// platform asks (this adapter only) and gives the row back, its attempt uncounted.
    private func callHosted(_ event: ClaimedAdapterEvent, lane: OutboxLane) -> Attempt {
        do {
            let api = try hostedAPI(lane: lane.name, adapter: event.adapter)
            api.beginEvent()
            switch try api.platform.apply(event.event, sub: event.sub, policy: event.adapter.policy, api: api)
            {
            case .noUser: return Attempt(event: event, outcome: "no_user", counts: AuthCounts())
            case .applied(let counts): return Attempt(event: event, outcome: "done", counts: counts)
            }
        } catch let error as HostedCallError {
            // Found, then gone before the event's last call (deleted meanwhile): nothing left to apply.
            if error.kind == .userGone {
                return Attempt(event: event, outcome: "no_user", counts: AuthCounts())
            }
            if error.kind == .rateLimited {
                let wait = min(error.retryAfter ?? .seconds(1), .seconds(3600))
                pauses.withLock { $0[lane.name] = ContinuousClock.now + wait }
                return Attempt(
                    event: event, outcome: "released", counts: AuthCounts(), error: error.description)
            }
            return Attempt(event: event, outcome: "retry", counts: AuthCounts(), error: error.description)
        } catch let error as ConfigurationError {
            return Attempt(event: event, outcome: "retry", counts: AuthCounts(), error: error.message)
        } catch let error as AuthPlatformError {
            return Attempt(event: event, outcome: "retry", counts: AuthCounts(), error: error.description)
        } catch {
            return Attempt(event: event, outcome: "retry", counts: AuthCounts(), error: "unexpected failure")
        }
    }

    /// The lane's admin API client, made again when the credentials file changed (rotation: the next
    /// call gets a token with the new credentials).
    private func hostedAPI(lane: String, adapter: AdapterSettings) throws -> HostedAPI {
        let credentials = try AuthDatabase.connectionFile(adapter.connectionReference)
        if let kept = hosted.withLock({ $0[lane] }), kept.credentials == credentials { return kept.api }
        let api = HostedAPI(
            platform: try adapter.makeHostedPlatform(credentials: credentials),
            timeout: configuration.calls.timeout, environment: configuration.calls.environment)
        hosted.withLock { $0[lane] = HostedClient(credentials: credentials, api: api) }
        return api
    }

    /// Records the batch in one statement (`siwa.record_auth_adapter_events`), each row if its lease is
    /// still the lane's.
    public func record(
        _ attempts: [Attempt], unsent: [ClaimedAdapterEvent], lane: OutboxLane,
        on connection: PostgresConnection
    ) throws -> [Outcome] {
        let rows =
            attempts.map { ($0.event.id, $0.outcome, $0.error, $0.outcome == "retry" ? nil : $0.counts.json) }
            + unsent.map { ($0.id, "released", String?.none, String?.none) }
        let recorded = Set(
            try connection.query(
                AuthAdapterQueries.record,
                [
                    .text(lane.owner), .array(rows.map { .int(Int64($0.0)) }),
                    .array(rows.map { .text($0.1) }),
                    .array(rows.map { $0.2.map { .text(String($0.prefix(300))) } }),
                    .array(rows.map { $0.3.map { .text($0) } }), .int(Int64(configuration.maxAttempts)),
                    .double(configuration.calls.retrySchedule.base.inSeconds),
                    .double(configuration.calls.retrySchedule.maximum.inSeconds),
                ]
            ).map { row throws(PostgresError) in try row[0, as: Int.self] })
        return attempts.map { attempt in
            let kept = recorded.contains(attempt.event.id)
            let state =
                !kept
                ? "lost"
                : attempt.outcome == "retry" && attempt.event.attempt >= configuration.maxAttempts
                    ? "dead"
                    : attempt.outcome == "released" ? "rate_limited" : attempt.outcome
            calls?.counter(
                "siwa_auth_adapter_events_total",
                help: "Auth adapter events handled, by adapter and outcome.",
                labels: [("adapter", lane.name), ("outcome", state)]
            ).increment()
            if !kept {
                logger.warning(
                    "auth adapter event not recorded: its lease expired and another lane took it over",
                    ["row": .int(attempt.event.id), "adapter": .string(lane.name)])
            } else if let error = attempt.error {
                logger.warning(
                    "auth adapter event failed; will retry",
                    [
                        "row": .int(attempt.event.id), "adapter": .string(lane.name),
                        "attempt": .int(attempt.event.attempt), "error": .string(error),
                    ])
            }
            return Outcome(id: attempt.event.id, adapter: lane.name, state: state, counts: attempt.counts)
        }
    }

    /// The lane's open connection to the auth database at `reference`, reconnecting when the file's URL
    /// changed (rotation) or none is open.
    private func authConnection(lane: String, reference: String) throws -> PostgresConnection {
        let url = try AuthDatabase.url(reference)
        if let open = connections.withLock({ $0[lane] }), open.url == url { return open.connection }
        forget(lane: lane)
        let connection = try AuthDatabase.connect(
            url, applicationName: "siwa-auth-adapter-\(lane)", timeout: configuration.calls.timeout)
        connections.withLock { $0[lane] = AuthConnection(url: url, connection: connection) }
        return connection
    }

    /// Closes the lane's connection to its auth database (after a failure that may have broken it).
    private func forget(lane: String) {
        connections.withLock { $0.removeValue(forKey: lane) }?.connection.close()
    }
}

/// A hosted adapter lane's admin API client and the credentials it was made with.
struct HostedClient: @unchecked Sendable {
    var credentials: String
    var api: HostedAPI
}

/// A lane's connection to its auth database and the URL it was opened with.
struct AuthConnection: @unchecked Sendable {
    var url: String
    var connection: PostgresConnection
}

extension AuthCounts {
    /// The counts as `siwa.record_auth_adapter_events` keeps them: `{"name": number}`, zeros left out.
    var json: String {
        let pairs: [(String, Int)] = [
            ("users_deleted", usersDeleted), ("users_disabled", usersDisabled),
            ("identities_unlinked", identitiesUnlinked), ("identities_moved", identitiesMoved),
            ("sessions_ended", sessionsEnded), ("refresh_tokens_revoked", refreshTokensRevoked),
            ("metadata_recorded", metadataRecorded),
        ]
        return "{" + pairs.filter { $0.1 != 0 }.map { "\"\($0.0)\": \($0.1)" }.joined(separator: ", ") + "}"
    }
}
