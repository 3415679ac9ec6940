import Foundation
import Postgres
import TestSupport
import Testing

@Suite("siwa-worker start → traffic → SIGTERM cycles", .serialized)
struct WorkerShutdownCycleTests {
    static let cycles = 50

    /// A hook slow enough (2 ms per notification) that SIGTERM lands while batches are being applied.
    static let slowHook = """
        CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                 email text, jti text) RETURNS void
        LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.002); END; $$;
        """

    private func queue(_ connection: PostgresConnection, cycle: Int, from: Int, count: Int) throws {
        try connection.storeAsReceiver(
            (from..<from + count).map {
                SeededNotification(jti: "cycle-\(cycle)-\($0)", sub: "sub-\(cycle)-\($0)")
            })
    }

    private func applied(_ connection: PostgresConnection, cycle: Int) throws -> Int {
        try connection.query(
            "SELECT count(*) FROM siwa.notifications WHERE jti LIKE $1 AND state = 'applied'",
            [.text("cycle-\(cycle)-%")]
        ).first?[0, as: Int.self] ?? 0
    }

    @Test(
        "50 cycles of start, queued notifications and /metrics scrapes (a PostgreSQL restart in some), SIGTERM mid-batch: exit status 0 every time"
    )
    func cyclesExitCleanly() throws {
        let cluster = try PostgresCluster.start()  // its own: it is restarted
        defer { cluster.destroy() }
        let db = try TestDatabase(cluster: cluster)
        try db.connection.simpleQuery(Self.slowHook)
        db.connection.close()

        var failures: [String] = []
        for cycle in 0..<Self.cycles {
            var connection = try PostgresConnection(configuration: db.configuration)
            try queue(connection, cycle: cycle, from: 0, count: 60)
            let addresses = ListenAddresses()
            defer { addresses.remove() }
            let worker = try WorkerProcess(
                [
                    "--concurrency", "2", "--batch-size", "5", "--poll-interval", "0.2",
                    "--metrics-listen", "127.0.0.1:0",
                ] + addresses.arguments, databaseURL: db.url)
            let metricsPort = try ListenAddresses.port(
                of: addresses.address("metrics", of: worker.process) { worker.log })
            let scrapes = KeepAliveTraffic(port: metricsPort, clients: 2) {
                .init(method: "GET", path: "/metrics")
            }
            #expect(
                try waitUntil(timeout: .seconds(20)) {
                    try applied(connection, cycle: cycle) >= 5 && scrapes.count(status: 200) >= 3
                }, "cycle \(cycle): no progress")
            if cycle % 10 == 5 {
                // The database goes away mid-drain and comes back: the lanes reconnect and carry on.
                connection.close()
                try cluster.stop(mode: .fast)
                #expect(waitUntil(timeout: .seconds(20)) { worker.log.contains("reconnecting") })
                try cluster.start()
                connection = try PostgresConnection(configuration: db.configuration)
                try queue(connection, cycle: cycle, from: 1000, count: 20)
                let before = try applied(connection, cycle: cycle)
                #expect(
                    try waitUntil(timeout: .seconds(30)) { try applied(connection, cycle: cycle) > before },
                    "cycle \(cycle): nothing applied after the restart")
            }
            worker.send(SIGTERM)  // while batches are applied and scrapes keep coming
            let status = worker.waitForExit(timeout: .seconds(30))
            scrapes.stop()
            let log = worker.log
            if status != 0 || CrashReport.showsCrash(log)
                || !log.contains("worker stopped")
            {
                failures.append(
                    "cycle \(cycle): status \(status.map(String.init) ?? "still running"); stderr:\n"
                        + CrashReport.summary(log))
            }
            connection.close()
        }
        #expect(
            failures.isEmpty,
            "\(failures.count) of \(Self.cycles) cycles failed:\n\(failures.joined(separator: "\n"))")
    }
}
