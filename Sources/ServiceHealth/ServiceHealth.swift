import Foundation
public import Postgres
import QueueConsumer
public import ServiceSupport
import Synchronization

/// What a running siwa-receiver or siwa-worker tells the database about itself, and the database's
/// health gauges for its `/metrics`.
///
/// One connection of its own, opened lazily and reopened after an error: a heartbeat row in
/// `siwa.service_heartbeats` every ``Configuration/heartbeatInterval`` (stale rows of the same kind
/// pruned, its own row deleted on ``stop()``), and `siwa.health_gauges` at most once per
/// ``Configuration/cacheDuration``, whatever the number of scrapes.
public final class ServiceHealth: Sendable {
    /// Which service a process is; the row-level policy lets each role write only its own kind.
    public struct Kind: Hashable, Sendable, CustomStringConvertible {
        /// The value of `siwa.service_heartbeats.kind`.
        public let name: String
        public var description: String { name }
        /// siwa-receiver.
        public static let receiver = Kind(name: "receiver")
        /// siwa-worker.
        public static let worker = Kind(name: "worker")
    }

    /// The settings, built once by the executable.
    public struct Configuration: Sendable {
        /// The database holding schema.sql (the process's own URL and role).
        public var database: PostgresConfiguration
        /// Receiver or worker.
        public var kind: Kind
        /// The receiver's accepted audiences, or the worker revoker's client IDs (empty when off).
        public var audiences: [String]
        /// The product version the process was built as, e.g. `5.0.0`.
        public var version: String
        /// The commit it was built from (`unknown` when not known at build time).
        public var commit: String
        /// The schema version it embeds (recorded as `schema N` in the `version` column, as before
        /// version 5; the product version and commit have their own columns).
        public var schemaVersion: Int
        /// How often the heartbeat row is refreshed.
        public var heartbeatInterval: Duration = .seconds(15)
        /// How long one reading of the gauges is served before the database is asked again.
        public var cacheDuration: Duration = .seconds(5)
        /// Rows of the same kind not seen for this long are deleted.
        public var pruneAfter: Duration = .seconds(86_400)
        /// The host name recorded (default: `gethostname`).
        public var host: String = ServiceHealth.hostName()
        /// The process ID recorded.
        public var processID: Int32 = getpid()
        /// Server-side limit per statement of this connection.
        public var statementTimeout: Duration = .seconds(30)

        /// - Throws: ``ConfigurationError`` for a non-positive interval.
        public init(
            database: PostgresConfiguration, kind: Kind, audiences: [String], version: String,
            commit: String, schemaVersion: Int, heartbeatInterval: Duration = .seconds(15)
        ) throws {
            guard heartbeatInterval > .zero else {
                throw ConfigurationError("the heartbeat interval must be positive")
            }
            self.database = database
            self.kind = kind
            self.audiences = audiences.sorted()
            self.version = version
            self.commit = commit
            self.schemaVersion = schemaVersion
            self.heartbeatInterval = heartbeatInterval
        }
    }

    /// One reading of `siwa.health_gauges`, in Unix seconds.
    public struct Snapshot: Sendable, Equatable {
        /// The latest notification stored by any receiver (`nil`: none within 400 days).
        public var lastReceived: Double?
        /// When schema version 1 was recorded.
        public var installed: Double?
        /// The latest application (applied or skipped; `nil`: none stored).
        public var lastApplied: Double?
        /// Dead notifications.
        public var dead: Int
        /// Age of the oldest pending notification (0: none pending).
        public var oldestPendingSeconds: Double
    }

    private struct State: ~Copyable {
        var connection: PostgresConnection?
        var snapshot: Snapshot?
        var fetchedAt: ContinuousClock.Instant?
        var lastFetchFailed = false
        var heartbeatFailed = false
    }

    /// The configuration it runs with.
    public let configuration: Configuration
    private let logger: Logger
    private let startedAt = Date()
    private let state = Mutex(State())
    /// The last reading, for callers that find `state` busy.
    private let published = Mutex<(done: Bool, failed: Bool, snapshot: Snapshot?)>((false, false, nil))
    /// The heartbeat thread and its stop signal, while started.
    private let running = Mutex<(thread: JoinableThread, stop: StopSignal)?>(nil)

    public init(configuration: Configuration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
    }

    /// The host name as `gethostname` gives it ("unknown" if it fails).
    public static func hostName() -> String {
        var buffer = [CChar](repeating: 0, count: 256)
        guard gethostname(&buffer, buffer.count - 1) == 0 else { return "unknown" }
        let name = String(cString: buffer)
        return name.isEmpty ? "unknown" : String(name.prefix(255))
    }

    // MARK: Metrics

