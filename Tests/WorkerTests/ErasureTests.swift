import Foundation
import Postgres
import TestSupport
import Testing

/// What the admin sees of one notification in `siwa.event_history`.
private func history(_ database: AdminDatabase, jti: String) throws -> (
    state: String, email: String?, lastError: String?
) {
    let admin = try database.connect(as: .admin)
    defer { admin.close() }
    let row = try #require(
        try admin.query(
            "SELECT state, email, last_error FROM siwa.event_history WHERE jti = $1", [.text(jti)]
        )
        .first)
    return (try row[0, as: String.self], try row[1, as: String?.self], try row[2, as: String?.self])
}

/// The raw token and email of one notification, read by the owner from the table itself.
private func stored(_ database: AdminDatabase, jti: String) throws -> (email: String?, rawToken: String?) {
    let owner = try database.connectAsOwner()
    defer { owner.close() }
    let row = try owner.query("SELECT email, raw_token FROM siwa.notifications WHERE jti = $1", [.text(jti)])[
        0]
    return (try row[0, as: String?.self], try row[1, as: String?.self])
}

/// One pass of the worker's role over everything due, in one transaction.
@discardableResult
private func workerPass(_ database: AdminDatabase, maxAttempts: Int = 5) throws -> [String] {
    let worker = try database.connect(as: .worker)
    defer { worker.close() }
    return try worker.transaction { connection in
        try connection.query(
            "SELECT outcome FROM siwa.process_due_notifications(100, $1::integer, interval '1 ms')",
            [.int(Int64(maxAttempts))]
        ).map { try $0[0, as: String.self] }
    }
}

@Suite("Erasure: nothing of a deleted user stays readable, whatever state their rows are in")
struct ErasureTests {
    @Test(
        "a late event claimed during the erasure, then refused by the hook, goes dead without email, token or error text"
    )
    func lateEventFailingAfterErasure() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        // The app already deleted the user: its hook raises for every later event of that user.
        try replaceHook(
            on: owner,
            body: """
                IF event_type LIKE 'email-%' THEN RAISE EXCEPTION 'app user % is gone', sub; END IF;
                """)
        let address = "ida.late@privaterelay.appleid.com"
        try storeAsReceiver(
            database, jti: "late-email", sub: "001000.ida", eventType: "email-disabled", email: address)
        try storeAsReceiver(database, jti: "delete", sub: "001000.ida", eventType: "account-delete")

        // Another worker holds the late event (claimed: its queue row locked, not yet applied) while the
        // deletion is applied and the personal data erased. Claims lock queue rows only, so the erasure
        // still clears the log row.
        let otherWorker = try database.connectAsOwner()
        defer { otherWorker.close() }
        try otherWorker.simpleQuery(
            "BEGIN; SELECT 1 FROM siwa.notification_queue WHERE jti = 'late-email' FOR UPDATE")
        #expect(try workerPass(database) == ["applied"])
        try otherWorker.simpleQuery("ROLLBACK")
        #expect(try stored(database, jti: "late-email").email == nil)

