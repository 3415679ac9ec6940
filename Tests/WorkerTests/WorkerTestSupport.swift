import Dispatch
import Foundation
import Postgres
import ServiceSupport
import Synchronization
import TestSupport
import Worker

/// The worker's helpers on TestSupport's `TestDatabase` (schema.sql, the owner's connection).
extension TestDatabase {
    /// Stores one pending notification as siwa-receiver does; `eventTime` and `issuedAt` are SQL (e.g.
    /// `now() - interval '1 hour'`).
    func insert(
        jti: String, type: String, sub: String, eventTime: String = "now()", email: String? = nil,
        issuedAt: String = "now()"
    ) throws {
        try connection.storeAsReceiver(
            SeededNotification(
                jti: jti, type: type, sub: sub, email: email, isPrivateEmail: email.map { _ in true },
                eventTime: connection.instant(eventTime),
                issuedAt: connection.instant(issuedAt)))
    }

    /// The state of the notification with `jti`.
    func state(_ jti: String) throws -> String {
        try value("SELECT state FROM siwa.notifications WHERE jti = $1", [.text(jti)])
    }

    /// A worker on this database with test-friendly timings.
    func worker(
        concurrency: Int = 2, batchSize: Int = 10,
        maxAttempts: Int = 3, retryBaseDelay: Duration = .milliseconds(5),
        statementTimeout: Duration? = .seconds(30), lockTimeout: Duration? = .seconds(5),
        retainTokens: Duration? = nil, retainEvents: Duration? = nil,
        maintenanceInterval: Duration = .seconds(60), logger: Logger = quietLogger,
        metrics: MetricsRegistry = MetricsRegistry()
    ) throws -> Worker {
        Worker(
            configuration: try Worker.Configuration(
                database: configuration, verification: .tests, concurrency: concurrency, batchSize: batchSize,
                maxAttempts: maxAttempts, retryBaseDelay: retryBaseDelay, pollInterval: .milliseconds(200),
                statementTimeout: statementTimeout, lockTimeout: lockTimeout, retainTokens: retainTokens,
                retainEvents: retainEvents, maintenanceInterval: maintenanceInterval),
            logger: logger, metrics: metrics)
    }

    /// Runs `drainOnce()` until nothing is pending (retries included) or `timeout` passes.
    @discardableResult
    func drainUntilSettled(_ worker: Worker, timeout: Duration = .seconds(30)) throws -> Bool {
        try waitUntil(timeout: timeout) {
            _ = try worker.drainOnce()
            return try value("SELECT count(*) FROM siwa.notifications WHERE state = 'pending'", as: Int.self)
                == 0
        }
    }
}

/// Runs `worker.drainOnce()` on a thread of its own and waits up to `timeout` for it to return. If it
/// does not, the worker is stopped (and waited for) and the result is nil: a drain that never ends
/// fails the test instead of hanging it.
func drainOnce(_ worker: Worker, within timeout: Duration) throws -> Worker.DrainSummary? {
    let result = Mutex<Result<Worker.DrainSummary, WorkerError>?>(nil)
    let done = DispatchSemaphore(value: 0)
    let thread = Thread {
        let outcome = Result { () throws(WorkerError) in try worker.drainOnce() }
        result.withLock { $0 = outcome }
        done.signal()
    }
    thread.start()
    if done.wait(timeout: .now() + timeout.inSeconds) == .timedOut {
        worker.stop()
        done.wait()
        return nil
    }
    return try result.withLock { $0 }?.get()
}

/// Runs `worker.run()` on a thread of its own until the returned closure is called, which stops the
/// worker and waits for `run()` to return.
func startRunning(_ worker: Worker) -> @Sendable () -> Void {
    let done = DispatchSemaphore(value: 0)
    let thread = Thread {
        worker.run()
        done.signal()
    }
    thread.start()
    return {
        worker.stop()
        done.wait()
    }
}

/// The value of one series in the Prometheus text `metrics` renders, e.g.
/// `siwa_worker_notifications_total{outcome="busy"}`; nil when absent.
func metric(_ series: String, in metrics: MetricsRegistry) -> Double? {
    for line in metrics.render().split(separator: "\n") where line.hasPrefix(series + " ") {
        return Double(line.dropFirst(series.count + 1))
    }
    return nil
}

extension StoredTokenVerification {
    /// The tests' verification: TestSigning's Apple key, any audience the token names (the seeds'
    /// tokens are signed by ``TestSigning/apple``).
    static let tests = StoredTokenVerification(audiences: [], keys: TestSigning.appleKeySet)
}
