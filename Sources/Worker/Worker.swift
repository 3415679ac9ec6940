import Dispatch
import Foundation
import Postgres
public import ServiceSupport
import Synchronization

/// Applies stored notifications exactly once: claims due ones in batches, applies each with its effects
/// in the same transaction that marks it applied, retries failures with backoff, and keeps the
/// retention settings.
///
/// Each of `configuration.concurrency` lanes is a thread with its own connection that listens on
/// `siwa_notifications`, drains what is due, then waits for a notification, the next due retry or the
/// poll interval. One more thread, with its own connection, runs maintenance (erasure that has become
/// due, retention) every `maintenanceInterval`, whatever the lanes are doing. All of them survive
/// database restarts (they reconnect with backoff), and all are joined before ``run()`` or
/// ``drainOnce()`` returns.
public final class Worker: Sendable {
    /// What the worker did to one notification. New outcomes may be added.
    public struct Outcome: Hashable, Sendable, CustomStringConvertible {
        /// The name used in the database, logs and metrics.
        public let name: String
        init(_ name: String) { self.name = name }
        public var description: String { name }

        /// Its effects were committed.
        public static let applied = Outcome("applied")
        /// Nothing to do (e.g. an unknown event type); the reason is in `last_error`.
        public static let skipped = Outcome("skipped")
        /// The attempt failed; another is scheduled with backoff.
        public static let retry = Outcome("retry")
        /// The attempt failed and it was the last one allowed.
        public static let dead = Outcome("dead")
        /// It was no longer pending when a failure was to be recorded (another lane finished it).
        public static let gone = Outcome("gone")
        /// Another transaction (another lane, maintenance, the app) held the user's account row: put off
        /// briefly without counting an attempt.
        public static let busy = Outcome("busy")
        /// Its stored token did not verify (or it had none): nothing applied, state `rejected`.
        public static let rejected = Outcome("rejected")
        /// Its queue row pointed at a notification that is not pending (already finished): deleted,
        /// nothing applied.
        public static let refused = Outcome("refused")
        /// Its token's key could not be had (the key set cannot be fetched): put off, no attempt.
        public static let deferred = Outcome("deferred")

        /// The outcomes this worker knows; the database may report others (a newer schema.sql).
        public static let known: [Outcome] = [
            .applied, .skipped, .retry, .dead, .gone, .busy, .rejected, .refused, .deferred,
        ]
    }

    /// Counts of what one call to ``drainOnce()`` did.
    public struct DrainSummary: Sendable, Hashable {
        /// Notifications applied.
        public var applied = 0
        /// Notifications skipped (nothing to do).
        public var skipped = 0
        /// Failed attempts that will be retried.
        public var retried = 0
        /// Notifications that became dead.
        public var dead = 0
        /// Times a notification was found busy (its user's account row held by another transaction) and
        /// put off without an attempt.
        public var busy = 0
        /// Notifications whose stored token did not verify (nothing applied).
        public var rejected = 0
        /// Queue rows of notifications already finished (nothing applied).
        public var refused = 0
        /// Notifications put off because their key could not be had.
        public var deferred = 0

        /// An empty summary.
        public init() {}

        mutating func record(_ outcome: Outcome) {
            switch outcome {
            case .applied: applied += 1
            case .skipped: skipped += 1
            case .retry: retried += 1
            case .dead: dead += 1
            case .busy: busy += 1
            case .rejected: rejected += 1
            case .refused: refused += 1
            case .deferred: deferred += 1
            default: break
            }
        }

        mutating func add(_ other: DrainSummary) {
            applied += other.applied
            skipped += other.skipped
            retried += other.retried
            dead += other.dead
            busy += other.busy
            rejected += other.rejected
            refused += other.refused
            deferred += other.deferred
        }
    }

    /// The configuration the worker was created with.
    public let configuration: Configuration
    let logger: Logger
    let metrics: WorkerMetrics
    /// The one stop signal of every lane and of maintenance: wakes their sleeps and LISTEN waits at once.
    let stopSignal = StopSignal()

