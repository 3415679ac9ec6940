import Foundation
import Postgres
import TestSupport
import Testing

/// The drain does no work it need not do, and skipping it never loses what it is for: each of a batch's
/// log rows is written once (the erasure leaves the batch's own rows to the marking), no team-transfer
/// alias is looked up while there is none (and each row's once when there are), and the webhook fan-out
/// stops at one probe of the endpoints while none is enabled, yet honours one committed meanwhile. Counted with
/// the transaction's own statistics (pg_stat_xact_*), which include the statements the functions run.
@Suite("The drain skips the work it need not do")
struct DrainWorkTests {
    private func processBatch(_ connection: PostgresConnection, limit: Int = 64) throws -> [String: String] {
        var outcomes: [String: String] = [:]
        for row in try connection.query(
            "SELECT jti, outcome FROM siwa.process_due_notifications($1::integer, 5, interval '1 second')",
            [.int(Int64(limit))])
        {
            outcomes[try row[0, as: String.self]] = try row[1, as: String.self]
        }
        return outcomes
    }

    /// A new session: the transaction statistics (pg_stat_xact_*) also hold what this session did in
    /// the last second, not yet reported, so each measured transaction runs in a session of its own.
    private func freshSession(_ db: TestDatabase) throws -> PostgresConnection {
        let session = try db.connect()
        try session.execute("SET track_functions = 'all'")
        return session
    }

    private func value(_ session: PostgresConnection, _ sql: String) throws -> Int {
        try #require(try session.query(sql).first)[0, as: Int.self]
    }

    private func logUpdatesInThisTransaction(_ session: PostgresConnection) throws -> Int {
        try value(
            session,
            """
            SELECT coalesce(sum(n_tup_upd), 0)::integer FROM pg_stat_xact_user_tables
             WHERE schemaname = 'siwa' AND relname LIKE 'notification_log%'
            """)
    }

