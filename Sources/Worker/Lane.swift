import AppleNotifications
import Foundation
import Postgres
import QueueConsumer
import ServiceSupport
import Synchronization

/// One notification handled by a database call: a row of `siwa.apply_verified_notifications`.
struct ProcessedNotification: PostgresRowDecodable {
    static let statement = """
        SELECT id, jti, event_type, outcome, error, attempt, latency, busy_seconds
          FROM siwa.apply_verified_notifications($1::bigint[], $2::bigint[], $3::text[], $4::bigint[],
                                                 $5::integer, $6::float8 * interval '1 second')
        """
    static let columns: PostgresColumns = """
        id bigint, jti text, event_type text, outcome text, error text, attempt integer, \
        latency double precision, busy_seconds double precision
        """

    var id: Int64
    var jti: String
    var eventType: String
    var outcome: Worker.Outcome
    var error: String?
    var attempt: Int
    /// Seconds from `received_at` to the end of this attempt.
    var latency: Double?
    /// For a busy one: how long its user has been busy in a row (seconds).
    var busySeconds: Double?
    /// The sub it was stored with, when it was claimed in this lane's transaction (busy users are left
    /// alone for the rest of a drain by it).
    var sub: String?

    init(row: PostgresRow) throws(PostgresError) {
        id = try row[0, as: Int64.self]
        jti = try row[1, as: String.self]
        eventType = try row[2, as: String.self]
        outcome = Worker.Outcome(try row[3, as: String.self])
        error = try row[4, as: String?.self]
        attempt = try row[5, as: Int?.self] ?? 0
        latency = try row[6, as: Double?.self]
        busySeconds = try row[7, as: Double?.self]
    }

    init(id: Int64, jti: String, eventType: String, outcome: Worker.Outcome, error: String?, attempt: Int) {
        self.id = id
        self.jti = jti
        self.eventType = eventType
        self.outcome = outcome
        self.error = error
        self.attempt = attempt
        self.latency = nil
        self.busySeconds = nil
    }
}

extension ClaimedNotification: PostgresRowDecodable {
    static let statement = """
        SELECT id, refused, origin, raw_token, jti, event_type, sub, audience, email, is_private_email,
               event_time, issued_at, expires_at, received_at, attempts, claimed_event_time
          FROM siwa.claim_notifications($1::integer, $2::bigint, $3::text[])
        """
    static let columns: PostgresColumns = """
        id bigint, refused boolean, origin text, raw_token text, jti text, event_type text, sub text, \
        audience text, email text, is_private_email boolean, event_time double precision, \
        issued_at double precision, expires_at double precision, received_at double precision, \
        attempts integer, claimed_event_time double precision
        """

    init(row: PostgresRow) throws(PostgresError) {
        func date(_ column: Int) throws(PostgresError) -> Date? {
            try row[column, as: Double?.self].map { Date(timeIntervalSince1970: $0) }
        }
        id = try row[0, as: Int64.self]
        refused = try row[1, as: Bool.self]
        origin = try row[2, as: String?.self] ?? ""
        rawToken = try row[3, as: String?.self]
        jti = try row[4, as: String.self]
        eventType = try row[5, as: String?.self] ?? ""
        sub = try row[6, as: String?.self] ?? ""
        audience = try row[7, as: String?.self] ?? ""
        email = try row[8, as: String?.self]
        isPrivateEmail = try row[9, as: Bool?.self]
        eventTime = try date(10)
        issuedAt = try date(11)
        expiresAt = try date(12)
        receivedAt = try date(13) ?? Date()
        attempts = try row[14, as: Int.self]
        claimedEventTime = try date(15)
    }
}

/// One lane: a thread's loop with its own connection. Not shared between threads.
final class Lane {
    let worker: Worker
    let index: Int
    let once: Bool
    /// When this lane last warned about a user that stays busy (at most one such warning a minute).
    private var lastBusyWarning: ContinuousClock.Instant?
    private var configuration: Worker.Configuration { worker.configuration }
    private var logger: Logger { worker.logger }

    static let channel = "siwa_notifications"
    /// A user busy this long (its account row held by another transaction) is worth a warning.
    static let busyWarningAfter = Duration.seconds(60)
    private static let recordFailureSQL = """
        SELECT siwa.record_failure($1::bigint, $2::text, $3::integer, $4::float8 * interval '1 second')
        """
    private static let nextDueSQL = """
        SELECT extract(epoch FROM min(next_attempt_at) - clock_timestamp())::float8
          FROM siwa.notification_queue
        """

