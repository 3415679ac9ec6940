import Foundation
import Postgres
import TestSupport
import Testing

/// `siwactl migrate`'s lock: one migration at a time, and no other login can make one wait.
@Suite("siwactl migrate: a lock no login without grants can hold")
struct MigrationLockProcessTests {
    func migrate(_ url: String, _ extra: [String] = []) throws -> ExecutableLocator.Result {
        try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwactl"), arguments: ["migrate", "--database-url", url] + extra,
            environment: ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") },
            timeout: .seconds(60))
    }

    @Test("a login with no grants holding the old advisory key cannot make a migration wait")
    func noGrantLoginCannotBlock() throws {
        let database = try TestDatabase()
        let intruder = try database.connect(asMemberOf: nil)
        defer { intruder.close() }
        try intruder.query("SELECT pg_advisory_lock(hashtextextended('siwa.migrate', 0))")
        // The lock migrate and the numbered changes take instead is one the intruder may not take.
        #expect(throws: PostgresError.self) {
            try intruder.transaction {
                try $0.simpleQuery("LOCK TABLE siwa.schema_version IN SHARE ROW EXCLUSIVE MODE")
            }
        }
        let started = Date()
        let result = try migrate(database.url, ["--lock-timeout", "30"])
        #expect(result.status == 0, "\(result.standardError)")
        #expect(result.standardOutput.contains("schema version after: 5"))
        #expect(!result.standardError.contains("waiting"), "\(result.standardError)")
        #expect(Date().timeIntervalSince(started) < 25)
    }

    @Test(
        "on a database without the schema, a lock held by another login is waited for at most --lock-timeout, and its holder named"
    )
    func emptyDatabaseNamesTheHolder() throws {
        let database = try TestDatabase(.empty)
        let intruder = try database.connect(asMemberOf: nil)
        let role = try database.loginRole(memberOf: nil)
        try intruder.query("SELECT pg_advisory_lock(hashtextextended('siwa.migrate', 0))")
        let pid = try intruder.query("SELECT pg_backend_pid()")[0][0, as: Int.self]
        let started = Date()
        let refused = try migrate(database.url, ["--lock-timeout", "1"])
        #expect(refused.status == 1, "\(refused.standardError)")
        #expect(Date().timeIntervalSince(started) < 20)
        #expect(
            refused.standardError.contains(
                "held for more than --lock-timeout 1 s by pid \(pid) (role \(role)"))
        #expect(refused.standardError.contains("nothing was changed"))
        #expect(
            try database.query("SELECT to_regclass('siwa.schema_version') IS NULL")[0][0, as: Bool.self])
        // Once the holder is gone, the migration runs.
        intruder.close()
        let migrated = try migrate(database.url, ["--lock-timeout", "1"])
        #expect(migrated.status == 0, "\(migrated.standardError)")
        #expect(migrated.standardOutput.contains("schema version after: 5"))
    }

    @Test("a second migration waits for the one holding the lock, then finds nothing to do")
    func secondMigrationWaits() throws {
        let database = try TestDatabase()
        let owner = try database.connect()
        defer { owner.close() }
        try owner.simpleQuery("BEGIN; LOCK TABLE siwa.schema_version IN SHARE ROW EXCLUSIVE MODE")
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent(
            "siwa-migrate-lock-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: scratch) }
        let second = try Subprocess(
            ExecutableLocator.url(named: "siwactl").path,
            ["migrate", "--database-url", database.url, "--lock-timeout", "1"],
            environment: ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") },
            standardOutput: scratch.appendingPathComponent("out").path,
            standardError: scratch.appendingPathComponent("err").path)
        // It waits for the lock, longer than --lock-timeout (which is for a database without the schema).
        let waiting = try waitUntil(timeout: .seconds(30)) {
            try database.query(
                """
                SELECT count(*)::bigint FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE 'LOCK TABLE siwa.schema_version%'
                   AND clock_timestamp() - query_start > interval '2 seconds'
                """
            )[0][0, as: Int.self] == 1 || !second.isRunning
        }
        #expect(waiting && second.isRunning)
        try owner.simpleQuery("COMMIT")
        #expect(second.wait() == .exited(0))
        #expect(
            try String(contentsOf: scratch.appendingPathComponent("out"), encoding: .utf8).contains(
                "schema version after: 5"))
    }
}
