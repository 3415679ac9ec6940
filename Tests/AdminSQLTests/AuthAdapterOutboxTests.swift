import Foundation
import Postgres
import TestSupport
import Testing

/// The auth adapters' outbox (schema/76-auth-adapters.sql), through the roles that use it: siwa_admin
/// adds adapters and retries dead rows, siwa_worker inserts changes (the fan-out runs as it), claims and
/// records.
@Suite("Auth adapter outbox: fan-out, per-user order, leases, records, retries and refused policies")
struct AuthAdapterOutboxTests {
    /// A fresh database and connections as siwa_admin and siwa_worker; the caller closes them.
    struct Setup {
        let database: TestDatabase
        let admin: PostgresConnection
        let worker: PostgresConnection

        init() throws {
            database = try TestDatabase()
            admin = try database.connect(as: .admin)
            worker = try database.connect(as: .worker)
        }

        func close() {
            admin.close()
            worker.close()
        }

        /// Adds an adapter as siwa_admin; `extra` are more named arguments (`, p_enabled => false`).
        @discardableResult
        func addAdapter(_ name: String, platform: String = "supabase", extra: String = "") throws -> Int {
            try admin.query(
                "SELECT siwa.add_auth_adapter($1, $2, 'apple', 'file:/etc/siwa/\(name).url'\(extra))",
                [.text(name), .text(platform)])[0][0, as: Int.self]
        }

        /// Inserts changes as siwa_worker in one statement: (type without its siwa. prefix, sub, old sub).
        func insertChanges(_ changes: [(type: String, sub: String, oldSub: String?)]) throws {
            try worker.execute(
                """
                INSERT INTO siwa.changes (type, sub, old_sub, event_time, applied_at, jti)
                SELECT 'siwa.' || t, s, o, now(), now(), ''
                  FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS c(t, s, o, n) ORDER BY n
                """,
                [
                    .array(changes.map { .text($0.type) }), .array(changes.map { .text($0.sub) }),
                    .array(changes.map { change in change.oldSub.map { .text($0) } }),
                ])
        }

        /// Claims as siwa_worker: the rows leased, as "type sub" (the type without its prefix) by id.
        func claim(
            _ owner: String, adapter: Int, limit: Int = 10, lease: String = "30 seconds",
            on connection: PostgresConnection? = nil
        ) throws -> [Int: String] {
            var claimed: [Int: String] = [:]
            for row in try (connection ?? worker).query(
                "SELECT id, substr(type, 6) || ' ' || sub FROM siwa.claim_auth_adapter_events($1, $2::interval, $3::integer, $4::bigint)",
                [.text(owner), .text(lease), .int(Int64(limit)), .int(Int64(adapter))])
            {
                claimed[try row[0, as: Int.self]] = try row[1, as: String.self]
            }
            return claimed
        }

        /// Records as siwa_worker; returns the ids recorded.
        func record(
            _ owner: String, _ outcomes: [Int: String], error: String? = nil, maxAttempts: Int = 5
        ) throws -> Set<Int> {
            let ids = outcomes.keys.sorted()
            return Set(
                try worker.query(
                    """
                    SELECT * FROM siwa.record_auth_adapter_events($1, $2::bigint[], $3::text[], $4::text[], NULL,
                                                                  $5::integer, interval '1 second', interval '1 minute')
                    """,
                    [
                        .text(owner), .array(ids.map { .int(Int64($0)) }),
                        .array(ids.map { .text(outcomes[$0]!) }),
                        .array(ids.map { _ in error.map { .text($0) } }), .int(Int64(maxAttempts)),
                    ]
                ).map { try $0[0, as: Int.self] })
        }

        /// A row's state, attempts and lease owner ("-": none), read as the owner: "pending 1 lane-1".
        func row(_ id: Int) throws -> String {
            try database.value(
                "SELECT state || ' ' || attempts || ' ' || coalesce(lease_owner, '-') FROM siwa.auth_adapter_events WHERE id = $1",
                [.int(Int64(id))], as: String.self)
        }
    }

