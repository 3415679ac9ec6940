import Foundation
import Postgres
import ServiceSupport
import TestSupport
import Testing
import Worker

@Suite("Failures, retries and retention")
struct FailureTests {
    @Test(
        "a hook that raises keeps nothing of that application and goes dead after max attempts while others flow"
    )
    func poisonedEventGoesDead() throws {
        let db = try TestDatabase()
        try db.connection.simpleQuery(
            """
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text) RETURNS void
            LANGUAGE plpgsql AS $$
            BEGIN
                IF sub = 'poison' THEN RAISE EXCEPTION 'refusing %', jti; END IF;
            END;
            $$;
            """)
        try db.connection.execute(
            "INSERT INTO siwa.sessions (sub, created_at) VALUES ('poison', now() - interval '1 day')")
        try db.insert(jti: "bad", type: "consent-revoked", sub: "poison")
        for index in 0..<20 {
            try db.insert(jti: "good-\(index)", type: "consent-revoked", sub: "user-\(index)")
        }
        let worker = try db.worker(maxAttempts: 4, retryBaseDelay: .milliseconds(2))
        #expect(try db.drainUntilSettled(worker))

        #expect(try db.state("bad") == "dead")
        #expect(try db.value("SELECT attempts FROM siwa.notifications WHERE jti = 'bad'", as: Int.self) == 4)
        #expect(
            try db.value("SELECT last_error FROM siwa.notifications WHERE jti = 'bad'", as: String.self)
                == "P0001: refusing bad")
        #expect(
            try db.value("SELECT count(*) FROM siwa.notifications WHERE state = 'applied'", as: Int.self)
                == 20)
        // The built-in effects of the failed attempts were rolled back with the hook.
        #expect(
            try db.value("SELECT count(*) FROM siwa.sessions WHERE revoked_at IS NOT NULL", as: Int.self) == 0
        )
        #expect(try db.value("SELECT count(*) FROM siwa.accounts WHERE sub = 'poison'", as: Int.self) == 0)
    }

    @Test("a failed attempt is retried later with backoff, and succeeds once the cause is gone")
    func retryAfterBackoff() throws {
        let db = try TestDatabase()
        try db.connection.execute("CREATE TABLE gate (open boolean)")
        try db.connection.execute("INSERT INTO gate VALUES (false)")
        try db.connection.simpleQuery(
            """
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text) RETURNS void
            LANGUAGE plpgsql AS $$
            BEGIN
                IF NOT (SELECT open FROM public.gate) THEN RAISE EXCEPTION 'gate closed'; END IF;
            END;
            $$;
            """)
        try db.insert(jti: "c1", type: "consent-revoked", sub: "u")
        let worker = try db.worker(maxAttempts: 5, retryBaseDelay: .seconds(60))
        let first = try worker.drainOnce()
        #expect(first.retried == 1)
        let delay = try db.value(
            "SELECT extract(epoch FROM next_attempt_at - now())::float8 FROM siwa.notifications",
            as: Double.self)
        #expect(delay > 25 && delay <= 60)  // base × 2^0 × jitter in [0.5, 1)
        try db.connection.execute("UPDATE gate SET open = true")
        try db.connection.execute("UPDATE siwa.notifications SET next_attempt_at = now()")
        #expect(try worker.drainOnce().applied == 1)
        #expect(try db.value("SELECT attempts FROM siwa.notifications", as: Int.self) == 2)
    }

    @Test("a statement timeout no subtransaction can catch is pinned on the slow event, not the batch")
    func statementTimeoutPoison() throws {
        let db = try TestDatabase()
        try db.connection.simpleQuery(
            """
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text) RETURNS void
            LANGUAGE plpgsql AS $$
            BEGIN
                IF sub = 'slow' THEN PERFORM pg_sleep(5); END IF;
            END;
            $$;
            """)
        for index in 0..<5 {
            try db.insert(jti: "a-\(index)", type: "consent-revoked", sub: "user-\(index)")
        }
        try db.insert(jti: "slow", type: "consent-revoked", sub: "slow")
        for index in 5..<10 {
            try db.insert(jti: "b-\(index)", type: "consent-revoked", sub: "user-\(index)")
        }
        let worker = try db.worker(
            maxAttempts: 2, retryBaseDelay: .milliseconds(2), statementTimeout: .milliseconds(300),
            lockTimeout: .milliseconds(100))
        #expect(try db.drainUntilSettled(worker))
        #expect(try db.state("slow") == "dead")
        #expect(
            try db.value("SELECT last_error FROM siwa.notifications WHERE jti = 'slow'", as: String.self)
                .hasPrefix("57014:"))
        #expect(
            try db.value("SELECT count(*) FROM siwa.notifications WHERE state = 'applied'", as: Int.self)
                == 10)
    }

    @Test(
        "retention clears old raw tokens and drops old months of history whole, keeping pending and dead rows"
    )
    func retentionPrunes() throws {
        let db = try TestDatabase()
        // Three months ago: its own partition, as the maintenance pass made it then.
        let old = "date_trunc('month', now()) - interval '3 months' + interval '1 day'"
        try db.connection.execute("SELECT siwa.create_log_partition((\(old))::date)")
        for index in 0..<5 {
            try db.insert(jti: "old-\(index)", type: "consent-revoked", sub: "u\(index)", issuedAt: old)
        }
        try db.insert(jti: "old-dead", type: "some-type", sub: "d", issuedAt: old)
        try db.insert(jti: "recent", type: "consent-revoked", sub: "r")
        let worker = try db.worker()
        _ = try worker.drainOnce()
        try db.connection.execute(
            "UPDATE siwa.notifications SET state = 'dead', applied_at = NULL, last_error = 'P0001: gave up' WHERE jti = 'old-dead'"
        )
        try db.insert(jti: "waiting", type: "consent-revoked", sub: "w", issuedAt: old)
        try db.connection.execute(
            "UPDATE siwa.notifications SET received_at = \(old), next_attempt_at = now() + interval '1 day' WHERE jti <> 'recent'"
        )
        try db.connection.execute(
            "UPDATE siwa.notifications SET received_at = now() - interval '10 days' WHERE jti = 'recent'")
        let partition = "'siwa.notification_log_' || to_char(\(old), 'YYYY_MM')"
        #expect(try db.value("SELECT to_regclass(\(partition)) IS NOT NULL", as: Bool.self))

        let pruning = try db.worker(retainTokens: .seconds(7 * 86_400), retainEvents: .seconds(30 * 86_400))
        _ = try pruning.drainOnce()
        let rows = try db.connection.query(
            "SELECT jti, raw_token IS NOT NULL, state FROM siwa.notifications ORDER BY jti")
        #expect(try rows.map { try $0[0, as: String.self] } == ["old-dead", "recent", "waiting"])
        #expect(try rows.map { try $0[1, as: Bool.self] } == [false, false, true])
        #expect(try rows.map { try $0[2, as: String.self] } == ["dead", "applied", "pending"])
        // The month is gone as a table; what was not done with waits in the DEFAULT partition, still
        // queued, and is applied as before.
        #expect(try db.value("SELECT to_regclass(\(partition)) IS NULL", as: Bool.self))
        #expect(
            try db.value("SELECT count(*)::integer FROM siwa.notification_log_default", as: Int.self) == 2)
        try db.connection.execute(
            "UPDATE siwa.notifications SET next_attempt_at = now() WHERE jti = 'waiting'")
        _ = try worker.drainOnce()
        #expect(try db.state("waiting") == "applied")
    }

    @Test(
        "a last failure of a busy notification leaves it dead, not busy, and a failure without text still says why"
    )
    func lastFailureOfBusyNotification() throws {
        let db = try TestDatabase()
        try db.insert(jti: "bf1", type: "consent-revoked", sub: "u1")
        try db.insert(jti: "bf2", type: "consent-revoked", sub: "u2")
        try db.connection.execute("UPDATE siwa.notifications SET busy_since = now() - interval '1 minute'")
        // As the worker's one-by-one fallback records an error no subtransaction could catch.
        #expect(
            try db.value(
                "SELECT siwa.record_failure(id, '57014: canceling statement', 1, interval '1 second') FROM siwa.notifications WHERE jti = 'bf1'",
                as: String.self) == "dead")
        #expect(
            try db.value(
                "SELECT siwa.record_failure(id, NULL, 1, interval '1 second') FROM siwa.notifications WHERE jti = 'bf2'",
                as: String.self) == "dead")
        let rows = try db.connection.query(
            "SELECT jti, busy_since IS NULL, last_error FROM siwa.notifications ORDER BY jti")
        #expect(try rows.map { try $0[1, as: Bool.self] } == [true, true])
        #expect(
            try rows.map { try $0[2, as: String.self] } == ["57014: canceling statement", "(no error text)"])
    }

    @Test("a dead notification can be requeued and is then applied")
    func requeueDead() throws {
        let db = try TestDatabase()
        try db.insert(jti: "c1", type: "consent-revoked", sub: "u")
        try db.connection.execute(
            "UPDATE siwa.notifications SET state = 'dead', attempts = 20, last_error = 'P0001: gave up'")
        #expect(try db.value("SELECT siwa.requeue(p_state => 'dead')", as: Int.self) == 1)
        #expect(try db.worker().drainOnce().applied == 1)
    }

    @Test(
        "a notification whose user's account row another transaction holds is busy: put off, no attempt, then applied"
    )
    func busyUser() throws {
        let db = try TestDatabase()
        try db.insert(jti: "b1", type: "consent-revoked", sub: "held")
        try db.connection.execute("INSERT INTO siwa.accounts (sub) VALUES ('held')")
        let other = try PostgresConnection(configuration: db.configuration)
        defer { other.close() }
        try other.simpleQuery("BEGIN; SELECT 1 FROM siwa.accounts WHERE sub = 'held' FOR UPDATE")

        let busy = try db.connection.query(
            "SELECT outcome, attempt, busy_seconds FROM siwa.process_due_notifications(10, 20, interval '1 second')"
        )
        #expect(try busy.map { try $0[0, as: String.self] } == ["busy"])
        #expect(try busy[0][1, as: Int.self] == 0)
        #expect(try busy[0][2, as: Double.self] == 0)
        #expect(try db.state("b1") == "pending")
        #expect(try db.value("SELECT attempts FROM siwa.notifications WHERE jti = 'b1'", as: Int.self) == 0)
        // Put off briefly (50–100 ms the first time), so it no longer fills batches; busy since now.
        let delay = try db.value(
            "SELECT extract(epoch FROM next_attempt_at - busy_since)::float8 FROM siwa.notifications",
            as: Double.self)
        #expect(delay > 0.04 && delay < 0.11)
        // A call made before the put-off ends finds nothing to do. (On a loaded machine the call may
        // start after it ended: then the row is due again, and that is right too.)
        let dueAt = try db.value(
            "SELECT extract(epoch FROM next_attempt_at)::float8 FROM siwa.notifications", as: Double.self)
        let calledAt = try db.value("SELECT extract(epoch FROM clock_timestamp())::float8", as: Double.self)
        let again = try db.connection.query(
            "SELECT * FROM siwa.process_due_notifications(10, 20, interval '1 second')")
        #expect(again.isEmpty || calledAt >= dueAt)

        try other.simpleQuery("COMMIT")
        try db.connection.execute("UPDATE siwa.notifications SET next_attempt_at = now()")
        let applied = try db.connection.query(
            """
            SELECT p.outcome FROM siwa.notifications n,
                   siwa.process_notification(n.id, 20, interval '1 second') p
            """)
        #expect(try applied.map { try $0[0, as: String.self] } == ["applied"])
        #expect(try db.state("b1") == "applied")
        #expect(try db.value("SELECT busy_since IS NULL FROM siwa.notifications", as: Bool.self))
    }

    @Test("workers are woken by new rows and by a requeue, not by their own updates")
    func wakeUps() throws {
        let db = try TestDatabase()
        let listener = try PostgresConnection(configuration: db.configuration)
        defer { listener.close() }
        try listener.listen("siwa_notifications")

        try db.insert(jti: "w1", type: "consent-revoked", sub: "u")
        #expect(try listener.waitForNotifications(timeout: .seconds(5)).count == 1)

        // Applying it, and scheduling a retry of another, send nothing: the marker is the next to arrive.
        #expect(try db.worker().drainOnce().applied == 1)
        try db.insert(jti: "w2", type: "consent-revoked", sub: "v")
        _ = try listener.waitForNotifications(timeout: .seconds(5))
        try db.connection.query(
            "SELECT siwa.record_failure(id, 'boom', 20, interval '1 hour') FROM siwa.notifications WHERE jti = 'w2'"
        )
        try db.connection.notify("siwa_notifications", payload: "marker")
        #expect(try listener.waitForNotifications(timeout: .seconds(5)).map(\.payload) == ["marker"])

        // Putting a finished row back to pending wakes them.
        #expect(try db.value("SELECT siwa.requeue(p_jti => 'w1')", as: Int.self) == 1)
        #expect(try listener.waitForNotifications(timeout: .seconds(5)).map(\.payload) == [""])
    }

    @Test(
        "configuration rejects out-of-range values",
        arguments: [
            (0, 10, 1), (1, 0, 1), (1, 10, 0),
        ])
    func configurationValidation(concurrency: Int, batchSize: Int, maxAttempts: Int) throws {
        let database = try PostgresConfiguration("host=/nonexistent dbname=x")
        #expect(throws: ConfigurationError.self) {
            _ = try Worker.Configuration(
                database: database, verification: .tests, concurrency: concurrency, batchSize: batchSize,
                maxAttempts: maxAttempts)
        }
    }

    @Test("an outcome this worker does not know (a newer schema's) is counted under outcome=\"unknown\"")
    func unknownOutcomeCounted() throws {
        let db = try TestDatabase()
        for index in 0..<3 {
            try db.insert(jti: "unknown-outcome-\(index)", type: "consent-revoked", sub: "u\(index)")
        }
        // As a schema.sql newer than this binary might: the same entry point, reporting a new outcome.
        try db.connection.simpleQuery(
            """
            ALTER FUNCTION siwa.apply_verified_notifications(bigint[], bigint[], text[], bigint[], integer, interval)
                RENAME TO apply_verified_notifications_known;
            CREATE FUNCTION siwa.apply_verified_notifications(
                p_verified bigint[], p_rejected bigint[], p_reasons text[], p_deferred bigint[],
                p_max_attempts integer, p_retry_base_delay interval)
            RETURNS SETOF siwa.processing_result LANGUAGE sql AS $$
                SELECT r.id, r.jti, r.event_type,
                       CASE r.outcome WHEN 'applied' THEN 'quarantined' ELSE r.outcome END,
                       r.error, r.attempt, r.latency, r.busy_seconds
                  FROM siwa.apply_verified_notifications_known(p_verified, p_rejected, p_reasons, p_deferred,
                                                               p_max_attempts, p_retry_base_delay) AS r
            $$;
            """)
        let metrics = MetricsRegistry()
        let worker = try db.worker(concurrency: 1, metrics: metrics)
        _ = try worker.drainOnce()
        #expect(metric(#"siwa_worker_notifications_total{outcome="unknown"}"#, in: metrics) == 3)
        #expect(metric(#"siwa_worker_notifications_total{outcome="applied"}"#, in: metrics) == 0)
    }

    @Test("drainOnce reports a database it cannot reach as an error")
    func unreachableDatabase() throws {
        let configuration = try Worker.Configuration(
            database: try PostgresConfiguration("host=/nonexistent port=1 dbname=x connect_timeout=2"),
            verification: .tests)
        let worker = Worker(configuration: configuration, logger: quietLogger)
        #expect(throws: WorkerError.self) { _ = try worker.drainOnce() }
    }
}
