import Foundation
import Postgres
import TestSupport
import Testing

/// A cluster of its own, so stopping it does not disturb suites using `PostgresCluster.shared`.
private let outageCluster = Result { try PostgresCluster.start() }

@Suite("Server outages", .serialized)
struct OutageTests {
    @Test(
        "a pool fails fast while the server is down and recovers after a restart, without being recreated",
        arguments: [PostgresCluster.StopMode.fast, .immediate])
    func stopAndRestart(mode: PostgresCluster.StopMode) throws {
        let cluster = try outageCluster.get()
        try cluster.start()  // In case an earlier failure left it stopped.
        let configuration = try cluster.createDatabase(applying: "CREATE TABLE t (id int)")
        let pool = PostgresPool(configuration: configuration, maxConnections: 3, acquireTimeout: .seconds(5))
        for index in 0..<3 {
            try pool.withConnection { try $0.execute("INSERT INTO t VALUES ($1)", [.int(Int64(index))]) }
        }
        let listener = try PostgresConnection(configuration: configuration)
        try listener.listen("outage")

        try cluster.stop(mode: mode)

        // The listening connection notices the lost server while waiting.
        let waitError = postgresError { _ = try listener.waitForNotifications(timeout: .seconds(10)) }
        #expect(waitError?.code == .connectionLost)

        // Pooled calls fail fast with a connection-level error.
        for _ in 0..<3 {
            let started = ContinuousClock.now
            let error = postgresError {
                _ = try pool.withConnection { try $0.execute("INSERT INTO t VALUES (99)") }
            }
            #expect(error?.isConnectionError == true, "\(String(describing: error))")
            #expect(error?.isRetryable == true)
            #expect(ContinuousClock.now - started < .seconds(3))
        }
        #expect(postgresError { try pool.ping() }?.isConnectionError == true)

        try cluster.start()

        // The same pool works again on the first call: dead idle connections are replaced.
        try pool.ping()
        let count = try pool.withConnection { connection in
            try connection.execute("INSERT INTO t VALUES (3)")
            return try connection.query("SELECT count(*) FROM t")[0][0, as: Int.self]
        }
        #expect(count == 4)
    }

    @Test("a connection broken mid-statement reports connectionLost and is not reused")
    func brokenMidStatement() throws {
        let cluster = try outageCluster.get()
        try cluster.start()
        let configuration = try cluster.createDatabase()
        let pool = PostgresPool(configuration: configuration, maxConnections: 1)
        let stopper = onThreadsAsync(1) { _ in
            // Once the statement below is running, stop the server under it.
            let deadline = ContinuousClock.now + .seconds(20)
            if let admin = try? PostgresConnection(configuration: configuration) {
                while ContinuousClock.now < deadline,
                    (try? admin.query(
                        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE 'SELECT pg_sleep%'"
                    )[0][0, as: Int.self]) == 0
                {
                    _ = try? admin.waitForNotifications(timeout: .milliseconds(20))
                }
            }
            try? cluster.stop(mode: .immediate)
        }
        let error = postgresError {
            _ = try pool.withConnection { try $0.query("SELECT pg_sleep(30)") }
        }
        #expect(stopper.wait(timeout: .now() + 60) == .success)
        #expect(error?.code == .connectionLost)
        try cluster.start()
        try pool.ping()
    }
}
