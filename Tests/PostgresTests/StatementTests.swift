import Foundation
import Postgres
import TestSupport
import Testing

@Suite("Errors, transactions and prepared statements")
struct StatementTests {
    @Test("a duplicate key is classified as uniqueViolation without echoing the value")
    func uniqueViolation() throws {
        let connection = try freshConnection(
            applying: "CREATE TABLE n (jti text CONSTRAINT n_jti PRIMARY KEY)")
        try connection.execute("INSERT INTO n VALUES ($1)", ["token-abc-123"])
        let error = postgresError { try connection.execute("INSERT INTO n VALUES ($1)", ["token-abc-123"]) }
        #expect(error?.code == .uniqueViolation)
        #expect(error?.sqlState == "23505")
        #expect(error?.constraintName == "n_jti")
        #expect(error?.isRetryable == false)
        #expect(error?.description.contains("token-abc-123") == false)
        #expect(connection.isHealthy)
    }

    @Test("a syntax error is queryFailed with SQLSTATE 42601 and the connection stays usable")
    func syntaxError() throws {
        let connection = try freshConnection()
        let error = postgresError { try connection.query("SELEC 1") }
        #expect(error?.code == .queryFailed)
        #expect(error?.sqlState == "42601")
        #expect(error?.isConnectionError == false)
        #expect(try connection.query("SELECT 1")[0][0, as: Int.self] == 1)
    }

    @Test("invalid input errors do not quote the offending value")
    func invalidInputRedacted() throws {
        let connection = try freshConnection()
        let error = postgresError { try connection.query("SELECT $1::int", ["user@example.com"]) }
        #expect(error?.sqlState == "22P02")
        #expect(error?.message.contains("user@example.com") == false)
    }

    @Test("a transaction commits its work")
    func commit() throws {
        let connection = try freshConnection(applying: "CREATE TABLE t (id int)")
        let value = try connection.transaction { conn in
            try conn.execute("INSERT INTO t VALUES (1)")
            return 7
        }
        #expect(value == 7)
        #expect(try !connection.isInTransaction)
        #expect(try connection.query("SELECT count(*) FROM t")[0][0, as: Int.self] == 1)
    }

    struct Abort: Error {}

