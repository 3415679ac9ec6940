import Foundation
import Postgres
import Receiver
import TestSupport
import Testing

/// Schema version 3's layout: the partitioned log, the queue, deduplication, partitions and retention.
@Suite("Storage: the log partitioned by month, the queue, deduplication and retention")
struct StorageTests {
    @Test("a redelivery (the same token) is stored once, and queued once")
    func redeliveryStoredOnce() throws {
        let database = try AdminDatabase.make()
        #expect(try storeAsReceiver(database, jti: "once", sub: "001000.una") == .accepted)
        #expect(try storeAsReceiver(database, jti: "once", sub: "001000.una") == .duplicate)
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        #expect(try owner.query("SELECT count(*) FROM siwa.notification_log")[0][0, as: Int.self] == 1)
        #expect(try owner.query("SELECT count(*) FROM siwa.notification_queue")[0][0, as: Int.self] == 1)
    }

    @Test("a redelivery re-signed with another iat is a duplicate too: stored once, by jti alone")
    func resignedRedeliveryStoredOnce() throws {
        let database = try AdminDatabase.make()
        #expect(try storeAsReceiver(database, jti: "resigned", sub: "001000.vic") == .accepted)
        let later = storeAsReceiverIssuedAt.addingTimeInterval(3600)
        #expect(
            try storeAsReceiver(database, jti: "resigned", sub: "001000.vic", issuedAt: later) == .duplicate)
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        #expect(try owner.query("SELECT count(*) FROM siwa.notification_log")[0][0, as: Int.self] == 1)
        #expect(try owner.query("SELECT count(*) FROM siwa.notification_queue")[0][0, as: Int.self] == 1)
        // Through the view the owner is refused the same way (as version 2's UNIQUE (jti) refused it).
        #expect(
            sqlState {
                try owner.simpleQuery(
                    """
                    INSERT INTO siwa.notifications (jti, event_type, sub, audience, event_time, issued_at)
                    VALUES ('resigned', 'consent-revoked', '001000.vic', 'com.example.app', now(), now())
                    """)
            } == "23505")
    }

    @Test("past the dedupe window, a second row with a known jti is skipped when applied, not applied twice")
    func sameJTIPastTheWindowAppliedOnce() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.storeAsReceiver(
            SeededNotification(jti: "resigned", sub: "001000.vic", issuedAt: Date().addingTimeInterval(-3600))
        )
        // The key pruned (past the window) and the same jti stored again, as a late token would be.
        try owner.simpleQuery("DELETE FROM siwa.notification_jtis")
        try owner.storeAsReceiver(SeededNotification(jti: "resigned", sub: "001000.vic"))
        let outcomes = try owner.transaction { connection in
            try connection.query(
                "SELECT outcome, error FROM siwa.process_due_notifications(10, 5, interval '1 second')"
            ).map { [try $0[0, as: String.self], try $0[1, as: String?.self] ?? ""] }
        }
        #expect(outcomes.map { $0[0] } == ["applied", "skipped"])
        #expect(outcomes[1][1].contains("duplicate jti"))
    }

    @Test("dedupe keys are pruned only past the window: 7 days after iat and once the token expired")
    func dedupeKeysPruned() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.simpleQuery(
            """
            INSERT INTO siwa.notification_jtis (jti, issued_at, expires_at) VALUES
                ('old-expired', now() - interval '8 days', now() - interval '7 days'),
                ('old-no-exp', now() - interval '8 days', NULL),
                ('old-unexpired', now() - interval '8 days', now() + interval '1 day'),
                ('recent', now() - interval '6 days', now() - interval '5 days');
            """)
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        _ = try worker.query("SELECT * FROM siwa.prune(NULL, NULL)")
        let left = try owner.query("SELECT jti FROM siwa.notification_jtis ORDER BY jti").map {
            try $0[0, as: String.self]
        }
        #expect(left == ["old-unexpired", "recent"])
    }

    @Test("a role that merely connects can run none of the partition maintenance; the worker can")
    func partitionMaintenanceGrants() throws {
        let database = try AdminDatabase.make()
        let nobody = try database.connect(as: .nobody)
        defer { nobody.close() }
        for statement in [
            "SELECT siwa.create_log_partitions(3)", "SELECT siwa.drop_log_partitions(interval '1 day')",
            "SELECT siwa.create_log_partition(current_date + 400)",
        ] {
            #expect(sqlState { try nobody.query(statement) } == permissionDenied, "\(statement)")
        }
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        func partitions() throws -> Int {
            try database.value(
                "SELECT count(*)::int FROM pg_inherits WHERE inhparent = 'siwa.notification_log'::regclass")
        }
        // The database may come from a template made last month (a test run across a month's end): the
        // first call creates what this month needs, and says how many; then it has nothing left to do.
        let before = try partitions()
        #expect(
            try worker.query("SELECT siwa.create_log_partitions(1)")[0][0, as: Int.self] == partitions()
                - before)
        #expect(try worker.query("SELECT siwa.create_log_partitions(1)")[0][0, as: Int.self] == 0)
        #expect(try worker.query("SELECT siwa.create_log_partitions(3)")[0][0, as: Int.self] == 2)
        // The worker may not create an arbitrary month itself, nor drop a partition by hand.
        #expect(
            sqlState { try worker.query("SELECT siwa.create_log_partition(current_date + 4000)") }
                == permissionDenied)
        #expect(
            sqlState { try worker.query("DROP TABLE siwa.notification_log_default") } == "42501")
        // The SECURITY DEFINER functions pin their search_path: nothing of the caller's is used.
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let configs = try owner.query(
            """
            SELECT p.proname, p.prosecdef, array_to_string(p.proconfig, ',')
              FROM pg_proc p
             WHERE p.pronamespace = 'siwa'::regnamespace
               AND p.proname IN ('create_log_partitions', 'drop_log_partitions')
             ORDER BY 1
            """)
        #expect(configs.count == 2)
        for row in configs {
            #expect(try row[1, as: Bool.self])
            #expect(try row[2, as: String.self] == "search_path=pg_catalog, pg_temp")
        }
    }

    @Test("a row of a month without a partition waits in the DEFAULT one and moves when the month is created")
    func defaultPartitionHandsRowsOver() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.storeAsReceiver(
            SeededNotification(
                jti: "far", sub: "001000.wes", issuedAt: owner.instant("'2031-05-17 12:00:00+00'"),
                rawToken: "t"))
        #expect(
            try owner.query("SELECT count(*) FROM siwa.notification_log_default")[0][0, as: Int.self] == 1)
        #expect(try owner.query("SELECT siwa.create_log_partition('2031-05-01')")[0][0, as: Bool.self])
        #expect(
            try owner.query("SELECT count(*) FROM siwa.notification_log_default")[0][0, as: Int.self] == 0)
        #expect(
            try owner.query("SELECT count(*) FROM siwa.notification_log_2031_05")[0][0, as: Int.self] == 1)
        // Still queued, still applied.
        let outcomes = try owner.transaction { connection in
            try connection.query(
                "SELECT outcome FROM siwa.process_due_notifications(10, 5, interval '1 second')"
            )
            .map { try $0[0, as: String.self] }
        }
        #expect(outcomes == ["applied"])
    }

    @Test(
        "retention never drops the current month, nor one that ended within the dedupe window, whatever it is asked"
    )
    func retentionKeepsTheDedupeWindow() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.simpleQuery("SELECT siwa.create_log_partition((now() - interval '1 day')::date)")
        let before = try owner.query(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'siwa.notification_log'::regclass")[0][
                0, as: Int.self]
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        #expect(try worker.query("SELECT siwa.drop_log_partitions(interval '0')")[0][0, as: Int.self] == 0)
        let after = try owner.query(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'siwa.notification_log'::regclass")[0][
                0, as: Int.self]
        #expect(after == before)
    }

    @Test(
        "retention drops a month of 100,000 rows in under a second, leaving no dead rows, keeping what is pending"
    )
    func retentionDropsAMonthQuickly() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let month = "date_trunc('month', now()) - interval '4 months'"
        try owner.simpleQuery(
            """
            SELECT siwa.create_log_partition((\(month))::date);
            INSERT INTO siwa.notification_log (jti, event_type, sub, audience, event_time, issued_at, received_at,
                                               raw_token, state, attempts, applied_at)
            SELECT 'm-' || g, 'consent-revoked', 'sub-' || (g % 5000), 'com.example.app', \(month) + g * interval '1 second',
                   \(month) + g * interval '1 second', \(month) + g * interval '1 second', NULL,
                   CASE WHEN g % 1000 = 0 THEN 'pending' ELSE 'applied' END, 1,
                   CASE WHEN g % 1000 = 0 THEN NULL ELSE \(month) + g * interval '1 second' END
              FROM generate_series(1, 100000) AS g;
            INSERT INTO siwa.notification_queue (id, jti, issued_at, received_at)
            SELECT id, jti, issued_at, received_at FROM siwa.notification_log WHERE state = 'pending';
            """)
        #expect(try owner.query("SELECT count(*) FROM siwa.notification_queue")[0][0, as: Int.self] == 100)
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        let start = ContinuousClock.now
        let dropped = try worker.query("SELECT siwa.drop_log_partitions(interval '30 days')")[0][
            0, as: Int.self]
        let took = ContinuousClock.now - start
        #expect(dropped == 99_900)
        #expect(took < .seconds(1), "\(took)")
        // Nothing pending is lost: the 100 queued rows are in the DEFAULT partition, still queued.
        #expect(
            try owner.query("SELECT count(*) FROM siwa.notification_log_default WHERE state = 'pending'")[0][
                0, as: Int.self] == 100)
        #expect(
            try owner.query(
                """
                SELECT count(*) FROM siwa.notification_queue q
                  JOIN siwa.notification_log l ON l.id = q.id AND l.jti = q.jti AND l.issued_at = q.issued_at
                """)[0][0, as: Int.self] == 100)
        #expect(
            try owner.query(
                "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'siwa.notification_log_default'::regclass"
            )[0][0, as: Int.self] == 0)
    }
}

