import Foundation
import Postgres
import ServiceSupport
import Synchronization
import TestSupport
import Testing
import Worker

/// Locks other transactions hold: a role that merely connects, the app's own transactions, and what the
/// worker does about each (hardening review, items 2 and 3).
@Suite("Locks held by other transactions")
struct LockTests {
    @Test("a siwa_admin login holding the old per-user advisory locks of every user stalls nothing")
    func adminCannotStallTheQueue() throws {
        let db = try TestDatabase()
        for index in 0..<150 {
            try db.insert(jti: "n-\(index)", type: "consent-revoked", sub: "user-\(index)")
        }
        let admin = try db.connect(asMemberOf: "siwa_admin")
        defer { admin.close() }
        // What any reader could do before: take the guessable per-user advisory lock of every user.
        #expect(
            try admin.query(
                """
                SELECT count(pg_advisory_lock(hashtextextended('siwa.sub:' || s.sub, 0)))
                  FROM (SELECT DISTINCT sub FROM siwa.event_history) AS s
                """
            ).first?[0, as: Int.self] == 150)
        // The lock that serialises a user now is its account row's, which the admin cannot take.
        #expect(pgState { try admin.query("SELECT sub FROM siwa.event_history FOR KEY SHARE") } == "42501")
        #expect(pgState { try admin.query("SELECT sub FROM siwa.accounts FOR KEY SHARE") } == "42501")