    @Test("a transaction rolls back when its body throws, and rethrows the error")
    func rollback() throws {
        let connection = try freshConnection(applying: "CREATE TABLE t (id int)")
        #expect(throws: Abort.self) {
            try connection.transaction { conn in
                try conn.execute("INSERT INTO t VALUES (1)")
                throw Abort()
            }
        }
        #expect(try !connection.isInTransaction)
        #expect(try connection.query("SELECT count(*) FROM t")[0][0, as: Int.self] == 0)
    }

    @Test("a transaction whose body swallowed a failure is reported, not silently rolled back")
    func swallowedFailure() throws {
        let connection = try freshConnection(applying: "CREATE TABLE t (id int PRIMARY KEY)")
        let error = postgresError {
            try connection.transaction { conn in
                try conn.execute("INSERT INTO t VALUES (1)")
                _ = try? conn.execute("INSERT INTO t VALUES (1)")
            }
        }
        #expect(error?.code == .queryFailed)
        #expect(try connection.query("SELECT count(*) FROM t")[0][0, as: Int.self] == 0)
    }

    @Test(
        "a transaction's body runs first after BEGIN, so it can choose the isolation level",
        arguments: [
            ("SERIALIZABLE", "serializable"), ("REPEATABLE READ", "repeatable read"),
            ("READ COMMITTED", "read committed"),
        ])
    func isolation(level: String, expected: String) throws {
        let connection = try freshConnection()
        let reported = try connection.transaction { conn in
            try conn.simpleQuery("SET TRANSACTION ISOLATION LEVEL \(level)")
            return try conn.query("SHOW transaction_isolation")[0][0, as: String.self]
        }
        #expect(reported == expected)
    }

    @Test("isInTransaction (TestSupport) tells a transaction block, an aborted one and none apart")
    func transactionState() throws {
        let connection = try freshConnection()
        #expect(try !connection.isInTransaction)
        try connection.simpleQuery("BEGIN")
        #expect(try connection.isInTransaction)
        _ = try? connection.query("SELECT 1/0")
        #expect(try connection.isInTransaction)
        try connection.simpleQuery("ROLLBACK")
        #expect(try !connection.isInTransaction)
    }

    @Test("a serializable conflict surfaces as a retryable serializationFailure")
    func serializationFailure() throws {
        let first = try freshConnection(
            applying: "CREATE TABLE c (id int PRIMARY KEY, n int); INSERT INTO c VALUES (1, 0)")
        let second = try PostgresConnection(configuration: first.configuration)
        try first.simpleQuery("BEGIN ISOLATION LEVEL SERIALIZABLE")
        try second.simpleQuery("BEGIN ISOLATION LEVEL SERIALIZABLE")
        #expect(try first.query("SELECT n FROM c WHERE id = 1")[0][0, as: Int.self] == 0)
        #expect(try second.query("SELECT n FROM c WHERE id = 1")[0][0, as: Int.self] == 0)
        try first.execute("UPDATE c SET n = n + 1 WHERE id = 1")
        try first.simpleQuery("COMMIT")
        let error = postgresError { try second.execute("UPDATE c SET n = n + 1 WHERE id = 1") }
        #expect(error?.code == .serializationFailure)
        #expect(error?.isRetryable == true)
        try second.simpleQuery("ROLLBACK")
    }

    @Test("a statement prepared in SQL runs many times, each EXECUTE reporting the rows it affected")
    func explicitPrepare() throws {
        let connection = try freshConnection(applying: "CREATE TABLE t (id int, name text)")
        try connection.simpleQuery("PREPARE insert_t (int, text) AS INSERT INTO t VALUES ($1, $2)")
        for index in 1...5 {
            #expect(try connection.execute("EXECUTE insert_t(\(index), 'n\(index)')") == 1)
        }
        let rows = try connection.query("EXECUTE insert_t(6, NULL)")
        #expect(rows.affectedRows == 1)
        #expect(try connection.query("SELECT count(*) FROM t")[0][0, as: Int.self] == 6)
        let duplicate = postgresError { try connection.simpleQuery("PREPARE insert_t AS SELECT 1") }
        #expect(duplicate?.sqlState == "42P05")
    }

    @Test("repeated parameterised statements reuse one cached prepared statement")
    func statementCache() throws {
        let connection = try freshConnection(applying: "CREATE TABLE t (id int)")
        for index in 0..<20 { try connection.execute("INSERT INTO t VALUES ($1)", [.int(Int64(index))]) }
        let prepared = try connection.query(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement = $1", ["INSERT INTO t VALUES ($1)"])
        #expect(try prepared[0][0, as: Int.self] == 1)
        #expect(try connection.query("SELECT count(*) FROM t")[0][0, as: Int.self] == 20)
    }

    @Test("the statement cache evicts beyond its capacity and recovers from DEALLOCATE ALL")
    func statementCacheBounds() throws {
        let cluster = try PostgresCluster.shared
        let database = try #require(try cluster.createDatabase().database)
        let configuration = try PostgresConfiguration(
            cluster.url(database: database), statementCacheCapacity: 2)
        let connection = try PostgresConnection(configuration: configuration)
        for index in 0..<5 { _ = try connection.query("SELECT $1::int + \(index)", [1]) }
        let count = try connection.query("SELECT count(*) FROM pg_prepared_statements")[0][0, as: Int.self]
        #expect(count <= 3)
        try connection.simpleQuery("DEALLOCATE ALL")
        #expect(try connection.query("SELECT $1::int + 4", [1])[0][0, as: Int.self] == 5)
    }
}