    /// Creates a worker; nothing connects until ``run()`` or ``drainOnce()``.
    /// - Parameters:
    ///   - logger: receives one line per handled notification and connection events; never emails or tokens.
    ///   - metrics: where the worker registers its counters and histograms.
    public init(configuration: Configuration, logger: Logger, metrics: MetricsRegistry = MetricsRegistry()) {
        self.configuration = configuration
        self.logger = logger
        self.metrics = WorkerMetrics(registry: metrics)
    }

    /// Runs every lane until ``stop()`` is called, then returns once each lane finished its current batch.
    public func run() {
        logger.info(
            "worker starting",
            [
                "concurrency": .int(configuration.concurrency), "batch_size": .int(configuration.batchSize),
                "database": .string(configuration.database.description),
            ])
        _ = runLanes(once: false)
        logger.info("worker stopped")
    }

    /// Asks ``run()`` (or ``drainOnce()``) to finish the batches in progress and return. Safe from any thread.
    public func stop() {
        stopSignal.stop()
    }

    /// Whether ``stop()`` has been called.
    public var isStopping: Bool { stopSignal.isStopped }

    /// Processes everything that is due now with all lanes, runs the maintenance pass once, and returns.
    ///
    /// Retries scheduled by this drain are not waited for, nor are notifications whose users stay busy
    /// (their account rows held by another transaction): they remain pending for a later drain. A
    /// notification put off only because another lane of this drain held its user is done in a further
    /// round, once due again; rounds end when one makes no progress or nothing is left busy.
    /// - Throws: `WorkerError` with code `.database` when a lane cannot reach the database.
    public func drainOnce() throws(WorkerError) -> DrainSummary {
        var total = DrainSummary()
        while true {
            let round = runLanes(once: true)
            total.add(round.summary)
            if let failure = round.failure { throw failure }
            let progress =
                round.summary.applied + round.summary.skipped + round.summary.retried + round.summary.dead
                + round.summary.rejected + round.summary.refused
            // Read once every lane is done: a lane's own look may precede another lane's put-off.
            guard !isStopping, progress > 0, let wait = try busyDue() else { break }
            sleep(min(max(wait, .milliseconds(10)), .seconds(5)))
        }
        if !isStopping, let failure = Maintenance(worker: self).runOnce() { throw failure }
        return total
    }

    /// How soon the first notification put off as busy is due again; nil when none is pending.
    private func busyDue() throws(WorkerError) -> Duration? {
        do throws(PostgresError) {
            let connection = try connect(listen: false, fields: ["task": .string("drain")])
            defer { connection.close() }
            return try connection.rows(BusyUsers.self).first?.firstDue
        } catch {
            throw WorkerError(code: .database, message: error.description)
        }
    }

    private struct Round {
        var summary = DrainSummary()
        var failure: WorkerError?
    }

    private func runLanes(once: Bool) -> Round {
        let results = Mutex(Round())
        var threads: [JoinableThread] = []
        if !once {
            threads.append(
                JoinableThread(name: "siwa-worker-maintenance") { [self] in Maintenance(worker: self).run() })
        }
        for index in 0..<configuration.concurrency {
            threads.append(
                JoinableThread(name: "siwa-worker-\(index)") { [self] in
                    let lane = Lane(worker: self, index: index, once: once)
                    let (summary, failure) = lane.run()
                    results.withLock { round in
                        round.summary.add(summary)
                        if round.failure == nil { round.failure = failure }
                    }
                })
        }
        for thread in threads { thread.join() }
        return results.withLock { $0 }
    }