    @Test("an account-delete's batch writes each of its own log rows once, and erases the user's older ones")
    func erasureWritesEachBatchRowOnce() throws {
        let db = try TestDatabase()
        try db.insert(
            jti: "early", type: "email-enabled", sub: "u", eventTime: "now() - interval '2 hours'",
            email: "a@privaterelay.appleid.com")
        #expect(try processBatch(db.connection) == ["early": "applied"])
        try db.insert(
            jti: "mail", type: "email-disabled", sub: "u", eventTime: "now() - interval '1 hour'",
            email: "b@privaterelay.appleid.com")
        try db.insert(jti: "delete", type: "account-delete", sub: "u")

        let session = try freshSession(db)
        defer { session.close() }
        try session.execute("BEGIN")
        #expect(try processBatch(session) == ["mail": "applied", "delete": "applied"])
        // The older row erased (1), the batch's two rows marked and erased by one UPDATE each (2).
        #expect(try logUpdatesInThisTransaction(session) == 3)
        try session.execute("COMMIT")

        #expect(
            try db.value(
                """
                SELECT count(*)::integer FROM siwa.notification_log
                 WHERE sub = 'u' AND email IS NULL AND raw_token IS NULL AND personal_data_erased_at IS NOT NULL
                """) == 3)
        #expect(try db.value("SELECT count(*)::integer FROM siwa.notification_log WHERE sub = 'u'") == 3)
        #expect(try db.state("mail") == "applied")
        #expect(try db.state("delete") == "applied")
    }

    @Test("no alias is looked up while none exists, and each row's once when one does")
    func aliasesLookedUpOnlyWhenThereAreAny() throws {
        let db = try TestDatabase()

        let currentSubCalls =
            "SELECT coalesce(sum(calls), 0)::integer FROM pg_stat_xact_user_functions WHERE funcname = 'current_sub'"
        for n in 1...3 { try db.insert(jti: "plain-\(n)", type: "consent-revoked", sub: "user-\(n)") }
        let first = try freshSession(db)
        defer { first.close() }
        try first.execute("BEGIN")
        #expect(try processBatch(first).values.allSatisfy { $0 == "applied" })
        #expect(try value(first, currentSubCalls) == 0)
        try first.execute("COMMIT")

        try db.query(
            "INSERT INTO siwa.sub_aliases (old_sub, new_sub, transfer_id) VALUES ('old-team-sub', 'new-team-sub', 't')"
        )
        try db.insert(jti: "moved", type: "consent-revoked", sub: "old-team-sub")
        for n in 4...5 { try db.insert(jti: "plain-\(n)", type: "consent-revoked", sub: "user-\(n)") }
        let second = try freshSession(db)
        defer { second.close() }
        try second.execute("BEGIN")
        #expect(try processBatch(second).values.allSatisfy { $0 == "applied" })
        #expect(try value(second, currentSubCalls) == 3)
        try second.execute("COMMIT")
        // The replaced sub's event went to the account it became.
        #expect(
            try db.value("SELECT count(*)::integer FROM siwa.accounts WHERE sub = 'new-team-sub'") == 1)
        #expect(
            try db.value("SELECT count(*)::integer FROM siwa.accounts WHERE sub = 'old-team-sub'") == 0)
        #expect(
            try db.value("SELECT sub FROM siwa.changes WHERE jti = 'moved'", as: String.self)
                == "new-team-sub")
    }

    @Test(
        "a batch reads no account row sequentially, however many users there are; an erased user's change keeps no email"
    )
    func changesLookUpAccountsByKey() throws {
        let db = try TestDatabase()
        // Enough users that a hashed subplan over the whole table looked cheaper to the planner than one
        // probe per change (the numbering's erased-account check read all of siwa.accounts, twice, per batch).
        try db.query("INSERT INTO siwa.accounts (sub) SELECT 'other-' || g FROM generate_series(1, 10000) g")
        try db.query("ANALYZE siwa.accounts")
        for n in 1...40 {
            try db.insert(
                jti: "mail-\(n)", type: "email-enabled", sub: "user-\(n)",
                eventTime: "now() - interval '1 hour'",
                email: "u\(n)@privaterelay.appleid.com")
        }
        try db.insert(jti: "gone", type: "account-delete", sub: "user-1")

        let session = try freshSession(db)
        defer { session.close() }
        try session.execute("BEGIN")
        #expect(try processBatch(session).values.allSatisfy { $0 == "applied" })
        #expect(
            try value(
                session,
                """
                SELECT coalesce(sum(seq_tup_read), 0)::integer FROM pg_stat_xact_user_tables
                 WHERE schemaname = 'siwa' AND relname = 'accounts'
                """) == 0)
        try session.execute("COMMIT")

        // user-1's email event came before its deletion in the same batch: its change has no email.
        #expect(
            try db.value(
                "SELECT count(*)::integer FROM siwa.changes WHERE jti = 'mail-1' AND email IS NULL AND is_private_email IS NULL"
            ) == 1)
        #expect(
            try db.value(
                "SELECT count(*)::integer FROM siwa.changes WHERE jti LIKE 'mail-%' AND email = 'u' || substr(jti, 6) || '@privaterelay.appleid.com'"
            ) == 39)
    }

    /// The worker's calls, as siwa-worker makes them: the claim, then every claimed row applied as verified.
    private func claimAndApplyAll(_ connection: PostgresConnection) throws -> Int {
        try #require(
            try connection.query(
                """
                SELECT count(*)::integer FROM siwa.apply_verified_notifications(
                    (SELECT coalesce(array_agg(c.id), '{}') FROM siwa.claim_notifications(64) AS c WHERE NOT c.refused),
                    '{}', '{}', '{}', 5, interval '1 second')
                """
            ).first)[0, as: Int.self]
    }

    @Test(
        "plans a worker's session made while the tables were empty read no table sequentially once they have filled"
    )
    func plansMadeOnEmptyTablesUseTheKeys() throws {
        let db = try TestDatabase()
        try db.query("ANALYZE")  // the tables known to be empty, as on a new deployment's first autovacuum
        let types = ["email-disabled", "email-enabled", "consent-revoked", "account-delete"]
        for (n, type) in types.enumerated() {
            try db.insert(
                jti: "first-\(n)", type: type, sub: "first-\(n)", email: "f\(n)@privaterelay.appleid.com")
        }
        let session = try freshSession(db)
        defer { session.close() }
        // The first batch makes the session's plans: every statement of the pass runs for these four types.
        try session.execute("BEGIN")
        #expect(try claimAndApplyAll(session) == 4)
        try session.execute("COMMIT")

        // A backlog arrives before autovacuum has looked at the tables again.
        try db.query("INSERT INTO siwa.accounts (sub) SELECT 'user-' || g FROM generate_series(1, 5000) g")
        try db.query(
            "INSERT INTO siwa.sessions (sub, created_at) SELECT 'user-' || g, now() - interval '1 day' FROM generate_series(1, 5000) g"
        )
        try db.query(
            """
            INSERT INTO siwa.refresh_tokens (sub, client_id, token_ciphertext, created_at)
            SELECT 'user-' || g, 'app', '\\x00'::bytea, now() - interval '1 day' FROM generate_series(1, 5000) g
            """)
        for n in 1...300 {
            try db.insert(
                jti: "backlog-\(n)", type: types[n % 4], sub: "user-\(n)",
                eventTime: "now() - interval '1 minute'",
                email: n % 4 < 2 ? "b\(n)@privaterelay.appleid.com" : nil)
        }
        // Rows read sequentially per table, as this transaction's statistics count them (they also hold
        // the first batch's, not reported yet: compared before and after). siwa.changes is left out: the
        // numbering is planned per call, and reads the small table of this test whole, rightly.
        let sequentialReads = """
            SELECT relname, seq_tup_read FROM pg_stat_xact_user_tables
             WHERE schemaname = 'siwa'
               AND (relname IN ('accounts', 'sessions', 'refresh_tokens', 'notification_queue')
                    OR relname LIKE 'notification_log%')
            """
        func reads() throws -> [String: Int] {
            var counts: [String: Int] = [:]
            for row in try session.query(sequentialReads) {
                counts[try row[0, as: String.self]] = try row[1, as: Int.self]
            }
            return counts
        }
        try session.execute("BEGIN")
        let before = try reads()
        #expect(try claimAndApplyAll(session) == 64)
        let after = try reads()
        #expect(after.filter { $0.value != before[$0.key, default: 0] } == [:])
        try session.execute("COMMIT")
        #expect(
            try db.value("SELECT count(*)::integer FROM siwa.notification_log WHERE state = 'applied'") == 68)
        // The 16 users deleted in the batch keep no ciphertext; the others keep theirs.
        #expect(
            try db.value("SELECT count(*)::integer FROM siwa.refresh_tokens WHERE token_ciphertext IS NULL")
                == 16)
    }

    @Test(
        "with no enabled endpoint the fan-out only probes; an endpoint committed meanwhile gets the next changes"
    )
    func fanOutSkipsWithoutEndpointsAndHonoursANewOne() throws {
        let db = try TestDatabase()
        let secret = "whsec_" + Data(repeating: 7, count: 32).base64EncodedString()
        let disabled = try db.value(
            "SELECT siwa.add_webhook_endpoint('http://127.0.0.1:9/off', $1)", [.text(secret)], as: Int64.self)
        try db.query("SELECT siwa.set_webhook_endpoint_enabled($1, false)", [.int(disabled)])
        try db.insert(jti: "before", type: "consent-revoked", sub: "u1")
        try db.insert(jti: "after", type: "consent-revoked", sub: "u2")

        let session = try freshSession(db)
        defer { session.close() }
        try session.execute("BEGIN")
        #expect(try processBatch(session, limit: 1) == ["before": "applied"])
        #expect(
            try value(
                session,
                """
                SELECT coalesce(sum(seq_scan + coalesce(idx_scan, 0)), 0)::integer FROM pg_stat_xact_user_tables
                 WHERE schemaname = 'siwa' AND relname IN ('webhook_endpoints', 'webhook_deliveries')
                """) == 1)  // the one probe of the endpoints
        // Another session adds an endpoint and commits while this transaction is open.
        let other = try db.connect()
        defer { other.close() }
        let added = try #require(
            try other.query("SELECT siwa.add_webhook_endpoint('http://127.0.0.1:9/on', $1)", [.text(secret)])
                .first?[0, as: Int64.self])
        #expect(try processBatch(session, limit: 1) == ["after": "applied"])
        try session.execute("COMMIT")

        let deliveries = try db.query(
            """
            SELECT c.jti, d.endpoint_id FROM siwa.webhook_deliveries d JOIN siwa.changes c ON c.id = d.change_id
            """)
        #expect(deliveries.count == 1)
        #expect(try deliveries.first?[0, as: String.self] == "after")
        #expect(try deliveries.first?[1, as: Int64.self] == added)
    }
}
