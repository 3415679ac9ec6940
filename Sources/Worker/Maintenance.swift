import Foundation
import Postgres
import ServiceSupport

/// Retention and the erasure of personal data that has become due, on a connection and a schedule of
/// their own: however busy or stuck the lanes are, maintenance runs every `maintenanceInterval`.
struct Maintenance {
    /// A pass found its connection gone: open another (after the backoff).
    private struct ConnectionLost: Error {}

    let worker: Worker
    private var configuration: Worker.Configuration { worker.configuration }
    private var logger: Logger { worker.logger }

    init(worker: Worker) {
        self.worker = worker
    }

    /// Runs a pass now and then every `maintenanceInterval` until the worker stops (a ``ConsumerLoop``
    /// without LISTEN), reconnecting with the shared backoff when the database goes away.
    func run() {
        var loop = ConsumerLoop<PostgresConnection>(
            state: ConsumerLoopState(
                pollInterval: configuration.maintenanceInterval,
                backoff: Backoff(
                    initial: configuration.reconnectDelay, maximum: configuration.maxReconnectDelay)),
            stop: worker.stopSignal,
            connect: { [worker] () throws(PostgresError) -> PostgresConnection in
                try worker.connect(listen: false, fields: ["task": "maintenance"])
            },
            drain: { [self] connection in
                // A pass logs its own failures; a connection it lost is opened again before the next.
                pass(connection)
                if !connection.isHealthy { throw ConnectionLost() }
                return nil
            },
            wait: { [worker] _, duration in worker.sleep(duration) },
            close: { $0.close() },
            failed: { [worker, logger] error, retry in
                if error is ConnectionLost { return }  // the pass logged and counted it
                let error = error as? PostgresError
                worker.metrics.maintenanceErrors.increment()
                logger.warning(
                    "maintenance cannot connect; retrying",
                    [
                        "error_code": .string(error?.code.description ?? "unknown"),
                        "sqlstate": .string(error?.sqlState ?? ""),
                        "retry_in_ms": .int(Int(retry.wholeMilliseconds)),
                    ])
            })
        try? loop.run()
    }

    /// One pass on a connection of its own (after a `once` drain).
    func runOnce() -> WorkerError? {
        do throws(PostgresError) {
            let connection = try worker.connect(listen: false, fields: ["task": "maintenance"])
            defer { connection.close() }
            pass(connection)
            return nil
        } catch {
            return WorkerError(code: .database, message: error.description)
        }
    }

    /// Retention and erasure of personal data that has become due; failures are logged, never fatal.
    private func pass(_ connection: PostgresConnection) {
        do throws(PostgresError) {
            // The history's month partitions, this month and the next (a no-op while they exist;
            // rows of a month without one wait in the DEFAULT partition and move when it is created).
            try connection.query("SELECT siwa.create_log_partitions(1)")
            // Each call is its own transaction of at most 64 accounts, one subtransaction each (the
            // subtransaction cache's size, see Worker.Configuration.maxBatchSize).
            var erased = 0
            for _ in 0..<100 where !worker.isStopping {
                let count =
                    try connection.query("SELECT siwa.erase_due_personal_data(64)").first?[0, as: Int.self]
                    ?? 0
                erased += count
                if count < 64 { break }
            }
            var tokens = 0
            var rows = 0
            // Always: besides the raw tokens and months of history the flags ask for (NULL: kept), it
            // deletes dedupe keys past their window and changes past siwa.settings.changes_retention.
            do {
                for _ in 0..<100 where !worker.isStopping {
                    guard
                        let row = try connection.query(
                            """
                            SELECT tokens_pruned, rows_pruned FROM siwa.prune(
                                $1::float8 * interval '1 second', $2::float8 * interval '1 second', 1000)
                            """,
                            [
                                configuration.retainTokens.map { .double($0.inSeconds) },
                                configuration.retainEvents.map { .double($0.inSeconds) },
                            ]
                        ).first
                    else { break }
                    let (t, r) = (try row[0, as: Int.self], try row[1, as: Int.self])
                    tokens += t
                    rows += r
                    if t == 0 && r == 0 { break }
                }
            }
            worker.metrics.maintenancePasses.increment()
            if erased + tokens + rows > 0 {
                logger.info(
                    "maintenance",
                    [
                        "personal_data_erased": .int(erased), "tokens_pruned": .int(tokens),
                        "rows_pruned": .int(rows),
                    ])
            }
        } catch {
            worker.metrics.maintenanceErrors.increment()
            logger.warning(
                "maintenance failed",
                ["error_code": .string(error.code.description), "sqlstate": .string(error.sqlState ?? "")])
        }
    }
}
