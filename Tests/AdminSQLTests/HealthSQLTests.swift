import Foundation
import Postgres
import TestSupport
import Testing

/// `siwa.service_heartbeats` and `siwa.health_gauges`: each service role writes the heartbeats
/// of its own kind only, and reads the health gauges' aggregates without any other grant.
@Suite("Health: heartbeats by kind, and the gauges' aggregates")
struct HealthSQLTests {
    static let upsert = """
        INSERT INTO siwa.service_heartbeats (kind, host, pid, version, audiences, started_at)
        VALUES ($1, 'h', 1, 'schema 3', '{com.example.app}', now())
        ON CONFLICT (kind, host, pid) DO UPDATE SET last_seen = excluded.last_seen
        """

    @Test("siwa_receiver and siwa_worker record and prune heartbeats of their own kind only")
    func ownKindOnly() throws {
        let database = try AdminDatabase.make()
        for (role, own, other) in [
            (AdminRole.receiver, "receiver", "worker"), (.worker, "worker", "receiver"),
        ] {
            let connection = try database.connect(as: role)
            defer { connection.close() }
            try connection.query(Self.upsert, [.text(own)])
            try connection.query(Self.upsert, [.text(own)])  // again: an update of the same row
            // The other kind's row: refused by the row-level policy (a receiver cannot fake a live worker).
            #expect(sqlState { try connection.query(Self.upsert, [.text(other)]) } == permissionDenied)
            #expect(
                sqlState {
                    try connection.query("UPDATE siwa.service_heartbeats SET kind = $1", [.text(other)])
                }
                    == permissionDenied)
        }
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        #expect(
            try owner.query("SELECT kind FROM siwa.service_heartbeats ORDER BY kind").map {
                try $0[0, as: String.self]
            } == ["receiver", "worker"])
        // Neither sees, changes or deletes the other's row.
        let receiver = try database.connect(as: .receiver)
        defer { receiver.close() }
        #expect(
            try receiver.query("SELECT kind FROM siwa.service_heartbeats").map { try $0[0, as: String.self] }
                == ["receiver"])
        #expect(try receiver.execute("DELETE FROM siwa.service_heartbeats WHERE kind = 'worker'") == 0)
        #expect(
            try receiver.execute("UPDATE siwa.service_heartbeats SET last_seen = now() WHERE kind = 'worker'")
                == 0)
        // siwa_admin reads them all and writes none; PUBLIC nothing.
        let admin = try database.connect(as: .admin)
        defer { admin.close() }
        #expect(try admin.query("SELECT count(*) FROM siwa.service_heartbeats")[0][0, as: Int.self] == 2)
        #expect(sqlState { try admin.query(Self.upsert, [.text("worker")]) } == permissionDenied)
        let nobody = try database.connect(as: .nobody)
        defer { nobody.close() }
        #expect(sqlState { try nobody.query("SELECT * FROM siwa.service_heartbeats") } == permissionDenied)
    }

    @Test(
        "the health gauges: latest received and applied, dead count and oldest pending age, from aggregates only"
    )
    func gauges() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let gauges = """
            SELECT extract(epoch FROM now() - last_received_at)::float8, last_applied_at IS NULL,
                   extract(epoch FROM now() - installed_at)::float8, dead, oldest_pending_seconds
              FROM siwa.health_gauges($1)
            """
        // An empty database: no notification, none applied, nothing dead or pending; installed just now.
        let receiver = try database.connect(as: .receiver)
        defer { receiver.close() }
        var row = try receiver.query(gauges, [nil])[0]
        #expect(try row[0, as: Double?.self] == nil)
        #expect(try row[1, as: Bool.self])
        #expect(try row[2, as: Double.self] < 600)
        #expect(try row[3, as: Int.self] == 0)
        #expect(try row[4, as: Double.self] == 0)
        // Three notifications: applied 3 days ago, dead 2 days ago, pending since 10 minutes.
        for (jti, state, ago) in [
            ("j-applied", "applied", 3 * 86_400.0), ("j-dead", "dead", 2 * 86_400.0),
            ("j-pending", "pending", 600.0),
        ] {
            try owner.query(
                """
                INSERT INTO siwa.notifications (jti, event_type, sub, audience, event_time, issued_at, received_at,
                                                state, applied_at, last_error)
                VALUES ($1, 'consent-revoked', 's', 'com.example.app', now(), now() - make_interval(secs => $3),
                        now() - make_interval(secs => $3), $2,
                        CASE WHEN $2 = 'applied' THEN now() - make_interval(secs => $3) END,
                        CASE WHEN $2 = 'dead' THEN 'P0001: x' END)
                """, [.text(jti), .text(state), .double(ago)])
        }
        for role in [AdminRole.receiver, .worker, .admin] {
            let connection = try database.connect(as: role)
            defer { connection.close() }
            row = try connection.query(gauges, [nil])[0]
            #expect(abs(try row[0, as: Double.self] - 600) < 60, "\(role)")  // the pending one is the latest
            #expect(try !row[1, as: Bool.self], "\(role)")
            #expect(try row[3, as: Int.self] == 1, "\(role)")
            #expect(abs(try row[4, as: Double.self] - 600) < 60, "\(role)")
        }
        // With the caller's last answer as the bound: the same latest time; a bound past every row: NULL,
        // nothing newer (the caller keeps what it had; the windows are not searched again).
        row = try receiver.query(gauges, [.date(Date().addingTimeInterval(-700))])[0]
        #expect(abs(try row[0, as: Double.self] - 600) < 60)
        row = try receiver.query(gauges, [.date(Date().addingTimeInterval(-60))])[0]
        #expect(try row[0, as: Double?.self] == nil)
        // The receiver still cannot read the columns the aggregates come from; PUBLIC cannot call it.
        #expect(
            sqlState { try receiver.query("SELECT received_at FROM siwa.notification_log") }
                == permissionDenied)
        let nobody = try database.connect(as: .nobody)
        defer { nobody.close() }
        #expect(sqlState { try nobody.query(gauges, [nil]) } == permissionDenied)
        #expect(
            sqlState { try nobody.query("SELECT * FROM siwa.client_ids_in_use(now())") } == permissionDenied)
        #expect(
            sqlState { try receiver.query("SELECT * FROM siwa.client_ids_in_use(now())") } == permissionDenied
        )
    }

    @Test("the gauges' functions are SECURITY DEFINER with a pinned search_path")
    func pinned() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let rows = try owner.query(
            """
            SELECT p.proname, p.prosecdef, array_to_string(p.proconfig, ',')
              FROM pg_proc p WHERE p.pronamespace = 'siwa'::regnamespace
               AND p.proname IN ('health_gauges', 'client_ids_in_use') ORDER BY 1
            """)
        #expect(rows.count == 2)
        for row in rows {
            #expect(try row[1, as: Bool.self])
            #expect(try row[2, as: String.self].contains("search_path=pg_catalog, pg_temp"))
        }
    }
}

