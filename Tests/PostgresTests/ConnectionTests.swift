import Foundation
import Postgres
import TestSupport
import Testing

@Suite("PostgresConnection")
struct ConnectionTests {
    @Test("connects with a socket URL, a TCP URL and a conninfo string")
    func connectionForms() throws {
        let cluster = try PostgresCluster.start(tcp: true)  // the shared one listens on its socket only
        defer { cluster.destroy() }
        let database = try #require(try cluster.createDatabase().database)
        let forms = [
            cluster.url(database: database),
            cluster.tcpURL(database: database),
            "host=\(cluster.socketDirectory) port=\(cluster.port) dbname=\(database) user=postgres",
            "postgres://postgres@localhost/\(database)?host=\(cluster.socketDirectory)&port=\(cluster.port)",
        ]
        for form in forms {
            let connection = try PostgresConnection(configuration: PostgresConfiguration(form))
            let name = try #require(try connection.query("SELECT current_database()").first)
            #expect(try name[0, as: String.self] == database)
            #expect(connection.isHealthy)
        }
    }

    @Test("reports the application name and uses UTC and ISO dates")
    func sessionSettings() throws {
        let cluster = try PostgresCluster.shared
        let database = try #require(try cluster.createDatabase().database)
        let connection = try PostgresConnection(
            configuration: cluster.configuration(database: database, applicationName: "siwa-test"))
        let row = try #require(
            try connection.query(
                "SELECT current_setting('application_name'), current_setting('TimeZone'), current_setting('DateStyle')"
            ).first)
        #expect(try row[0, as: String.self] == "siwa-test")
        #expect(try row[1, as: String.self] == "UTC")
        #expect(try row[2, as: String.self].hasPrefix("ISO"))
    }

    @Test("fails promptly with connectionFailed when nothing listens")
    func connectFailure() throws {
        let configuration = try PostgresConfiguration(
            "postgresql://postgres@/postgres?host=/nonexistent-siwa-socket-dir&port=1")
        let started = ContinuousClock.now
        let error = postgresError { _ = try PostgresConnection(configuration: configuration) }
        #expect(error?.code == .connectionFailed)
        #expect(error?.isConnectionError == true)
        #expect(ContinuousClock.now - started < .seconds(5))
    }

    @Test("runs multi-statement scripts with simpleQuery")
    func simpleQueryScript() throws {
        let connection = try freshConnection()
        let results = try connection.simpleQuery(
            "CREATE TABLE t (id int); INSERT INTO t VALUES (1), (2); SELECT count(*) AS n FROM t")
        #expect(results.count == 3)
        #expect(try results[2].first?["n", as: Int.self] == 2)
    }

    @Test("reports affected rows from execute")
    func affectedRows() throws {
        let connection = try freshConnection(applying: "CREATE TABLE t (id int)")
        #expect(try connection.execute("INSERT INTO t SELECT generate_series(1, $1::int)", [5]) == 5)
        #expect(try connection.execute("UPDATE t SET id = id + 1 WHERE id > $1", [2]) == 3)
        #expect(try connection.execute("DELETE FROM t") == 5)
    }

    @Test("refuses work after close")
    func closed() throws {
        let connection = try freshConnection()
        connection.close()
        connection.close()
        #expect(connection.status == .closed)
        #expect(postgresError { try connection.query("SELECT 1") }?.code == .connectionClosed)
    }
}
