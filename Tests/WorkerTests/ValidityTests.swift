import Foundation
import Postgres
import TestSupport
import Testing

/// One pass of the worker's role over everything due, in one transaction.
@discardableResult
private func workerPass(_ database: AdminDatabase) throws -> [String] {
    let worker = try database.connect(as: .worker)
    defer { worker.close() }
    return try worker.transaction { connection in
        try connection.query(
            "SELECT outcome FROM siwa.process_due_notifications(100, 5, interval '1 ms')"
        ).map { try $0[0, as: String.self] }
    }
}

/// A session or refresh token as the owner reads it: revoked_at set, revoke_reason.
private func revocation(_ database: AdminDatabase, table: String, id: Int) throws -> (
    revoked: Bool, reason: String?
) {
    let owner = try database.connectAsOwner()
    defer { owner.close() }
    let row = try owner.query(
        "SELECT revoked_at IS NOT NULL, revoke_reason FROM siwa.\(table) WHERE id = $1",
        [
            .int(Int64(id))
        ])[0]
    return (try row[0, as: Bool.self], try row[1, as: String?.self])
}

/// What `siwa.session_is_valid(sub, created_at)` says of the row `id` of `table`, asked as the app.
private func isValid(_ app: PostgresConnection, table: String, id: Int) throws -> Bool {
    try app.query(
        "SELECT siwa.session_is_valid(sub, created_at) FROM siwa.\(table) WHERE id = $1",
        [
            .int(Int64(id))
        ])[0][0, as: Bool.self]
}

@Suite("The validity rule: a session the worker could not see is revoked on write and refused on read")
struct ValidityTests {
    @Test(
        "a session and a refresh token recorded after the worker applied consent-revoked, created before it, are stored revoked",
        arguments: ["sessions", "refresh_tokens"])
    func recordedAfterConsentRevoked(table: String) throws {
        let database = try AdminDatabase.make()
        // event_time is a minute ago (storeAsReceiver).
        try storeAsReceiver(database, jti: "revoke", sub: "001000.vera", eventType: "consent-revoked")
        #expect(try workerPass(database) == ["applied"])
        let app = try database.connect(as: .app)
        defer { app.close() }
        // A sign-in transaction that began before the revocation and commits after the worker ran.
        let late = try app.query(
            "INSERT INTO siwa.\(table) (sub, created_at) VALUES ('001000.vera', now() - interval '2 minutes') RETURNING id"
        )[0][0, as: Int.self]
        // A sign-in after the revocation is valid.
        let fresh = try app.query("INSERT INTO siwa.\(table) (sub) VALUES ('001000.vera') RETURNING id")[0][
            0, as: Int.self]
        let lateRow = try revocation(database, table: table, id: late)
        #expect(lateRow.revoked)
        #expect(lateRow.reason == "consent-revoked")
        #expect(try isValid(app, table: table, id: late) == false)
        // Clearing the revocation does not make it valid on read.
        try app.execute(
            "UPDATE siwa.\(table) SET revoked_at = NULL, revoke_reason = NULL WHERE id = $1",
            [.int(Int64(late))])
        #expect(try isValid(app, table: table, id: late) == false)
        let freshRow = try revocation(database, table: table, id: fresh)
        #expect(!freshRow.revoked)
        #expect(freshRow.reason == nil)
        #expect(try isValid(app, table: table, id: fresh))
    }

    @Test("a session back-dated to before the revocation is revoked")
    func backDated() throws {
        let database = try AdminDatabase.make()
        try storeAsReceiver(database, jti: "revoke", sub: "001000.walt", eventType: "consent-revoked")
        #expect(try workerPass(database) == ["applied"])
        let app = try database.connect(as: .app)
        defer { app.close() }
        let id = try app.query("INSERT INTO siwa.sessions (sub) VALUES ('001000.walt') RETURNING id")[0][
            0, as: Int.self]
        #expect(try !revocation(database, table: "sessions", id: id).revoked)
        try app.execute(
            "UPDATE siwa.sessions SET created_at = now() - interval '1 hour' WHERE id = $1", [.int(Int64(id))]
        )
        let row = try revocation(database, table: "sessions", id: id)
        #expect(row.revoked)
        #expect(row.reason == "consent-revoked")
        #expect(try isValid(app, table: "sessions", id: id) == false)
    }

