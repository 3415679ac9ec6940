import Foundation
import Postgres
import ServiceSupport

/// One notification handled by a database call: a row of `siwa.processing_result`.
struct ProcessedNotification {
    var id: Int64
    var jti: String
    var eventType: String
    var outcome: Worker.Outcome
    var error: String?
    var attempt: Int
    /// Seconds from `received_at` to the end of this attempt.
    var latency: Double?

    init(row: PostgresRow) throws(PostgresError) {
        id = try row[0, as: Int64.self]
        jti = try row[1, as: String.self]
        eventType = try row[2, as: String.self]
        outcome = Worker.Outcome(try row[3, as: String.self])
        error = try row[4, as: String?.self]
        attempt = try row[5, as: Int?.self] ?? 0
        latency = try row[6, as: Double?.self]
    }

    init(id: Int64, jti: String, eventType: String, outcome: Worker.Outcome, error: String?, attempt: Int) {
        self.id = id
        self.jti = jti
        self.eventType = eventType
        self.outcome = outcome
        self.error = error
        self.attempt = attempt
        self.latency = nil
    }
}

/// One lane: a thread's loop with its own connection. Not shared between threads.
struct Lane {
    let worker: Worker
    let index: Int
    let once: Bool
    private var configuration: Worker.Configuration { worker.configuration }
    private var logger: Logger { worker.logger }

    static let channel = "siwa_notifications"
    private static let batchSQL = """
        SELECT id, jti, event_type, outcome, error, attempt, latency
          FROM siwa.process_due_notifications($1::integer, $2::integer, $3::float8 * interval '1 second')
        """
    private static let oneSQL = """
        SELECT id, jti, event_type, outcome, error, attempt, latency
          FROM siwa.process_notification($1::bigint, $2::integer, $3::float8 * interval '1 second')
        """
    private static let dueSQL = """
        SELECT id, jti, event_type, attempts FROM siwa.notifications
         WHERE state = 'pending' AND next_attempt_at <= clock_timestamp()
         ORDER BY next_attempt_at, id LIMIT $1::integer
        """
    private static let recordFailureSQL = """
        SELECT siwa.record_failure($1::bigint, $2::text, $3::integer, $4::float8 * interval '1 second')
        """
    private static let nextDueSQL = """
        SELECT extract(epoch FROM min(next_attempt_at) - clock_timestamp())::float8
          FROM siwa.notifications WHERE state = 'pending'
        """

    init(worker: Worker, index: Int, once: Bool) {
        self.worker = worker
        self.index = index
        self.once = once
    }

    /// One maintenance pass on a connection of its own (after a `once` drain).
    func maintainOnce() -> WorkerError? {
        do throws(PostgresError) {
            let connection = try connect()
            defer { connection.close() }
            maintain(connection)
            return nil
        } catch {
            return WorkerError(code: .database, message: error.description)
        }
    }

    /// Runs until the worker stops (or, with `once`, until nothing is due). In `once` mode a database
    /// failure ends the lane with an error; otherwise the lane reconnects with backoff.
    func run() -> (Worker.DrainSummary, WorkerError?) {
        var summary = Worker.DrainSummary()
        var connection: PostgresConnection?
        var reconnectDelay = configuration.reconnectDelay
        var lastMaintenance: ContinuousClock.Instant?
        defer {
            if connection != nil { worker.metrics.connectedLanes.decrement() }
            connection?.close()
        }
        while !worker.isStopping {
            do throws(PostgresError) {
                let active: PostgresConnection
                if let connection, connection.isHealthy {
                    active = connection
                } else {
                    if connection != nil { worker.metrics.connectedLanes.decrement() }
                    connection?.close()
                    connection = nil
                    active = try connect()
                    connection = active
                    worker.metrics.connectedLanes.increment()
                    reconnectDelay = configuration.reconnectDelay
                }
                try drain(active, into: &summary)
                if once { return (summary, nil) }  // the worker runs maintenance once all lanes are done
                if index == 0 && !worker.isStopping {
                    let now = ContinuousClock.now
                    if lastMaintenance.map({ now - $0 >= configuration.maintenanceInterval }) ?? true {
                        lastMaintenance = now
                        maintain(active)
                    }
                }
                try waitForWork(active)
            } catch {
                worker.metrics.reconnects.increment()
                if connection != nil { worker.metrics.connectedLanes.decrement() }
                connection?.close()
                connection = nil
                if once {
                    return (summary, WorkerError(code: .database, message: error.description))
                }
                logger.warning(
                    error.isConnectionError
                        ? "database unavailable; reconnecting" : "database error; reconnecting",
                    [
                        "lane": .int(index), "error_code": .string(error.code.description),
                        "sqlstate": .string(error.sqlState ?? ""),
                        "retry_in_ms": .int(Int(reconnectDelay.wholeMilliseconds)),
                    ])
                sleep(reconnectDelay)
                reconnectDelay = min(reconnectDelay * 2, configuration.maxReconnectDelay)
            }
        }
        return (summary, nil)
    }