/// The admins' questions at 1M rows: no sequential scan of the history's month partitions.
@Suite("The cookbook's history questions at 1M rows", .serialized)
struct CookbookPlanTests {
    static let database = Result { () throws -> AdminDatabase in
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        // A year of history, 1M rows spread evenly over it; one in 1,000 skipped, one in 2,000 dead.
        try owner.simpleQuery(
            """
            SELECT siwa.create_log_partition((now() - make_interval(months => m))::date)
              FROM generate_series(1, 12) AS m;
            INSERT INTO siwa.notification_log (jti, event_type, sub, audience, event_time, issued_at, received_at,
                                               state, attempts, applied_at, last_error)
            SELECT 'h-' || g,
                   CASE WHEN g % 1000 = 0 THEN 'some-future-type'
                        ELSE (ARRAY['email-disabled', 'email-enabled', 'consent-revoked', 'account-delete'])[g % 4 + 1]
                   END,
                   'sub-' || (g % 200000), CASE WHEN g % 2 = 0 THEN 'com.example.app' ELSE 'com.example.web' END,
                   t, t, t,
                   CASE WHEN g % 1000 = 0 THEN 'skipped' WHEN g % 2000 = 1 THEN 'dead' ELSE 'applied' END,
                   1,
                   CASE WHEN g % 2000 = 1 THEN NULL ELSE t + interval '1 second' END,
                   CASE WHEN g % 1000 = 0 THEN 'unknown event type' WHEN g % 2000 = 1 THEN 'P0001: x' END
              FROM generate_series(1, 1000000) AS g,
                   LATERAL (SELECT now() - interval '360 days' + g * interval '31 seconds' AS t) AS s;
            -- A backlog of 100, the newest.
            UPDATE siwa.notification_log SET state = 'pending', attempts = 0, applied_at = NULL, last_error = NULL
             WHERE jti IN (SELECT 'h-' || g FROM generate_series(999901, 1000000) AS g);
            INSERT INTO siwa.notification_queue (id, jti, issued_at, received_at)
            SELECT id, jti, issued_at, received_at FROM siwa.notification_log WHERE state = 'pending';
            ANALYZE siwa.notification_log;
            ANALYZE siwa.notification_queue;
            """)
        return database
    }

