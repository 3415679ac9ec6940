import Foundation
import Postgres
import QueueConsumer
import ServiceSupport

/// The notification maintenance (log partitions, erasure of personal data that has become due,
/// retention), on a connection and a schedule of their own: however busy or stuck the lanes are, it
/// runs every `maintenanceInterval`.
struct Maintenance {
    /// A pass found its connection gone: open another (after the backoff).
    private struct ConnectionLost: Error {}

    let worker: Worker
    var configuration: Worker.Configuration { worker.configuration }
    private var logger: Logger { worker.logger }

    init(worker: Worker) {
        self.worker = worker
    }

    /// Runs a pass now and then every `maintenanceInterval` until the worker stops (a ``ConsumerLoop``
    /// without LISTEN), reconnecting with the shared backoff when the database goes away.
    func run() {
        var due = PeriodicTasks(tasks)
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
                pass(connection, &due)
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
            var all = PeriodicTasks(tasks)
            pass(connection, &all)
            return nil
        } catch {
            return WorkerError(code: .database, message: error.description)
        }
    }

    /// The notification maintenance, in the order a pass runs it; each task is a file of its own.
    var tasks: [PeriodicTask<PostgresConnection>] {
        [logPartitions, personalDataErasure, retention]
    }

    /// One pass of the tasks due (all of them: they share ``Worker/Configuration/maintenanceInterval``);
    /// failures are logged, never fatal.
    private func pass(_ connection: PostgresConnection, _ tasks: inout PeriodicTasks<PostgresConnection>) {
        do {
            let report = try tasks.runDue(on: connection)
            worker.metrics.maintenancePasses.increment()
            let erased = report["personal_data_erased"] ?? 0
            let tokens = report["tokens_pruned"] ?? 0
            let rows = report["rows_pruned"] ?? 0
            if erased + tokens + rows > 0 {
                logger.info(
                    "maintenance",
                    [
                        "personal_data_erased": .int(erased), "tokens_pruned": .int(tokens),
                        "rows_pruned": .int(rows),
                    ])
            }
        } catch {
            let error = error as? PostgresError
            worker.metrics.maintenanceErrors.increment()
            logger.warning(
                "maintenance failed",
                [
                    "error_code": .string(error?.code.description ?? "unknown"),
                    "sqlstate": .string(error?.sqlState ?? ""),
                ])
        }
    }
}