    @Test(
        "after account-delete, a new session and refresh token are stored revoked, the token without its ciphertext"
    )
    func afterAccountDelete() throws {
        let database = try AdminDatabase.make()
        try storeAsReceiver(database, jti: "delete", sub: "001000.xena", eventType: "account-delete")
        #expect(try workerPass(database) == ["applied"])
        let app = try database.connect(as: .app)
        defer { app.close() }
        let session = try app.query("INSERT INTO siwa.sessions (sub) VALUES ('001000.xena') RETURNING id")[0][
            0, as: Int.self]
        let token = try app.query(
            """
            INSERT INTO siwa.refresh_tokens (sub, client_id, token_sha256, token_ciphertext)
            VALUES ('001000.xena', 'com.example.app', '\\x01', '\\x02') RETURNING id
            """)[0][0, as: Int.self]
        for (table, id) in [("sessions", session), ("refresh_tokens", token)] {
            let row = try revocation(database, table: table, id: id)
            #expect(row.revoked)
            #expect(row.reason == "account-delete")
            #expect(try isValid(app, table: table, id: id) == false)
        }
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        #expect(
            try owner.query(
                "SELECT token_ciphertext IS NULL FROM siwa.refresh_tokens WHERE id = $1",
                [
                    .int(Int64(token))
                ])[0][0, as: Bool.self])
    }

    @Test(
        "a session inserted while the worker's transaction runs escapes both, and the read check refuses it")
    func concurrentInsertRefusedOnRead() throws {
        let database = try AdminDatabase.make()
        try storeAsReceiver(database, jti: "revoke", sub: "001000.yuri", eventType: "consent-revoked")
        let app = try database.connect(as: .app)
        defer { app.close() }
        try app.execute("BEGIN")
        let id = try app.query(
            "INSERT INTO siwa.sessions (sub, created_at) VALUES ('001000.yuri', now() - interval '2 minutes') RETURNING id"
        )[0][0, as: Int.self]
        // The worker commits its revocation while the app's row is not yet committed: it cannot see it.
        #expect(try workerPass(database) == ["applied"])
        try app.execute("COMMIT")
        #expect(try !revocation(database, table: "sessions", id: id).revoked)
        #expect(try isValid(app, table: "sessions", id: id) == false)
        #expect(
            try app.query(
                """
                SELECT count(*) FROM siwa.sessions
                 WHERE id = $1 AND revoked_at IS NULL AND siwa.session_is_valid(sub, created_at)
                """, [.int(Int64(id))])[0][0, as: Int.self] == 0)
    }

    @Test("a user Apple never told us about has valid sessions")
    func unknownUser() throws {
        let database = try AdminDatabase.make()
        let app = try database.connect(as: .app)
        defer { app.close() }
        #expect(try app.query("SELECT siwa.session_is_valid('001000.zoe', now())")[0][0, as: Bool.self])
        let id = try app.query(
            "INSERT INTO siwa.sessions (sub, created_at) VALUES ('001000.zoe', now() - interval '1 day') RETURNING id"
        )[0][0, as: Int.self]
        #expect(try !revocation(database, table: "sessions", id: id).revoked)
    }

    @Test("the sign-in API still records refresh tokens, stored revoked for a deleted account")
    func signInRecordsTokens() throws {
        let database = try AdminDatabase.make()
        try storeAsReceiver(database, jti: "delete", sub: "001000.gone", eventType: "account-delete")
        #expect(try workerPass(database) == ["applied"])
        let signin = try database.connect(as: .signin)
        defer { signin.close() }
        for (code, sub) in [("\\x0a", "001000.live"), ("\\x0b", "001000.gone")] {
            // A sign-in is recorded only for a code the API claimed for that user and client.
            try signin.execute(
                "SELECT siwa.begin_sign_in($1::bytea, 'com.example.app', $2)", [.text(code), .text(sub)])
            try signin.execute(
                """
                SELECT siwa.record_sign_in($1::bytea, 'com.example.app', $2, NULL, NULL, true, 2,
                                           ($1 || '01')::bytea, '\\x99')
                """, [.text(code), .text(sub)])
        }
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let rows = try owner.query(
            "SELECT sub, revoke_reason, token_ciphertext IS NULL FROM siwa.refresh_tokens ORDER BY sub")
        #expect(rows.count == 2)
        #expect(try rows[0][0, as: String.self] == "001000.gone")
        #expect(try rows[0][1, as: String?.self] == "account-delete")
        #expect(try rows[0][2, as: Bool.self])
        #expect(try rows[1][0, as: String.self] == "001000.live")
        #expect(try rows[1][1, as: String?.self] == nil)
        #expect(try !rows[1][2, as: Bool.self])
    }

    // MARK: siwa_app

    @Test("siwa_app records, looks up and revokes its sessions and refresh tokens")
    func appMay() throws {
        let database = try AdminDatabase.make()
        let app = try database.connect(as: .app)
        defer { app.close() }
        let session = try app.query("INSERT INTO siwa.sessions (sub) VALUES ('001000.amy') RETURNING id")[0][
            0, as: Int.self]
        let token = try app.query(
            """
            INSERT INTO siwa.refresh_tokens (sub, client_id, token_sha256, token_ciphertext)
            VALUES ('001000.amy', 'com.example.app', '\\x01', '\\x02') RETURNING id
            """)[0][0, as: Int.self]
        #expect(
            try app.query(
                """
                SELECT count(*) FROM siwa.sessions
                 WHERE sub = '001000.amy' AND revoked_at IS NULL AND siwa.session_is_valid(sub, created_at)
                """)[0][0, as: Int.self] == 1)
        #expect(
            try app.execute(
                "UPDATE siwa.sessions SET revoked_at = now(), revoke_reason = 'sign-out' WHERE id = $1",
                [.int(Int64(session))]) == 1)
        #expect(
            try app.execute(
                """
                UPDATE siwa.refresh_tokens SET revoked_at = now(), revoke_reason = 'sign-out'
                 WHERE id = $1 RETURNING id, sub, client_id, created_at
                """, [.int(Int64(token))]) == 1)
        #expect(try revocation(database, table: "refresh_tokens", id: token).reason == "sign-out")
        #expect(try revocation(database, table: "sessions", id: session).reason == "sign-out")
    }

    @Test(
        "siwa_app may not read tokens, ciphertexts, hashes, errors, the log or personal data, nor delete or rewrite rows",
        arguments: [
            "SELECT token_ciphertext FROM siwa.refresh_tokens",
            "SELECT token_sha256 FROM siwa.refresh_tokens",
            "INSERT INTO siwa.refresh_tokens (sub, token_sha256) VALUES ('x', '\\x01') ON CONFLICT (token_sha256) DO NOTHING",
            "SELECT * FROM siwa.refresh_tokens",
            "UPDATE siwa.refresh_tokens SET token_ciphertext = NULL",
            "UPDATE siwa.refresh_tokens SET sub = 'x'",
            "DELETE FROM siwa.refresh_tokens",
            "UPDATE siwa.sessions SET sub = 'x'",
            "DELETE FROM siwa.sessions",
            "SELECT email FROM siwa.accounts",
            "SELECT * FROM siwa.accounts",
            "UPDATE siwa.accounts SET deleted_at = NULL",
            "INSERT INTO siwa.accounts (sub) VALUES ('x')",
            "SELECT raw_token FROM siwa.notifications",
            "SELECT * FROM siwa.notification_log",
            "SELECT last_error FROM siwa.notification_queue",
            "SELECT * FROM siwa.event_history",
            "SELECT * FROM siwa.account_overview",
            "SELECT * FROM siwa.revocation_ledger",
            "SELECT last_error FROM siwa.revocation_requests",
            "SELECT * FROM siwa.sign_ins",
            "SELECT * FROM siwa.process_due_notifications(10, 5, interval '1 second')",
            "SELECT siwa.erase_personal_data('x')",
        ])
    func appCannot(statement: String) throws {
        let database = try AdminDatabase.make()
        let app = try database.connect(as: .app)
        defer { app.close() }
        #expect(sqlState { try app.query(statement) } == permissionDenied)
    }
}
