import AuthAdapters
import AuthPlatforms
import Foundation
import Postgres
import QueueConsumer
import ServiceSupport
import TestSupport
import Testing

/// siwa's database with a Supabase Auth adapter, and the auth system's own database (the fixture of
/// Tests/Fixtures/auth-platforms) holding two users linked to Apple: A (001.a, Apple only) and B (001.b,
/// with an email login).
struct AdapterFixture {
    static let userA = SupabaseAuthFixture.userA
    static let userB = SupabaseAuthFixture.userB
    let siwa: TestDatabase
    let auth: TestDatabase
    let connectionFile: String

    init(policy: String = "") throws {
        siwa = try TestDatabase()
        auth = try SupabaseAuthFixture.database()
        connectionFile =
            FileManager.default.temporaryDirectory.appendingPathComponent("adapter-\(UUID().uuidString)").path
        try write(url: auth.url)
        _ = try siwa.value(
            "SELECT siwa.add_auth_adapter('supabase-main', 'supabase', 'apple', $1\(policy))",
            [.text("file:" + connectionFile)], as: Int.self)
    }

    /// The connection file, owner-only, holding `url`.
    func write(url: String) throws {
        FileManager.default.createFile(
            atPath: connectionFile, contents: Data((url + "\n").utf8), attributes: [.posixPermissions: 0o600])
        try Data((url + "\n").utf8).write(to: URL(fileURLWithPath: connectionFile))
    }

    /// Changes as the worker inserts them (the fan-out writes the adapter's rows): (type, sub, old sub).
    func insertChanges(_ changes: [(String, String, String?)]) throws {
        for (type, sub, oldSub) in changes {
            try siwa.connection.execute(
                """
                INSERT INTO siwa.changes (type, sub, old_sub, event_time, applied_at, jti)
                VALUES ($1, $2, $3, now(), now(), 'apple-' || gen_random_uuid())
                """, [.text(type), .text(sub), oldSub.map { .text($0) }])
        }
    }

    func dispatcher(maxAttempts: Int = 30) throws -> AuthAdapterDispatcher {
        let database = try siwa.configuration(asMemberOf: "siwa_worker")
        return AuthAdapterDispatcher(
            configuration: try AuthAdapterDispatcher.Configuration(
                database: database, adapters: try AuthAdapterDispatcher.adapters(in: database),
                timeout: .seconds(5), retryBaseDelay: .milliseconds(10), maxRetryDelay: .milliseconds(20),
                maxAttempts: maxAttempts),
            logger: quietLogger)
    }

    func sessions(of user: String) throws -> Int {
        try auth.value(
            "SELECT count(*)::integer FROM auth.sessions WHERE user_id = $1::uuid", [.text(user)],
            as: Int.self)
    }

    func linkedUser(sub: String) throws -> String? {
        try auth.connection.firstValue(
            "SELECT user_id::text FROM auth.identities WHERE provider = 'apple' AND provider_id = $1",
            [.text(sub)],
            as: String.self)
    }

    func rows() throws -> [(state: String, sub: String?, result: String?, error: String?)] {
        try siwa.query(
            "SELECT state, sub, result::text, last_error FROM siwa.auth_adapter_events ORDER BY id"
        ).map { row throws(PostgresError) in
            (
                try row[0, as: String.self], try row[1, as: String?.self], try row[2, as: String?.self],
                try row[3, as: String?.self]
            )
        }
    }
}

@Suite("Auth adapters: Apple's changes applied in the auth system's own database")
struct DispatcherTests {
    @Test(
        "consent revoked ends the user's sessions there; the other user's stay; the row is done with its counts"
    )
    func consentRevoked() throws {
        let fixture = try AdapterFixture()
        try fixture.insertChanges([("siwa.consent_revoked", "001.a", nil)])
        let outcomes = try fixture.dispatcher().drainOnce()
        #expect(outcomes.map(\.state) == ["done"])
        #expect(try fixture.sessions(of: AdapterFixture.userA) == 0)
        #expect(try fixture.sessions(of: AdapterFixture.userB) == 1)
        let row = try #require(try fixture.rows().first)
        #expect(row.state == "done")
        #expect(row.result?.contains("\"sessions_ended\": 1") == true, "\(row.result ?? "")")
    }

    @Test("a sub that links no user there is no_user, finished, not retried")
    func noUser() throws {
        let fixture = try AdapterFixture()
        try fixture.insertChanges([("siwa.consent_revoked", "001.nobody", nil)])
        #expect(try fixture.dispatcher().drainOnce().map(\.state) == ["no_user"])
        #expect(try fixture.dispatcher().drainOnce().isEmpty)
        #expect(try fixture.rows().map(\.state) == ["no_user"])
    }

    @Test(
        "a team transfer then the account's deletion, in order: the identity moves to the new sub, then is unlinked"
    )
    func transferThenDeletion() throws {
        let fixture = try AdapterFixture()
        try fixture.insertChanges([
            ("siwa.sub_transferred", "002.a", "001.a"), ("siwa.account_deleted", "002.a", nil),
        ])
        // One row per user per claim: the deletion waits for the transfer.
        let dispatcher = try fixture.dispatcher()
        #expect(try dispatcher.drainOnce().map(\.state) == ["done", "done"])
        #expect(try fixture.linkedUser(sub: "001.a") == nil)
        #expect(try fixture.linkedUser(sub: "002.a") == nil)
        // A had no other login: unlinking it bans the user (when_unlink_leaves_no_login disable).
        #expect(
            try fixture.auth.value(
                "SELECT banned_until > now() FROM auth.users WHERE id = $1::uuid",
                [.text(AdapterFixture.userA)],
                as: Bool.self))
        #expect(try fixture.linkedUser(sub: "001.b") == AdapterFixture.userB)
    }

    @Test(
        "an auth database that cannot be reached: retried with the cause named, no URL in the error; applied once it is back"
    )
    func unreachable() throws {
        let fixture = try AdapterFixture()
        try fixture.write(url: "postgresql://nobody:secret-password@/no_such_database?host=/nonexistent")
        try fixture.insertChanges([("siwa.consent_revoked", "001.a", nil)])
        let dispatcher = try fixture.dispatcher()
        #expect(try dispatcher.drainOnce().map(\.state) == ["retry"])
        let failed = try #require(try fixture.rows().first)
        #expect(failed.state == "pending")
        #expect(
            failed.error?.contains("cannot connect to the auth database") == true, "\(failed.error ?? "")")
        #expect(failed.error?.contains("secret-password") == false)
        #expect(try fixture.sessions(of: AdapterFixture.userA) == 1)
        try fixture.write(url: fixture.auth.url)
        #expect(waitUntil(timeout: .seconds(10)) { (try? dispatcher.drainOnce().map(\.state)) == ["done"] })
        #expect(try fixture.sessions(of: AdapterFixture.userA) == 0)
    }

    @Test("a connection file readable by others is refused before anything is read from it")
    func worldReadableFile() throws {
        let fixture = try AdapterFixture()
        try FileManager.default.setAttributes(
            [.posixPermissions: 0o644], ofItemAtPath: fixture.connectionFile)
        try fixture.insertChanges([("siwa.consent_revoked", "001.a", nil)])
        #expect(try fixture.dispatcher().drainOnce().map(\.state) == ["retry"])
        let error = try fixture.rows().first?.error ?? ""
        #expect(error.contains("chmod 600"), "\(error)")
        #expect(try fixture.sessions(of: AdapterFixture.userA) == 1)
    }
}
