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
            ReleasedReceiver.version4Store,
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
