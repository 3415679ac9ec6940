import AppleNotifications
import Dispatch
import Foundation
import Postgres
import ServiceSupport

/// Durable storage of verified notifications: one row per `jti`, with group commit.
///
/// Concurrent deliveries are written together: each call queues its row and blocks; a small set of
/// committer threads takes everything queued (up to ``Configuration/maxBatchSize`` rows) as soon as one
/// is free and inserts it in one statement — one transaction, one WAL flush for the whole group. A
/// call returns only after the transaction holding its row has committed, so a 200 to Apple still
/// always means "stored". The schema's statement trigger sends the workers' `NOTIFY` in that same
/// transaction.
public final class NotificationStore: @unchecked Sendable {
    /// What storing did.
    public enum Outcome: String, Sendable {
        /// A new row was committed.
        case accepted
        /// A row with this `jti` was already stored; nothing was written.
        case duplicate
    }

    /// Group-commit tuning.
    public struct Configuration: Sendable {
        /// Threads committing batches concurrently (each holds one pooled connection while it works).
        public var committers: Int
        /// The most rows in one transaction.
        public var maxBatchSize: Int
        /// How long a caller waits for its row's commit before giving up (it then answers 503; if the
        /// commit lands later, Apple's retry is answered `duplicate`).
        public var commitTimeout: Duration

        public init(committers: Int = 2, maxBatchSize: Int = 256, commitTimeout: Duration = .seconds(10)) {
            self.committers = max(1, committers)
            self.maxBatchSize = max(1, maxBatchSize)
            self.commitTimeout = commitTimeout
        }
    }

    /// Storing could not complete in time.
    public struct CommitTimeout: Error, CustomStringConvertible {
        public var description: String { "the commit did not complete in time" }
    }

    /// The store is shut down.
    public struct Closed: Error, CustomStringConvertible {
        public var description: String { "the store is closed" }
    }

    /// One statement per batch writes the log and the queue: a redelivery is the same token, so the same
    /// (jti, issued_at), and inserts nothing; the new rows are queued for the worker, which is woken
    /// (NOTIFY at commit) once if anything was queued. A row for an account whose personal data is
    /// already erased is stored without email and token (one primary-key probe of siwa.accounts per row).
    static let insertSQL = """
        WITH stored AS (
            INSERT INTO siwa.notification_log
                (jti, event_type, sub, audience, email, is_private_email, event_time, issued_at, expires_at,
                 raw_token, personal_data_erased_at)
            SELECT b.jti, b.event_type, b.sub, b.audience,
                   CASE WHEN a.sub IS NULL THEN b.email END, b.is_private_email, b.event_time, b.issued_at,
                   b.expires_at, CASE WHEN a.sub IS NULL THEN b.raw_token END,
                   CASE WHEN a.sub IS NOT NULL THEN clock_timestamp() END
              FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::boolean[],
                          $7::timestamptz[], $8::timestamptz[], $9::timestamptz[], $10::text[])
                   AS b(jti, event_type, sub, audience, email, is_private_email, event_time, issued_at,
                        expires_at, raw_token)
              LEFT JOIN siwa.accounts a ON a.sub = b.sub AND a.personal_data_erased_at IS NOT NULL
            ON CONFLICT (jti, issued_at) DO NOTHING
            RETURNING id, jti, issued_at),
        queued AS (
            INSERT INTO siwa.notification_queue (id, jti, issued_at)
            SELECT s.id, s.jti, s.issued_at FROM stored s
            RETURNING 1)
        SELECT s.jti FROM stored s
         WHERE (SELECT count(pg_notify('siwa_notifications', '')) FROM (SELECT 1 FROM queued LIMIT 1) AS w) >= 0
        """

    /// One queued row and, once committed, its result.
    private final class Ticket: @unchecked Sendable {
        let notification: ServerNotification
        let rawToken: String
        let done = DispatchSemaphore(value: 0)
        var result: Result<Outcome, any Error>?  // written once by a committer before `done` is signalled

        init(_ notification: ServerNotification, _ rawToken: String) {
            self.notification = notification
            self.rawToken = rawToken
        }
    }

    private let pool: PostgresPool
    /// The group-commit settings in use.
    public let configuration: Configuration
    private let observeBatch: @Sendable (Int, Duration) -> Void
    private let condition = NSCondition()
    private var queue: [Ticket] = []  // guarded by `condition`
    private var closed = false  // guarded by `condition`
    private var committers: [JoinableThread] = []