    private func connect() throws(PostgresError) -> PostgresConnection {
        let connection = try PostgresConnection(configuration: configuration.database)
        do throws(PostgresError) {
            let timeout = configuration.statementTimeout.map { String($0.wholeMilliseconds) } ?? "0"
            try connection.simpleQuery("SET statement_timeout = \(timeout)")
            try connection.listen(Self.channel)
        } catch {
            connection.close()
            throw error
        }
        logger.info(
            "connected", ["lane": .int(index), "backend_pid": .int(Int(connection.backendProcessID))])
        return connection
    }

    /// Runs batches until nothing is claimable. A batch of only busy notifications (their users are
    /// being worked on by other lanes) is retried after a short, growing pause.
    private func drain(_ connection: PostgresConnection, into summary: inout Worker.DrainSummary)
        throws(PostgresError)
    {
        var busyPause = Duration.milliseconds(5)
        while !worker.isStopping {
            let handled = try runBatch(connection)
            for notification in handled { summary.record(notification.outcome) }
            if handled.isEmpty { return }
            if handled.allSatisfy({ $0.outcome == .busy }) {
                sleep(busyPause)
                busyPause = min(busyPause * 2, .milliseconds(200))
            } else {
                busyPause = .milliseconds(5)
            }
        }
    }

    /// One batch in one transaction; if the batch fails as a whole (an error its subtransactions could
    /// not catch, such as a statement timeout), the same work is done one notification at a time.
    private func runBatch(_ connection: PostgresConnection) throws(PostgresError) -> [ProcessedNotification] {
        let rows: PostgresRows
        do {
            rows = try connection.query(
                Self.batchSQL,
                [
                    .int(Int64(configuration.batchSize)), .int(Int64(configuration.maxAttempts)),
                    .double(configuration.retryBaseDelay.inSeconds),
                ])
        } catch  where !error.isConnectionError {
            worker.metrics.batchFailures.increment()
            logger.warning(
                "batch failed; processing its notifications one at a time",
                [
                    "lane": .int(index), "error_code": .string(error.code.description),
                    "sqlstate": .string(error.sqlState ?? ""),
                ])
            return try runOneByOne(connection)
        }
        var handled: [ProcessedNotification] = []
        for row in rows {
            let notification = try ProcessedNotification(row: row)
            report(notification)
            handled.append(notification)
        }
        return handled
    }

