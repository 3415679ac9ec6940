import Foundation
import Postgres
import TestSupport
import Testing

/// One `siwa-worker` of the stress, named in `pg_stat_activity` by its slot and generation.
private struct StressWorker {
    let process: WorkerProcess
    let name: String

    init(slot: Int, generation: Int, db: TestDatabase) throws {
        name = "stress-\(slot)-\(generation)"
        process = try WorkerProcess(
            [
                "--concurrency", "2", "--batch-size", "8", "--poll-interval", "0.2", "--retry-base-delay",
                "0.05",
            ], databaseURL: db.url + "&application_name=\(name)")
    }
}

@Suite("Erased accounts under kill -9: every account ends as its events give by event time", .serialized)
struct ErasedAccountStressTests {
    static let accounts = 200
    static let waves = 4
    static let workers = 3

    /// Every call of the hook, and a few milliseconds of work in it, so that kills land mid-batch.
    static let hook = """
        CREATE TABLE public.hook_calls (jti text NOT NULL, sub text NOT NULL, email text);
        CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                 email text, jti text) RETURNS void
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO public.hook_calls VALUES (jti, sub, email);
            PERFORM pg_sleep(0.003);
        END;
        $$;
        """

    /// Each account's events (1 to 6: email events, consent-revoked, account-delete, some with a
    /// second deletion), each at its own event time within the last hours, and one session.
    private static func events(_ random: inout SplitMix64, now: Date) -> [SeededNotification] {
        var all: [SeededNotification] = []
        for account in 0..<accounts {
            let sub = "001000.stress\(account)"
            let offsets = (0..<Int.random(in: 1...6, using: &random)).map { _ in
                Double(Int.random(in: 60...36_000, using: &random))
            }
            for (index, offset) in Set(offsets).sorted().enumerated() {
                let type = [
                    "email-enabled", "email-disabled", "consent-revoked", "account-delete", "account-delete",
                ]
                .randomElement(using: &random)!
                let email =
                    type.hasPrefix("email-") ? "stress\(account).\(index)@privaterelay.appleid.com" : nil
                all.append(
                    SeededNotification(
                        jti: "stress-\(account)-\(index)", type: type, sub: sub, email: email,
                        eventTime: now.addingTimeInterval(-offset), issuedAt: now))
            }
        }
        return all
    }