    /// Stores into the database behind `pool`, which must hold schema.sql.
    /// - Parameter observeBatch: told the size and duration of every committed batch (metrics).
    public init(
        pool: PostgresPool, configuration: Configuration = Configuration(),
        observeBatch: @escaping @Sendable (Int, Duration) -> Void = { _, _ in }
    ) {
        self.pool = pool
        self.configuration = configuration
        self.observeBatch = observeBatch
        for index in 0..<configuration.committers {
            // The thread keeps the store alive until close().
            committers.append(JoinableThread(name: "siwa-commit-\(index)") { self.commitLoop() })
        }
    }

    /// Commits `notification` (with its token, for audit) unless its `jti` is already stored.
    /// Blocks until the transaction holding it has committed.
    ///
    /// - Parameter deadline: when to give up waiting (``CommitTimeout``); by default
    ///   ``Configuration/commitTimeout`` from now. A caller that measures from when its request
    ///   arrived bounds the client's whole wait, queueing included.
    public func store(
        _ notification: ServerNotification, rawToken: String, deadline: ContinuousClock.Instant? = nil
    ) throws -> Outcome {
        let deadline = deadline ?? .now + configuration.commitTimeout
        let remaining = deadline - .now
        guard remaining > .zero else { throw CommitTimeout() }
        let ticket = Ticket(notification, rawToken)
        condition.lock()
        guard !closed else {
            condition.unlock()
            throw Closed()
        }
        queue.append(ticket)
        condition.signal()
        condition.unlock()
        guard ticket.done.wait(timeout: .now() + remaining.dispatchInterval) == .success else {
            throw CommitTimeout()
        }
        return try ticket.result!.get()
    }

    /// Whether the database answers (readiness).
    public func isReachable() -> Bool {
        (try? pool.ping()) != nil
    }

    /// Commits what is queued, then stops the committer threads and returns once they have ended. Later
    /// calls to ``store(_:rawToken:)`` throw.
    public func close() {
        condition.lock()
        closed = true
        condition.broadcast()
        let threads = committers
        committers = []
        condition.unlock()
        for thread in threads { thread.join() }
    }

    private func commitLoop() {
        while true {
            condition.lock()
            while queue.isEmpty && !closed { condition.wait() }
            if queue.isEmpty {  // closed and drained
                condition.unlock()
                return
            }
            let batch = Array(queue.prefix(configuration.maxBatchSize))
            queue.removeFirst(batch.count)
            if !queue.isEmpty { condition.signal() }  // more work: wake another committer
            condition.unlock()
            commit(batch)
        }
    }

    /// Inserts `batch` in one statement; on an error that is not about the connection, retries each row
    /// alone so that one bad row cannot fail the others.
    private func commit(_ batch: [Ticket]) {
        let started = ContinuousClock.now
        do {
            let inserted = try insert(batch)
            observeBatch(batch.count, ContinuousClock.now - started)
            // The first ticket for each inserted jti is accepted; any other (a duplicate in the same
            // batch, or a jti stored before) is a duplicate.
            var fresh = inserted
            for ticket in batch {
                let accepted = fresh.remove(ticket.notification.jti) != nil
                ticket.result = .success(accepted ? .accepted : .duplicate)
                ticket.done.signal()
            }
        } catch let error as PostgresError where batch.count > 1 && !error.isConnectionError {
            for ticket in batch { commit([ticket]) }
        } catch {
            for ticket in batch {
                ticket.result = .failure(error)
                ticket.done.signal()
            }
        }
    }

    private func insert(_ batch: [Ticket]) throws -> Set<String> {
        var columns = Array(repeating: [PostgresData?](), count: 10)
        for column in columns.indices { columns[column].reserveCapacity(batch.count) }
        for ticket in batch {
            let n = ticket.notification
            columns[0].append(.text(n.jti))
            columns[1].append(.text(n.eventType.rawValue))
            columns[2].append(.text(n.subject))
            columns[3].append(.text(n.audience))
            columns[4].append(n.email.map { .text($0) })
            columns[5].append(n.isPrivateEmail.map { .bool($0) })
            columns[6].append(.date(n.eventTime))
            columns[7].append(.date(n.issuedAt))
            columns[8].append(n.expiresAt.map { .date($0) })
            columns[9].append(.text(ticket.rawToken))
        }
        let rows = try pool.withConnection { connection in
            try connection.query(Self.insertSQL, columns.map { .array($0) })
        }
        var inserted = Set<String>(minimumCapacity: rows.count)
        for row in rows { inserted.insert(try row[0, as: String.self]) }
        return inserted
    }

}
