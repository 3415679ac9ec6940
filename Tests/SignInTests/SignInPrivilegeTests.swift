import Foundation
import Postgres
import TestSupport
import Testing

/// Claims `code` (a hex byte string) for `sub` as the sign-in API does; returns begin_sign_in's answer.
@discardableResult
private func claim(_ signin: PostgresConnection, code: String, sub: String) throws -> String {
    try signin.query(
        "SELECT siwa.begin_sign_in($1::bytea, 'com.example.app', $2)", [.text(code), .text(sub)])[0][
            0, as: String.self]
}

/// Records the sign-in of a claimed `code` as the sign-in API does (an email, a token).
private func record(_ signin: PostgresConnection, code: String, sub: String, email: String = "s@example.com")
    throws
{
    try signin.execute(
        """
        SELECT siwa.record_sign_in($1::bytea, 'com.example.app', $2, $3, false, true, 2,
                                   ($1 || 'aa')::bytea, '\\x99')
        """, [.text(code), .text(sub), .text(email)])
}

@Suite("siwa_signin acts only through the sign-in functions")
struct SignInPrivilegeTests {
    @Test(
        "siwa_signin reads no email, updates nothing and inserts no token row by itself",
        arguments: [
            "SELECT email FROM siwa.accounts",
            "SELECT sub FROM siwa.accounts",
            "UPDATE siwa.accounts SET email = 'x@example.com'",
            "INSERT INTO siwa.accounts (sub, email) VALUES ('001000.new', 'x@example.com')",
            "INSERT INTO siwa.refresh_tokens (sub, client_id, token_sha256, token_ciphertext) "
                + "VALUES ('001000.victim', 'com.example.app', '\\x01', '\\x02')",
            "SELECT token_sha256 FROM siwa.refresh_tokens",
            "SELECT * FROM siwa.sign_ins",
            "UPDATE siwa.sign_ins SET sign_in_count = 0",
            "SELECT * FROM siwa.sign_in_codes",
            "UPDATE siwa.sign_in_codes SET state = 'done'",
            "DELETE FROM siwa.sign_in_codes",
            "SELECT * FROM siwa.sub_aliases",
        ])
    func signinCannot(statement: String) throws {
        let database = try AdminDatabase.make()
        let signin = try database.connect(as: .signin)
        defer { signin.close() }
        #expect(sqlState { try signin.query(statement) } == permissionDenied)
    }

    @Test("siwa_signin cannot lock accounts: the stall is refused and the worker applies meanwhile")
    func noStall() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.execute("INSERT INTO siwa.accounts (sub, email) VALUES ('001000.held', 'h@example.com')")
        try storeAsReceiver(database, jti: "held-1", sub: "001000.held")
        let signin = try database.connect(as: .signin)
        defer { signin.close() }
        try signin.simpleQuery("BEGIN")
        #expect(
            sqlState { try signin.query("SELECT sub FROM siwa.accounts FOR NO KEY UPDATE") }
                == permissionDenied)
        // The sign-in login's transaction is still open: the worker is not held up by it.
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        let outcomes = try worker.transaction { connection in
            try connection.query("SELECT outcome FROM siwa.process_due_notifications(10, 5, interval '1 ms')")
                .map { try $0[0, as: String.self] }
        }
        #expect(outcomes == ["applied"])
        try signin.simpleQuery("ROLLBACK")
    }

    @Test("the functions record a sign-in only for a code claimed for that user, one account per transaction")
    func functionsWork() throws {
        let database = try AdminDatabase.make()
        let signin = try database.connect(as: .signin)
        defer { signin.close() }
        // No claim, no record: a token row for an arbitrary user is refused.
        #expect(sqlState { try record(signin, code: "\\x01", sub: "001000.victim") } == "22023")
        // The flow: claim, record, answer.
        #expect(try claim(signin, code: "\\x02", sub: "001000.sam") == "new")
        try record(signin, code: "\\x02", sub: "001000.sam", email: "sam@example.com")
        let answer = try signin.query(
            "SELECT outcome, sub, email FROM siwa.sign_in_answer('\\x02'::bytea, 'com.example.app', '001000.sam')"
        )
        #expect(answer.count == 1)
        #expect(try answer[0][0, as: String.self] == "signed_in")
        #expect(try answer[0][1, as: String.self] == "001000.sam")
        #expect(try answer[0][2, as: String?.self] == "sam@example.com")
        #expect(try claim(signin, code: "\\x02", sub: "001000.sam") == "done")
        // A finished code is not recorded twice; another user's answer is not read through it.
        #expect(sqlState { try record(signin, code: "\\x02", sub: "001000.sam") } == "22023")
        #expect(
            try signin.query(
                "SELECT * FROM siwa.sign_in_answer('\\x02'::bytea, 'com.example.app', '001000.other')"
            ).isEmpty)
        #expect(
            try signin.query(
                "SELECT * FROM siwa.sign_in_answer('\\x03'::bytea, 'com.example.app', '001000.sam')"
            ).isEmpty)
        // A claim older than ten minutes is not recorded.
        try claim(signin, code: "\\x04", sub: "001000.late")
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.execute(
            "UPDATE siwa.sign_in_codes SET created_at = now() - interval '11 minutes' WHERE code_sha256 = '\\x04'"
        )
        #expect(sqlState { try record(signin, code: "\\x04", sub: "001000.late") } == "22023")
        // One account row per transaction: a transaction that already wrote is refused (25001).
        try claim(signin, code: "\\x05", sub: "001000.one")
        try claim(signin, code: "\\x06", sub: "001000.two")
        try signin.simpleQuery("BEGIN")
        try record(signin, code: "\\x05", sub: "001000.one")
        #expect(sqlState { try record(signin, code: "\\x06", sub: "001000.two") } == "25001")
        try signin.simpleQuery("ROLLBACK")
        try signin.simpleQuery("BEGIN")
        try claim(signin, code: "\\x07", sub: "001000.three")
        #expect(sqlState { try record(signin, code: "\\x07", sub: "001000.three") } == "25001")
        try signin.simpleQuery("ROLLBACK")
        #expect(
            try owner.query("SELECT count(*) FROM siwa.accounts WHERE sub IN ('001000.one', '001000.two')")[
                0][
                    0, as: Int.self] == 0)
        #expect(
            try owner.query("SELECT count(*) FROM siwa.refresh_tokens WHERE sub <> '001000.sam'")[0][
                0, as: Int.self] == 0)
    }
}
