import Foundation
import Postgres
import Receiver
import Synchronization
import TestSupport
import Testing

/// The store's committer policy, seen from its public face: the size of every committed batch (the
/// `observeBatch` hook behind `siwa_commit_batch_size`) and the sessions waiting in PostgreSQL.
@Suite("Group commit: the rows that arrive during a commit make the next batch", .serialized)
struct BatchingTests {
    /// Sizes of the committed batches, in order of commit.
    private final class Sizes: Sendable {
        private let sizes = Mutex<[Int]>([])
        func append(_ size: Int) { sizes.withLock { $0.append(size) } }
        var values: [Int] { sizes.withLock { $0 } }
    }

    /// Store sessions waiting for the lock `locker` holds.
    private func lockWaiters(_ locker: PostgresConnection) throws -> Int {
        try locker.query(
            """
            SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'
            """)[0][0, as: Int.self]
    }

    /// Queues `count` distinct notifications; `group` is left once each is answered.
    private func queue(
        _ count: Int, prefix: String, on store: NotificationStore, group: DispatchGroup,
        outcomes: Sizes
    ) {
        for index in 0..<count {
            let seeded = SeededNotification(
                jti: "\(prefix)-\(index)", sub: "\(prefix)-user-\(index)", rawToken: "t")
            group.enter()
            store.store(seeded.notification, rawToken: seeded.rawToken) { result in
                if case .success(.accepted) = result { outcomes.append(1) }
                group.leave()
            }
        }
    }

    @Test("while one batch commits, the rows that arrive wait for it and commit together in one transaction")
    func rowsArrivingDuringACommitFormOneBatch() throws {
        let database = try PostgresCluster.shared.createSchemaDatabase()
        let pool = PostgresPool(configuration: database, maxConnections: 4)
        defer { pool.close() }
        let sizes = Sizes()
        // The receiver's own defaults.
        let store = NotificationStore(pool: pool) { size, _ in sizes.append(size) }
        defer { store.close() }
        // A first row alone, on an idle store (its session is then connected and its plan made).
        let lone = SeededNotification(jti: "lone", sub: "lone-user", rawToken: "t")
        #expect(try store.store(lone.notification, rawToken: lone.rawToken) == .accepted)
        let locker = try PostgresConnection(configuration: database)
        defer { locker.close() }
        // The first batch's insert waits for this lock, as a slow commit would.
        try locker.simpleQuery("BEGIN; LOCK TABLE siwa.notification_jtis IN EXCLUSIVE MODE")
        let group = DispatchGroup()
        let accepted = Sizes()
        queue(1, prefix: "first", on: store, group: group, outcomes: accepted)
        #expect(try waitUntil { try lockWaiters(locker) == 1 })
        // Fewer rows than a second commit is started for (overlapThreshold) arrive meanwhile.
        let later = NotificationStore.Configuration().overlapThreshold - 1
        queue(later, prefix: "later", on: store, group: group, outcomes: accepted)
        try locker.simpleQuery("COMMIT")
        #expect(group.wait(timeout: .now() + 30) == .success)
        // One transaction for the first row, one for all the others: no free committer took a few of
        // them alone while the first commit was in flight.
        #expect(sizes.values == [1, 1, later])
        #expect(accepted.values.count == later + 1)
        #expect(
            try locker.query("SELECT count(*) FROM siwa.notification_queue")[0][0, as: Int.self] == later + 2)
    }

    @Test("under load, a committer waits up to the gather delay for more rows; an idle store does not")
    func gatherDelayUnderLoad() throws {
        let database = try PostgresCluster.shared.createSchemaDatabase()
        let pool = PostgresPool(configuration: database, maxConnections: 2)
        defer { pool.close() }
        let sizes = Sizes()
        let store = NotificationStore(
            pool: pool, configuration: .init(committers: 1, overlapThreshold: 4, gatherDelay: .seconds(2))
        ) { size, _ in sizes.append(size) }
        defer { store.close() }
        // Idle (nothing waits for a commit): a lone row is committed at once.
        let lone = SeededNotification(jti: "gather-lone", sub: "gather-user", rawToken: "t")
        let started = ContinuousClock.now
        #expect(try store.store(lone.notification, rawToken: lone.rawToken) == .accepted)
        let waited = ContinuousClock.now - started
        #expect(waited < .seconds(1), "waited \(waited)")
        let locker = try PostgresConnection(configuration: database)
        defer { locker.close() }
        try locker.simpleQuery("BEGIN; LOCK TABLE siwa.notification_jtis IN EXCLUSIVE MODE")
        let group = DispatchGroup()
        let accepted = Sizes()
        queue(1, prefix: "first", on: store, group: group, outcomes: accepted)
        #expect(try waitUntil { try lockWaiters(locker) == 1 })
        // Load: two rows wait for the commit in flight; two more come right after it.
        queue(2, prefix: "waiting", on: store, group: group, outcomes: accepted)
        try locker.simpleQuery("COMMIT")
        queue(2, prefix: "after", on: store, group: group, outcomes: accepted)
        #expect(group.wait(timeout: .now() + 30) == .success)
        #expect(sizes.values == [1, 1, 4])
        #expect(accepted.values.count == 5)
    }

    @Test("a commit held up longer than overlapAfter does not hold up the rows behind it")
    func heldUpCommitDoesNotHoldUpOthers() throws {
        let database = try PostgresCluster.shared.createSchemaDatabase()
        let pool = PostgresPool(configuration: database, maxConnections: 4)
        defer { pool.close() }
        let store = NotificationStore(pool: pool, configuration: .init(overlapAfter: .milliseconds(100)))
        defer { store.close() }
        let warm = SeededNotification(jti: "warm", sub: "warm-user", rawToken: "t")
        #expect(try store.store(warm.notification, rawToken: warm.rawToken) == .accepted)
        // Another transaction inserts the dedupe key of one notification and stays open: the batch
        // holding that notification waits for it (a commit held up, as by a lock or a stalled disk).
        let locker = try PostgresConnection(configuration: database)
        defer { locker.close() }
        try locker.simpleQuery(
            "BEGIN; INSERT INTO siwa.notification_jtis (jti, issued_at) VALUES ('stuck', now())")
        let group = DispatchGroup()
        let stuck = SeededNotification(jti: "stuck", sub: "stuck-user", rawToken: "t")
        let stuckAnswered = Atomic<Bool>(false)
        group.enter()
        store.store(stuck.notification, rawToken: stuck.rawToken) { _ in
            stuckAnswered.store(true, ordering: .relaxed)
            group.leave()
        }
        #expect(try waitUntil { try lockWaiters(locker) == 1 })
        // Fewer rows than overlapThreshold arrive behind it: they are stored while it still waits.
        let others = Sizes()
        let behind = DispatchGroup()
        for index in 0..<5 {
            let seeded = SeededNotification(
                jti: "behind-\(index)", sub: "behind-user-\(index)", rawToken: "t")
            behind.enter()
            store.store(seeded.notification, rawToken: seeded.rawToken) { result in
                if case .success(.accepted) = result { others.append(1) }
                behind.leave()
            }
        }
        #expect(behind.wait(timeout: .now() + 5) == .success)
        #expect(others.values.count == 5)
        let stuckAnsweredEarly = stuckAnswered.load(ordering: .relaxed)
        #expect(!stuckAnsweredEarly)
        try locker.simpleQuery("ROLLBACK")
        #expect(group.wait(timeout: .now() + 30) == .success)
    }
}
