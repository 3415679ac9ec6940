import Foundation
import Postgres
import TestSupport
import Testing

/// Rows per rewritten table for `sub`.
private func rowsHolding(_ connection: PostgresConnection, sub: String) throws -> [String: Int] {
    var counts: [String: Int] = [:]
    for table in [
        "accounts", "sessions", "refresh_tokens", "sign_in_codes", "sign_ins", "revocation_requests",
    ] {
        counts[table] = try connection.query(
            "SELECT count(*)::bigint FROM siwa.\(table) WHERE sub = $1", [.text(sub)])[0][0, as: Int.self]
    }
    return counts
}

private let oneEach = [
    "accounts": 1, "sessions": 2, "refresh_tokens": 1, "sign_in_codes": 1, "sign_ins": 1,
    "revocation_requests": 1,
]
private let none = oneEach.mapValues { _ in 0 }

@Suite("Team transfer: the rewrite of every sub, the aliases, and who may run it")
struct TransferSQLTests {
    @Test("the rewrite moves every table holding a sub to the new sub and keeps the history's")
    func rewritesEveryTable() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try seedUser(owner, sub: "old.alice", email: "alice@example.com", isPrivate: false)
        try seedUser(owner, sub: "old.bob", email: "bob@privaterelay.appleid.com", isPrivate: true)
        let outcomes = try applyTransfer(
            owner,
            [
                ("old.alice", "new.alice", "alice@example.com", false),
                ("old.bob", "new.bob", "bob2@privaterelay.appleid.com", true),
            ])
        #expect(outcomes == ["old.alice": "applied", "old.bob": "applied"])
        #expect(try rowsHolding(owner, sub: "new.alice") == oneEach)
        #expect(try rowsHolding(owner, sub: "old.alice") == none)
        #expect(try rowsHolding(owner, sub: "new.bob") == oneEach)
        // The history keeps what Apple sent; the relay address is the new team's.
        #expect(
            try owner.query("SELECT sub FROM siwa.event_history WHERE jti = 'before-old.alice'")[0][
                0, as: String.self] == "old.alice")
        #expect(
            try owner.query("SELECT email FROM siwa.accounts WHERE sub = 'new.bob'")[0][0, as: String.self]
                == "bob2@privaterelay.appleid.com")
        let aliases = try owner.query("SELECT old_sub, new_sub, transfer_id FROM siwa.sub_aliases ORDER BY 1")
        #expect(aliases.count == 2)
        #expect(try aliases[0][1] as String == "new.alice")
        let batch = try owner.query(
            "SELECT users, outcomes::text, rewritten->>'sessions.sub' FROM siwa.sub_transfer_batches")
        #expect(try batch[0][0] as Int == 2)
        #expect(try batch[0][2] as String == "4")
        // Again: idempotent.
        #expect(try applyTransfer(owner, [("old.alice", "new.alice", nil, nil)]) == ["old.alice": "already"])
    }

    @Test("every column named sub of a table in schema siwa is on the rewrite list")
    func everySubColumnIsListed() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let unlisted = try owner.query(
            """
            SELECT c.relname::text FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
             WHERE c.relnamespace = 'siwa'::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition
               AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = 'sub'
               AND NOT EXISTS (SELECT 1 FROM siwa.sub_columns s WHERE s.table_name = c.relname AND s.column_name = 'sub')
            """
        ).map { row throws -> String in try row[0] }
        #expect(unlisted == [], "add these to siwa.sub_columns in schema.sql")
        // And the rewrite refuses to run while one is missing.
        try owner.execute("CREATE TABLE siwa.extra_table (sub text)")
        try seedUser(owner, sub: "old.x", email: nil, isPrivate: nil)
        #expect(sqlState { try applyTransfer(owner, [("old.x", "new.x", nil, nil)]) } == "55000")
        #expect(try rowsHolding(owner, sub: "old.x") == oneEach)
    }

    @Test("two old subs for one new sub refuse the whole batch (23505) and change nothing")
    func duplicateRefusesBatch() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        for sub in ["old.a", "old.b", "old.c"] { try seedUser(owner, sub: sub, email: nil, isPrivate: nil) }
        #expect(
            sqlState {
                try applyTransfer(
                    owner,
                    [
                        ("old.a", "new.a", nil, nil), ("old.b", "new.a", nil, nil),
                        ("old.c", "new.c", nil, nil),
                    ])
            } == "23505")
        for sub in ["old.a", "old.b", "old.c"] { #expect(try rowsHolding(owner, sub: sub) == oneEach) }
        #expect(try owner.query("SELECT count(*)::bigint FROM siwa.sub_aliases")[0][0, as: Int.self] == 0)
        // Across batches: a new sub already another old sub's alias target.
        try applyTransfer(owner, [("old.a", "new.a", nil, nil)])
        #expect(sqlState { try applyTransfer(owner, [("old.b", "new.a", nil, nil)]) } == "23505")
        #expect(try rowsHolding(owner, sub: "old.b") == oneEach)
    }

    @Test(
        "an answer that does not fit the account is recorded as a mismatch, not applied; a new sub that has an account is merged"
    )
    func mismatchAndConflict() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try seedUser(owner, sub: "old.mail", email: "m@example.com", isPrivate: false)
        try seedUser(owner, sub: "old.flag", email: "f@privaterelay.appleid.com", isPrivate: true)
        try seedUser(owner, sub: "old.taken", email: nil, isPrivate: nil)
        try owner.execute("INSERT INTO siwa.accounts (sub) VALUES ('new.taken')")
        let outcomes = try applyTransfer(
            owner,
            [
                ("old.mail", "new.mail", "someone.else@example.com", false),
                ("old.flag", "new.flag", "f@example.com", false),
                ("old.taken", "new.taken", nil, nil),
            ])
        #expect(outcomes == ["old.mail": "mismatch", "old.flag": "mismatch", "old.taken": "merged"])
        for sub in ["old.mail", "old.flag"] {
            #expect(try rowsHolding(owner, sub: sub) == oneEach)
        }
        // The new sub had an account already: the old one is merged into it (AliasTests), nothing left.
        #expect(try rowsHolding(owner, sub: "new.taken") == oneEach)
        #expect(try rowsHolding(owner, sub: "old.taken") == none)
    }

    @Test("only the owner runs the rewrite: every role gets 42501", arguments: AdminRole.allCases)
    func onlyTheOwner(role: AdminRole) throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try seedUser(owner, sub: "old.p", email: nil, isPrivate: nil)
        let connection = try database.connect(as: role)
        defer { connection.close() }
        #expect(
            sqlState { try applyTransfer(connection, [("old.p", "new.p", nil, nil)]) } == permissionDenied)
        #expect(
            sqlState { try connection.execute("UPDATE siwa.sub_columns SET on_transfer = 'keep'") }
                == permissionDenied)
        #expect(
            sqlState { try connection.execute("INSERT INTO siwa.sub_aliases VALUES ('x', 'y', now(), 't')") }
                == permissionDenied)
        #expect(try rowsHolding(owner, sub: "old.p") == oneEach)
    }

    @Test("siwa.history_of finds a user's history by either sub, as siwa_admin")
    func historyByEitherSub() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try seedUser(owner, sub: "old.h", email: nil, isPrivate: nil)
        try applyTransfer(owner, [("old.h", "new.h", nil, nil)])
        try owner.storeAsReceiver(SeededNotification(jti: "after-new.h", sub: "new.h"))
        let admin = try database.connect(as: .admin)
        defer { admin.close() }
        for sub in ["old.h", "new.h"] {
            let jtis = try admin.query("SELECT jti FROM siwa.history_of($1)", [.text(sub)]).map {
                row throws -> String in try row[0]
            }
            #expect(jtis == ["before-old.h", "after-new.h"])
        }
        #expect(
            try admin.query("SELECT new_sub FROM siwa.sub_aliases WHERE old_sub = 'old.h'")[0][
                0, as: String.self] == "new.h")
        #expect(
            try admin.query("SELECT count(*)::bigint FROM siwa.sub_transfer_batches")[0][0, as: Int.self] == 1
        )
    }

    @Test("a notification for an old sub arriving after the transfer is applied to the aliased account")
    func lateNotificationFollowsAlias() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try seedUser(owner, sub: "old.late", email: nil, isPrivate: nil)
        try applyTransfer(owner, [("old.late", "new.late", nil, nil)])
        try storeAsReceiver(database, jti: "late-1", sub: "old.late", eventType: "account-delete")
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        let outcome: String = try worker.query(
            "SELECT outcome FROM siwa.process_due_notifications(10, 5, interval '1 second')")[0][0]
        #expect(outcome == "applied")
        #expect(
            try owner.query("SELECT count(*)::bigint FROM siwa.accounts WHERE sub = 'old.late'")[0][
                0, as: Int.self] == 0)
        #expect(
            try owner.query("SELECT deleted_at IS NOT NULL FROM siwa.accounts WHERE sub = 'new.late'")[0][
                0, as: Bool.self] == true)
        #expect(
            try owner.query(
                "SELECT count(*)::bigint FROM siwa.sessions WHERE sub = 'new.late' AND revoked_at IS NULL")[
                    0][0, as: Int.self] == 0)
        // The history keeps the sub Apple sent.
        #expect(
            try owner.query("SELECT sub FROM siwa.event_history WHERE jti = 'late-1'")[0][0, as: String.self]
                == "old.late")
    }

    @Test("a replaced sub never comes back as an account (40001: the writer retries and finds the alias)")
    func replacedSubRefused() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try seedUser(owner, sub: "old.r", email: nil, isPrivate: nil)
        try applyTransfer(owner, [("old.r", "new.r", nil, nil)])
        for role in [AdminRole.worker] {
            let connection = try database.connect(as: role)
            defer { connection.close() }
            #expect(
                sqlState { try connection.execute("INSERT INTO siwa.accounts (sub) VALUES ('old.r')") }
                    == "40001")
        }
        // The sign-in API's role may not insert accounts at all (it records sign-ins through
        // siwa.record_sign_in only).
        let signin = try database.connect(as: .signin)
        defer { signin.close() }
        #expect(
            sqlState { try signin.execute("INSERT INTO siwa.accounts (sub) VALUES ('old.r')") } == "42501")
        #expect(
            sqlState { try owner.execute("UPDATE siwa.accounts SET sub = 'old.r' WHERE sub = 'new.r'") }
                == "40001")
        #expect(
            try owner.query("SELECT count(*)::bigint FROM siwa.accounts WHERE sub = 'old.r'")[0][
                0, as: Int.self] == 0)
        // Other subs are created as before.
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        try worker.execute("INSERT INTO siwa.accounts (sub) VALUES ('someone.else')")
    }

    @Test("a late email event for the old sub of an erased account keeps no email once applied")
    func lateEmailOfErasedAccount() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try seedUser(owner, sub: "old.gone", email: "g@privaterelay.appleid.com", isPrivate: true)
        try applyTransfer(owner, [("old.gone", "new.gone", nil, nil)])
        try owner.execute("UPDATE siwa.accounts SET deleted_at = now() WHERE sub = 'new.gone'")
        try owner.execute("SELECT siwa.erase_personal_data('new.gone')")
        // The receiver knows nothing of aliases: it stores the email; the worker drops it when applying.
        try storeAsReceiver(
            database, jti: "late-mail", sub: "old.gone", eventType: "email-disabled",
            email: "g@privaterelay.appleid.com")
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        _ = try worker.query("SELECT outcome FROM siwa.process_due_notifications(10, 5, interval '1 second')")
        let row = try owner.query(
            "SELECT email, raw_token, state FROM siwa.notification_log WHERE jti = 'late-mail'")[0]
        #expect(try row[0, as: String?.self] == nil)
        #expect(try row[1, as: String?.self] == nil)
        #expect(
            try owner.query("SELECT count(*)::bigint FROM siwa.accounts WHERE sub = 'old.gone'")[0][
                0, as: Int.self] == 0)
    }

    @Test("erasure also drops an email the import holds for the user between exchange and rewrite")
    func erasureReachesImportRows() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try seedUser(owner, sub: "old.i", email: "i@privaterelay.appleid.com", isPrivate: true)
        try owner.execute(
            """
            INSERT INTO siwa.transfer_imports (transfer_id, transfer_sub, old_sub, new_sub, email, state)
            VALUES ('t1', 'ts.i', 'old.i', 'new.i', 'i2@privaterelay.appleid.com', 'exchanged')
            """)
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        try worker.execute("SELECT siwa.erase_personal_data('old.i')")
        #expect(
            try owner.query("SELECT email FROM siwa.transfer_imports WHERE old_sub = 'old.i'")[0][
                0, as: String?.self]
                == nil)
    }

    @Test("erasing a transferred user's data also erases the history stored under the old sub")
    func erasureFollowsAliases() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try seedUser(owner, sub: "old.e", email: "e@privaterelay.appleid.com", isPrivate: true)
        try owner.execute(
            "UPDATE siwa.notification_log SET email = 'e@privaterelay.appleid.com', raw_token = 'a.b.c' WHERE sub = 'old.e'"
        )
        try applyTransfer(owner, [("old.e", "new.e", nil, nil)])
        try owner.execute("SELECT siwa.erase_personal_data('new.e')")
        let row = try owner.query("SELECT email, raw_token FROM siwa.notification_log WHERE sub = 'old.e'")[0]
        #expect(try row[0] as String? == nil)
        #expect(try row[1] as String? == nil)
    }

    @Test(
        "a user's changes and pending webhook deliveries move to the new sub, and their order per sub holds, also for a late change"
    )
    func changesAndDeliveriesFollowTheTransfer() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        let app = try database.connect(as: .app)
        defer { app.close() }
        // Two endpoints (as siwactl webhooks add), then changes applied by the worker while nothing is
        // delivered: three of the user's, one of someone else's in between.
        for url in ["https://hooks.example.com/one", "https://hooks.example.com/two"] {
            try owner.execute(
                "SELECT siwa.add_webhook_endpoint($1::text, 'whsec_' || encode(sha256(convert_to($1::text, 'UTF8')), 'base64'))",
                [.text(url)])
        }
        try seedUser(owner, sub: "old.w", email: "w@privaterelay.appleid.com", isPrivate: true)
        func apply(_ jti: String, _ sub: String, _ type: String, email: String? = nil) throws {
            try storeAsReceiver(database, jti: jti, sub: sub, eventType: type, email: email)
            #expect(
                try worker.query(
                    "SELECT outcome FROM siwa.process_due_notifications(10, 5, interval '1 second')"
                )
                .map { row throws -> String in try row[0] } == ["applied"])
        }
        try apply("w-1", "old.w", "email-disabled", email: "w@privaterelay.appleid.com")
        try apply("o-1", "other.u", "consent-revoked")
        try apply("w-2", "old.w", "consent-revoked")
        try apply("w-3", "old.w", "email-enabled", email: "w@privaterelay.appleid.com")
        let changes = try owner.query("SELECT id::bigint FROM siwa.changes WHERE sub = 'old.w' ORDER BY id")
            .map {
                row throws -> Int in try row[0]
            }
        #expect(changes.count == 3)
        // The first delivery to endpoint 1 failed once and waits for its retry: the others queue behind it.
        try owner.execute(
            """
            UPDATE siwa.webhook_deliveries SET attempts = 1, next_attempt_at = now() + interval '1 hour',
                   last_error = 'HTTP 503'
             WHERE change_id = $1 AND endpoint_id = 1
            """, [.int(Int64(changes[0]))])
        // The transfer's own change (siwa.sub_transferred, AliasTests) is left out of what is compared.
        let feedBefore = try app.query("SELECT position, id FROM siwa.changefeed ORDER BY position").map {
            row throws -> String in "\(try row[0] as Int) \(try row[1] as Int)"
        }

        #expect(
            try applyTransfer(owner, [("old.w", "new.w", "w2@privaterelay.appleid.com", true)]) == [
                "old.w": "applied"
            ])

        // Rewritten: the same changes (ids, positions) and deliveries, under the new sub.
        let count = { (sql: String) throws -> Int in try owner.query(sql)[0][0, as: Int.self] }
        #expect(try count("SELECT count(*)::bigint FROM siwa.changes WHERE sub = 'old.w'") == 0)
        #expect(try count("SELECT count(*)::bigint FROM siwa.webhook_deliveries WHERE sub = 'old.w'") == 0)
        #expect(
            try owner.query(
                "SELECT id::bigint FROM siwa.changes WHERE sub = 'new.w' AND type <> 'siwa.sub_transferred' ORDER BY id"
            ).map {
                row throws -> Int in try row[0]
            } == changes)
        #expect(
            try count(
                "SELECT count(*)::bigint FROM siwa.webhook_deliveries d JOIN siwa.changes c ON c.id = d.change_id WHERE d.sub = 'new.w' AND c.sub = 'new.w' AND d.state = 'pending' AND c.type <> 'siwa.sub_transferred'"
            ) == 6)
        let rewritten = try owner.query(
            "SELECT coalesce((rewritten->>'changes.sub')::bigint, 0), coalesce((rewritten->>'webhook_deliveries.sub')::bigint, 0) FROM siwa.sub_transfer_batches"
        )[0]
        #expect(try rewritten[0] as Int == 3)
        #expect(try rewritten[1] as Int == 6)
        // The app's changefeed: the same positions in the same order, naming the sub the app now knows.
        #expect(
            try app.query(
                "SELECT position, id FROM siwa.changefeed WHERE type <> 'siwa.sub_transferred' ORDER BY position"
            ).map {
                row throws -> String in "\(try row[0] as Int) \(try row[1] as Int)"
            } == feedBefore)
        #expect(
            try app.query(
                "SELECT count(*)::bigint FROM siwa.changefeed WHERE sub = 'new.w' AND type <> 'siwa.sub_transferred'"
            )[0][
                0, as: Int.self]
                == 3)

        // A late notification for the old sub: applied to the new sub; its change and deliveries too.
        try apply("w-4", "old.w", "email-disabled", email: "w2@privaterelay.appleid.com")
        #expect(try count("SELECT count(*)::bigint FROM siwa.changes WHERE sub = 'old.w'") == 0)
        #expect(try count("SELECT count(*)::bigint FROM siwa.webhook_deliveries WHERE sub = 'old.w'") == 0)
        #expect(
            try count(
                "SELECT count(*)::bigint FROM siwa.changes WHERE sub = 'new.w' AND type <> 'siwa.sub_transferred'"
            ) == 4)

        // What a claim may take (the dispatcher's conditions: pending, ready, no earlier pending delivery
        // of its endpoint and sub): each endpoint's queue heads only, the user's first change on both;
        // and no ready hint points past an earlier pending delivery.
        let claimable =
            """
            SELECT d.endpoint_id || ' ' || d.sub || ' ' || d.change_id FROM siwa.webhook_deliveries d
             WHERE d.state = 'pending' AND d.ready
               AND NOT EXISTS (SELECT 1 FROM siwa.webhook_deliveries p
                                WHERE p.endpoint_id = d.endpoint_id AND p.sub = d.sub AND p.state = 'pending'
                                  AND p.change_id < d.change_id)
             ORDER BY d.endpoint_id, d.sub
            """
        let other = try count("SELECT id::bigint FROM siwa.changes WHERE sub = 'other.u'")
        #expect(
            try owner.query(claimable).map { row throws -> String in try row[0] } == [
                "1 new.w \(changes[0])", "1 other.u \(other)", "2 new.w \(changes[0])", "2 other.u \(other)",
            ])
        #expect(
            try count(
                """
                SELECT count(*)::bigint FROM siwa.webhook_deliveries d
                 WHERE d.state = 'pending' AND d.ready
                   AND EXISTS (SELECT 1 FROM siwa.webhook_deliveries p
                                WHERE p.endpoint_id = d.endpoint_id AND p.sub = d.sub AND p.state = 'pending'
                                  AND p.change_id < d.change_id)
                """) == 0)
        // The queue of the new sub, per endpoint, in change order: the four changes, the late one last.
        let late = try count(
            "SELECT max(id)::bigint FROM siwa.changes WHERE sub = 'new.w' AND type <> 'siwa.sub_transferred'")
        for endpoint in [1, 2] {
            #expect(
                try owner.query(
                    "SELECT d.change_id::bigint FROM siwa.webhook_deliveries d JOIN siwa.changes c ON c.id = d.change_id WHERE d.endpoint_id = $1 AND d.sub = 'new.w' AND d.state = 'pending' AND c.type <> 'siwa.sub_transferred' ORDER BY d.change_id",
                    [.int(Int64(endpoint))]
                ).map { row throws -> Int in try row[0] } == changes + [late])
        }
    }
}
