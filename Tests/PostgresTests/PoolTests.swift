import Foundation
import Postgres
import Synchronization
import TestSupport
import Testing

@Suite("PostgresPool")
struct PoolTests {
    @Test("opens connections lazily and reuses them")
    func lazyAndReused() throws {
        let pool = try PostgresPool(configuration: PostgresCluster.shared.createDatabase(), maxConnections: 3)
        #expect(pool.statistics == .init(idle: 0, inUse: 0))
        let first = try pool.withConnection { $0.backendProcessID }
        let second = try pool.withConnection { $0.backendProcessID }
        #expect(first == second)
        #expect(pool.statistics == .init(idle: 1, inUse: 0))
        try pool.ping()
        pool.close()
        #expect(pool.statistics.idle == 0)
        #expect(postgresError { try pool.ping() }?.code == .poolClosed)
    }

    @Test("the N+1th caller waits and then fails with poolExhausted")
    func bounded() throws {
        let pool = try PostgresPool(configuration: PostgresCluster.shared.createDatabase(), maxConnections: 2)
        let holding = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let finished = onThreadsAsync(2) { _ in
            _ = try? pool.withConnection { _ in
                holding.signal()
                release.wait()
            }
        }
        #expect(holding.wait(timeout: .now() + 10) == .success)
        #expect(holding.wait(timeout: .now() + 10) == .success)
        #expect(pool.statistics.inUse == 2)
        let started = ContinuousClock.now
        let error = postgresError { try pool.withConnection(timeout: .milliseconds(300)) { _ in } }
        #expect(error?.code == .poolExhausted)
        #expect(ContinuousClock.now - started >= .milliseconds(300))
        release.signal()
        release.signal()
        #expect(finished.wait(timeout: .now() + 10) == .success)
        try pool.ping()
    }

    @Test("200 inserts from 20 threads all land, using at most maxConnections backends")
    func concurrentUse() throws {
        let configuration = try PostgresCluster.shared.createDatabase(
            applying: "CREATE TABLE hits (thread int, n int, backend int)")
        let pool = PostgresPool(configuration: configuration, maxConnections: 4, acquireTimeout: .seconds(30))
        let failures = Mutex<[String]>([])
        let done = onThreads(20) { thread in
            for n in 0..<10 {
                do {
                    try pool.withConnection { connection in
                        try connection.execute(
                            "INSERT INTO hits VALUES ($1, $2, pg_backend_pid())",
                            [.int(Int64(thread)), .int(Int64(n))])
                    }
                } catch {
                    failures.withLock { $0.append("\(error)") }
                }
            }
        }
        #expect(done)
        #expect(failures.withLock { $0 } == [])
        let counts = try pool.withConnection { connection in
            try connection.query("SELECT count(*), count(DISTINCT backend) FROM hits")[0]
        }
        #expect(try counts[0, as: Int.self] == 200)
        #expect(try counts[1, as: Int.self] <= 4)
    }

    @Test("a connection broken inside the body is discarded and the next call reconnects")
    func discardsBroken() throws {
        let pool = try PostgresPool(configuration: PostgresCluster.shared.createDatabase(), maxConnections: 1)
        let doomed = try pool.withConnection { $0.backendProcessID }
        let error = postgresError {
            _ = try pool.withConnection { connection in
                try connection.query("SELECT pg_terminate_backend(pg_backend_pid())")
            }
        }
        #expect(error?.isConnectionError == true)
        let next = try pool.withConnection { $0.backendProcessID }
        #expect(next != doomed)
    }

    @Test("an idle connection killed by the server is replaced transparently")
    func replacesDeadIdle() throws {
        let configuration = try PostgresCluster.shared.createDatabase()
        let pool = PostgresPool(configuration: configuration, maxConnections: 1)
        let victim = try pool.withConnection { $0.backendProcessID }
        let admin = try PostgresConnection(configuration: configuration)
        try admin.query("SELECT pg_terminate_backend($1::int)", [.int(Int64(victim))])
        // Wait (bounded) until the backend is really gone, then use the pool.
        let deadline = ContinuousClock.now + .seconds(10)
        while try admin.query(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1::int", [.int(Int64(victim))])[0][
                0, as: Int.self] > 0, ContinuousClock.now < deadline
        {
            _ = try admin.waitForNotifications(timeout: .milliseconds(20))
        }
        let replacement = try pool.withConnection {
            try $0.query("SELECT pg_backend_pid()")[0][0, as: Int32.self]
        }
        #expect(replacement != victim)
    }

    @Test("a transaction left open by the body is rolled back before reuse")
    func rollsBackLeftovers() throws {
        let pool = try PostgresPool(
            configuration: PostgresCluster.shared.createDatabase(applying: "CREATE TABLE t (id int)"),
            maxConnections: 1)
        try pool.withConnection { connection in
            try connection.simpleQuery("BEGIN")
            try connection.execute("INSERT INTO t VALUES (1)")
        }
        let count = try pool.withConnection { connection in
            (
                try connection.query("SELECT count(*) FROM t")[0][0, as: Int.self],
                try connection.isInTransaction
            )
        }
        #expect(count.0 == 0)
        #expect(count.1 == false)
    }
}

/// Starts `count` threads running `body`; the returned semaphore is signalled once all have finished.
func onThreadsAsync(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) -> DispatchSemaphore {
    let done = DispatchSemaphore(value: 0)
    Thread {
        _ = onThreads(count, body)
        done.signal()
    }.start()
    return done
}
