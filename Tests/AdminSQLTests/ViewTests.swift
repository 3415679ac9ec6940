import Foundation
import Postgres
import TestSupport
import Testing

@Suite("Admin views on seeded data, and schema.sql itself")
struct ViewTests {
    /// The seeded database's single queue_health row, read as the admin.
    func queueHealth() throws -> PostgresRow {
        let admin = try Seed.shared.get().connect(as: .admin)
        defer { admin.close() }
        let rows = try admin.query("SELECT * FROM siwa.queue_health")
        #expect(rows.count == 1)
        return try #require(rows.first)
    }

    func account(_ sub: String) throws -> PostgresRow {
        let admin = try Seed.shared.get().connect(as: .admin)
        defer { admin.close() }
        return try #require(
            try admin.query("SELECT * FROM siwa.account_overview WHERE sub = $1", [.text(sub)]).first,
            "no account_overview row for \(sub)")
    }

    @Test("queue_health has exactly the columns siwactl stats reads")
    func queueHealthColumns() throws {
        #expect(
            try queueHealth().columns == [
                "pending", "due", "retrying", "dead", "oldest_pending_seconds", "received_last_hour",
                "applied_last_hour", "apply_latency_p50_seconds", "apply_latency_p99_seconds", "busy",
                "oldest_busy_seconds",
            ])
    }

    @Test("queue_health counts the backlog, failures and the last hour")
    func queueHealthCounts() throws {
        let row = try queueHealth()
        #expect(try row["pending", as: Int.self] == 2)
        #expect(try row["due", as: Int.self] == 1)
        #expect(try row["retrying", as: Int.self] == 1)
        #expect(try row["dead", as: Int.self] == 1)
        // Every seeded notification but carol's first (received two days ago).
        #expect(try row["received_last_hour", as: Int.self] == 10)
        // Applied or skipped by the worker's pass; not the dead one.
        #expect(try row["applied_last_hour", as: Int.self] == 8)
    }

    @Test("queue_health measures the oldest pending age and the apply latency percentiles")
    func queueHealthTimes() throws {
        let row = try queueHealth()
        // Frank's notification was received 30 minutes before seeding, which happened some time before
        // this read (the seeded database is shared by the suite): the oldest pending age is his
        // notification's age now, read in the same snapshot.
        let admin = try Seed.shared.get().connect(as: .admin)
        defer { admin.close() }
        let ages = try #require(
            try admin.query(
                """
                SELECT q.oldest_pending_seconds, extract(epoch FROM now() - n.received_at)::float8
                  FROM siwa.queue_health q, siwa.event_history n
                 WHERE n.sub = $1 AND n.state = 'pending'
                """, [.text(Seed.frank)]
            ).first)
        let oldest = try #require(try ages[0, as: Double?.self])
        let franksAge = try ages[1, as: Double.self]
        #expect(franksAge >= 1800)
        #expect(abs(oldest - franksAge) < 1)
        // Latencies (s): 300 360 600 1200 1800 2400 3000 172800, plus the seconds the seeding took.
        let p50 = try #require(try row["apply_latency_p50_seconds", as: Double?.self])
        #expect(abs(p50 - 1500) < 60)
        let p99 = try #require(try row["apply_latency_p99_seconds", as: Double?.self])
        #expect(abs(p99 - (3000 + 0.93 * 169_800)) < 60)
    }

    @Test("queue_health on an empty database: zero counts and NULL times")
    func queueHealthEmpty() throws {
        let admin = try AdminDatabase.make().connect(as: .admin)
        defer { admin.close() }
        let row = try #require(try admin.query("SELECT * FROM siwa.queue_health").first)
        #expect(try row["pending", as: Int.self] == 0)
        #expect(try row["dead", as: Int.self] == 0)
        #expect(try row["oldest_pending_seconds", as: Double?.self] == nil)
        #expect(try row["apply_latency_p50_seconds", as: Double?.self] == nil)
        #expect(try row["busy", as: Int.self] == 0)
        #expect(try row["oldest_busy_seconds", as: Double?.self] == nil)
    }

    @Test("queue_health counts busy notifications and how long the oldest has waited for its user")
    func queueHealthBusy() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.execute(
            """
            INSERT INTO siwa.notifications (jti, event_type, sub, audience, event_time, issued_at, busy_since)
            VALUES ('b1', 'consent-revoked', 's1', 'a', now(), now(), now() - interval '10 minutes'),
                   ('b2', 'consent-revoked', 's1', 'a', now(), now(), now() - interval '1 minute'),
                   ('n1', 'consent-revoked', 's2', 'a', now(), now(), NULL)
            """)
        let admin = try database.connect(as: .admin)
        defer { admin.close() }
        let row = try #require(try admin.query("SELECT * FROM siwa.queue_health").first)
        #expect(try row["pending", as: Int.self] == 3)
        #expect(try row["busy", as: Int.self] == 2)
        let oldest = try #require(try row["oldest_busy_seconds", as: Double?.self])
        #expect(abs(oldest - 600) < 60)
    }

    @Test("account_overview: consent revoked, signed in again, a newer event pending")
    func overviewAlice() throws {
        let row = try account(Seed.alice)
        #expect(try row["email_status", as: String?.self] == "enabled")
        #expect(try row["email", as: String?.self] == "alice@privaterelay.appleid.com")
        #expect(try row["consent_revoked_at", as: Date?.self] != nil)
        #expect(try row["open_sessions", as: Int.self] == 1)
        #expect(try row["revoked_sessions_by_reason", as: String.self] == #"{"consent-revoked": 2}"#)
        #expect(try row["event_count", as: Int.self] == 4)
        #expect(try row["pending_events", as: Int.self] == 1)
        #expect(try row["dead_events", as: Int.self] == 0)
        #expect(try row["last_event_type", as: String?.self] == "email-disabled")
        let lastSession = try #require(try row["last_session_created_at", as: Date?.self])
        let revoked = try #require(try row["consent_revoked_at", as: Date?.self])
        #expect(lastSession > revoked)
    }

    @Test("account_overview: relay email disabled, one open refresh token")
    func overviewBob() throws {
        let row = try account(Seed.bob)
        #expect(try row["email_status", as: String?.self] == "disabled")
        #expect(try row["is_private_email", as: Bool?.self] == true)
        #expect(try row["open_refresh_tokens", as: Int.self] == 1)
        #expect(try row["open_sessions", as: Int.self] == 0)
        #expect(try row["event_count", as: Int.self] == 1)
    }

    @Test("account_overview: a deleted account has nothing open and no personal data")
    func overviewCarol() throws {
        let row = try account(Seed.carol)
        #expect(try row["deleted_at", as: Date?.self] != nil)
        #expect(try row["personal_data_erased_at", as: Date?.self] != nil)
        #expect(try row["email", as: String?.self] == nil)
        #expect(try row["open_sessions", as: Int.self] == 0)
        #expect(try row["open_refresh_tokens", as: Int.self] == 0)
        #expect(try row["revoked_sessions_by_reason", as: String.self] == #"{"account-delete": 1}"#)
        #expect(try row["last_event_type", as: String?.self] == "account-delete")
    }

    @Test("account_overview counts a dead event")
    func overviewErin() throws {
        let row = try account(Seed.erin)
        #expect(try row["dead_events", as: Int.self] == 1)
        #expect(try row["event_count", as: Int.self] == 2)
        #expect(try row["consent_revoked_at", as: Date?.self] == nil)
    }

    @Test("account_overview has one row per account")
    func overviewRows() throws {
        let admin = try Seed.shared.get().connect(as: .admin)
        defer { admin.close() }
        let subs = try admin.query("SELECT sub FROM siwa.account_overview ORDER BY sub").map {
            try $0[0, as: String.self]
        }
        // Every user seen in a notification the worker handled (dave's only one is of an unknown type:
        // its account row is what serialises it with erasure); frank's is still pending.
        #expect(subs == [Seed.alice, Seed.bob, Seed.carol, Seed.dave, Seed.erin])
    }

    @Test("every view and every view column has a comment")
    func comments() throws {
        let owner = try AdminDatabase.make().connectAsOwner()
        defer { owner.close() }
        let missing = try owner.query(
            """
            SELECT c.relname || coalesce('.' || a.attname, '')
              FROM pg_class c
              LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
             WHERE c.relnamespace = 'siwa'::regnamespace AND c.relkind = 'v'
               AND (obj_description(c.oid, 'pg_class') IS NULL OR col_description(c.oid, a.attnum) IS NULL)
            """
        ).map { try $0[0, as: String.self] }
        #expect(missing == [])
    }

    @Test("schema.sql applies twice and keeps data, roles and grants")
    func appliesTwice() throws {
        let database = try Seed.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try TestSchema.apply(on: owner)
        try TestSchema.apply(on: owner)
        #expect(try owner.query("SELECT count(*) FROM siwa.notifications").first?[0, as: Int.self] == 11)
        // The replaced hook survives.
        #expect(
            try owner.query("SELECT prosrc LIKE '%hook refused%' FROM pg_proc WHERE proname = 'on_event'")
                .first?[0, as: Bool.self] == true)
        let admin = try database.connect(as: .admin)
        defer { admin.close() }
        #expect(try admin.query("SELECT pending FROM siwa.queue_health").first?[0, as: Int.self] == 2)
        #expect(sqlState { try admin.query("SELECT * FROM siwa.notifications") } == permissionDenied)
    }

    @Test(
        "the views' queries are served by indexes",
        arguments: [
            "SELECT * FROM siwa.queue_health",
            "SELECT * FROM siwa.account_overview WHERE sub = '001000.alice'",
            "SELECT * FROM siwa.event_history WHERE sub = '001000.alice' ORDER BY event_time",
        ])
    func indexed(query: String) throws {
        let owner = try AdminDatabase.make().connectAsOwner()
        defer { owner.close() }
        let plan = try owner.transaction { connection in
            try connection.simpleQuery("SET LOCAL enable_seqscan = off")
            return try connection.query("EXPLAIN " + query).map { try $0[0, as: String.self] }
        }
        // The queue is read whole on purpose (it holds only the work still to do); the history never.
        let sequentialScans = plan.filter {
            $0.contains("Seq Scan") && !$0.contains("Seq Scan on notification_queue")
        }
        #expect(sequentialScans == [], "\(plan.joined(separator: "\n"))")
    }
}
