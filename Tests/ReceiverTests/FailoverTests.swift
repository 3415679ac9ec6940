import AppleNotifications
import Foundation
import HTTPServer
import Postgres
import Receiver
import TestSupport
import Testing

@Suite("Failover: a database that accepts no writes, and synchronous replication", .serialized)
struct ReceiverFailoverTests {
    @Test("a receiver whose database accepts no writes is not ready and answers 503, then recovers by itself")
    func readOnlyDatabase() throws {
        let harness = try ReceiverHarness(poolSize: 4)
        #expect(try harness.deliver(TestSigning.token()).status == 200)
        let name = try #require(harness.database.database)
        let admin = try PostgresConnection(
            configuration: PostgresCluster.shared.configuration(database: "postgres"))
        defer { admin.close() }
        // As after a failover to a server that is still a standby: the receiver's sessions end, and every
        // new one is read-only.
        try admin.simpleQuery("ALTER DATABASE \(name) SET default_transaction_read_only = on")
        try admin.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            [.text(name)])

        let refused = try harness.deliver(TestSigning.token())
        #expect(refused.status == 503, "\(refused.text)")
        #expect(refused.headers["Retry-After"] != nil)
        // Not ready, on every probe: each finds a read-only session (none is kept for reuse).
        for _ in 0..<3 { #expect(try harness.get("/readyz").status == 503) }

        try admin.simpleQuery("ALTER DATABASE \(name) RESET default_transaction_read_only")
        let jti = UUID().uuidString
        #expect(try waitUntil { try harness.deliver(TestSigning.token(jti: jti)).status == 200 })
        #expect(try harness.rowCount(jti: jti) == 1)
        #expect(try harness.get("/readyz").status == 200)
    }

    @Test("a duplicate is answered 200 only once the row it found is on the synchronous standby")
    func duplicateWaitsForStandby() throws {
        let cluster = try PostgresCluster.start()
        defer { cluster.destroy() }
        let database = try cluster.createSchemaDatabase()
        var admin = try PostgresConnection(configuration: database)
        defer { admin.close() }
        // A synchronous standby that is away: every commit that writes waits for it.
        try admin.simpleQuery("ALTER SYSTEM SET synchronous_standby_names = 'away'")
        try admin.simpleQuery("SELECT pg_reload_conf()")
        let pool = PostgresPool(configuration: database, maxConnections: 2)
        defer { pool.close() }
        let store = NotificationStore(pool: pool, configuration: .init(committers: 2))
        defer { store.close() }

        // A delivery commits on the primary and waits for the standby: 503 at its deadline. (The reload
        // reaches the server's processes a moment later: deliveries before that are simply stored.)
        var waiting: (notification: ServerNotification, token: String)?
        #expect(
            try waitUntil {
                let token = TestSigning.token()
                let notification = try TestSigning.verifier.verify(
                    token: token, keys: TestSigning.appleKeySet)
                do {
                    _ = try store.store(notification, rawToken: token, deadline: .now + .milliseconds(300))
                    return false
                } catch is NotificationStore.CommitTimeout {
                    waiting = (notification, token)
                    return true
                }
            })
        let (notification, token) = try #require(waiting)
        // The primary restarts before the standby is back: its own WAL has the commit, so the row is
        // there for everyone (a cancelled wait does the same), though no standby has it.
        try cluster.stop(mode: .immediate)
        try cluster.start()
        admin.close()
        admin = try PostgresConnection(configuration: database)
        let count = "SELECT count(*) FROM siwa.notification_log WHERE jti = $1"
        #expect(try admin.query(count, [.text(notification.jti)])[0][0, as: Int.self] == 1)

        // Apple's retry finds that row: it must not be answered 200 before the standby has it.
        #expect(throws: NotificationStore.CommitTimeout.self) {
            try store.store(notification, rawToken: token, deadline: .now + .milliseconds(500))
        }

        // The standby requirement lifted (as when the standby is back): the retry is a duplicate.
        try admin.simpleQuery("ALTER SYSTEM RESET synchronous_standby_names")
        try admin.simpleQuery("SELECT pg_reload_conf()")
        #expect(try store.store(notification, rawToken: token, deadline: .now + .seconds(10)) == .duplicate)
    }
}
