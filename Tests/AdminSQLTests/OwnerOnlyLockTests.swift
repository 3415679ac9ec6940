import Foundation
import Postgres
import TestSupport
import Testing

/// The locks that serialise a team transfer's batches and the log's partition maintenance are ones only
/// a role that may write the locked table can take: a login with no grants (which may take any advisory
/// lock, on keys anyone can read in schema.sql) cannot make them wait.
@Suite("Locks a login with no grants cannot hold")
struct OwnerOnlyLockTests {
    /// A login in no group, holding the advisory key `key` (as the schema used to lock) for the test.
    func intruder(_ database: TestDatabase, holding key: String) throws -> PostgresConnection {
        let intruder = try database.connect(asMemberOf: nil)
        try intruder.query("SELECT pg_advisory_lock(hashtextextended($1, 0))", [.text(key)])
        return intruder
    }

    /// Whether `intruder` may take `lock` (it may not: it has no privilege on the table).
    func mayLock(_ intruder: PostgresConnection, _ lock: String) -> Bool {
        do {
            try intruder.transaction { try $0.simpleQuery(lock) }
            return true
        } catch {
            return false
        }
    }

    @Test(
        "siwa.apply_sub_transfer proceeds while a login with no grants holds the transfer's old advisory key")
    func transferBatch() throws {
        let database = try TestDatabase()
        try database.query("INSERT INTO siwa.accounts (sub) VALUES ('000300.lock.old')")
        let intruder = try intruder(database, holding: "siwa.transfer")
        defer { intruder.close() }
        #expect(!mayLock(intruder, "LOCK TABLE siwa.sub_transfer_batches IN SHARE ROW EXCLUSIVE MODE"))
        let owner = try database.connect()
        defer { owner.close() }
        // Waiting would end in 55P03 here; the code before waited for the intruder forever.
        try owner.query("SET lock_timeout = '5s'")
        let rows = try owner.query(
            "SELECT outcome FROM siwa.apply_sub_transfer('lock-test', ARRAY['000300.lock.old'], ARRAY['000300.lock.new'], NULL, NULL)"
        )
        #expect(try rows.map { row throws -> String in try row[0] } == ["applied"])
        #expect(
            try database.query("SELECT count(*)::bigint FROM siwa.accounts WHERE sub = '000300.lock.new'")[0][
                0, as: Int.self] == 1)
    }

    @Test(
        "the worker's partition maintenance proceeds while a login with no grants holds its old advisory key")
    func logPartitions() throws {
        let database = try TestDatabase()
        let intruder = try intruder(database, holding: "siwa.notification_log partitions")
        defer { intruder.close() }
        #expect(!mayLock(intruder, "LOCK TABLE siwa.notification_log IN SHARE UPDATE EXCLUSIVE MODE"))
        let worker = try database.connect(asMemberOf: "siwa_worker")
        defer { worker.close() }
        try worker.query("SET lock_timeout = '5s'")
        let before = try database.query(
            "SELECT count(*)::bigint FROM pg_inherits WHERE inhparent = 'siwa.notification_log'::regclass")[
                0][
                0, as: Int.self]
        // Months far enough ahead that some partition is missing: the function takes its lock.
        _ = try worker.query("SELECT siwa.create_log_partitions(12)")
        let after = try database.query(
            "SELECT count(*)::bigint FROM pg_inherits WHERE inhparent = 'siwa.notification_log'::regclass")[
                0][
                0, as: Int.self]
        #expect(after > before)
    }
}
