import Dispatch
import Foundation
import Postgres
import ServiceSupport
import Synchronization

/// Applies stored notifications exactly once: claims due ones in batches, applies each with its effects
/// in the same transaction that marks it applied, retries failures with backoff, and keeps the
/// retention settings.
///
/// Each of `configuration.concurrency` lanes is a thread with its own connection that listens on
/// `siwa_notifications`, drains what is due, then waits for a notification, the next due retry or the
/// poll interval. Lanes survive database restarts (they reconnect with backoff).
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
        /// Another lane was working on the same user; it stays due.
        public static let busy = Outcome("busy")
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

        /// An empty summary.
        public init() {}

        mutating func record(_ outcome: Outcome) {
            switch outcome {
            case .applied: applied += 1
            case .skipped: skipped += 1
            case .retry: retried += 1
            case .dead: dead += 1
            default: break
            }
        }

        mutating func add(_ other: DrainSummary) {
            applied += other.applied
            skipped += other.skipped
            retried += other.retried
            dead += other.dead
        }
    }

    /// The configuration the worker was created with.
    public let configuration: Configuration
    let logger: Logger
    let metrics: WorkerMetrics
    private let stopRequested = Atomic<Bool>(false)

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
        stopRequested.store(true, ordering: .sequentiallyConsistent)
    }

    /// Whether ``stop()`` has been called.
    public var isStopping: Bool { stopRequested.load(ordering: .sequentiallyConsistent) }

    /// Processes everything that is due now with all lanes, runs the maintenance pass once, and returns.
    ///
    /// Retries scheduled by this drain are not waited for.
    /// - Throws: `WorkerError` with code `.database` when a lane cannot reach the database.
    public func drainOnce() throws(WorkerError) -> DrainSummary {
        let (summary, failure) = runLanes(once: true)
        if let failure { throw failure }
        return summary
    }

    private func runLanes(once: Bool) -> (DrainSummary, WorkerError?) {
        let results = Mutex<(DrainSummary, WorkerError?)>((DrainSummary(), nil))
        let group = DispatchGroup()
        for index in 0..<configuration.concurrency {
            group.enter()
            let thread = Thread { [self] in
                let lane = Lane(worker: self, index: index, once: once)
                let (summary, failure) = lane.run()
                results.withLock { state in
                    state.0.add(summary)
                    if state.1 == nil { state.1 = failure }
                }
                group.leave()
            }
            thread.name = "siwa-worker-\(index)"
            thread.start()
        }
        group.wait()
        // Erasure and retention after every lane has finished, so that no lane still holds a user.
        if once, results.withLock({ $0.1 == nil }), !isStopping,
            let failure = Lane(worker: self, index: 0, once: true).maintainOnce()
        {
            results.withLock { $0.1 = failure }
        }
        return results.withLock { $0 }
    }
}

/// The worker's Prometheus metrics.
struct WorkerMetrics: Sendable {
    let outcomes: [Worker.Outcome: Counter]
    let latency: Histogram
    let batchFailures: Counter
    let reconnects: Counter
    let connectedLanes: Gauge
    let maintenanceErrors: Counter

    init(registry: MetricsRegistry) {
        var outcomes: [Worker.Outcome: Counter] = [:]
        for outcome in [Worker.Outcome.applied, .skipped, .retry, .dead, .gone, .busy] {
            outcomes[outcome] = registry.counter(
                "siwa_worker_notifications_total", help: "Notifications handled by the worker, by outcome.",
                labels: [("outcome", outcome.name)])
        }
        self.outcomes = outcomes
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
    }
}