    /// Registers the database's gauges on `registry`; each scrape reads them through ``snapshot()``.
    public func register(on registry: MetricsRegistry) {
        registry.computedGauge(
            "siwa_health_gauges_up",
            help:
                "1 when the database answered the last reading of the siwa_* health gauges, else 0 (they are NaN)."
        ) { [self] in snapshot() == nil ? 0 : 1 }
        registry.computedGauge(
            "siwa_last_verified_notification_timestamp_seconds",
            help: "Unix time of the latest notification stored by any receiver (from the database); "
                + "the schema's installation time when none was stored within 400 days."
        ) { [self] in
            guard let snapshot = snapshot() else { return .nan }
            return snapshot.lastReceived ?? snapshot.installed ?? 0
        }
        registry.computedGauge(
            "siwa_last_application_timestamp_seconds",
            help:
                "Unix time of the latest notification applied or skipped by any worker (from the database); 0 when none."
        ) { [self] in snapshot().map { $0.lastApplied ?? 0 } ?? .nan }
        registry.computedGauge(
            "siwa_dead_notifications",
            help: "Notifications the workers gave up on (state dead; siwactl replay requeues them)."
        ) { [self] in snapshot().map { Double($0.dead) } ?? .nan }
        registry.computedGauge(
            "siwa_oldest_pending_notification_age_seconds",
            help:
                "Seconds since the oldest pending notification (in arrival order) was received; 0 when none is pending."
        ) { [self] in snapshot()?.oldestPendingSeconds ?? .nan }
    }

    /// The gauges, read from the database when the last reading is older than
    /// ``Configuration/cacheDuration``; `nil` when the database cannot answer now. Once a first reading
    /// is done, a caller that finds the connection busy (another reading, a heartbeat) gets the last
    /// reading instead of waiting: a scrape never queues behind the database.
    public func snapshot() -> Snapshot? {
        let last = published.withLock { $0 }
        if last.done, let answer = state.withLockIfAvailable({ read(&$0) }) { return answer }
        if last.done { return last.failed ? nil : last.snapshot }
        return state.withLock { read(&$0) }
    }

    /// One reading (or the cached one), with the state locked; publishes it.
    private func read(_ state: inout State) -> Snapshot? {
        if let fetchedAt = state.fetchedAt, ContinuousClock.now - fetchedAt < configuration.cacheDuration {
            return state.lastFetchFailed ? nil : state.snapshot
        }
        let since = state.snapshot?.lastReceived
        do {
            let connection = try Self.open(&state.connection, configuration)
            var snapshot = try connection.rows(Snapshot.self, [since.map { .double($0) }])[0]
            // NULL with a bound: nothing received since; the previous answer stands.
            snapshot.lastReceived = snapshot.lastReceived ?? since
            state.snapshot = snapshot
            state.lastFetchFailed = false
        } catch {
            state.connection?.close()
            state.connection = nil
            if !state.lastFetchFailed {
                logger.warning("cannot read the health gauges", ["error": .string(Self.describe(error))])
            }
            state.lastFetchFailed = true
        }
        state.fetchedAt = ContinuousClock.now
        let reading = (done: true, failed: state.lastFetchFailed, snapshot: state.snapshot)
        published.withLock { $0 = reading }
        return reading.failed ? nil : reading.snapshot
    }

    // MARK: Heartbeats

    /// Records one heartbeat now (and prunes stale rows of the same kind).
    public func beat() throws {
        try state.withLock { state in
            do {
                let connection = try Self.open(&state.connection, configuration)
                try connection.query(
                    """
                    SELECT siwa.record_heartbeat($1, $2, $3::integer, $4::integer, $5, $6, $7::text[], $8,
                                                 $9::float8 * interval '1 second')
                    """,
                    [
                        .text(configuration.kind.name), .text(configuration.host),
                        .int(Int64(configuration.processID)), .int(Int64(configuration.schemaVersion)),
                        .text(configuration.version), .text(configuration.commit),
                        .array(configuration.audiences.map { .text($0) }), .date(startedAt),
                        .double(configuration.pruneAfter.inSeconds),
                    ])
            } catch {
                state.connection?.close()
                state.connection = nil
                throw error
            }
        }
    }

    /// Starts the heartbeat thread: a heartbeat and a first reading of the gauges at once (so the first
    /// scrape finds them warm), then a heartbeat every interval (a ``ConsumerLoop`` without LISTEN: a
    /// failed heartbeat is tried again after the shared reconnect backoff, not a whole interval later).
    public func start() {
        let stop = StopSignal()
        let started = JoinableThread(name: "siwa-heartbeat") { [self] in
            warnAboutRole()
            _ = snapshot()
            var loop = ConsumerLoop<Void>(
                state: ConsumerLoopState(pollInterval: configuration.heartbeatInterval), stop: stop,
                connect: {},
                drain: { [self] _ in
                    try beat()
                    let recovered = state.withLock { state in
                        defer { state.heartbeatFailed = false }
                        return state.heartbeatFailed
                    }
                    if recovered { logger.info("heartbeats recorded again") }
                    return nil
                },
                wait: { _, duration in stop.sleep(duration) },
                close: {},
                failed: { [self] error, _ in
                    let first = state.withLock { state in
                        defer { state.heartbeatFailed = true }
                        return !state.heartbeatFailed
                    }
                    if first {
                        logger.warning("cannot record a heartbeat", ["error": .string(Self.describe(error))])
                    }
                })
            try? loop.run()
        }
        running.withLock { $0 = (started, stop) }
    }