extension CookbookPlanTests {
    @Test("the health gauges, once they have an answer, read a few block ranges of the log, no month whole")
    func healthGaugesReadLittle() throws {
        let database = try Self.database.get()
        // What autovacuum's autosummarize does (the fixture was loaded in one statement just now):
        // summarize every complete BRIN range of received_at; each month's last, partly filled range
        // stays unsummarized, and is read every time.
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.query(
            """
            SELECT count(brin_summarize_range(i.indexrelid, r.block))
              FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid,
                   LATERAL generate_series(0, pg_relation_size(i.indrelid) / 8192 / 128 * 128 - 1, 128) AS r(block)
             WHERE c.relname LIKE 'notification\\_log\\_%\\_received\\_at\\_idx' AND c.relkind = 'i'
               AND c.relam = (SELECT oid FROM pg_am WHERE amname = 'brin')
            """)
        let receiver = try database.connect(as: .receiver)
        defer { receiver.close() }
        // Rows read per partition of the log, and how many of them by a sequential scan.
        let counters = """
            SELECT relname::text, seq_scan, seq_tup_read + coalesce(idx_tup_fetch, 0)
              FROM pg_stat_xact_user_tables WHERE schemaname = 'siwa' AND relname LIKE 'notification_log%'
            """
        // The first reading (no previous answer) finds the latest notification by widening windows.
        let latest = try receiver.transaction { connection in
            try connection.query(
                "SELECT extract(epoch FROM last_received_at)::float8 FROM siwa.health_gauges()")[0][
                    0, as: Double.self]
        }
        // The next ones pass it: only block ranges received since are read (plus each partition's last,
        // partly filled range, which BRIN leaves unsummarized), in a fresh session so that the counters
        // are this reading's alone.
        let again = try database.connect(as: .receiver)
        defer { again.close() }
        let (reads, answer) = try again.transaction { connection in
            let answer = try connection.query(
                "SELECT extract(epoch FROM last_received_at)::float8 FROM siwa.health_gauges(to_timestamp($1::float8))",
                [.double(latest)])[0][0, as: Double?.self]
            let reads = try connection.query(counters).map {
                (
                    partition: try $0[0, as: String.self], seqScans: try $0[1, as: Int.self],
                    rows: try $0[2, as: Int.self]
                )
            }
            return (reads, answer)
        }
        #expect(answer.map { abs($0 - latest) < 0.001 } ?? true)
        // Per partition: its blocks and the rows one full block range of it holds.
        let partitions = Dictionary(
            uniqueKeysWithValues: try owner.query(
                """
                SELECT relname::text, pg_relation_size(oid) / 8192,
                       ceil(128 * reltuples / greatest(relpages, 1))::bigint
                  FROM pg_class
                 WHERE relnamespace = 'siwa'::regnamespace AND relname LIKE 'notification\\_log\\_%' AND relkind = 'r'
                """
            ).map {
                (
                    try $0[0, as: String.self],
                    (blocks: try $0[1, as: Int.self], rowsPerRange: try $0[2, as: Int.self])
                )
            })
        // A partition smaller than one block range (early in a month, this month's) is read whole by
        // either plan, and the planner rightly scans it; any larger partition read whole is a failure.
        for read in reads where read.seqScans > 0 {
            #expect((partitions[read.partition]?.blocks ?? 0) <= 128, "\(read.partition) was read whole")
        }
        // The partitions an 8-day window of issued_at reaches (two months and DEFAULT) read at most their
        // last, partly filled range and the one before; every other month a block or two (about 44 rows,
        // its BRIN's unsummarized end). Without that bound: every month's last range (about 35,000 rows).
        let touched = reads.sorted { $0.rows > $1.rows }
        for (rank, read) in touched.enumerated() {
            let range = max(partitions[read.partition]?.rowsPerRange ?? 0, 128)
            let limit = rank < 3 ? 2 * range : 2 * range / 128
            #expect(read.rows <= limit, "\(read.partition): \(read.rows) rows read, \(range) per block range")
        }
    }
}