    @Test(
        "3 workers killed -9 again and again while they drain 200 accounts' events, out of event-time order, in waves (later ones after the erasure), with redeliveries"
    )
    func finalStateFollowsEventTime() throws {
        let seed = UInt64.random(in: 1...UInt64.max)
        var random = SplitMix64(seed: seed)
        let db = try TestDatabase()
        try db.connection.simpleQuery(Self.hook)
        let now = Date()
        // One session per account, created somewhen within the events' hours.
        try db.connection.execute(
            """
            INSERT INTO siwa.sessions (sub, created_at)
            SELECT '001000.stress' || g, now() - (random() * 36000) * interval '1 second'
              FROM generate_series(0, $1::integer - 1) AS g
            """, [.int(Int64(Self.accounts))])

        // Shuffled (out of event-time order), with about one in six redelivered in a later wave.
        let events = Self.events(&random, now: now).shuffled(using: &random)
        var waves = Array(repeating: [SeededNotification](), count: Self.waves)
        for (index, event) in events.enumerated() {
            let wave = index * Self.waves / events.count
            waves[wave].append(event)
            if wave + 1 < Self.waves, Int.random(in: 0..<6, using: &random) == 0 {
                waves[Int.random(in: wave + 1..<Self.waves, using: &random)].append(event)
            }
        }

        var generation = 0
        var workers = try (0..<Self.workers).map { slot in
            try StressWorker(slot: slot, generation: 0, db: db)
        }
        let pending = "SELECT count(*) FROM siwa.notification_queue"
        let midBatch = """
            SELECT count(*) FROM pg_stat_activity
             WHERE application_name = $1 AND state IN ('active', 'idle in transaction')
               AND (query LIKE '%claim_notifications%' OR query LIKE '%apply_verified_notifications%')
            """
        var kills = 0
        var nextWave = 0
        let deadline = ContinuousClock.now + .seconds(50)
        // Each wave is stored once the previous one is drained; while any is pending, a worker caught in
        // a batch (its claim or apply running, or its transaction open between them) is killed -9 and a
        // new one started in its place.
        while ContinuousClock.now < deadline {
            if try db.value(pending, as: Int.self) == 0 {
                if nextWave == Self.waves { break }
                for chunk in stride(from: 0, to: waves[nextWave].count, by: 64) {
                    try db.connection.storeAsReceiver(
                        Array(waves[nextWave][chunk..<min(chunk + 64, waves[nextWave].count)]))
                }
                nextWave += 1
            }
            let slot = Int.random(in: 0..<Self.workers, using: &random)
            let caught = try waitUntil(timeout: .seconds(2)) {
                try db.value(midBatch, [.text(workers[slot].name)], as: Int.self) > 0
                    || db.value(pending, as: Int.self) == 0
            }
            guard caught, try db.value(pending, as: Int.self) > 0 else { continue }
            workers[slot].process.send(SIGKILL)
            #expect(workers[slot].process.waitForExit(timeout: .seconds(10)) != nil)
            kills += 1
            generation += 1
            workers[slot] = try StressWorker(slot: slot, generation: generation, db: db)
        }
        #expect(nextWave == Self.waves, "seed \(seed): only \(nextWave) waves stored in time")
        #expect(try waitUntil(timeout: .seconds(30)) { try db.value(pending, as: Int.self) == 0 })
        // A worker started by the last kill stops cleanly once it is up (its lanes connected).
        for worker in workers {
            #expect(waitUntil(timeout: .seconds(10)) { worker.process.log.contains("\"connected\"") })
            worker.process.send(SIGTERM)
        }
        for worker in workers { #expect(worker.process.waitForExit(timeout: .seconds(10)) == 0) }
        #expect(kills >= 5, "seed \(seed): workers were killed mid-batch only \(kills) times")

        // Every event stored once (redeliveries deduplicated).
        #expect(try db.value("SELECT count(*) FROM siwa.notification_log", as: Int.self) == events.count)
        // What each account's events give by event time, from the log: the earliest deletion, the latest
        // consent revocation, the latest email event (for accounts never deleted: once deleted, the email
        // status stops changing, whatever the order), and which session they revoke.
        let mismatches = try db.connection.query(
            """
            WITH expected AS (
                SELECT l.sub,
                       min(l.event_time) FILTER (WHERE l.event_type = 'account-delete') AS deleted_at,
                       max(l.event_time) FILTER (WHERE l.event_type = 'consent-revoked') AS consent_revoked_at,
                       (array_agg(l.event_type ORDER BY l.event_time DESC)
                            FILTER (WHERE l.event_type LIKE 'email-%'))[1] AS email_event,
                       (array_agg(l.email ORDER BY l.event_time DESC)
                            FILTER (WHERE l.event_type LIKE 'email-%'))[1] AS email
                  FROM siwa.notification_log l GROUP BY l.sub)
            SELECT e.sub
              FROM expected e
              LEFT JOIN siwa.accounts a ON a.sub = e.sub
              JOIN siwa.sessions s ON s.sub = e.sub
             WHERE a.sub IS NULL
                OR a.deleted_at IS DISTINCT FROM e.deleted_at
                OR a.consent_revoked_at IS DISTINCT FROM e.consent_revoked_at
                OR (s.revoked_at IS NOT NULL)
                   IS DISTINCT FROM (e.deleted_at IS NOT NULL OR coalesce(s.created_at <= e.consent_revoked_at, false))
                OR CASE WHEN e.deleted_at IS NULL
                        THEN a.email_status IS DISTINCT FROM
                                 CASE e.email_event WHEN 'email-enabled' THEN 'enabled'
                                                    WHEN 'email-disabled' THEN 'disabled' END
                             OR a.email IS DISTINCT FROM e.email
                        ELSE a.email IS NOT NULL OR a.personal_data_erased_at IS NULL END
             ORDER BY e.sub
            """
        ).map { try $0[0, as: String.self] }
        #expect(
            mismatches.isEmpty, "seed \(seed): \(mismatches.count) accounts differ: \(mismatches.prefix(10))")

        // Every consent-revoked and account-delete applied; an email event only skipped when it found its
        // account erased (the documented exception); the hook ran once for each applied event, none else.
        let outcomes = try db.connection.query(
            """
            SELECT count(*) FILTER (WHERE event_type IN ('consent-revoked', 'account-delete') AND state <> 'applied'),
                   count(*) FILTER (WHERE event_type LIKE 'email-%' AND state NOT IN ('applied', 'skipped')),
                   count(*) FILTER (WHERE state = 'skipped'
                                      AND (last_error IS DISTINCT FROM
                                               'account erased: no stored token to verify, nothing applied'
                                           OR event_type NOT LIKE 'email-%')),
                   count(*) FILTER (WHERE state = 'skipped'),
                   (SELECT count(*) FROM public.hook_calls),
                   (SELECT count(DISTINCT jti) FROM public.hook_calls),
                   count(*) FILTER (WHERE state = 'applied'),
                   (SELECT count(*) FROM public.hook_calls h
                     WHERE NOT EXISTS (SELECT 1 FROM siwa.notification_log n
                                        WHERE n.jti = h.jti AND n.state = 'applied'))
              FROM siwa.notification_log
            """)[0]
        let counts = try (0..<8).map { try outcomes[$0, as: Int.self] }
        #expect(counts[0] == 0, "seed \(seed): consent-revoked or account-delete not applied: \(counts[0])")
        #expect(counts[1] == 0 && counts[2] == 0, "seed \(seed): other outcomes \(counts)")
        #expect(
            counts[4] == counts[6] && counts[5] == counts[6] && counts[7] == 0,
            "seed \(seed): hooks \(counts)")

        // Nothing of an erased user is left: no email or token in the log, no email in the changefeed
        // or in the hook's calls after the erasure.
        #expect(
            try db.value(
                """
                SELECT count(*) FROM siwa.notification_log l JOIN siwa.accounts a ON a.sub = l.sub
                 WHERE a.personal_data_erased_at IS NOT NULL AND (l.raw_token IS NOT NULL OR l.email IS NOT NULL)
                """, as: Int.self) == 0)
        #expect(
            try db.value(
                """
                SELECT count(*) FROM siwa.changes c JOIN siwa.accounts a ON a.sub = c.sub
                 WHERE a.personal_data_erased_at IS NOT NULL AND (c.email IS NOT NULL OR c.is_private_email IS NOT NULL)
                """, as: Int.self) == 0)
        let skippedEmails = counts[3]
        let erased = try db.value(
            "SELECT count(*) FROM siwa.accounts WHERE personal_data_erased_at IS NOT NULL", as: Int.self)
        print(
            "erased-account stress (seed \(seed)): \(events.count) events over \(Self.accounts) accounts, \(kills) kill -9s, \(erased) accounts erased, \(skippedEmails) email events skipped after the erasure"
        )
    }
}