    /// Opens a connection with the worker's statement and lock timeouts (and LISTEN, for a lane).
    func connect(listen: Bool, fields: [String: Logger.Value]) throws(PostgresError) -> PostgresConnection {
        let connection = try PostgresConnection(configuration: configuration.database)
        do throws(PostgresError) {
            let statementTimeout = configuration.statementTimeout.map { String($0.wholeMilliseconds) } ?? "0"
            let lockTimeout = configuration.lockTimeout.map { String($0.wholeMilliseconds) } ?? "0"
            try connection.simpleQuery(
                "SET statement_timeout = \(statementTimeout); SET lock_timeout = \(lockTimeout)")
            if listen { try connection.listen(Lane.channel) }
        } catch {
            connection.close()
            throw error
        }
        var fields = fields
        fields["backend_pid"] = .int(Int(connection.backendProcessID))
        logger.info("connected", fields)
        return connection
    }

    /// Sleeps up to `duration`, woken at once when the worker stops.
    func sleep(_ duration: Duration) {
        stopSignal.sleep(duration)
    }
}

/// The worker's Prometheus metrics.
final class WorkerMetrics: Sendable {
    /// Counts one handled notification under its outcome (or `unknown`): none goes uncounted.
    func count(_ outcome: Worker.Outcome) {
        (outcomes[outcome] ?? unknownOutcomes).increment()
        if outcome == .applied || outcome == .skipped {
            lastApplicationMilliseconds.store(Int(Date().timeIntervalSince1970 * 1000), ordering: .relaxed)
        }
    }

    /// When this process last applied or skipped a notification (Unix milliseconds; 0: not yet).
    let lastApplicationMilliseconds = Atomic<Int>(0)

    let outcomes: [Worker.Outcome: Counter]
    /// Outcomes this worker does not know (reported by a newer schema), counted under one label so that
    /// the database cannot create series.
    let unknownOutcomes: Counter
    let latency: Histogram
    let batchFailures: Counter
    let reconnects: Counter
    let connectedLanes: Gauge
    let maintenanceErrors: Counter
    let maintenancePasses: Counter
    /// Set by the lanes after each drain; rendered as seconds.
    let oldestBusyMilliseconds: Atomic<Int>

    init(registry: MetricsRegistry) {
        var outcomes: [Worker.Outcome: Counter] = [:]
        for outcome in Worker.Outcome.known {
            outcomes[outcome] = registry.counter(
                "siwa_worker_notifications_total", help: "Notifications handled by the worker, by outcome.",
                labels: [("outcome", outcome.name)])
        }
        self.outcomes = outcomes
        unknownOutcomes = registry.counter(
            "siwa_worker_notifications_total", help: "Notifications handled by the worker, by outcome.",
            labels: [("outcome", "unknown")])
        latency = registry.histogram(
            "siwa_worker_notification_latency_seconds",
            help: "Seconds from receiving a notification to applying (or skipping) it.")
        batchFailures = registry.counter(
            "siwa_worker_batch_failures_total",
            help: "Batches that failed as a whole and were retried one notification at a time.")
        reconnects = registry.counter(
            "siwa_worker_reconnects_total",
            help: "Times a lane lost or could not open its database connection.")
        connectedLanes = registry.gauge(
            "siwa_worker_connected_lanes", help: "Lanes currently connected to the database.")
        maintenanceErrors = registry.counter(
            "siwa_worker_maintenance_errors_total",
            help: "Maintenance passes (retention, erasure) that failed.")
        maintenancePasses = registry.counter(
            "siwa_worker_maintenance_passes_total",
            help: "Maintenance passes (retention, erasure) completed.")
        oldestBusyMilliseconds = Atomic(0)
        registry.computedGauge(
            "siwa_worker_oldest_busy_seconds",
            help: "How long the longest-busy pending notification has waited for its user's account row "
                + "(held by another transaction), as of the last drain; 0 when none is busy."
        ) { [self] in Double(oldestBusyMilliseconds.load(ordering: .relaxed)) / 1000 }
        registry.computedGauge(
            "siwa_worker_last_application_timestamp_seconds",
            help: "Unix time this worker process last applied or skipped a notification; 0 since its start."
        ) { [self] in Double(lastApplicationMilliseconds.load(ordering: .relaxed)) / 1000 }
    }
}
