import AppleNotifications
import Foundation
import Postgres
import ServiceSupport
import SiwaSchema
import Synchronization
import TestSupport
import Testing

/// The upgrade from 4.0.0 to this version as operators run it (docs/operations.md § 7): the 4.0.0
/// receivers keep storing while `siwactl migrate` runs, then the new worker applies what they stored.
@Suite("siwactl migrate from version 4 under the 4.0.0 receiver's load")
struct UpgradeUnderLoadTests {
    /// The statement a 4.0.0 siwa-receiver stores a batch with (Sources/Receiver/NotificationStore.swift
    /// at 192fc65), as its login runs it.
    static let version4Insert = """
        WITH batch AS (
            SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::boolean[],
                                 $7::timestamptz[], $8::timestamptz[], $9::timestamptz[], $10::text[])
                   AS b(jti, event_type, sub, audience, email, is_private_email, event_time, issued_at,
                        expires_at, raw_token)),
        fresh AS (
            INSERT INTO siwa.notification_jtis (jti, issued_at, expires_at)
            SELECT b.jti, b.issued_at, b.expires_at FROM batch b
            ON CONFLICT (jti) DO NOTHING
            RETURNING jti, issued_at),
        stored AS (
            INSERT INTO siwa.notification_log
                (jti, event_type, sub, audience, email, is_private_email, event_time, issued_at, expires_at,
                 raw_token, personal_data_erased_at)
            SELECT b.jti, b.event_type, b.sub, b.audience,
                   CASE WHEN a.sub IS NULL THEN b.email END, b.is_private_email, b.event_time, b.issued_at,
                   b.expires_at, CASE WHEN a.sub IS NULL THEN b.raw_token END,
                   CASE WHEN a.sub IS NOT NULL THEN clock_timestamp() END
              FROM batch b
              JOIN fresh f ON f.jti = b.jti AND f.issued_at = b.issued_at
              LEFT JOIN siwa.accounts a ON a.sub = b.sub AND a.personal_data_erased_at IS NOT NULL
            ON CONFLICT (jti, issued_at) DO NOTHING
            RETURNING id, jti, issued_at),
        queued AS (
            INSERT INTO siwa.notification_queue (id, jti, issued_at)
            SELECT s.id, s.jti, s.issued_at FROM stored s
            RETURNING 1)
        SELECT s.jti FROM stored s
         WHERE (SELECT count(pg_notify('siwa_notifications', '')) FROM (SELECT 1 FROM queued LIMIT 1) AS w) >= 0
        """

    /// What the load threads saw: the jtis committed, the slowest insert, the failures.
    final class Load: Sendable {
        let stored = Mutex<[String]>([])
        let slowest = Mutex<Duration>(.zero)
        let failures = Mutex<[String]>([])
        let stop = Atomic<Bool>(false)
    }

    /// Stores one signed notification as the 4.0.0 receiver does; returns its jti once committed.
    static func store(_ index: Int, on connection: PostgresConnection) throws -> String {
        let jti = "upgrade-\(index)-\(UUID().uuidString)"
        // Whole seconds, as the token carries them; event times an hour back, one second apart.
        let now = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down))
        let eventTime = now.addingTimeInterval(Double(index) - 3600)
        let type = ["email-disabled", "consent-revoked", "email-enabled"][index % 3]
        let sub = "001026.upgrade\(index % 40).0001"
        let email = type.hasPrefix("email") ? "u\(index % 40)@privaterelay.appleid.com" : nil
        let token = TestSigning.token(
            type: type, subject: sub, email: email, isPrivateEmail: email.map { _ in true },
            eventTime: eventTime, issuedAt: now, jti: jti)
        let rows = try connection.query(
            version4Insert,
            [
                .array([.text(jti)]), .array([.text(type)]), .array([.text(sub)]),
                .array([.text(TestSigning.audience)]), .array([email.map { .text($0) }]),
                .array([email.map { _ in .bool(true) }]), .array([.date(eventTime)]),
                .array([.date(now)]), .array([.date(now.addingTimeInterval(86_400))]), .array([.text(token)]),
            ])
        return try rows[0][0, as: String.self]
    }

    @Test("every notification the 4.0.0 receivers stored during the migration is kept and applied once")
    func upgradeUnderLoad() throws {
        let released = try #require(try releasedSchemas().first { $0.version == 4 })
        let database = try TestDatabase(.empty)
        let owner = try database.connect()
        defer { owner.close() }
        try owner.simpleQuery(released.sql)
        let load = Load()
        let counter = Atomic<Int>(0)
        var threads: [JoinableThread] = []
        for _ in 0..<4 {
            let connection = try database.connect(asMemberOf: "siwa_receiver")
            threads.append(
                JoinableThread(name: "v4-receiver") {
                    defer { connection.close() }
                    while !load.stop.load(ordering: .acquiring) {
                        let index = counter.add(1, ordering: .relaxed).oldValue
                        let start = ContinuousClock.now
                        do {
                            let jti = try Self.store(index, on: connection)
                            let took = ContinuousClock.now - start
                            load.stored.withLock { $0.append(jti) }
                            load.slowest.withLock { $0 = max($0, took) }
                        } catch {
                            load.failures.withLock { $0.append("\(error)") }
                        }
                    }
                })
        }
        #expect(waitUntil(timeout: .seconds(20)) { load.stored.withLock { $0.count } >= 200 })
        let before = load.stored.withLock { $0.count }
        let started = ContinuousClock.now
        let migrated = try siwactl(["migrate", "--database-url", database.url])
        let migration = ContinuousClock.now - started
        let during = load.stored.withLock { $0.count } - before
        #expect(
            waitUntil(timeout: .seconds(20)) { load.stored.withLock { $0.count } >= before + during + 200 })
        load.stop.store(true, ordering: .releasing)
        for thread in threads { thread.join() }
        #expect(migrated.status == 0, "\(migrated.standardError)")
        #expect(load.failures.withLock { $0 } == [])

        // Every committed jti is stored once and queued; the new worker applies each once.
        let stored = load.stored.withLock { $0 }
        #expect(
            try owner.query("SELECT count(*)::int FROM siwa.notification_log")[0][0, as: Int.self]
                == stored.count)
        let keys = try StaticHTTPServer(body: TestSigning.apple.jwksJSON())
        let worker = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwa-worker"), arguments: ["--once"],
            environment: ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }.merging([
                "SIWA_DATABASE_URL": try database.url(asMemberOf: "siwa_worker"),
                "SIWA_JWKS_URL": keys.url.absoluteString,
            ]) { $1 }, timeout: .seconds(120))
        #expect(worker.status == 0, "\(worker.standardError.suffix(2000))")
        let states = try owner.query(
            "SELECT state || ' ' || count(*) || ' ' || coalesce(max(last_error), '') FROM siwa.notification_log GROUP BY state"
        ).map { try $0[0, as: String.self] }
        #expect(
            try owner.query(
                "SELECT count(*)::int FROM siwa.notification_log WHERE state IN ('applied', 'skipped')")[0][
                    0, as: Int.self] == stored.count, "\(states)")
        print(
            "upgrade 4 → \(SiwaSchema.version) under load: migrate \(migration), \(during) notifications stored "
                + "while it ran, slowest insert \(load.slowest.withLock { $0 }), \(stored.count) in all, all applied"
        )
    }
}
