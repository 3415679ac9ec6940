import Foundation
import Postgres
import TestSupport
import Testing

/// The real `siwa-worker` binary as subprocesses against a real database.
@Suite("siwa-worker processes", .serialized)
struct WorkerProcessTests {
    private static let countingHook = """
        CREATE TABLE hook_calls (jti text NOT NULL);
        CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                 email text, jti text) RETURNS void
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO public.hook_calls VALUES (jti);
            PERFORM pg_sleep(0.001);
        END;
        $$;
        """

    private func insertMany(_ db: TestDatabase, count: Int, subjects: Int) throws {
        let now = Date()
        try db.connection.storeAsReceiver(
            (1...count).map { i in
                SeededNotification(
                    jti: "bulk-\(i)", type: ["consent-revoked", "email-disabled", "email-enabled"][i % 3],
                    sub: "sub-\(i % subjects)", email: i % 3 > 0 ? "u\(i)@privaterelay.appleid.com" : nil,
                    eventTime: now.addingTimeInterval(-Double(i)), issuedAt: now)
            })
    }

    @Test("two workers drain 3000 events over 300 users, one killed mid-drain; each hook effect happens once")
    func twoWorkersSurviveSigkill() throws {
        let db = try TestDatabase()
        try db.connection.simpleQuery(Self.countingHook)
        try insertMany(db, count: 3000, subjects: 300)
        let arguments = ["--concurrency", "2", "--batch-size", "50", "--poll-interval", "0.2"]
        let victim = try WorkerProcess(arguments, databaseURL: db.url)
        let survivor = try WorkerProcess(arguments, databaseURL: db.url)

        let applied = "SELECT count(*) FROM siwa.notifications WHERE state = 'applied'"
        #expect(try waitUntil(timeout: .seconds(60)) { try db.value(applied, as: Int.self) >= 300 })
        victim.send(SIGKILL)
        #expect(victim.waitForExit(timeout: .seconds(10)) != nil)
        #expect(try db.value(applied, as: Int.self) < 3000, "the kill should land mid-drain")

        #expect(try waitUntil(timeout: .seconds(120)) { try db.value(applied, as: Int.self) == 3000 })
        #expect(try db.value("SELECT count(*) FROM hook_calls", as: Int.self) == 3000)
        #expect(try db.value("SELECT count(DISTINCT jti) FROM hook_calls", as: Int.self) == 3000)
        #expect(try db.value("SELECT count(*) FROM siwa.accounts", as: Int.self) == 300)
        survivor.send(SIGTERM)
        #expect(survivor.waitForExit(timeout: .seconds(10)) == 0)
    }

