import Foundation
import Postgres
import ServiceSupport
import TestSupport
import Testing
import Worker

@Suite("A worker on a database that accepts no writes")
struct WorkerFailoverTests {
    @Test(
        "its lanes reconnect with backoff instead of failing batches, then apply once the database accepts writes"
    )
    func readOnlyDatabase() throws {
        let db = try TestDatabase()
        let name = try #require(db.configuration.database)
        try db.insert(jti: "read-only-1", type: "consent-revoked", sub: "u-read-only")
        let admin = try PostgresConnection(configuration: db.cluster.configuration(database: "postgres"))
        defer { admin.close() }
        // What every session sees on a standby, e.g. when a failover has not finished yet.
        try admin.simpleQuery("ALTER DATABASE \(name) SET default_transaction_read_only = on")
        let metrics = MetricsRegistry()
        let worker = try db.worker(concurrency: 1, metrics: metrics)
        let stop = startRunning(worker)
        defer { stop() }

        #expect(waitUntil { (metric("siwa_worker_reconnects_total", in: metrics) ?? 0) >= 2 })
        #expect(metric("siwa_worker_batch_failures_total", in: metrics) == 0)
        #expect(try db.value("SELECT attempts FROM siwa.notification_queue WHERE jti = 'read-only-1'") == 0)

        try admin.simpleQuery("ALTER DATABASE \(name) RESET default_transaction_read_only")
        #expect(try waitUntil(timeout: .seconds(20)) { try db.state("read-only-1") == "applied" })
    }
}