    init(worker: Worker, index: Int, once: Bool) {
        self.worker = worker
        self.index = index
        self.once = once
    }

    /// Runs until the worker stops (or, with `once`, until nothing but busy notifications is due): a
    /// ``ConsumerLoop`` that LISTENs, drains, and waits for a NOTIFY, the next due retry or the poll
    /// interval. In `once` mode a database failure ends the lane with an error; otherwise the lane
    /// reconnects with the shared backoff. Maintenance is not a lane's job: ``Maintenance`` runs it on
    /// its own schedule.
    func run() -> (Worker.DrainSummary, WorkerError?) {
        var summary = Worker.DrainSummary()
        var loop = ConsumerLoop<PostgresConnection>(
            state: ConsumerLoopState(
                pollInterval: configuration.pollInterval,
                backoff: Backoff(
                    initial: configuration.reconnectDelay, maximum: configuration.maxReconnectDelay),
                once: once, minimumWait: .milliseconds(20)),
            stop: worker.stopSignal,
            connect: { [worker, index] () throws(PostgresError) -> PostgresConnection in
                let connection = try worker.connect(listen: true, fields: ["lane": .int(index)])
                worker.metrics.connectedLanes.increment()
                return connection
            },
            drain: { [self] connection in
                try drain(connection, into: &summary)
                try observeBusy(connection)
                return once ? nil : try untilNextDue(connection)
            },
            wait: { [worker] connection, timeout in
                _ = try connection.waitForNotifications(
                    timeout: timeout, wakeDescriptor: worker.stopSignal.wakeDescriptor)
            },
            close: { [worker] connection in
                worker.metrics.connectedLanes.decrement()
                connection.close()
            },
            failed: { [self] error, retry in
                worker.metrics.reconnects.increment()
                let error = error as? PostgresError
                var fields: [String: Logger.Value] = [
                    "lane": .int(index), "error_code": .string(error?.code.description ?? "unknown"),
                    "sqlstate": .string(error?.sqlState ?? ""),
                    "retry_in_ms": .int(Int(retry.wholeMilliseconds)),
                ]
                // Why the server refused the connection (wrong password, no such database, no
                // pg_hba.conf entry), password masked.
                if let reason = error?.connectionFailureReason { fields["reason"] = .string(reason) }
                logger.warning(
                    error?.code == .readOnly
                        ? "database accepts no writes (a standby?); reconnecting"
                        : error?.isConnectionError ?? false
                            ? "database unavailable; reconnecting" : "database error; reconnecting",
                    fields)
            })
        do {
            try loop.run()
        } catch {
            worker.metrics.reconnects.increment()
            let message = (error as? PostgresError)?.description ?? "\(error)"
            return (summary, WorkerError(code: .database, message: message))
        }
        return (summary, nil)
    }

    /// Runs batches until nothing is claimable but notifications of users found busy (their account
    /// rows held by another transaction) in this drain: the database puts each busy one off briefly,
    /// but a pass can outlast the shortest put-off, and a busy user's older notifications would then
    /// fill every batch again ahead of everyone else's. So a user found busy is left alone for the rest
    /// of the drain (the next drain, when they are due again, tries them first as before).
    private func drain(_ connection: PostgresConnection, into summary: inout Worker.DrainSummary)
        throws(PostgresError)
    {
        var busySubs = Set<String>()
        while !worker.isStopping {
            let handled = try runBatch(connection, skipping: busySubs)
            for notification in handled { summary.record(notification.outcome) }
            if handled.isEmpty { return }
            for notification in handled where notification.outcome == .busy {
                if let sub = notification.sub { busySubs.insert(sub) }
            }
        }
    }

    /// Publishes how long the longest-busy pending notification has waited for its user.
    private func observeBusy(_ connection: PostgresConnection) throws(PostgresError) {
        let oldest = try connection.rows(BusyUsers.self).first?.longestWait ?? 0
        worker.metrics.oldestBusyMilliseconds.store(Int((oldest * 1000).rounded()), ordering: .relaxed)
    }

    /// One batch in one transaction: the claim (``claimAndApply(_:only:skipping:)``), each stored token verified
    /// here, then the set-based pass on the verified ones, which, if it fails, runs on each alone,
    /// recording its failure. Only an error no subtransaction can catch (a statement timeout, which
    /// cancels the whole call) comes back here: then the due notifications are handled one per
    /// transaction (``runOneByOne``).
    private func runBatch(_ connection: PostgresConnection, skipping busySubs: Set<String>)
        throws(PostgresError) -> [ProcessedNotification]
    {
        do {
            return try claimAndApply(connection, only: nil, skipping: busySubs)
        } catch  where !error.isConnectionError {
            worker.metrics.batchFailures.increment()
            logger.warning(
                "batch failed; processing its notifications one at a time",
                [
                    "lane": .int(index), "error_code": .string(error.code.description),
                    "sqlstate": .string(error.sqlState ?? ""),
                ])
            return try runOneByOne(connection, skipping: busySubs)
        }
    }