    @Test("an idle worker applies a new notification in milliseconds, not after the poll interval")
    func notificationWakesIdleWorker() throws {
        let db = try TestDatabase()
        let worker = try WorkerProcess(["--poll-interval", "5"], databaseURL: db.url)
        // Ready once it has connected (and so listens): it logs that line after LISTEN.
        #expect(waitUntil(timeout: .seconds(10)) { worker.log.contains("\"connected\"") })
        var latencies: [Duration] = []
        for index in 0..<3 {
            try db.connection.storeAsReceiver(SeededNotification(jti: "wake-\(index)", sub: "u\(index)"))
            let start = ContinuousClock.now  // Each insert finds the worker idle, waiting after the last one.
            #expect(
                try waitUntil(timeout: .seconds(10)) {
                    try db.value(
                        "SELECT state FROM siwa.notifications WHERE jti = $1", [.text("wake-\(index)")],
                        as: String.self)
                        == "applied"
                })
            latencies.append(ContinuousClock.now - start)
        }
        #expect(latencies.allSatisfy { $0 < .seconds(1) }, "latencies: \(latencies)")
        worker.send(SIGTERM)
        #expect(worker.waitForExit(timeout: .seconds(10)) == 0)
    }

    @Test("a worker survives a database restart and applies what arrives afterwards")
    func reconnectsAfterRestart() throws {
        let cluster = try PostgresCluster.start()
        defer { cluster.destroy() }
        let db = try TestDatabase(cluster: cluster)
        let worker = try WorkerProcess(["--poll-interval", "0.5"], databaseURL: db.url)
        #expect(waitUntil(timeout: .seconds(10)) { worker.log.contains("\"connected\"") })
        db.connection.close()
        try cluster.stop(mode: .fast)
        #expect(waitUntil(timeout: .seconds(10)) { worker.log.contains("reconnecting") })
        try cluster.start()
        let again = try PostgresConnection(configuration: db.configuration)
        defer { again.close() }
        try again.storeAsReceiver(SeededNotification(jti: "after-restart", sub: "u"))
        let applied = try waitUntil(timeout: .seconds(20)) {
            try again.query("SELECT state FROM siwa.notifications").first?[0, as: String.self] == "applied"
        }
        #expect(applied)
        #expect(worker.process.isRunning)
        worker.send(SIGTERM)
        #expect(worker.waitForExit(timeout: .seconds(10)) == 0)
    }

    @Test("SIGTERM stops an idle worker with exit status 0")
    func sigtermExitsCleanly() throws {
        let db = try TestDatabase()
        let worker = try WorkerProcess(["--poll-interval", "1"], databaseURL: db.url)
        #expect(waitUntil(timeout: .seconds(10)) { worker.log.contains("\"connected\"") })
        worker.send(SIGTERM)
        #expect(worker.waitForExit(timeout: .seconds(10)) == 0)
        #expect(worker.log.contains("worker stopped"))
    }

    @Test("--once drains everything due and exits 0")
    func onceDrainsAndExits() throws {
        let db = try TestDatabase()
        try insertMany(db, count: 500, subjects: 50)
        let worker = try WorkerProcess(["--once", "--concurrency", "2"], databaseURL: db.url)
        #expect(worker.waitForExit(timeout: .seconds(60)) == 0)
        // What is left, and why, when anything is.
        let left = try db.query(
            """
            SELECT n.state || ' ' || coalesce(q.attempts::text, '-') || ' ' || coalesce(q.last_error, '-')
                   || ' busy ' || (q.busy_since IS NOT NULL)::text
              FROM siwa.notifications n LEFT JOIN siwa.notification_queue q ON q.jti = n.jti
             WHERE n.state <> 'applied'
            """
        ).map { try $0[0, as: String.self] }
        let notApplied = worker.log.split(separator: "\n").filter { !$0.contains("\"outcome\":\"applied\"") }
        #expect(left.isEmpty, "\(left.prefix(5)); \(notApplied.joined(separator: "\n"))")
        // Logs carry identifiers and outcomes, never the email addresses.
        #expect(worker.log.contains("\"outcome\":\"applied\""))
        #expect(!worker.log.contains("privaterelay"))
    }

    @Test("--lock-timeout and SIWA_WORKER_LOCK_TIMEOUT must stay below the statement timeout (exit 2)")
    func lockTimeoutIsValidated() throws {
        let flag = try WorkerProcess(
            ["--once", "--statement-timeout", "2", "--lock-timeout", "2"],
            databaseURL: "postgresql://postgres@/x?host=/nonexistent&port=1")
        #expect(flag.waitForExit(timeout: .seconds(30)) == 2)
        #expect(flag.log.contains("lock timeout must be shorter than the statement timeout"))
        let environment = try WorkerProcess(
            ["--once", "--statement-timeout", "2"],
            databaseURL: "postgresql://postgres@/x?host=/nonexistent&port=1",
            environment: ["SIWA_WORKER_LOCK_TIMEOUT": "3"])
        #expect(environment.waitForExit(timeout: .seconds(30)) == 2)
    }

    @Test("--once against an unreachable database exits 1")
    func onceFailsWithoutDatabase() throws {
        let worker = try WorkerProcess(
            ["--once"], databaseURL: "postgresql://postgres@/x?host=/nonexistent&port=1")
        #expect(worker.waitForExit(timeout: .seconds(30)) == 1)
    }

    @Test("a batch size above 64 is refused at start (exit 2), saying why")
    func largerBatchRefused() throws {
        let process = try WorkerProcess(
            ["--batch-size", "100"], databaseURL: "postgresql:///x?host=/nonexistent")
        #expect(process.waitForExit(timeout: .seconds(30)) == 2)
        #expect(process.log.contains("subtransaction"), "\(process.log)")
    }
}
