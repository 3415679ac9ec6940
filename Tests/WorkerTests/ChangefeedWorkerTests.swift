import Foundation
import Postgres
import TestSupport
import Testing
import Worker

/// The changefeed as siwa-worker's lanes and maintenance pass keep it.
@Suite("siwa-worker keeps the changefeed: numbered as it commits, pruned by its maintenance pass")
struct ChangefeedWorkerTests {
    @Test("two lanes draining leave every change numbered: positions 1 to n, none left without one")
    func lanesNumberEveryChange() throws {
        let db = try TestDatabase()
        for index in 0..<60 {
            try db.insert(
                jti: "j\(index)", type: index % 3 == 0 ? "consent-revoked" : "email-enabled",
                sub: "u\(index)",
                email: "u\(index)@privaterelay.appleid.com")
        }
        let worker = try db.worker(concurrency: 2, batchSize: 5)
        #expect(try db.drainUntilSettled(worker))
        #expect(try db.value("SELECT count(*)::integer FROM siwa.changes", as: Int.self) == 60)
        #expect(
            try db.value(
                "SELECT array_agg(position ORDER BY position) = array(SELECT generate_series(1, 60)::bigint) FROM siwa.changes",
                as: Bool.self))
        #expect(try db.value("SELECT last_position::integer FROM siwa.changes_counter", as: Int.self) == 60)
    }

    @Test(
        "the maintenance pass prunes changes past siwa.settings.changes_retention, with no retention flag set"
    )
    func maintenancePrunesChanges() throws {
        let db = try TestDatabase()
        try db.insert(jti: "old", type: "consent-revoked", sub: "u")
        try db.insert(jti: "new", type: "consent-revoked", sub: "v")
        let worker = try db.worker()
        _ = try worker.drainOnce()
        #expect(try db.value("SELECT count(*)::integer FROM siwa.changes", as: Int.self) == 2)
        try db.connection.simpleQuery(
            """
            UPDATE siwa.settings SET changes_retention = interval '1 hour';
            UPDATE siwa.changes SET applied_at = now() - interval '2 hours' WHERE jti = 'old';
            """)
        _ = try worker.drainOnce()
        #expect(try db.value("SELECT string_agg(jti, ' ') FROM siwa.changes", as: String.self) == "new")
    }
}