    @Test(
        "each change fans out to every adapter and wakes the lanes; a disabled adapter's rows wait unclaimed")
    func fanOut() throws {
        let setup = try Setup()
        defer { setup.close() }
        let supabase = try setup.addAdapter("supabase")
        let django = try setup.addAdapter("django", platform: "django-allauth")
        let paused = try setup.addAdapter("paused", platform: "keycloak", extra: ", p_enabled => false")
        let listener = try setup.database.connect(as: .worker)
        defer { listener.close() }
        try listener.listen("siwa_auth_adapters")
        try setup.insertChanges([("consent_revoked", "u1", nil), ("email_disabled", "u2", nil)])
        #expect(!(try listener.waitForNotifications(timeout: .seconds(5))).isEmpty)
        let rows = try setup.database.query(
            """
            SELECT adapter_id, string_agg(substr(type, 6) || ' ' || sub, ',' ORDER BY id)
              FROM siwa.auth_adapter_events GROUP BY adapter_id
            """
        ).reduce(into: [Int: String]()) { $0[try $1[0, as: Int.self]] = try $1[1, as: String.self] }
        let both = "consent_revoked u1,email_disabled u2"
        #expect(rows == [supabase: both, django: both, paused: both])
        func claim(_ adapter: Int) throws -> Int {
            try setup.worker.value(
                "SELECT count(*)::int FROM siwa.claim_auth_adapter_events('lane', interval '1 minute', 10, $1)",
                [.int(Int64(adapter))], as: Int.self)
        }
        #expect(try claim(paused) == 0)
        // Resumed by the admin's function, its rows are claimed; an unknown name is false.
        #expect(try setup.admin.value("SELECT siwa.set_auth_adapter_enabled('paused', true)", as: Bool.self))
        #expect(try !setup.admin.value("SELECT siwa.set_auth_adapter_enabled('nobody', true)", as: Bool.self))
        #expect(try claim(paused) == 2)
        #expect(throws: PostgresError.self) {
            try setup.admin.execute("SELECT siwa.set_auth_adapter_enabled('paused', NULL)")
        }
    }

    @Test(
        "rows are claimed in order per user, across a team transfer: the transfer waits for the old sub's, the new sub's wait for it"
    )
    func orderPerUser() throws {
        let setup = try Setup()
        defer { setup.close() }
        let adapter = try setup.addAdapter("supabase")
        try setup.insertChanges([
            ("consent_revoked", "old.u", nil), ("email_disabled", "other", nil),
            ("sub_transferred", "new.u", "old.u"), ("account_deleted", "new.u", nil),
        ])
        // Only the heads: the transfer waits for old.u's consent, the deletion for the transfer.
        let first = try setup.claim("lane-1", adapter: adapter)
        #expect(Set(first.values) == ["consent_revoked old.u", "email_disabled other"])
        #expect(try setup.claim("lane-2", adapter: adapter) == [:])
        #expect(try setup.record("lane-1", first.mapValues { _ in "done" }) == Set(first.keys))
        let transfer = try setup.claim("lane-1", adapter: adapter)
        #expect(Array(transfer.values) == ["sub_transferred new.u"])
        // In flight, it still holds the new sub's rows back.
        #expect(try setup.claim("lane-2", adapter: adapter) == [:])
        #expect(try setup.record("lane-1", transfer.mapValues { _ in "done" }) == Set(transfer.keys))
        #expect(Array(try setup.claim("lane-2", adapter: adapter).values) == ["account_deleted new.u"])
    }

    @Test("an expired lease is taken over by exactly one claimer, and a live one by none")
    func leaseTakeover() throws {
        let setup = try Setup()
        defer { setup.close() }
        let adapter = try setup.addAdapter("supabase")
        try setup.insertChanges([("consent_revoked", "u1", nil)])
        let claimed = try setup.claim("dead-lane", adapter: adapter)
        let id = try #require(claimed.keys.first)
        #expect(try setup.claim("lane-a", adapter: adapter) == [:])  // live: nobody takes it
        // The lane's process died: its lease runs out.
        try setup.database.query(
            "UPDATE siwa.auth_adapter_events SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE id = $1",
            [.int(Int64(id))])
        let other = try setup.database.connect(as: .worker)
        defer { other.close() }
        // Two claimers at once: the one whose transaction holds the row takes it, the other skips it.
        let (first, second) = try setup.worker.transaction { connection in
            let first = try setup.claim("lane-a", adapter: adapter, on: connection)
            let second = try setup.claim("lane-b", adapter: adapter, on: other)
            return (first, second)
        }
        #expect(first.keys.sorted() == [id])
        #expect(second == [:])
        #expect(try setup.claim("lane-b", adapter: adapter, on: other) == [:])
        #expect(try setup.row(id) == "pending 2 lane-a")
    }

    @Test("a record whose lease was taken over writes nothing; the new owner's is recorded")
    func lostLease() throws {
        let setup = try Setup()
        defer { setup.close() }
        let adapter = try setup.addAdapter("supabase")
        try setup.insertChanges([("account_deleted", "u1", nil)])
        let id = try #require(try setup.claim("slow-lane", adapter: adapter).keys.first)
        try setup.database.query(
            "UPDATE siwa.auth_adapter_events SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE id = $1",
            [.int(Int64(id))])
        #expect(try setup.claim("lane-b", adapter: adapter).keys.sorted() == [id])
        #expect(try setup.record("slow-lane", [id: "done"]) == [])
        #expect(try setup.row(id) == "pending 2 lane-b")
        #expect(try setup.record("lane-b", [id: "no_user"]) == [id])
        #expect(try setup.row(id) == "no_user 2 -")
        #expect(try setup.record("lane-b", [id: "done"]) == [])  // finished: nothing more
    }

    @Test("a row released uncalled is pending and due again with its attempt uncounted")
    func releaseUncounts() throws {
        let setup = try Setup()
        defer { setup.close() }
        let adapter = try setup.addAdapter("supabase")
        try setup.insertChanges([("consent_revoked", "u1", nil), ("consent_revoked", "u2", nil)])
        let claimed = try setup.claim("lane-1", adapter: adapter)
        #expect(claimed.count == 2)
        let ids = claimed.keys.sorted()
        #expect(
            try setup.record("lane-1", [ids[0]: "done", ids[1]: "released"], error: "ignored") == Set(ids))
        #expect(try setup.row(ids[1]) == "pending 0 -")
        #expect(
            try setup.database.value(
                "SELECT last_error IS NULL AND next_attempt_at <= now() FROM siwa.auth_adapter_events WHERE id = $1",
                [.int(Int64(ids[1]))], as: Bool.self))
        #expect(try setup.claim("lane-2", adapter: adapter).keys.sorted() == [ids[1]])
        #expect(try setup.row(ids[1]) == "pending 1 lane-2")
    }

    @Test(
        "a row is dead after its last attempt, holds the user's later rows no more, and a retry makes it pending again"
    )
    func deadAndRetried() throws {
        let setup = try Setup()
        defer { setup.close() }
        let adapter = try setup.addAdapter("supabase")
        try setup.insertChanges([("account_deleted", "u1", nil), ("consent_revoked", "u1", nil)])
        let dueNow = "UPDATE siwa.auth_adapter_events SET next_attempt_at = now() - interval '1 second'"
        var id = 0
        for attempt in 1...2 {
            let claimed = try setup.claim("lane-1", adapter: adapter)
            #expect(Array(claimed.values) == ["account_deleted u1"], "attempt \(attempt)")
            id = try #require(claimed.keys.first)
            #expect(try setup.record("lane-1", [id: "retry"], error: "unreachable", maxAttempts: 2) == [id])
            try setup.database.query(dueNow)
        }
        #expect(try setup.row(id) == "dead 2 -")
        let overview = try setup.admin.query(
            "SELECT pending, dead, last_error FROM siwa.auth_adapter_overview WHERE id = $1",
            [.int(Int64(adapter))])[0]
        #expect(try overview[0, as: Int.self] == 1 && overview[1, as: Int.self] == 1)
        #expect(try overview[2, as: String?.self] == "unreachable")
        // The user's later row goes on.
        #expect(Array(try setup.claim("lane-1", adapter: adapter).values) == ["consent_revoked u1"])
        #expect(
            try setup.admin.query("SELECT siwa.retry_auth_adapter_events($1, NULL)", [.int(Int64(adapter))])[
                0][
                    0, as: Int.self] == 1)
        #expect(try setup.row(id) == "pending 0 -")
        #expect(try setup.claim("lane-2", adapter: adapter).keys.sorted() == [id])
        #expect(try setup.row(id) == "pending 1 lane-2")
    }

    @Test(
        "a policy the platform cannot express is refused when the adapter is added or changed (22023, naming it)"
    )
    func refusedPolicies() throws {
        let setup = try Setup()
        defer { setup.close() }
        func refusal(_ sql: String) -> String? {
            do {
                _ = try setup.admin.query(sql)
                return nil
            } catch let error as PostgresError {
                return "\(error.sqlState ?? "-") \(error.message)"
            } catch {
                return "\(error)"
            }
        }
        let add = "SELECT siwa.add_auth_adapter('a', 'authjs', 'apple', 'file:/etc/siwa/a.url'"
        #expect(
            refusal(add + ", p_when_unlink_leaves_no_login => 'keep', p_on_account_deleted => 'disable')")?
                .hasPrefix("22023 on_account_deleted") == true)
        // The default for a user an unlink leaves without a login is disable: Auth.js must choose keep.
        #expect(refusal(add + ")")?.hasPrefix("22023 when_unlink_leaves_no_login") == true)
        #expect(
            refusal(add.replacing("'authjs'", with: "'authjs-prisma'") + ")")?.hasPrefix(
                "22023 when_unlink_leaves_no_login") == true)
        #expect(refusal(add + ", p_when_unlink_leaves_no_login => 'keep')") == nil)
        let better = "SELECT siwa.add_auth_adapter('b', 'better-auth', 'apple', 'file:/etc/siwa/b.url'"
        #expect(
            refusal(better + ", p_on_account_deleted => 'disable', p_when_unlink_leaves_no_login => 'keep')")?
                .hasPrefix("22023 on_account_deleted") == true)
        #expect(refusal(better + ", '{\"ban\": true}', p_on_account_deleted => 'disable')") == nil)
        // Taking the admin plugin away afterwards is refused too.
        #expect(
            refusal("UPDATE siwa.auth_adapters SET options = '{}' WHERE name = 'b'")?.hasPrefix(
                "22023 on_account_deleted") == true)
        // The connection is a file reference, never the URL.
        #expect(
            refusal("SELECT siwa.add_auth_adapter('c', 'supabase', 'apple', 'postgres://u:p@db/auth')")?
                .hasPrefix("22023") == true)
        #expect(
            try setup.admin.query("SELECT name FROM siwa.auth_adapter_overview ORDER BY name").map {
                try $0[0, as: String.self]
            } == ["a", "b"])
    }

    @Test(
        "the erasure takes the user's sub out of finished rows; pending ones keep it, and a transfer keeps every row's"
    )
    func erasureAndTransfer() throws {
        let setup = try Setup()
        defer { setup.close() }
        let adapter = try setup.addAdapter("supabase")
        try setup.insertChanges([("consent_revoked", "u1", nil), ("account_deleted", "u1", nil)])
        let first = try setup.claim("lane-1", adapter: adapter)
        #expect(try setup.record("lane-1", first.mapValues { _ in "done" }) == Set(first.keys))
        try setup.worker.execute("SELECT siwa.erase_personal_data_of(ARRAY['u1'])")
        let subs = try setup.database.query(
            "SELECT substr(type, 6), state, sub FROM siwa.auth_adapter_events ORDER BY id"
        ).map {
            "\(try $0[0, as: String.self]) \(try $0[1, as: String.self]) \(try $0[2, as: String?.self] ?? "-")"
        }
        #expect(subs == ["consent_revoked done -", "account_deleted pending u1"])
        // A team transfer keeps the sub the auth system knows until the transfer's own row.
        try setup.database.query("INSERT INTO siwa.accounts (sub) VALUES ('old.v')")
        try setup.insertChanges([("email_disabled", "old.v", nil)])
        try setup.database.query(
            "SELECT * FROM siwa.apply_sub_transfer('t', ARRAY['old.v'], ARRAY['new.v'], NULL, NULL)")
        let moved = try setup.database.query(
            "SELECT substr(type, 6) || ' ' || sub || coalesce(' ' || old_sub, '') FROM siwa.auth_adapter_events WHERE sub LIKE '%.v' ORDER BY id"
        ).map { try $0[0, as: String.self] }
        #expect(moved == ["email_disabled old.v", "sub_transferred new.v old.v"])
    }
}