    /// Claims due notifications (or only `id`), verifies each stored token (``StoredTokenVerification``)
    /// and applies the verified ones, marking the rejected ones, in one transaction. A `kid` not held
    /// is never fetched inside it: the transaction is rolled back (nothing claimed, nothing changed), the
    /// keys are fetched with none open, and the batch is claimed again; a row whose key still cannot be
    /// had is put off (deferred). Notifications of `busySubs` are not claimed.
    private func claimAndApply(
        _ connection: PostgresConnection, only id: Int64?, skipping busySubs: Set<String>
    ) throws(PostgresError) -> [ProcessedNotification] {
        let skipped = busySubs.sorted().map { PostgresData.text($0) }
        var unknownKeys = Set<String>()
        var fetchedOnce = false
        while true {
            try connection.execute("BEGIN")
            var open = true
            defer { if open { _ = try? connection.execute("ROLLBACK") } }
            let claimed = try connection.rows(
                ClaimedNotification.self,
                [.int(Int64(configuration.batchSize)), id.map { .int($0) }, .array(skipped)])
            var handled: [ProcessedNotification] = []
            var verified: [PostgresData?] = []
            var rejected: [PostgresData?] = []
            var reasons: [PostgresData?] = []
            var deferred: [PostgresData?] = []
            var missingKeys = Set<String>()
            var subs: [Int64: String] = [:]
            for notification in claimed {
                subs[notification.id] = notification.sub
                if notification.refused {
                    handled.append(
                        ProcessedNotification(
                            id: notification.id, jti: notification.jti, eventType: "", outcome: .refused,
                            error: "refused: its notification is not pending", attempt: notification.attempts)
                    )
                    continue
                }
                switch configuration.verification.check(notification, unknownKeys: unknownKeys) {
                case .verified: verified.append(.int(notification.id))
                case .rejected(let reason):
                    rejected.append(.int(notification.id))
                    reasons.append(.text(reason))
                case .needsKey(let kid):
                    missingKeys.insert(kid)
                    deferred.append(.int(notification.id))
                }
            }
            if !missingKeys.isEmpty && !fetchedOnce {
                _ = try connection.execute("ROLLBACK")
                open = false
                fetchedOnce = true
                for kid in missingKeys.sorted() {
                    do {
                        _ = try configuration.verification.fetchKey(kid)
                    } catch  where error.kind == .keyNotAvailable {
                        logger.warning(
                            "Apple's key set cannot be fetched; notifications signed with a key not held wait",
                            ["lane": .int(index)])
                    } catch {
                        unknownKeys.insert(kid)
                    }
                }
                continue
            }
            for var notification in try connection.rows(
                ProcessedNotification.self,
                [
                    .array(verified), .array(rejected), .array(reasons), .array(deferred),
                    .int(Int64(configuration.maxAttempts)), .double(configuration.retryBaseDelay.inSeconds),
                ])
            {
                notification.sub = subs[notification.id]
                handled.append(notification)
            }
            _ = try connection.execute("COMMIT")
            open = false
            for notification in handled { report(notification) }
            return handled
        }
    }

    /// The fallback for an error that cancelled the whole batch: each due notification in its own
    /// transaction (claimed, verified and applied as a batch of one); one whose transaction fails is
    /// recorded as a failed attempt in a separate transaction, so it cannot wedge the queue.
    private func runOneByOne(_ connection: PostgresConnection, skipping busySubs: Set<String>)
        throws(PostgresError) -> [ProcessedNotification]
    {
        let due = try connection.rows(DueNotification.self, [.int(Int64(configuration.batchSize))])
        var handled: [ProcessedNotification] = []
        for candidate in due {
            if worker.isStopping { break }
            let id = candidate.id
            do {
                handled += try claimAndApply(connection, only: id, skipping: busySubs)
            } catch  where !error.isConnectionError {
                let message = (error.sqlState.map { $0 + ": " } ?? "") + error.message
                let outcome = try connection.firstValue(
                    Self.recordFailureSQL,
                    [
                        .int(id), .text(message), .int(Int64(configuration.maxAttempts)),
                        .double(configuration.retryBaseDelay.inSeconds),
                    ], as: String.self)
                let notification = ProcessedNotification(
                    id: id, jti: candidate.jti, eventType: candidate.eventType,
                    outcome: Worker.Outcome(outcome ?? "gone"),
                    error: message, attempt: candidate.attempts + 1)
                report(notification)
                handled.append(notification)
            }
        }
        return handled
    }

