import Foundation
import Postgres
import TestSupport
import Testing

/// A row type as the project's modules declare them: statement, columns and decoding side by side.
private struct Ticket: PostgresRowDecodable, Equatable {
    static let statement = "SELECT id, owner, seen_at, weight FROM tickets WHERE id >= $1::bigint ORDER BY id"
    static let columns: PostgresColumns =
        "id bigint, owner text, seen_at timestamp with time zone, weight double precision"
    var id: Int64
    var owner: String?
    var seenAt: Date
    var weight: Double

    init(row: PostgresRow) throws(PostgresError) {
        id = try row[0, as: Int64.self]
        owner = try row[1, as: String?.self]
        seenAt = try row[2, as: Date.self]
        weight = try row[3, as: Double.self]
    }
}

@Suite("Typed rows: a statement, its columns and its decoding in one type")
struct TypedRowTests {
    private static let table = """
        CREATE TABLE tickets (id bigint PRIMARY KEY, owner text, seen_at timestamptz NOT NULL, weight float8 NOT NULL);
        INSERT INTO tickets VALUES (1, 'a', '2026-01-31 23:59:59+00', 0.5), (2, NULL, '2028-02-29 12:00:00+00', 2);
        """

    @Test("describe gives a statement's columns and type names without running it")
    func describeWithoutRunning() throws {
        let connection = try freshConnection(applying: Self.table + "CREATE TABLE calls (n int);")
        #expect(try connection.describe(Ticket.statement) == Ticket.columns)
        let sideEffect = "INSERT INTO calls VALUES (1) RETURNING n, n::text AS t, now() AS at"
        #expect(try connection.describe(sideEffect) == "n integer, t text, at timestamp with time zone")
        #expect(try connection.query("SELECT count(*) FROM calls")[0][0, as: Int.self] == 0)
        #expect(try connection.describe("UPDATE calls SET n = 2") == PostgresColumns(names: [], types: []))
    }

    @Test("rows decode through the type; parameters are typed as the statement says")
    func decodeRows() throws {
        let connection = try freshConnection(applying: Self.table)
        let tickets = try connection.rows(Ticket.self, [.int(2)])
        #expect(tickets.count == 1)
        #expect(tickets.first?.owner == nil)
        #expect(tickets.first?.seenAt == Date(timeIntervalSince1970: 1_835_438_400))
        #expect(try connection.rows(Ticket.self, [.int(1)]).map(\.id) == [1, 2])
    }

    @Test("a result whose columns differ from the declared ones is refused, naming both lists")
    func driftRefused() throws {
        let connection = try freshConnection(applying: Self.table)
        let drifted = try connection.query("SELECT id, owner AS holder, seen_at, weight FROM tickets")
        let error = postgresError { _ = try drifted.decode(Ticket.self) }
        #expect(error?.code == .decoding)
        #expect(error?.message.contains("(id, owner, seen_at, weight)") == true)
        #expect(error?.message.contains("(id, holder, seen_at, weight)") == true)
    }

    @Test("a statement that does not parse is an error from describe, and the connection stays usable")
    func describeError() throws {
        let connection = try freshConnection()
        let error = postgresError { _ = try connection.describe("SELEC 1") }
        #expect(error?.sqlState == "42601")
        #expect(try connection.query("SELECT 1")[0][0, as: Int.self] == 1)
    }

    @Test("value wants exactly one row of one column; firstValue, at most one column and maybe no row")
    func singleValues() throws {
        let connection = try freshConnection(applying: Self.table)
        #expect(try connection.value("SELECT count(*) FROM tickets", as: Int.self) == 2)
        #expect(try connection.value("SELECT owner FROM tickets WHERE id = 2", as: String?.self) == nil)
        #expect(
            postgresError { _ = try connection.value("SELECT id FROM tickets", as: Int.self) }?.code
                == .decoding)
        #expect(
            postgresError {
                _ = try connection.value("SELECT id, owner FROM tickets WHERE id = 1", as: Int.self)
            }?.code == .decoding)
        #expect(
            try connection.firstValue("SELECT id FROM tickets WHERE id > $1::bigint", [.int(5)], as: Int.self)
                == nil)
        #expect(try connection.firstValue("SELECT id FROM tickets ORDER BY id DESC", as: Int.self) == 2)
        #expect(
            postgresError { _ = try connection.firstValue("SELECT id, owner FROM tickets", as: Int.self) }?
                .code == .decoding)
    }
}
