public import AppleNotifications
import Dispatch
import Foundation
public import Postgres
import ServiceSupport
import Synchronization

/// Durable storage of verified notifications: one row per `jti`, with group commit.
///
/// Concurrent deliveries are written together: each call queues its row with a completion and
/// returns; a committer thread takes everything queued (up to ``Configuration/maxBatchSize`` rows) and
/// inserts it in one statement — one transaction, one WAL flush for the whole group — then calls each
/// row's completion. While one batch commits, the rows that arrive wait for it and make the next
/// batch: a second committer starts beside it only once ``Configuration/overlapThreshold`` rows wait,
/// and under load a committer waits up to ``Configuration/gatherDelay`` for more rows (each commit
/// costs PostgreSQL a transaction, a statement and a flush: fewer, larger batches cost less per row). A completion
/// says "stored" only after the transaction holding its row has committed, so a 200 to Apple still
/// always means "stored". No thread waits per row: a deadline watcher answers ``CommitTimeout`` to
/// rows still unanswered at their deadline. `siwa.store_notifications` itself sends the workers' `NOTIFY`
/// (once per batch that queued anything, delivered at commit) in that same transaction; there is no
/// trigger on the log or the queue (schema/20-log-and-queue.sql).
// @unchecked: the queue, `closed` and the committer threads are guarded by `condition`, the deadline
// watcher's state and thread by `timer` (both set in `init` before any thread can see the store, then
// taken under their lock by `close`); a ticket is answered once (an Atomic).
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
        /// While a batch is committing, another committer starts one only once this many rows wait;
        /// fewer wait for the commit in flight and go with the next batch (classic group commit: the
        /// rows that arrive during one commit make the next). 1: a free committer takes whatever waits.
        public var overlapThreshold: Int
        /// Under load (rows were waiting when the previous commit ended), how long a committer that
        /// would commit fewer than ``overlapThreshold`` rows waits for more first; a row that finds the
        /// store idle is committed at once. Zero: never wait.
        public var gatherDelay: Duration
        /// A commit in flight this long is held up (a lock wait, a slow disk, a connection gone quiet):
        /// another committer then starts beside it with whatever waits, as if the threshold were met, so
        /// the rows behind a stuck commit are not held up with it.
        public var overlapAfter: Duration
        /// How long a caller waits for its row's commit before giving up (it then answers 503; if the
        /// commit lands later, Apple's retry is answered `duplicate`).
        public var commitTimeout: Duration

        public init(
            committers: Int = 2, maxBatchSize: Int = 256, overlapThreshold: Int = 64,
            gatherDelay: Duration = .milliseconds(2), overlapAfter: Duration = .milliseconds(100),
            commitTimeout: Duration = .seconds(10)
        ) {
            self.gatherDelay = max(.zero, gatherDelay)
            self.overlapAfter = max(.zero, overlapAfter)
            self.committers = max(1, committers)
            self.maxBatchSize = max(1, maxBatchSize)
            self.overlapThreshold = min(max(1, overlapThreshold), self.maxBatchSize)
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

    /// One call of `siwa.store_notifications` per batch (schema/20-log-and-queue.sql) writes the dedupe
    /// keys, the log and the queue in one statement: a jti already stored
    /// (a redelivery, even one Apple re-signed with another iat) inserts no key, so nothing else; the new
    /// rows are queued for the worker, which is woken (NOTIFY at commit) once if anything was queued. A
    /// row for an account whose personal data is already erased is stored without email and token (one
    /// primary-key probe of siwa.accounts per row).
    static let insertSQL = """
        SELECT siwa.store_notifications($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                                        $6::boolean[], $7::timestamptz[], $8::timestamptz[],
                                        $9::timestamptz[], $10::text[], $11::timestamptz[])
        """

    /// One queued row and the completion that answers it, exactly once.
    private final class Ticket: Sendable {
        let notification: ServerNotification
        let rawToken: String
        let deadline: ContinuousClock.Instant
        private let completion: @Sendable (Result<Outcome, any Error>) -> Void
        private let finished = Atomic<Bool>(false)

        init(
            _ notification: ServerNotification, _ rawToken: String, deadline: ContinuousClock.Instant,
            completion: @escaping @Sendable (Result<Outcome, any Error>) -> Void
        ) {
            self.notification = notification
            self.rawToken = rawToken
            self.deadline = deadline
            self.completion = completion
        }

        /// Whether the ticket has been answered (its commit finished, failed or timed out).
        var isFinished: Bool { finished.load(ordering: .acquiring) }

        /// Calls the completion with `result` unless an earlier call did (the commit and the deadline
        /// race; whichever comes first answers).
        func finish(_ result: Result<Outcome, any Error>) {
            guard
                finished.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing)
                    .exchanged
            else { return }
            completion(result)
        }
    }

    private let pool: PostgresPool
    /// The group-commit settings in use.
    public let configuration: Configuration
    private let observeBatch: @Sendable (Int, Duration) -> Void
    private let condition = NSCondition()
    private var queue: [Ticket] = []  // guarded by `condition`
    private var closed = false  // guarded by `condition`
    /// When each batch being committed now was taken (or its gather began); guarded by `condition`.
    private var commitsStarted: [ContinuousClock.Instant] = []
    /// Whether rows were waiting when the last commit ended; guarded by `condition`.
    private var underLoad = false
    private var committers: [JoinableThread] = []
    /// Tickets not yet answered, by deadline, for the deadline watcher; guarded by `timer`.
    private let timer = NSCondition()
    private var pending: [Ticket] = []
    private var pendingHead = 0
    private var watcherStopping = false
    private var watcher: JoinableThread?

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
        watcher = JoinableThread(name: "siwa-commit-deadlines") { self.watchDeadlines() }
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
        let done = DispatchSemaphore(value: 0)
        let answer = Mutex<Result<Outcome, any Error>?>(nil)
        store(notification, rawToken: rawToken, deadline: deadline) { result in
            answer.withLock { $0 = result }
            done.signal()
        }
        done.wait()  // bounded: the deadline watcher answers at the deadline at the latest
        return try answer.withLock { $0! }.get()
    }

    /// Queues `notification` (with its token, for audit) for the next group commit and returns at once;
    /// `completion` is called exactly once: with the outcome after the transaction holding the row has
    /// committed, or with an error (the commit failed, ``CommitTimeout`` at `deadline`, ``Closed``).
    ///
    /// `completion` runs on a committer thread, on the deadline watcher's thread, or (for a deadline
    /// already passed or a closed store) on the caller's before this returns. It must be quick and must
    /// not block: the next batch waits for it. A row whose caller was told ``CommitTimeout`` may still
    /// be committed later (a retry then finds it as a duplicate).
    ///
    /// - Parameter deadline: when to give up waiting; by default ``Configuration/commitTimeout`` from
    ///   now.
    public func store(
        _ notification: ServerNotification, rawToken: String, deadline: ContinuousClock.Instant? = nil,
        completion: @escaping @Sendable (Result<Outcome, any Error>) -> Void
    ) {
        let deadline = deadline ?? .now + configuration.commitTimeout
        guard deadline > .now else { return completion(.failure(CommitTimeout())) }
        let ticket = Ticket(notification, rawToken, deadline: deadline, completion: completion)
        condition.lock()
        guard !closed else {
            condition.unlock()
            return completion(.failure(Closed()))
        }
        queue.append(ticket)
        // Wake a committer only when one may act: none is committing (an idle one takes the row),
        // the first row now waits behind a commit in flight (an idle committer then watches that
        // commit: it starts beside it if it is held up, see ``Configuration/overlapAfter``), or enough
        // rows wait to start a batch beside it (or to end a gather). Otherwise the committer in flight
        // takes the row when its commit ends: no futile wake-up per row.
        if commitsStarted.isEmpty || queue.count == 1 || queue.count >= configuration.overlapThreshold {
            condition.signal()
        }
        condition.unlock()
        watch(ticket)
    }

    /// Whether the database answers and accepts writes (readiness): false while the only server
    /// reachable is a standby (during a failover) or read-only, when every store would fail.
    public func isReachable() -> Bool {
        (try? pool.checkWritable()) != nil
    }

    /// Commits what is queued, then stops the committer threads and the deadline watcher and returns
    /// once they have ended. Every queued row has been answered by then. Later calls to
    /// ``store(_:rawToken:deadline:)`` throw ``Closed``.
    public func close() {
        condition.lock()
        closed = true
        condition.broadcast()
        let threads = committers
        committers = []
        condition.unlock()
        for thread in threads { thread.join() }
        timer.lock()
        watcherStopping = true
        timer.broadcast()
        let watching = watcher
        watcher = nil
        timer.unlock()
        watching?.join()
    }

    private func commitLoop() {
        while true {
            condition.lock()
            while !closed {
                if queue.isEmpty {
                    condition.wait()
                    continue
                }
                if commitsStarted.isEmpty || queue.count >= configuration.overlapThreshold { break }
                // Rows wait behind a commit in flight and go with the next batch, unless that commit
                // is held up: then this committer starts beside it.
                guard let oldest = commitsStarted.min() else { break }
                let heldUp = oldest + configuration.overlapAfter
                let now = ContinuousClock.now
                if now >= heldUp { break }
                _ = condition.wait(until: Date(timeIntervalSinceNow: (heldUp - now).inSeconds))
            }
            if queue.isEmpty {  // closed and drained
                condition.unlock()
                return
            }
            let started = ContinuousClock.now
            commitsStarted.append(started)
            // Under load (rows queued while the last commit was in flight), wait a little for more
            // rows to share this commit; a row that finds the store idle is committed at once.
            if configuration.gatherDelay > .zero && commitsStarted.count == 1 && !closed && underLoad
                && queue.count < configuration.overlapThreshold
            {
                let until = Date(timeIntervalSinceNow: configuration.gatherDelay.inSeconds)
                while !closed && queue.count < configuration.overlapThreshold {
                    if !condition.wait(until: until) { break }
                }
                if queue.isEmpty {  // another committer took them
                    if let index = commitsStarted.firstIndex(of: started) { commitsStarted.remove(at: index) }
                    condition.unlock()
                    continue
                }
            }
            let batch = Array(queue.prefix(configuration.maxBatchSize))
            queue.removeFirst(batch.count)
            // More work than one batch holds, or enough to start another beside this one.
            if queue.count >= configuration.overlapThreshold { condition.signal() }
            condition.unlock()
            commit(batch)
            condition.lock()
            if let index = commitsStarted.firstIndex(of: started) { commitsStarted.remove(at: index) }
            underLoad = !queue.isEmpty
            // A committer waiting for this commit may take what queued meanwhile (this one, too).
            if !queue.isEmpty { condition.signal() }
            condition.unlock()
            timer.withLock { dropFinishedPending() }
        }
    }

    // MARK: - Deadlines

    /// Adds `ticket` to the deadline watcher's list (kept sorted by deadline; almost always appended).
    private func watch(_ ticket: Ticket) {
        timer.lock()
        var index = pending.count
        while index > pendingHead && pending[index - 1].deadline > ticket.deadline { index -= 1 }
        pending.insert(ticket, at: index)
        // The watcher sleeps until the earliest deadline; only a new earliest one needs to wake it.
        if index == pendingHead { timer.signal() }
        timer.unlock()
    }

    /// Forgets answered tickets at the head of the list. Call with `timer` held.
    private func dropFinishedPending() {
        while pendingHead < pending.count && pending[pendingHead].isFinished { pendingHead += 1 }
        if pendingHead == pending.count {
            pending.removeAll(keepingCapacity: pending.count <= 4096)
            pendingHead = 0
        } else if pendingHead >= 1024 && pendingHead * 2 >= pending.count {
            pending.removeFirst(pendingHead)
            pendingHead = 0
        }
    }

    /// The deadline watcher: answers ``CommitTimeout`` to every ticket still unanswered at its
    /// deadline. It sleeps until the earliest deadline, so it wakes about once per commit timeout, not
    /// once per row.
    private func watchDeadlines() {
        timer.lock()
        while true {
            dropFinishedPending()
            if pendingHead == pending.count {
                if watcherStopping { break }
                timer.wait()
                continue
            }
            let now = ContinuousClock.now
            var expired: [Ticket] = []
            while pendingHead < pending.count && (pending[pendingHead].deadline <= now || watcherStopping) {
                expired.append(pending[pendingHead])
                pendingHead += 1
            }
            if !expired.isEmpty {
                timer.unlock()
                let error: any Error = watcherStopping ? Closed() : CommitTimeout()
                for ticket in expired { ticket.finish(.failure(error)) }
                timer.lock()
                continue
            }
            let wait = pending[pendingHead].deadline - now
            _ = timer.wait(until: Date(timeIntervalSinceNow: wait.inSeconds))
        }
        timer.unlock()
    }

    /// Inserts `batch` in one statement; on an error that is not about the connection, retries each row
    /// alone so that one bad row cannot fail the others.
    private func commit(_ batch: [Ticket]) {
        let started = ContinuousClock.now
        do {
            let inserted = try insert(batch)
            if inserted.isEmpty { try awaitReplication() }
            observeBatch(batch.count, ContinuousClock.now - started)
            // The first ticket for each inserted jti is accepted; any other (a duplicate in the same
            // batch, or a jti stored before) is a duplicate.
            var fresh = inserted
            for ticket in batch {
                let accepted = fresh.remove(ticket.notification.jti) != nil
                ticket.finish(.success(accepted ? .accepted : .duplicate))
            }
        } catch let error as PostgresError where batch.count > 1 && !error.isConnectionError {
            for ticket in batch { commit([ticket]) }
        } catch {
            for ticket in batch { ticket.finish(.failure(error)) }
        }
    }

    /// Before a batch that wrote nothing (every row a duplicate) is answered 200: waits, as a commit
    /// does, until what this session found is as durable as a commit is (on the synchronous standby,
    /// with synchronous replication).
    ///
    /// A transaction that writes no WAL commits without waiting for any standby; yet the row it found may
    /// be committed on the primary only: the primary restarted (or an operator cancelled the wait) while
    /// the first delivery's commit waited for a standby that was away, and Apple's retry came. Answering
    /// 200 then could lose the row at a failover. So the batch writes one record of WAL in a transaction
    /// of its own (a transactional logical-decoding message, prefix `siwa`, empty: no table is touched),
    /// whose commit returns only once the standby has everything up to it. Where the function is
    /// missing or not granted to the receiver's role, the answer is given as before.
    private func awaitReplication() throws {
        do {
            try pool.withConnection { connection in
                _ = try connection.query("SELECT pg_catalog.pg_logical_emit_message(true, 'siwa', '')")
            }
        } catch let error as PostgresError where error.sqlState == "42883" || error.sqlState == "42501" {
            return
        }
    }

    private func insert(_ batch: [Ticket]) throws -> Set<String> {
        try pool.withConnection { connection in
            try Self.insert(batch.map { ($0.notification, $0.rawToken) }, on: connection)
        }
    }

    /// Stores `batch` on `connection` with the statement every batch of the store runs (``insertSQL``,
    /// one row per notification); returns the jtis it inserted (a jti stored before is not inserted).
    /// Public so that tests seed notifications exactly the way the receiver stores them.
    public static func insert(
        _ batch: [(notification: ServerNotification, rawToken: String)], on connection: PostgresConnection
    ) throws -> Set<String> {
        var columns = Array(repeating: [PostgresData?](), count: 11)
        for column in columns.indices { columns[column].reserveCapacity(batch.count) }
        for (n, rawToken) in batch {
            columns[0].append(.text(n.jti))
            columns[1].append(.text(n.eventType.rawValue))
            columns[2].append(.text(n.subject))
            columns[3].append(.text(n.audience))
            columns[4].append(n.email.map { .text($0) })
            columns[5].append(n.isPrivateEmail.map { .bool($0) })
            columns[6].append(.date(n.eventTime))
            columns[7].append(.date(n.issuedAt))
            columns[8].append(n.expiresAt.map { .date($0) })
            columns[9].append(.text(rawToken))
            columns[10].append(n.claimedEventTime.map { .date($0) })
        }
        let rows = try connection.query(insertSQL, columns.map { .array($0) })
        var inserted = Set<String>(minimumCapacity: rows.count)
        for row in rows { inserted.insert(try row[0, as: String.self]) }
        return inserted
    }

}