    /// Logs and counts one handled notification: identifiers, outcome and timing only.
    private func report(_ notification: ProcessedNotification) {
        worker.metrics.count(notification.outcome)
        if notification.outcome == .busy {
            reportBusy(notification)
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
        case .rejected, .refused:
            // The reason names the check that failed, never a claim's value.
            fields["reason"] = .string(notification.error ?? "")
            logger.warning("notification \(notification.outcome.name): nothing applied", fields)
        case .deferred:
            logger.info("notification deferred: its key is not at hand", fields)
        case _ where !Worker.Outcome.known.contains(notification.outcome):
            // A newer schema (applied before this binary was upgraded) reports an outcome we do not know.
            logger.warning("notification outcome unknown to this worker", fields)
        default:
            fields["error_code"] = .string(Self.errorCode(notification.error))
            logger.warning("notification failed", fields)
        }
    }

    /// Busy notifications are counted, not logged, unless their user stays busy for long: then a
    /// warning (at most one a minute per lane) names the notification, never the user.
    private func reportBusy(_ notification: ProcessedNotification) {
        guard let seconds = notification.busySeconds, seconds >= Self.busyWarningAfter.inSeconds else {
            return
        }
        let now = ContinuousClock.now
        if let lastBusyWarning, now - lastBusyWarning < Self.busyWarningAfter { return }
        lastBusyWarning = now
        logger.warning(
            "notification busy for long: another transaction holds its user's account row",
            [
                "jti": .string(notification.jti), "event_type": .string(notification.eventType),
                "busy_seconds": .int(Int(seconds)), "lane": .int(index),
            ])
    }

    /// The SQLSTATE at the start of a stored error: messages are not logged, as they may quote data.
    static func errorCode(_ error: String?) -> String {
        guard let error else { return "" }
        let code = error.prefix { $0 != ":" }
        return code.count == 5 ? String(code) : "unknown"
    }

    /// How soon the next scheduled retry is due (nil: nothing pending).
    private func untilNextDue(_ connection: PostgresConnection) throws(PostgresError) -> Duration? {
        try connection.value(Self.nextDueSQL, as: Double?.self).map { .untilDue(seconds: $0) }
    }
}

/// A due notification as the one-by-one fallback sees it, before claiming it.
struct DueNotification: PostgresRowDecodable {
    static let statement = """
        SELECT q.id, q.jti, coalesce(l.event_type, '') AS event_type, q.attempts
          FROM siwa.notification_queue q
          LEFT JOIN siwa.notification_log l ON l.id = q.id AND l.jti = q.jti AND l.issued_at = q.issued_at
         WHERE q.next_attempt_at <= clock_timestamp()
         ORDER BY q.id LIMIT $1::integer
        """
    static let columns: PostgresColumns = "id bigint, jti text, event_type text, attempts integer"
    var id: Int64
    var jti: String
    var eventType: String
    var attempts: Int

    init(row: PostgresRow) throws(PostgresError) {
        id = try row[0, as: Int64.self]
        jti = try row[1, as: String.self]
        eventType = try row[2, as: String.self]
        attempts = try row[3, as: Int.self]
    }
}

/// How long the longest-busy pending notification has waited for its user, and when the first is due
/// again (seconds; both nil when none is busy).
struct BusyUsers: PostgresRowDecodable {
    static let statement = """
        SELECT extract(epoch FROM clock_timestamp() - min(busy_since))::float8 AS longest_wait,
               extract(epoch FROM min(next_attempt_at) - clock_timestamp())::float8 AS first_due_in
          FROM siwa.notification_queue WHERE busy_since IS NOT NULL
        """
    static let columns: PostgresColumns = "longest_wait double precision, first_due_in double precision"
    var longestWait: Double?
    var firstDueIn: Double?

    init(row: PostgresRow) throws(PostgresError) {
        longestWait = try row[0, as: Double?.self]
        firstDueIn = try row[1, as: Double?.self]
    }
    /// How soon the first busy one is due again, in whole milliseconds up (none past); nil when none is busy.
    var firstDue: Duration? { firstDueIn.map { .untilDue(seconds: $0) } }
}