        #expect(try workerPass(database, maxAttempts: 1) == ["dead"])
        let late = try history(database, jti: "late-email")
        #expect(late.state == "dead")
        #expect(late.email == nil)
        #expect(late.lastError == "P0001: (erased with the account's personal data)")
        let table = try stored(database, jti: "late-email")
        #expect(table.email == nil && table.rawToken == nil)
    }

    @Test("the same late event, failing and retried, keeps nothing while it waits for its next attempt")
    func lateEventRetryingAfterErasure() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try replaceHook(
            on: owner,
            body: """
                IF event_type LIKE 'email-%' THEN RAISE EXCEPTION 'app user % is gone', sub; END IF;
                """)
        try storeAsReceiver(
            database, jti: "late-email", sub: "001000.ida", eventType: "email-enabled",
            email: "ida@privaterelay.appleid.com")
        try storeAsReceiver(database, jti: "delete", sub: "001000.ida", eventType: "account-delete")
        let otherWorker = try database.connectAsOwner()
        defer { otherWorker.close() }
        try otherWorker.simpleQuery(
            "BEGIN; SELECT 1 FROM siwa.notification_queue WHERE jti = 'late-email' FOR UPDATE")
        try workerPass(database)
        try otherWorker.simpleQuery("ROLLBACK")

        #expect(try workerPass(database) == ["retry"])
        let late = try history(database, jti: "late-email")
        #expect(late.state == "pending")
        #expect(late.email == nil)
        #expect(late.lastError == "P0001: (erased with the account's personal data)")
        #expect(try stored(database, jti: "late-email").rawToken == nil)
    }

    @Test("a failure's error text is stored with quoted values and email addresses masked")
    func errorsAreRedacted() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try replaceHook(
            on: owner,
            body: """
                IF event_type = 'email-enabled' THEN
                    PERFORM split_part(email, '@', 1)::integer;  -- invalid input syntax: "john.doe"
                ELSIF event_type = 'email-disabled' THEN
                    RAISE EXCEPTION 'no app user with address % (%)', email, quote_literal(sub);
                END IF;
                """)
        try storeAsReceiver(
            database, jti: "cast", sub: "001000.john", eventType: "email-enabled",
            email: "john.doe@example.com")
        try storeAsReceiver(
            database, jti: "raise", sub: "001000.john", eventType: "email-disabled",
            email: "john.doe@example.com")
        #expect(try workerPass(database, maxAttempts: 1).sorted() == ["dead", "dead"])
        #expect(
            try history(database, jti: "cast").lastError
                == #"22P02: invalid input syntax for type integer: "…""#)
        #expect(try history(database, jti: "raise").lastError == "P0001: no app user with address …@… ('…')")

        // The worker's own fallback (siwa.record_failure after an error no subtransaction caught) too.
        try storeAsReceiver(database, jti: "fallback", sub: "001000.kim", eventType: "consent-revoked")
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        _ = try worker.query(
            """
            SELECT siwa.record_failure(id, '22P02: invalid input syntax for type integer: "kim@example.com"', 5,
                                       interval '1 ms')
              FROM siwa.notifications WHERE jti = 'fallback'
            """)
        #expect(
            try history(database, jti: "fallback").lastError
                == #"22P02: invalid input syntax for type integer: "…""#)
    }

    @Test(
        "siwa.redact_error masks quoted values and addresses, and keeps the SQLSTATE, the words and object names",
        arguments: [
            (
                #"22P02: invalid input syntax for type integer: "john.doe""#,
                #"22P02: invalid input syntax for type integer: "…""#
            ),
            (
                #"23502: null value in column "email" of relation "users" violates not-null constraint"#,
                #"23502: null value in column "email" of relation "users" violates not-null constraint"#
            ),
            (#"42P01: relation "app_users" does not exist"#, #"42P01: relation "app_users" does not exist"#),
            ("P0001: user 'Jane Roe' not found", "P0001: user '…' not found"),
            ("P0001: no user for jane.roe+apple@example.com", "P0001: no user for …@…"),
            ("P0001: cut off in a \"quoted value", "P0001: cut off in a \"…\""),
            (
                "57014: canceling statement due to statement timeout",
                "57014: canceling statement due to statement timeout"
            ),
        ])
    func redaction(input: String, redacted: String) throws {
        let database = try Seed.shared.get()
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        #expect(
            try worker.query("SELECT siwa.redact_error($1)", [.text(input)])[0][0, as: String.self]
                == redacted)
    }

    @Test("erasing an account clears the error text of its failed and dead events, keeping the SQLSTATE")
    func erasureClearsErrorText() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try replaceHook(
            on: owner,
            body: """
                IF event_type = 'consent-revoked' THEN RAISE EXCEPTION 'Jane Roe has no sessions'; END IF;
                """)
        try storeAsReceiver(database, jti: "dead-one", sub: "001000.jane", eventType: "consent-revoked")
        #expect(try workerPass(database, maxAttempts: 1) == ["dead"])
        #expect(try history(database, jti: "dead-one").lastError == "P0001: Jane Roe has no sessions")

        try storeAsReceiver(database, jti: "delete", sub: "001000.jane", eventType: "account-delete")
        #expect(try workerPass(database) == ["applied"])
        let dead = try history(database, jti: "dead-one")
        #expect(dead.state == "dead")
        #expect(dead.lastError == "P0001: (erased with the account's personal data)")
        #expect(try stored(database, jti: "dead-one").rawToken == nil)
    }

    @Test("erasing an account calls siwa.erased_error only for rows with an error text, not for every row")
    func erasureCallsErasedErrorOnlyForErrors() throws {
        // siwa.erased_error pins its search_path, so it is not inlined and every call switches the path:
        // calling it for each of an account's (mostly error-free) notifications doubled the cost of an
        // account-delete in the worker's drain (docs/performance.md).
        let database = try AdminDatabase.make()
        let sub = "001000.kim"
        let types = ["email-disabled", "email-enabled", "consent-revoked"]
        for (index, type) in types.enumerated() {
            try storeAsReceiver(
                database, jti: "event-\(index)", sub: sub, eventType: type,
                email: type.hasPrefix("email-") ? "kim@privaterelay.appleid.com" : nil)
        }
        #expect(try workerPass(database) == ["applied", "applied", "applied"])

        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let calls = try owner.transaction { connection in
            try connection.simpleQuery("SET LOCAL track_functions = 'all'")
            _ = try connection.query("SELECT 1 FROM siwa.accounts WHERE sub = $1 FOR UPDATE", [.text(sub)])
            _ = try connection.query("SELECT siwa.erase_personal_data($1)", [.text(sub)])
            return try connection.query(
                """
                SELECT coalesce(pg_stat_get_xact_function_calls('siwa.erased_error(text, text)'::regprocedure), 0)
                """)[0][0, as: Int64.self]
        }
        #expect(calls == 0)
        for index in types.indices {
            let row = try stored(database, jti: "event-\(index)")
            #expect(row.email == nil && row.rawToken == nil)
        }
    }

    @Test("a notification that arrives after the erasure is stored without its email and token")
    func lateArrivalStoredWithoutPersonalData() throws {
        let database = try AdminDatabase.make()
        try storeAsReceiver(database, jti: "delete", sub: "001000.lou", eventType: "account-delete")
        #expect(try workerPass(database) == ["applied"])

        // The worker is busy elsewhere (or down): the late event waits, pending.
        try storeAsReceiver(
            database, jti: "late", sub: "001000.lou", eventType: "email-disabled",
            email: "lou@privaterelay.appleid.com")
        let late = try history(database, jti: "late")
        #expect(late.state == "pending")
        #expect(late.email == nil)
        #expect(try stored(database, jti: "late").rawToken == nil)
        // Another user's notification keeps both.
        try storeAsReceiver(
            database, jti: "other", sub: "001000.max", eventType: "email-disabled",
            email: "max@privaterelay.appleid.com")
        #expect(try stored(database, jti: "other").email == "max@privaterelay.appleid.com")
        #expect(try stored(database, jti: "other").rawToken != nil)
    }

    @Test("token retention clears the raw tokens of dead notifications too")
    func pruneClearsDeadTokens() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try replaceHook(
            on: owner,
            body: """
                RAISE EXCEPTION 'refused';
                """)
        try storeAsReceiver(database, jti: "dead-old", sub: "001000.ned")
        #expect(try workerPass(database, maxAttempts: 1) == ["dead"])
        try owner.query("UPDATE siwa.notifications SET received_at = now() - interval '40 days'")

        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        let pruned = try worker.query(
            "SELECT tokens_pruned, rows_pruned FROM siwa.prune(interval '30 days', interval '30 days')")[0]
        #expect(try pruned[0, as: Int.self] == 1)
        #expect(try pruned[1, as: Int.self] == 0)  // dead rows stay for siwactl replay
        #expect(try stored(database, jti: "dead-old").rawToken == nil)
        #expect(try history(database, jti: "dead-old").state == "dead")
    }
}