    /// The fallback: each due notification in its own transaction; one whose transaction fails is
    /// recorded as a failed attempt in a separate transaction, so it cannot wedge the queue.
    private func runOneByOne(_ connection: PostgresConnection) throws(PostgresError)
        -> [ProcessedNotification]
    {
        let due = try connection.query(Self.dueSQL, [.int(Int64(configuration.batchSize))])
        var handled: [ProcessedNotification] = []
        for row in due {
            if worker.isStopping { break }
            let id = try row[0, as: Int64.self]
            do {
                for result in try connection.query(
                    Self.oneSQL,
                    [
                        .int(id), .int(Int64(configuration.maxAttempts)),
                        .double(configuration.retryBaseDelay.inSeconds),
                    ])
                {
                    let notification = try ProcessedNotification(row: result)
                    report(notification)
                    handled.append(notification)
                }
            } catch  where !error.isConnectionError {
                let message = (error.sqlState.map { $0 + ": " } ?? "") + error.message
                let outcome = try connection.query(
                    Self.recordFailureSQL,
                    [
                        .int(id), .text(message), .int(Int64(configuration.maxAttempts)),
                        .double(configuration.retryBaseDelay.inSeconds),
                    ]
                ).first?[0, as: String.self]
                let notification = ProcessedNotification(
                    id: id, jti: try row[1, as: String.self], eventType: try row[2, as: String.self],
                    outcome: Worker.Outcome(outcome ?? "gone"), error: message,
                    attempt: try row[3, as: Int.self] + 1)
                report(notification)
                handled.append(notification)
            }
        }
        return handled
    }

    /// Logs and counts one handled notification: identifiers, outcome and timing only.
    private func report(_ notification: ProcessedNotification) {
        worker.metrics.outcomes[notification.outcome]?.increment()
        if notification.outcome == .busy {
            return
        }
        var fields: [String: Logger.Value] = [
            "jti": .string(notification.jti), "event_type": .string(notification.eventType),
            "outcome": .string(notification.outcome.name), "attempt": .int(notification.attempt),
            "lane": .int(index),
        ]
        if let latency = notification.latency {
            fields["latency_ms"] = .double((latency * 10_000).rounded() / 10)
        }
        switch notification.outcome {
        case .applied, .skipped:
            if let latency = notification.latency { worker.metrics.latency.observe(latency) }
            logger.info("notification \(notification.outcome.name)", fields)
        case .dead:
            fields["error_code"] = .string(Self.errorCode(notification.error))
            logger.error("notification dead", fields)
        default:
            fields["error_code"] = .string(Self.errorCode(notification.error))
            logger.warning("notification failed", fields)
        }
    }

    /// The SQLSTATE at the start of a stored error: messages are not logged, as they may quote data.
    static func errorCode(_ error: String?) -> String {
        guard let error else { return "" }
        let code = error.prefix { $0 != ":" }
        return code.count == 5 ? String(code) : "unknown"
    }

    /// Waits for a notification, the next scheduled retry or the poll interval, whichever comes first,
    /// in short slices so that ``Worker/stop()`` is noticed quickly.
    private func waitForWork(_ connection: PostgresConnection) throws(PostgresError) {
        var wait = configuration.pollInterval
        if let seconds = try connection.query(Self.nextDueSQL).first?[0, as: Double?.self] {
            let untilDue = Duration.milliseconds(Int64((max(seconds, 0) * 1000).rounded(.up)))
            wait = min(wait, max(untilDue, .milliseconds(20)))
        }
        let deadline = ContinuousClock.now + wait
        while !worker.isStopping {
            let remaining = deadline - ContinuousClock.now
            if remaining <= .zero { return }
            if !(try connection.waitForNotifications(timeout: min(remaining, .milliseconds(100)))).isEmpty {
                return
            }
        }
    }

    /// Retention and erasure of personal data that has become due; failures are logged, never fatal.
    private func maintain(_ connection: PostgresConnection) {
        do throws(PostgresError) {
            var erased = 0
            for _ in 0..<100 where !worker.isStopping {
                let count =
                    try connection.query("SELECT siwa.erase_due_personal_data(100)").first?[0, as: Int.self]
                    ?? 0
                erased += count
                if count < 100 { break }
            }
            var tokens = 0
            var rows = 0
            if configuration.retainTokens != nil || configuration.retainEvents != nil {
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

    /// Sleeps up to `duration`, waking early when the worker stops.
    private func sleep(_ duration: Duration) {
        let deadline = ContinuousClock.now + duration
        while !worker.isStopping {
            let remaining = deadline - ContinuousClock.now
            if remaining <= .zero { return }
            Thread.sleep(forTimeInterval: min(remaining, .milliseconds(50)).inSeconds)
        }
    }
}