        let metrics = MetricsRegistry()
        let worker = try db.worker(concurrency: 1, batchSize: 20, metrics: metrics)
        let summary = try drainOnce(worker, within: .seconds(30))
        #expect(summary?.applied == 150)
        #expect(
            try db.value("SELECT count(*) FROM siwa.notifications WHERE state = 'applied'", as: Int.self)
                == 150)
        #expect(metric(#"siwa_worker_notifications_total{outcome="busy"}"#, in: metrics) == 0)
    }

    /// 30 due notifications of the user `held`, whose account row an app transaction (the returned
    /// connection, left open) holds, and one of each of 20 other users.
    private func heldUserAndOthers() throws -> (TestDatabase, PostgresConnection) {
        let db = try TestDatabase()
        try db.connection.execute("INSERT INTO siwa.accounts (sub) VALUES ('held')")
        for index in 0..<30 {
            try db.insert(
                jti: "held-\(index)", type: "email-enabled", sub: "held", email: "h@privaterelay.appleid.com")
        }
        for index in 0..<20 {
            try db.insert(jti: "free-\(index)", type: "consent-revoked", sub: "free-\(index)")
        }
        let app = try PostgresConnection(configuration: db.configuration)
        try app.simpleQuery("BEGIN; UPDATE siwa.accounts SET updated_at = now() WHERE sub = 'held'")
        return (db, app)
    }

    @Test("a user whose account row an app transaction holds is put off; the others apply and the drain ends")
    func heldAccountRowDoesNotStopOthers() throws {
        let (db, app) = try heldUserAndOthers()
        defer { app.close() }

        let metrics = MetricsRegistry()
        let worker = try db.worker(batchSize: 10, metrics: metrics)
        let start = ContinuousClock.now
        let summary = try #require(try drainOnce(worker, within: .seconds(20)), "drainOnce did not return")
        #expect(ContinuousClock.now - start < .seconds(10))
        #expect(summary.applied == 20)
        #expect(summary.retried == 0 && summary.dead == 0)

        // Every one still pending with no attempt counted; those a lane claimed (a batch per lane at
        // least: a lane leaves a busy user alone for the rest of its drain) are put off and visible as
        // busy.
        let held = try #require(
            try db.connection.query(
                """
                SELECT count(*) FILTER (WHERE state = 'pending' AND attempts = 0),
                       count(*) FILTER (WHERE state = 'pending' AND attempts = 0 AND busy_since IS NOT NULL
                                          AND next_attempt_at > busy_since)
                  FROM siwa.notifications WHERE sub = 'held'
                """
            ).first)
        #expect(try held[0, as: Int.self] == 30)
        let putOff = try held[1, as: Int.self]
        #expect(putOff >= 10)
        let admin = try db.connect(asMemberOf: "siwa_admin")
        defer { admin.close() }
        let health = try #require(try admin.query("SELECT * FROM siwa.queue_health").first)
        #expect(try health["busy", as: Int.self] == putOff)
        #expect(try health["oldest_busy_seconds", as: Double?.self].map { $0 >= 0 } == true)
        #expect(
            (metric(#"siwa_worker_notifications_total{outcome="busy"}"#, in: metrics) ?? 0) >= Double(putOff))
        #expect(metric("siwa_worker_oldest_busy_seconds", in: metrics) != nil)
        #expect(metric("siwa_worker_batch_failures_total", in: metrics) == 0)

        // Once the app commits, they apply, and are no longer busy.
        try app.simpleQuery("COMMIT")
        #expect(try db.drainUntilSettled(worker))
        #expect(
            try db.value(
                "SELECT count(*) FROM siwa.notifications WHERE state = 'applied' AND busy_since IS NULL",
                as: Int.self) == 50)
        let after = try #require(
            try admin.query("SELECT busy, oldest_busy_seconds FROM siwa.queue_health").first)
        #expect(try after["busy", as: Int.self] == 0)
        #expect(try after["oldest_busy_seconds", as: Double?.self] == nil)
    }

    @Test(
        "a busy user's notifications, due again before the next pass, do not keep other users' out of the drain"
    )
    func busyUserDueAgainDoesNotCrowdOutOthers() throws {
        let (db, app) = try heldUserAndOthers()
        defer { app.close() }

        // As on a loaded machine, where a pass takes longer than the shortest put-off: every busy
        // notification is due again as soon as it was put off.
        let stop = Atomic<Bool>(false)
        let stopped = DispatchSemaphore(value: 0)
        let configuration = db.configuration
        let expirer = Thread {
            defer { stopped.signal() }
            guard let connection = try? PostgresConnection(configuration: configuration) else { return }
            defer { connection.close() }
            while !stop.load(ordering: .relaxed) {
                _ = try? connection.execute(
                    """
                    UPDATE siwa.notification_queue SET next_attempt_at = now() - interval '1 second'
                     WHERE busy_since IS NOT NULL AND next_attempt_at > now()
                    """)
            }
        }
        expirer.start()
        defer {
            stop.store(true, ordering: .relaxed)
            stopped.wait()
        }

        let worker = try db.worker(concurrency: 1, batchSize: 10)
        let summary = try #require(try drainOnce(worker, within: .seconds(20)), "drainOnce did not return")
        #expect(summary.applied == 20)
        #expect(
            try db.value(
                "SELECT count(*) FROM siwa.notifications WHERE sub LIKE 'free-%' AND state = 'applied'",
                as: Int.self) == 20)
        #expect(
            try db.value(
                "SELECT count(*) FROM siwa.notifications WHERE sub = 'held' AND state = 'pending'",
                as: Int.self)
                == 30)
    }

    @Test("a user busy for over a minute is logged once as a warning naming the notification, not the user")
    func longBusyIsLogged() throws {
        let db = try TestDatabase()
        try db.connection.execute("INSERT INTO siwa.accounts (sub) VALUES ('001234.held-user')")
        try db.insert(jti: "long-busy", type: "consent-revoked", sub: "001234.held-user")
        try db.insert(jti: "long-busy-2", type: "consent-revoked", sub: "001234.held-user")
        try db.connection.execute("UPDATE siwa.notifications SET busy_since = now() - interval '2 minutes'")
        let app = try PostgresConnection(configuration: db.configuration)
        defer { app.close() }
        try app.simpleQuery("BEGIN; SELECT 1 FROM siwa.accounts WHERE sub = '001234.held-user' FOR UPDATE")

        let log = LogCapture()
        let metrics = MetricsRegistry()
        let worker = try db.worker(concurrency: 1, logger: log.logger(level: .warning), metrics: metrics)
        #expect(try drainOnce(worker, within: .seconds(20)) != nil)
        let warnings = log.all.split(separator: "\n").filter { $0.contains("busy for long") }
        #expect(warnings.count == 1)
        #expect(warnings.first?.contains("long-busy") == true)
        #expect(!log.all.contains("held-user"))
        #expect((metric("siwa_worker_oldest_busy_seconds", in: metrics) ?? 0) >= 100)
        try app.simpleQuery("ROLLBACK")
    }

    @Test("a new user whose account row another transaction is inserting is busy, not a failed attempt")
    func concurrentInsertIsBusy() throws {
        let db = try TestDatabase()
        try db.insert(jti: "fresh", type: "consent-revoked", sub: "fresh")
        let app = try PostgresConnection(configuration: db.configuration)
        defer { app.close() }
        try app.simpleQuery("BEGIN; INSERT INTO siwa.accounts (sub) VALUES ('fresh')")

        try db.connection.simpleQuery("SET lock_timeout = '100ms'")
        let rows = try db.connection.query(
            "SELECT outcome, attempt FROM siwa.process_due_notifications(10, 20, interval '1 second')")
        #expect(try rows.map { try $0[0, as: String.self] } == ["busy"])
        #expect(try db.value("SELECT attempts FROM siwa.notifications", as: Int.self) == 0)
        #expect(try db.value("SELECT busy_since IS NOT NULL FROM siwa.notifications", as: Bool.self))
        try app.simpleQuery("COMMIT")
        try db.connection.execute("UPDATE siwa.notifications SET next_attempt_at = now()")
        #expect(
            try db.connection.query(
                "SELECT outcome FROM siwa.process_due_notifications(10, 20, interval '1 second')"
            ).map { try $0[0, as: String.self] } == ["applied"])
    }

    @Test("erasure that has become due runs on schedule while the only lane is stuck in a batch")
    func maintenanceRunsWhileLaneIsStuck() throws {
        let db = try TestDatabase()
        try db.connection.simpleQuery(
            """
            CREATE TABLE gate (open boolean NOT NULL);
            INSERT INTO gate VALUES (false);
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text) RETURNS void
            LANGUAGE plpgsql AS $$
            BEGIN
                WHILE sub = 'stuck' AND NOT (SELECT g.open FROM public.gate g) LOOP
                    PERFORM pg_sleep(0.02);
                END LOOP;
            END;
            $$;
            UPDATE siwa.settings SET erase_personal_data_after = interval '1 day';
            """)
        try db.insert(jti: "stuck", type: "consent-revoked", sub: "stuck")
        let worker = try db.worker(concurrency: 1, maintenanceInterval: .milliseconds(200))
        let stop = startRunning(worker)
        defer {
            _ = try? db.connection.execute("UPDATE gate SET open = true")
            stop()
        }

        let laneInBatch = """
            SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active'
               AND query LIKE '%apply_verified_notifications%'
            """
        // Only once the lane is stuck in its batch does an account's erasure become due.
        #expect(try waitUntil(timeout: .seconds(10)) { try db.value(laneInBatch, as: Int.self) == 1 })
        try db.connection.execute(
            """
            INSERT INTO siwa.accounts (sub, email, deleted_at)
            VALUES ('gone', 'gone@privaterelay.appleid.com', now() - interval '2 days')
            """)

        let erased =
            "SELECT personal_data_erased_at IS NOT NULL AND email IS NULL FROM siwa.accounts WHERE sub = 'gone'"
        #expect(try waitUntil(timeout: .seconds(10)) { try db.value(erased, as: Bool.self) })
        // The lane was in its batch all along.
        #expect(try db.state("stuck") == "pending")
        #expect(try db.value(laneInBatch, as: Int.self) == 1)

        try db.connection.execute("UPDATE gate SET open = true")
        #expect(try waitUntil(timeout: .seconds(10)) { try db.state("stuck") == "applied" })
    }

    @Test(
        "a session row an app transaction holds delays only its event by the lock timeout; the batch applies")
    func lockedSessionRetriesOnlyThatEvent() throws {
        let db = try TestDatabase()
        try db.connection.execute(
            """
            INSERT INTO siwa.sessions (sub, created_at)
            SELECT 'user-' || i, now() - interval '1 day' FROM generate_series(0, 9) AS i
            """)
        for index in 0..<10 {
            try db.insert(jti: "c-\(index)", type: "consent-revoked", sub: "user-\(index)")
        }
        let app = try PostgresConnection(configuration: db.configuration)
        defer { app.close() }
        try app.simpleQuery("BEGIN; SELECT id FROM siwa.sessions WHERE sub = 'user-4' FOR UPDATE")

        let metrics = MetricsRegistry()
        let worker = try db.worker(
            concurrency: 1, batchSize: 10, maxAttempts: 5, retryBaseDelay: .seconds(60),
            statementTimeout: .seconds(3), lockTimeout: .milliseconds(200), metrics: metrics)
        let start = ContinuousClock.now
        let summary = try #require(try drainOnce(worker, within: .seconds(20)))
        #expect(ContinuousClock.now - start < .seconds(2))
        #expect(summary.applied == 9)
        #expect(summary.retried == 1)
        #expect(metric("siwa_worker_batch_failures_total", in: metrics) == 0)
        let row = try #require(
            try db.connection.query(
                "SELECT state, attempts, last_error FROM siwa.notifications WHERE jti = 'c-4'"
            ).first)
        #expect(try row[0, as: String.self] == "pending")
        #expect(try row[1, as: Int.self] == 1)
        #expect(try row[2, as: String?.self]?.hasPrefix("55P03:") == true)
        #expect(
            try db.value("SELECT count(*) FROM siwa.sessions WHERE revoked_at IS NOT NULL", as: Int.self) == 9
        )

        // Released, it applies on its retry.
        try app.simpleQuery("COMMIT")
        try db.connection.execute("UPDATE siwa.notifications SET next_attempt_at = now() WHERE jti = 'c-4'")
        #expect(try worker.drainOnce().applied == 1)
        #expect(try db.state("c-4") == "applied")
        #expect(try db.value("SELECT attempts FROM siwa.notifications WHERE jti = 'c-4'", as: Int.self) == 2)
        #expect(
            try db.value("SELECT count(*) FROM siwa.sessions WHERE revoked_at IS NOT NULL", as: Int.self)
                == 10)
    }

    @Test("a lock timeout not below the statement timeout is rejected")
    func lockTimeoutValidation() throws {
        let database = try PostgresConfiguration("host=/nonexistent dbname=x")
        #expect(throws: ConfigurationError.self) {
            _ = try Worker.Configuration(
                database: database, verification: .tests, statementTimeout: .seconds(5),
                lockTimeout: .seconds(5))
        }
        #expect(throws: ConfigurationError.self) {
            _ = try Worker.Configuration(database: database, verification: .tests, lockTimeout: .zero)
        }
        _ = try Worker.Configuration(
            database: database, verification: .tests, statementTimeout: nil, lockTimeout: .seconds(60))
    }
}

/// The SQLSTATE of the `PostgresError` that `body` throws, or nil when it does not throw.
func pgState(_ body: () throws -> Void) -> String? {
    do {
        try body()
        return nil
    } catch let error as PostgresError {
        return error.sqlState
    } catch {
        return "not a PostgresError"
    }
}