@Suite("Deleted accounts: their email status stops changing")
struct DeletedAccountTests {
    @Test(
        "a late email event after the deletion leaves the email status as it was, and the account is labelled deleted"
    )
    func lateEmailEventChangesNothing() throws {
        let database = try AdminDatabase.make()
        try storeAsReceiver(
            database, jti: "enabled", sub: "001000.ola", eventType: "email-enabled",
            email: "ola@privaterelay.appleid.com")
        try storeAsReceiver(database, jti: "delete", sub: "001000.ola", eventType: "account-delete")
        #expect(try workerPass(database) == ["applied", "applied"])
        try storeAsReceiver(
            database, jti: "late", sub: "001000.ola", eventType: "email-disabled",
            email: "ola@privaterelay.appleid.com")
        #expect(try workerPass(database) == ["applied"])

        let admin = try database.connect(as: .admin)
        defer { admin.close() }
        let row = try admin.query(
            "SELECT email_status, account_status FROM siwa.account_overview WHERE sub = '001000.ola'")[0]
        #expect(try row[0, as: String?.self] == "enabled")
        #expect(try row[1, as: String.self] == "deleted")
    }

    @Test("the cookbook's \"relay email disabled right now\" leaves deleted accounts out")
    func cookbookLeavesDeletedOut() throws {
        let database = try Seed.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        // Pam disabled her relay email, then deleted her account. Carol deleted hers (applied by the
        // seed); an email-disabled from before her deletion arrives late.
        let day = 86_400.0
        try owner.storeAsReceiver([
            SeededNotification(
                jti: "jti-pam-1", type: "email-disabled", sub: "001000.pam",
                email: "pam@privaterelay.appleid.com",
                isPrivateEmail: true, eventTime: Date().addingTimeInterval(-3 * day), rawToken: "token"),
            SeededNotification(
                jti: "jti-pam-2", type: "account-delete", sub: "001000.pam",
                eventTime: Date().addingTimeInterval(-day), rawToken: "token"),
            SeededNotification(
                jti: "jti-carol-late", type: "email-disabled", sub: Seed.carol, email: "carol@example.com",
                isPrivateEmail: false, eventTime: Date().addingTimeInterval(-2 * day), rawToken: "token"),
        ])
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        for jti in ["jti-pam-1", "jti-pam-2", "jti-carol-late"] {
            let outcome = try worker.transaction { connection in
                try connection.query(
                    """
                    SELECT outcome FROM siwa.process_notification(
                        (SELECT id FROM siwa.notifications WHERE jti = $1), 1, interval '1 second')
                    """, [.text(jti)]
                ).first?[0, as: String.self]
            }
            #expect(outcome == "applied", "\(jti)")
        }

        let admin = try database.connect(as: .admin)
        defer { admin.close() }
        let query = try CookbookQuery.under("Which users' relay email is disabled right now?")
        let subs = try #require(try admin.simpleQuery(query.sql).last).map { try $0[0, as: String.self] }
        #expect(subs == [Seed.bob])
        let pam = try admin.query(
            "SELECT email_status, account_status FROM siwa.account_overview WHERE sub = '001000.pam'")[0]
        #expect(try pam[0, as: String?.self] == "disabled")  // as it was when she deleted the account
        #expect(try pam[1, as: String.self] == "deleted")
    }
}
