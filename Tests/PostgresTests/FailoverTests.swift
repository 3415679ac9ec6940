import Foundation
import Postgres
import TestSupport
import Testing

@Suite("Servers that accept no writes, and failover to a standby", .serialized)
struct FailoverTests {
    @Test(
        "a write on a server that accepts no writes fails as readOnly and its connection is not pooled; writes work again once it does"
    )
    func readOnlyServer() throws {
        let cluster = try PostgresCluster.shared
        let configuration = try cluster.createDatabase(applying: "CREATE TABLE t (id int)")
        let name = try #require(configuration.database)
        let admin = try PostgresConnection(configuration: cluster.configuration(database: "postgres"))
        defer { admin.close() }
        // What a session of a hot standby, or of a primary made read-only by its provider, sees.
        try admin.simpleQuery("ALTER DATABASE \(name) SET default_transaction_read_only = on")
        let pool = PostgresPool(configuration: configuration, maxConnections: 1)
        defer { pool.close() }

        let error = postgresError {
            _ = try pool.withConnection { try $0.execute("INSERT INTO t VALUES (1)") }
        }
        #expect(error?.code == .readOnly)
        #expect(error?.sqlState == "25006")
        #expect(error?.isConnectionError == true && error?.isRetryable == true)
        #expect(pool.statistics == .init(idle: 0, inUse: 0), "the read-only session is not kept")

        let inTransaction = postgresError {
            _ = try pool.withConnection { connection in
                try connection.transaction { try $0.execute("INSERT INTO t VALUES (1)") }
            }
        }
        #expect(inTransaction?.code == .readOnly)
        #expect(pool.statistics == .init(idle: 0, inUse: 0))

        #expect(postgresError { try pool.checkWritable() }?.code == .readOnly)
        #expect(pool.statistics == .init(idle: 0, inUse: 0))

        // Sessions opened from now on may write: the same pool writes, without being recreated.
        try admin.simpleQuery("ALTER DATABASE \(name) RESET default_transaction_read_only")
        try pool.checkWritable()
        try pool.withConnection { try $0.execute("INSERT INTO t VALUES (2)") }
        #expect(try pool.withConnection { try $0.query("SELECT count(*) FROM t")[0][0, as: Int.self] } == 1)
    }

    @Test(
        "with several hosts and target_session_attrs=read-write, writes go to the primary though a standby is named first"
    )
    func multiHostWritesToPrimary() throws {
        let primary = try PostgresCluster.start()
        defer { primary.destroy() }
        let standby = try primary.startStandby()
        defer { standby.destroy() }
        let configuration = try primary.createDatabase(applying: "CREATE TABLE t (id int)")
        let name = try #require(configuration.database)
        #expect(
            try waitUntil {
                (try? PostgresConnection(configuration: standby.configuration(database: name))) != nil
            })

        let hosts =
            "host=\(standby.socketDirectory),\(primary.socketDirectory)&port=\(standby.port),\(primary.port)"
        let url = "postgresql://postgres@/\(name)?\(hosts)"
        let pool = PostgresPool(
            configuration: try PostgresConfiguration(url + "&target_session_attrs=read-write"),
            maxConnections: 2)
        defer { pool.close() }
        try pool.checkWritable()
        try pool.withConnection { try $0.execute("INSERT INTO t VALUES (1)") }
        let onPrimary = try PostgresConnection(configuration: configuration)
        defer { onPrimary.close() }
        #expect(try onPrimary.query("SELECT count(*) FROM t")[0][0, as: Int.self] == 1)

        // Without it libpq takes the first host, the standby: not ready, and every write fails, retryably.
        let anyHost = PostgresPool(configuration: try PostgresConfiguration(url), maxConnections: 1)
        defer { anyHost.close() }
        #expect(postgresError { try anyHost.checkWritable() }?.code == .readOnly)
        let error = postgresError {
            _ = try anyHost.withConnection { try $0.execute("INSERT INTO t VALUES (2)") }
        }
        #expect(error?.code == .readOnly && error?.isRetryable == true)
        #expect(anyHost.statistics.idle == 0)
        #expect(try onPrimary.query("SELECT count(*) FROM t")[0][0, as: Int.self] == 1)
    }

    @Test(
        "a pool follows a failover: primary killed, standby promoted, the next call writes to the new primary"
    )
    func followsPromotion() throws {
        let primary = try PostgresCluster.start()
        defer { primary.destroy() }
        let standby = try primary.startStandby()
        defer { standby.destroy() }
        let configuration = try primary.createDatabase(applying: "CREATE TABLE t (id int)")
        let name = try #require(configuration.database)
        let url =
            "postgresql://postgres@/\(name)?host=\(primary.socketDirectory),\(standby.socketDirectory)"
            + "&port=\(primary.port),\(standby.port)&target_session_attrs=read-write"
        let pool = PostgresPool(configuration: try PostgresConfiguration(url), maxConnections: 2)
        defer { pool.close() }
        try pool.withConnection { try $0.execute("INSERT INTO t VALUES (1)") }
        let onStandby = try standby.configuration(database: name)
        #expect(
            try waitUntil {
                let connection = try? PostgresConnection(configuration: onStandby)
                defer { connection?.close() }
                return (try? connection?.query("SELECT count(*) FROM t")[0][0, as: Int.self]) == 1
            })

        try primary.stop(mode: .immediate)
        // No primary: the old one is gone and the standby refuses read-write sessions. Fast, retryable.
        let started = ContinuousClock.now
        let down = postgresError {
            _ = try pool.withConnection { try $0.execute("INSERT INTO t VALUES (2)") }
        }
        #expect(down?.isConnectionError == true && down?.isRetryable == true, "\(String(describing: down))")
        #expect(postgresError { try pool.checkWritable() } != nil)
        #expect(ContinuousClock.now - started < .seconds(5))

        try standby.promote()
        try pool.checkWritable()
        try pool.withConnection { try $0.execute("INSERT INTO t VALUES (3)") }
        let promoted = try PostgresConnection(configuration: onStandby)
        defer { promoted.close() }
        #expect(
            try promoted.query("SELECT array_agg(id ORDER BY id)::text FROM t")[0][0, as: String.self]
                == "{1,3}")
    }
}
