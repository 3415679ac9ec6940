import Foundation
import Postgres
import Synchronization
import TestSupport
import Testing

/// One pass of the worker (as siwa_worker): the outcomes of the due notifications, in claim order.
@discardableResult
private func workerPass(_ worker: PostgresConnection, maxAttempts: Int = 5) throws -> [String] {
    try worker.query(
        "SELECT outcome FROM siwa.process_due_notifications(64, $1::integer, interval '1 second')",
        [.int(Int64(maxAttempts))]
    ).map { row throws -> String in try row[0] }
}

/// The single value of `sql` (one row, one column).
private func value<T: PostgresDecodable>(
    _ connection: PostgresConnection, _ sql: String, _ binds: [PostgresData?] = [], as type: T.Type = T.self
) throws -> T {
    guard let row = try connection.query(sql, binds).first else {
        throw PostgresError(code: .queryFailed, message: "no row: \(sql)")
    }
    return try row[0, as: T.self]
}

/// What a statement run on another thread came to.
private final class Finished: Sendable {
    let done = Mutex(false)
    let failure = Mutex<String?>(nil)
}

@Suite("Aliases: one current sub for every replaced one, wherever a sub enters")
struct AliasTests {
    @Test("siwa.current_sub maps a replaced sub to the account's current one, along a chain, for every role")
    func currentSub() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try seedUser(owner, sub: "old.a", email: nil, isPrivate: nil)
        try applyTransfer(owner, [("old.a", "mid.a", nil, nil)])
        try applyTransfer(owner, [("mid.a", "new.a", nil, nil)], transferID: "t2")
        for role in [AdminRole.app, .worker, .receiver, .signin, .admin] {
            let connection = try database.connect(as: role)
            defer { connection.close() }
            for sub in ["old.a", "mid.a", "new.a"] {
                #expect(try value(connection, "SELECT siwa.current_sub($1)", [.text(sub)]) == "new.a")
            }
            #expect(try value(connection, "SELECT siwa.current_sub('someone')") == "someone")
        }
        // A chain written by hand (not flattened by the rewrite) is followed too.
        try owner.execute(
            "INSERT INTO siwa.sub_aliases (old_sub, new_sub, transfer_id) VALUES ('x1', 'x2', 'h')")
        try owner.execute(
            "INSERT INTO siwa.sub_aliases (old_sub, new_sub, transfer_id) VALUES ('x2', 'x3', 'h')")
        #expect(try value(owner, "SELECT siwa.current_sub('x1')") == "x3")
    }

    // 1. Erasure after a transfer.

    @Test("after A→C and C's erasure, the receiver stores a late notification for A without email or token")
    func receiverErasedCheckFollowsAlias() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        try seedUser(owner, sub: "old.e1", email: "e1@privaterelay.appleid.com", isPrivate: true)
        try applyTransfer(owner, [("old.e1", "new.e1", nil, nil)])
        try storeAsReceiver(database, jti: "del-e1", sub: "new.e1", eventType: "account-delete")
        #expect(try workerPass(worker) == ["applied"])
        try storeAsReceiver(
            database, jti: "late-e1", sub: "old.e1", eventType: "email-enabled",
            email: "e1@privaterelay.appleid.com")
        let row = try owner.query(
            "SELECT email, raw_token, personal_data_erased_at IS NOT NULL FROM siwa.notification_log WHERE jti = 'late-e1'"
        )[0]
        #expect(try row[0, as: String?.self] == nil)
        #expect(try row[1, as: String?.self] == nil)
        #expect(try row[2, as: Bool.self])
    }

    @Test("the receiver's store calls siwa.current_sub only for a sub that has an alias, not once per row")
    func receiverStoreResolvesOnlyAliasedSubs() throws {
        // siwa.current_sub pins its search_path (no inlining: every call switches it) and runs a
        // recursive query: called for every row of a batch, it was a quarter of PostgreSQL's CPU per
        // stored notification (docs/performance.md).
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try seedUser(owner, sub: "old.e2", email: "e2@privaterelay.appleid.com", isPrivate: true)
        try applyTransfer(owner, [("old.e2", "new.e2", nil, nil)])
        let calls = try owner.transaction { connection -> [Int64] in
            try connection.simpleQuery("SET LOCAL track_functions = 'all'")
            let count =
                "SELECT coalesce(pg_stat_get_xact_function_calls('siwa.current_sub(text)'::regprocedure), 0)"
            try connection.storeAsReceiver(
                (1...8).map { SeededNotification(jti: "plain-\($0)", sub: "001000.plain\($0)") })
            let plain = try value(connection, count, as: Int64.self)
            try connection.storeAsReceiver([
                SeededNotification(jti: "aliased", sub: "old.e2"),
                SeededNotification(jti: "plain-9", sub: "001000.plain9"),
            ])
            return [plain, try value(connection, count, as: Int64.self)]
        }
        #expect(calls == [0, 1])
        #expect(
            try value(
                owner,
                "SELECT count(*) FROM siwa.notification_log WHERE jti LIKE 'plain-%' OR jti = 'aliased'",
                as: Int64.self) == 10)
    }

    @Test(
        "after A→C and C's erasure, a late notification for A that fails keeps no error text (dead or retrying)"
    )
    func recordFailureFollowsAlias() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        try seedUser(owner, sub: "old.e2", email: "e2@privaterelay.appleid.com", isPrivate: true)
        try applyTransfer(owner, [("old.e2", "new.e2", nil, nil)])
        try storeAsReceiver(database, jti: "del-e2", sub: "new.e2", eventType: "account-delete")
        #expect(try workerPass(worker) == ["applied"])
        try replaceHook(
            on: owner,
            body:
                "IF jti LIKE 'late-%' THEN RAISE EXCEPTION 'hook refused e2@privaterelay.appleid.com secret'; END IF;"
        )
        try storeAsReceiver(database, jti: "late-e2a", sub: "old.e2", eventType: "consent-revoked")
        #expect(try workerPass(worker, maxAttempts: 1) == ["dead"])
        try storeAsReceiver(database, jti: "late-e2b", sub: "old.e2", eventType: "consent-revoked")
        #expect(try workerPass(worker, maxAttempts: 5) == ["retry"])
        let admin = try database.connect(as: .admin)
        defer { admin.close() }
        for sub in ["new.e2", "old.e2"] {
            let rows = try admin.query(
                "SELECT jti, state, last_error FROM siwa.history_of($1) WHERE jti LIKE 'late-%' ORDER BY jti",
                [.text(sub)])
            #expect(rows.count == 2)
            for row in rows {
                let jti: String = try row[0]
                let error = try row[2, as: String?.self] ?? ""
                #expect(!error.contains("secret") && !error.contains("refused"), "\(jti): \(error)")
                #expect(error.hasPrefix("P0001"))
            }
        }
        let queued: String = try value(
            owner,
            "SELECT q.last_error FROM siwa.notification_queue q JOIN siwa.notification_log l USING (id) WHERE l.jti = 'late-e2b'"
        )
        #expect(!queued.contains("secret"))
    }

    @Test("erasure under the new sub before the rewrite drops the email the import holds for it")
    func erasureReachesImportRowsByNewSub() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.execute(
            """
            INSERT INTO siwa.transfer_imports (transfer_id, transfer_sub, old_sub, new_sub, email, state)
            VALUES ('t1', 'ts.n', 'old.n', 'new.n', 'n2@privaterelay.appleid.com', 'exchanged')
            """)
        // Apple notifies under the new sub once the app has moved: the account-delete comes first.
        try storeAsReceiver(database, jti: "del-n", sub: "new.n", eventType: "account-delete")
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        #expect(try workerPass(worker) == ["applied"])
        #expect(
            try value(
                owner, "SELECT email FROM siwa.transfer_imports WHERE new_sub = 'new.n'", as: String?.self)
                == nil)
    }

    // 3. A new sub that already has an account: merged.

    @Test(
        "a new sub that already has an account is merged: earliest deletion, latest consent, newest email status"
    )
    func mergeOnImport() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try seedUser(owner, sub: "old.m", email: "m@privaterelay.appleid.com", isPrivate: true)
        try owner.execute(
            """
            UPDATE siwa.accounts SET email_status = 'disabled', email_status_at = '2026-06-01 11:00Z',
                   consent_revoked_at = '2026-05-01 00:00Z'
             WHERE sub = 'old.m'
            """)
        try owner.execute(
            "UPDATE siwa.notification_log SET email = 'm@privaterelay.appleid.com', raw_token = 'a.b.c' WHERE sub = 'old.m'"
        )
        // The account the new sub got from a notification before the import; the user signed in there too.
        try owner.execute(
            """
            INSERT INTO siwa.accounts (sub, email_status, email_status_at, consent_revoked_at)
            VALUES ('new.m', 'enabled', '2026-06-01 10:00Z', '2026-05-02 00:00Z')
            """)
        try owner.execute(
            "INSERT INTO siwa.sign_ins (sub, client_id, sign_in_count) VALUES ('new.m', 'com.example.app', 2)"
        )
        try owner.execute("INSERT INTO siwa.sessions (sub) VALUES ('new.m')")
        let outcomes = try applyTransfer(owner, [("old.m", "new.m", "m2@privaterelay.appleid.com", true)])
        #expect(outcomes == ["old.m": "merged"])
        #expect(try value(owner, "SELECT count(*)::bigint FROM siwa.accounts WHERE sub = 'old.m'") == 0)
        let account = try owner.query(
            """
            SELECT email, email_status, email_status_at = '2026-06-01 11:00Z',
                   consent_revoked_at = '2026-05-02 00:00Z', deleted_at IS NULL
              FROM siwa.accounts WHERE sub = 'new.m'
            """)[0]
        #expect(try account[0] as String? == "m2@privaterelay.appleid.com")
        #expect(try account[1] as String? == "disabled")
        #expect(try account[2] as Bool)
        #expect(try account[3] as Bool)
        #expect(try account[4] as Bool)
        #expect(try value(owner, "SELECT count(*)::bigint FROM siwa.sessions WHERE sub = 'new.m'") == 3)
        #expect(
            try value(
                owner,
                "SELECT sign_in_count FROM siwa.sign_ins WHERE sub = 'new.m' AND client_id = 'com.example.app'"
            )
                == 3)
        #expect(try value(owner, "SELECT count(*)::bigint FROM siwa.sign_ins WHERE sub = 'old.m'") == 0)
        #expect(try value(owner, "SELECT outcomes->>'merged' FROM siwa.sub_transfer_batches") == "1")

        // The account-delete for the new sub now reaches everything the old account had.
        try storeAsReceiver(database, jti: "del-m", sub: "new.m", eventType: "account-delete")
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        #expect(try workerPass(worker) == ["applied"])
        #expect(
            try value(
                owner, "SELECT count(*)::bigint FROM siwa.sessions WHERE sub = 'new.m' AND revoked_at IS NULL"
            )
                == 0)
        #expect(
            try value(
                owner,
                "SELECT count(*)::bigint FROM siwa.notification_log WHERE sub = 'old.m' AND (email IS NOT NULL OR raw_token IS NOT NULL)"
            )
                == 0)
        #expect(
            try value(owner, "SELECT email FROM siwa.accounts WHERE sub = 'new.m'", as: String?.self) == nil)
    }

    @Test("merging into a deleted account revokes what the old account brings and erases its data")
    func mergeIntoDeletedAccount() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        try seedUser(owner, sub: "old.d", email: "d@example.com", isPrivate: false)
        // The new sub's account-delete arrives (and is applied, erasing) before the import.
        try storeAsReceiver(database, jti: "del-d", sub: "new.d", eventType: "account-delete")
        #expect(try workerPass(worker) == ["applied"])
        #expect(try applyTransfer(owner, [("old.d", "new.d", "d@example.com", false)]) == ["old.d": "merged"])
        let app = try database.connect(as: .app)
        defer { app.close() }
        #expect(
            try value(
                app, "SELECT count(*)::bigint FROM siwa.sessions WHERE sub = 'new.d' AND revoked_at IS NULL")
                == 0)
        #expect(
            try value(
                app,
                "SELECT bool_and(revoke_reason = 'account-delete') FROM siwa.sessions WHERE sub = 'new.d'"))
        let account = try owner.query(
            "SELECT email, personal_data_erased_at IS NOT NULL, deleted_at IS NOT NULL FROM siwa.accounts WHERE sub = 'new.d'"
        )[0]
        #expect(try account[0] as String? == nil)
        #expect(try account[1] as Bool)
        #expect(try account[2] as Bool)
        #expect(
            try value(
                owner,
                "SELECT count(*)::bigint FROM siwa.refresh_tokens WHERE sub = 'new.d' AND revoked_at IS NULL")
                == 0)
    }

    // 4. The app's entry points.

    @Test(
        "request_revocation, session_is_valid and sessions recorded under a replaced sub act on the current sub"
    )
    func appEntryPointsResolveAliases() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try seedUser(owner, sub: "old.p", email: nil, isPrivate: nil)
        try owner.execute("UPDATE siwa.refresh_tokens SET token_ciphertext = '\\x01' WHERE sub = 'old.p'")
        try applyTransfer(owner, [("old.p", "new.p", nil, nil)])
        let app = try database.connect(as: .app)
        defer { app.close() }
        let request: Int = try value(
            app, "SELECT siwa.request_revocation('old.p', 'account deleted in the app')")
        #expect(
            try value(owner, "SELECT sub FROM siwa.revocation_requests WHERE id = $1", [.int(Int64(request))])
                == "new.p")
        // A session the app records under the old sub belongs to the current one.
        let session: String = try value(
            app,
            "INSERT INTO siwa.sessions (sub, created_at) VALUES ('old.p', now() - interval '1 hour') RETURNING sub"
        )
        #expect(session == "new.p")
        #expect(try value(app, "SELECT siwa.session_is_valid('old.p', now() - interval '1 hour')"))
        // Deleted under the new sub: the old sub's answers follow.
        try storeAsReceiver(database, jti: "del-p", sub: "new.p", eventType: "account-delete")
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        #expect(try workerPass(worker) == ["applied"])
        #expect(try value(app, "SELECT siwa.session_is_valid('old.p', now() - interval '1 hour')") == false)
        let late = try app.query(
            "INSERT INTO siwa.sessions (sub, created_at) VALUES ('old.p', now()) RETURNING sub, revoke_reason"
        )[0]
        #expect(try late[0] as String == "new.p")
        #expect(try late[1] as String? == "account-delete")
    }

    @Test(
        "a transfer writes a siwa.sub_transferred change (changefeed, webhooks); siwa_app reads the mapping")
    func subTransferredChange() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.execute(
            "SELECT siwa.add_webhook_endpoint('https://hooks.example.com/t', 'whsec_' || encode(sha256('t'::bytea), 'base64'), ARRAY['siwa.sub_transferred'])"
        )
        try seedUser(owner, sub: "old.t", email: nil, isPrivate: nil)
        try applyTransfer(owner, [("old.t", "new.t", nil, nil)])
        let app = try database.connect(as: .app)
        defer { app.close() }
        let rows = try app.query(
            "SELECT type, sub, old_sub FROM siwa.changefeed WHERE type = 'siwa.sub_transferred'")
        #expect(rows.count == 1)
        #expect(try rows[0][1] as String == "new.t")
        #expect(try rows[0][2] as String? == "old.t")
        #expect(
            try value(
                owner,
                "SELECT count(*)::bigint FROM siwa.webhook_deliveries d JOIN siwa.changes c ON c.id = d.change_id WHERE c.type = 'siwa.sub_transferred' AND d.sub = 'new.t'"
            ) == 1)
        #expect(try value(app, "SELECT new_sub FROM siwa.sub_aliases WHERE old_sub = 'old.t'") == "new.t")
        #expect(sqlState { try app.execute("SELECT transfer_id FROM siwa.sub_aliases") } == permissionDenied)
        // Again: nothing new.
        try applyTransfer(owner, [("old.t", "new.t", nil, nil)])
        #expect(
            try value(owner, "SELECT count(*)::bigint FROM siwa.changes WHERE type = 'siwa.sub_transferred'")
                == 1)
    }

    // 5. A late email event for a replaced sub.

    @Test("a late email event for a replaced sub applies the status, not the old team's address")
    func lateEmailEventOfReplacedSub() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try seedUser(owner, sub: "old.l", email: "l@privaterelay.appleid.com", isPrivate: true)
        try applyTransfer(owner, [("old.l", "new.l", "l2@privaterelay.appleid.com", true)])
        try storeAsReceiver(
            database, jti: "late-l", sub: "old.l", eventType: "email-disabled",
            email: "l@privaterelay.appleid.com")
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        #expect(try workerPass(worker) == ["applied"])
        let account = try owner.query("SELECT email, email_status FROM siwa.accounts WHERE sub = 'new.l'")[0]
        #expect(try account[0] as String? == "l2@privaterelay.appleid.com")
        #expect(try account[1] as String? == "disabled")
        let change = try owner.query(
            "SELECT sub, email, is_private_email FROM siwa.changes WHERE jti = 'late-l'")[0]
        #expect(try change[0] as String == "new.l")
        #expect(try change[1] as String? == nil)
        // The history keeps what Apple sent.
        #expect(
            try value(owner, "SELECT email FROM siwa.notification_log WHERE jti = 'late-l'", as: String?.self)
                == "l@privaterelay.appleid.com")
    }

    // 6. The race between the rewrite and the worker creating the old sub's account.

    @Test(
        "the rewrite running first: the worker's account creation for the old sub waits (busy), then follows the alias"
    )
    func raceTransferFirst() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        // A worker's lock waits end (the worker sets lock_timeout too): without a lock order, it would
        // wait for the rewrite's session rows while this test holds the rewrite open.
        try worker.execute("SET lock_timeout = '5s'")
        // The user has sessions but no account yet (the app signed them in before any notification).
        try owner.execute("INSERT INTO siwa.sessions (sub) VALUES ('old.r1')")
        try storeAsReceiver(database, jti: "r1", sub: "old.r1", eventType: "account-delete")
        try owner.simpleQuery("BEGIN")
        try applyTransfer(owner, [("old.r1", "new.r1", nil, nil)])
        // The rewrite has not committed: the worker resolves no alias and must not create the old sub.
        #expect(try workerPass(worker) == ["busy"])
        try owner.simpleQuery("COMMIT")
        try owner.execute("UPDATE siwa.notification_queue SET next_attempt_at = now()")
        #expect(try workerPass(worker) == ["applied"])
        #expect(try value(owner, "SELECT count(*)::bigint FROM siwa.accounts WHERE sub = 'old.r1'") == 0)
        #expect(try value(owner, "SELECT deleted_at IS NOT NULL FROM siwa.accounts WHERE sub = 'new.r1'"))
        #expect(
            try value(
                owner,
                "SELECT count(*)::bigint FROM siwa.sessions WHERE sub = 'new.r1' AND revoked_at IS NULL")
                == 0)
    }

    @Test(
        "the worker creating the old sub's account first: the rewrite waits for it, then moves that account too"
    )
    func raceWorkerFirst() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        try owner.execute("INSERT INTO siwa.sessions (sub) VALUES ('old.r2')")
        try storeAsReceiver(database, jti: "r2", sub: "old.r2", eventType: "account-delete")
        try worker.simpleQuery("BEGIN")
        #expect(try workerPass(worker) == ["applied"])  // creates old.r2's account, not committed yet
        let transferer = try database.connectAsOwner()
        defer { transferer.close() }
        let pid: Int = try value(transferer, "SELECT pg_backend_pid()")
        let finished = Finished()
        let group = DispatchGroup()
        DispatchQueue.global().async(group: group) {
            do {
                try applyTransfer(transferer, [("old.r2", "new.r2", nil, nil)])
            } catch {
                finished.failure.withLock { $0 = "\(error)" }
            }
            finished.done.withLock { $0 = true }
        }
        // Deterministic: the rewrite either waits for the worker's transaction (a lock not granted) or,
        // without a lock order, finishes before it.
        #expect(
            try waitUntil(timeout: .seconds(30)) {
                if finished.done.withLock({ $0 }) { return true }
                let waiting: Int = try value(
                    owner, "SELECT count(*)::bigint FROM pg_locks WHERE pid = $1 AND NOT granted",
                    [.int(Int64(pid))])
                return waiting > 0
            })
        try worker.simpleQuery("COMMIT")
        group.wait()
        #expect(finished.failure.withLock { $0 } == nil)
        #expect(try value(owner, "SELECT count(*)::bigint FROM siwa.accounts WHERE sub = 'old.r2'") == 0)
        #expect(try value(owner, "SELECT deleted_at IS NOT NULL FROM siwa.accounts WHERE sub = 'new.r2'"))
        #expect(
            try value(owner, "SELECT count(*)::bigint FROM siwa.sessions WHERE revoked_at IS NULL") == 0)
    }

    // 12. An earlier second deletion.

    @Test(
        "an account-delete earlier than the recorded deletion is a change: the changefeed's time is the account's"
    )
    func earlierSecondDeletion() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        let later = try owner.instant("now() - interval '1 hour'")
        let earlier = try owner.instant("now() - interval '2 hours'")
        try owner.storeAsReceiver(
            SeededNotification(jti: "d1", type: "account-delete", sub: "u.d", eventTime: later))
        #expect(try workerPass(worker) == ["applied"])
        try owner.storeAsReceiver(
            SeededNotification(jti: "d2", type: "account-delete", sub: "u.d", eventTime: earlier))
        #expect(try workerPass(worker) == ["applied"])
        #expect(
            try value(
                owner,
                "SELECT (SELECT deleted_at FROM siwa.accounts WHERE sub = 'u.d') = (SELECT event_time FROM siwa.changes WHERE jti = 'd2' AND type = 'siwa.account_deleted')"
            ) == true)
        // A third, later again, changed nothing: superseded, no change.
        try owner.storeAsReceiver(
            SeededNotification(jti: "d3", type: "account-delete", sub: "u.d", eventTime: later))
        #expect(try workerPass(worker) == ["applied"])
        #expect(try value(owner, "SELECT count(*)::bigint FROM siwa.changes WHERE jti = 'd3'") == 0)
        // In one batch: the earlier one second is a change as well.
        try owner.storeAsReceiver([
            SeededNotification(jti: "b1", type: "account-delete", sub: "u.b", eventTime: later),
            SeededNotification(jti: "b2", type: "account-delete", sub: "u.b", eventTime: earlier),
        ])
        #expect(try workerPass(worker) == ["applied", "applied"])
        #expect(
            try value(
                owner,
                "SELECT (SELECT deleted_at FROM siwa.accounts WHERE sub = 'u.b') = (SELECT event_time FROM siwa.changes WHERE jti = 'b2' AND type = 'siwa.account_deleted')"
            ) == true)
    }
}