    /// Stops the heartbeat thread (woken at once, and joined) and deletes this process's row, so that a
    /// stopped process does not look alive; closes the connection.
    public func stop() {
        let started = running.withLock { running in
            defer { running = nil }
            return running
        }
        started?.stop.stop()
        started?.thread.join()
        state.withLock { state in
            if let connection = try? Self.open(&state.connection, configuration) {
                _ = try? connection.query(
                    "SELECT siwa.remove_heartbeat($1, $2, $3::integer)",
                    [
                        .text(configuration.kind.name), .text(configuration.host),
                        .int(Int64(configuration.processID)),
                    ])
            }
            state.connection?.close()
            state.connection = nil
        }
    }

    /// Logs a warning when the process's role is a superuser or the owner of schema siwa (or a member
    /// of it): such a role may do anything to the data, far more than the group role's grant says, so a
    /// bug or a compromised process is not contained. Checked once, at start.
    func warnAboutRole() {
        let standing: RoleStanding? = state.withLock { state in
            guard let connection = try? Self.open(&state.connection, configuration) else { return nil }
            return try? connection.rows(RoleStanding.self).first
        }
        guard let standing, standing.superuser || standing.owner else { return }
        let group = configuration.kind == .receiver ? "siwa_receiver" : "siwa_worker"
        logger.warning(
            standing.superuser
                ? "connected as a superuser: this process may do anything to every database of the server; log in as a member of \(group) instead"
                : "connected as the owner of schema siwa: this process may change or drop any of its tables; log in as a member of \(group) instead",
            ["role": .string(standing.user), "group_role": .string(group)])
    }

    private static func open(_ connection: inout PostgresConnection?, _ configuration: Configuration) throws
        -> PostgresConnection
    {
        if let existing = connection, existing.isHealthy { return existing }
        connection?.close()
        connection = nil
        var database = configuration.database
        database.applicationName = (database.applicationName ?? "siwa") + "-health"
        let opened = try PostgresConnection(configuration: database)
        do {
            try opened.query(
                "SELECT set_config('statement_timeout', $1, false)",
                [.text("\(Int(configuration.statementTimeout.inSeconds * 1000))ms")])
        } catch {
            opened.close()
            throw error
        }
        connection = opened
        return opened
    }

    /// An error for the log: the database error's code and SQLSTATE, without its message (which may
    /// quote values).
    private static func describe(_ error: any Error) -> String {
        (error as? PostgresError)?.description ?? "\(error)"
    }
}

extension ServiceHealth.Snapshot: PostgresRowDecodable {
    /// `siwa.health_gauges`, times as seconds since 1970; `$1`: the last answer's `lastReceived`.
    public static let statement = """
        SELECT extract(epoch FROM g.last_received_at)::float8 AS last_received,
               extract(epoch FROM g.installed_at)::float8 AS installed,
               extract(epoch FROM g.last_applied_at)::float8 AS last_applied, g.dead, g.oldest_pending_seconds
          FROM siwa.health_gauges(to_timestamp($1::float8)) g
        """
    public static let columns: PostgresColumns = """
        last_received double precision, installed double precision, last_applied double precision, \
        dead bigint, oldest_pending_seconds double precision
        """

    public init(row: PostgresRow) throws(PostgresError) {
        lastReceived = try row[0, as: Double?.self]
        installed = try row[1, as: Double?.self]
        lastApplied = try row[2, as: Double?.self]
        dead = try row[3, as: Int.self]
        oldestPendingSeconds = try row[4, as: Double.self]
    }
}

/// Whether this session's role is a superuser or a member of the owner of schema `siwa`.
struct RoleStanding: PostgresRowDecodable {
    static let statement = """
        SELECT current_user::text AS role, r.rolsuper,
               coalesce((SELECT pg_has_role(current_user, n.nspowner, 'USAGE')
                           FROM pg_namespace n WHERE n.nspname = 'siwa'), false) AS owner
          FROM pg_roles r WHERE r.rolname = current_user
        """
    static let columns: PostgresColumns = "role text, rolsuper boolean, owner boolean"
    var user: String
    var superuser: Bool
    var owner: Bool

    init(row: PostgresRow) throws(PostgresError) {
        user = try row[0, as: String.self]
        superuser = try row[1, as: Bool.self]
        owner = try row[2, as: Bool.self]
    }
}
