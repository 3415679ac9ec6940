import Foundation
import Postgres
import TestSupport
import Testing

/// As postgres-nio's `PSQLError`: what `"\(error)"` shows (and so every log line that interpolates an
/// error) is generic; the server's message, which may quote the data a statement carried, is only in the
/// debug description, redacted.
@Suite("PostgreSQL errors are safe to print")
struct ErrorDescriptionTests {
    static let address = "someone@example.com"

    @Test("a data exception's description names code and SQLSTATE only; its debug description, redacted")
    func dataException() throws {
        let connection = try freshConnection()
        defer { connection.close() }
        // The server's message quotes the input: invalid input syntax for type integer: "someone@…".
        let error = try #require(postgresError { _ = try connection.query("SELECT '\(Self.address)'::int") })
        #expect(error.sqlState == "22P02")
        let description = String(describing: error)
        #expect(description == "PostgresError(code: query_failed, sqlState: 22P02)")
        let debug = String(reflecting: error)
        #expect(debug.hasPrefix("PostgresError(code: query_failed, sqlState: 22P02, message: "), "\(debug)")
        #expect(debug.contains("invalid input syntax"), "\(debug)")
        #expect(!debug.contains("someone"), "\(debug)")
    }

    @Test("a message a function raised is not in the description, only in the debug description")
    func raisedMessage() throws {
        let connection = try freshConnection()
        defer { connection.close() }
        let error = try #require(
            postgresError {
                try connection.execute(
                    "DO $$ BEGIN RAISE EXCEPTION 'no account for %', '\(Self.address)'; END $$")
            })
        #expect(error.sqlState == "P0001")
        #expect(!String(describing: error).contains(Self.address), "\(error)")
        #expect(!"\(error)".contains("no account"), "\(error)")
        #expect(String(reflecting: error).contains("no account for"))
    }

    @Test("an integrity error's description carries its constraint name, not the message")
    func constraintName() throws {
        let connection = try freshConnection()
        defer { connection.close() }
        try connection.execute("CREATE TABLE t (email text CONSTRAINT t_email_key UNIQUE)")
        try connection.execute("INSERT INTO t VALUES ($1)", [.text(Self.address)])
        let error = try #require(
            postgresError { try connection.execute("INSERT INTO t VALUES ($1)", [.text(Self.address)]) })
        #expect(error.code == .uniqueViolation)
        #expect(
            String(describing: error)
                == "PostgresError(code: unique_violation, sqlState: 23505, constraint: t_email_key)")
    }
}