    @Test(
        "is answered from the log's indexes",
        arguments: [
            "What happened to user X, and when?", "What happened to one notification?",
            "How many users revoked consent, per day?", "Which notifications are dead, and why?",
            "Which notifications are still pending, and how late are they?",
            "Which notifications were skipped, and why?", "How many notifications came for each client ID?",
            "How long does applying take (percentiles per hour)?", "How many events of each type per day?",
        ])
    func noSequentialScan(heading: String) throws {
        let database = try Self.database.get()
        let admin = try database.connect(as: .admin)
        defer { admin.close() }
        let query = try CookbookQuery.under(heading).substituting(["sub": "sub-42", "jti": "h-42"])
        let plan = try admin.query("EXPLAIN " + query).map { try $0[0, as: String.self] }
        // This month and the last may be read whole: the 14- and 30-day questions need every row of
        // them. Any older month read whole would be a scan of the history (an empty partition, planned
        // at cost 0, does not count).
        let recent = try admin.query(
            """
            SELECT 'notification_log_' || to_char(now() AT TIME ZONE 'UTC', 'YYYY_MM'),
                   'notification_log_' || to_char(now() AT TIME ZONE 'UTC' - interval '1 month', 'YYYY_MM')
            """)[0]
        let allowed = [try recent[0, as: String.self], try recent[1, as: String.self]]
        let scans = plan.filter { line in
            guard line.contains("Seq Scan on notification_log"),
                !allowed.contains(where: { line.contains("Seq Scan on \($0) ") }),
                let cost = line.firstMatch(of: /cost=[0-9.]+\.\.([0-9.]+)/), let total = Double(cost.1)
            else { return false }
            return total > 100
        }
        #expect(scans == [], "\(heading):\n\(plan.joined(separator: "\n"))")
    }
}
