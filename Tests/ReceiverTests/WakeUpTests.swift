import Foundation
import Postgres
import Receiver
import TestSupport
import Testing

/// The worker's wake-up: sent by the store after its batch commits, in a transaction of its own, never
/// by the storing transaction (whose NOTIFY would hold PostgreSQL's notify lock through its flush).
@Suite("The store's wake-up after the commit")
struct WakeUpTests {
    /// What `listener` receives on `siwa_notifications` up to and including the first `marker` payload.
    private func payloads(until marker: String, on listener: PostgresConnection) throws -> [String] {
        var received: [String] = []
        let deadline = ContinuousClock.now + .seconds(20)
        while !received.contains(marker) && ContinuousClock.now < deadline {
            received += try listener.waitForNotifications(timeout: .seconds(5))
                .filter { $0.channel == "siwa_notifications" }.map(\.payload)
        }
        return received
    }

    @Test("the receiver's storing statement sends no NOTIFY at its commit; the default statement does")
    func storingTransactionSendsNone() throws {
        let database = try PostgresCluster.shared.createSchemaDatabase()
        let listener = try PostgresConnection.listening(on: "siwa_notifications", configuration: database)
        let storing = try PostgresConnection(configuration: database)
        let quiet = SeededNotification(jti: "quiet-1", sub: "u1")
        let woken = SeededNotification(jti: "woken-1", sub: "u2")

        // As the store runs it: the row commits, and nothing is sent before the marker that follows it.
        try storing.simpleQuery("BEGIN")
        #expect(
            try NotificationStore.insert(
                [(quiet.notification, quiet.rawToken)], on: storing, wakeAtCommit: false) == ["quiet-1"])
        try storing.simpleQuery("COMMIT")
        try storing.notify("siwa_notifications", payload: "after-quiet")
        #expect(try payloads(until: "after-quiet", on: listener) == ["after-quiet"])
        #expect(
            try storing.query("SELECT count(*) FROM siwa.notification_queue")[0][0, as: Int.self] == 1)

        // Every other caller (siwactl, tests, drills, the admins' SQL) wakes the worker at its commit.
        try storing.simpleQuery("BEGIN")
        try storing.storeAsReceiver(woken)
        try storing.simpleQuery("COMMIT")
        try storing.notify("siwa_notifications", payload: "after-woken")
        #expect(try payloads(until: "after-woken", on: listener) == ["", "after-woken"])
        listener.close()
        storing.close()
    }

    @Test("the store wakes a listener once its batch has committed, and stores a duplicate without waking")
    func storeWakesAfterCommit() throws {
        let database = try PostgresCluster.shared.createSchemaDatabase()
        let pool = PostgresPool(configuration: database, maxConnections: 2)
        defer { pool.close() }
        let store = NotificationStore(pool: pool, configuration: .init(committers: 2))
        defer { store.close() }
        let listener = try PostgresConnection.listening(on: "siwa_notifications", configuration: database)
        let checker = try PostgresConnection(configuration: database)
        let notification = try TestSigning.verifier.verify(
            token: TestSigning.token(), keys: TestSigning.appleKeySet)

        #expect(try store.store(notification, rawToken: "t") == .accepted)
        var woken: [PostgresNotification] = []
        let deadline = ContinuousClock.now + .seconds(20)
        while woken.isEmpty && ContinuousClock.now < deadline {
            woken = try listener.waitForNotifications(timeout: .seconds(5))
        }
        #expect(woken.map(\.payload) == [""])
        // Sent after the commit: the row is visible to another session when the wake-up arrives.
        #expect(
            try checker.query(
                "SELECT count(*) FROM siwa.notification_queue WHERE jti = $1", [.text(notification.jti)]
            )[0][0, as: Int.self] == 1)

        // A redelivery stores nothing and so wakes nobody.
        #expect(try store.store(notification, rawToken: "t") == .duplicate)
        try checker.notify("siwa_notifications", payload: "marker")
        #expect(try payloads(until: "marker", on: listener) == ["marker"])
        listener.close()
        checker.close()
    }

    @Test("batches committed while a wake-up is being sent are each followed by one")
    func concurrentBatchesAreCovered() throws {
        let database = try PostgresCluster.shared.createSchemaDatabase()
        let pool = PostgresPool(configuration: database, maxConnections: 3)
        defer { pool.close() }
        let store = NotificationStore(pool: pool, configuration: .init(committers: 2, maxBatchSize: 4))
        let listener = try PostgresConnection.listening(on: "siwa_notifications", configuration: database)
        let group = DispatchGroup()
        for index in 0..<40 {
            let seeded = SeededNotification(jti: "many-\(index)", sub: "u\(index)")
            group.enter()
            store.store(seeded.notification, rawToken: seeded.rawToken) { _ in group.leave() }
        }
        #expect(group.wait(timeout: .now() + 30) == .success)
        store.close()  // returns after the last wake-up was sent
        // The last commit came before the last wake-up: at least one arrives after all 40 rows committed.
        let checker = try PostgresConnection(configuration: database)
        #expect(try checker.query("SELECT count(*) FROM siwa.notification_queue")[0][0, as: Int.self] == 40)
        try checker.notify("siwa_notifications", payload: "marker")
        let received = try payloads(until: "marker", on: listener)
        #expect(received.last == "marker")
        #expect(received.dropLast().count >= 1 && received.dropLast().allSatisfy { $0.isEmpty })
        listener.close()
        checker.close()
    }
}
