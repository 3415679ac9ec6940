public import Foundation
public import Postgres

/// siwa's database with a Supabase Auth adapter (named supabase-main), and the auth system's own database (the fixture of
/// Tests/Fixtures/auth-platforms) holding two users linked to Apple: A (001.a, Apple only) and B (001.b,
/// with an email login).
public struct AdapterFixture {
    public static let userA = "aaaaaaaa-0000-4000-8000-000000000001"
    public static let userB = "bbbbbbbb-0000-4000-8000-000000000001"
    public let siwa: TestDatabase
    public let auth: TestDatabase
    public let connectionFile: String

    public init(policy: String = "") throws {
        siwa = try TestDatabase()
        let fixture = try String(
            contentsOf: RepositoryRoot.url.appendingPathComponent(
                "Tests/Fixtures/auth-platforms/supabase-auth.sql"),
            encoding: .utf8)
        auth = try TestDatabase(
            .applying(
                """
                DO $$ BEGIN CREATE ROLE supabase_auth_admin NOLOGIN NOINHERIT;
                EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
                """ + "\n"
                    + fixture.split(separator: "\n").filter { !$0.hasPrefix("\\") }.joined(separator: "\n")
                    + "\n" + Self.seed))
        connectionFile =
            FileManager.default.temporaryDirectory.appendingPathComponent("adapter-\(UUID().uuidString)").path
        try write(url: auth.url)
        _ = try siwa.value(
            "SELECT siwa.add_auth_adapter('supabase-main', 'supabase', 'apple', $1\(policy))",
            [.text("file:" + connectionFile)], as: Int.self)
    }

    /// The connection file, owner-only, holding `url`.
    public func write(url: String) throws {
        FileManager.default.createFile(
            atPath: connectionFile, contents: Data((url + "\n").utf8), attributes: [.posixPermissions: 0o600])
        try Data((url + "\n").utf8).write(to: URL(fileURLWithPath: connectionFile))
    }

    public static let seed = """
        INSERT INTO auth.users (id, aud, role, email, encrypted_password, raw_app_meta_data, created_at, updated_at)
        VALUES ('\(userA)', 'authenticated', 'authenticated', 'a@privaterelay.appleid.com', '', '{}', now(), now()),
               ('\(userB)', 'authenticated', 'authenticated', 'b@example.com', '$2a$10$abcdefghijklmnopqrstuuvwxyzabcdefghijklmnopqrstuvwxy', '{}', now(), now());
        INSERT INTO auth.identities (provider_id, user_id, identity_data, provider, created_at, updated_at)
        VALUES ('001.a', '\(userA)', '{"sub": "001.a"}', 'apple', now(), now()),
               ('001.b', '\(userB)', '{"sub": "001.b"}', 'apple', now(), now());
        INSERT INTO auth.sessions (id, user_id, created_at) VALUES
            ('aaaaaaaa-0000-4000-8000-00000000005a', '\(userA)', now()),
            ('bbbbbbbb-0000-4000-8000-00000000005a', '\(userB)', now());
        INSERT INTO auth.refresh_tokens (token, user_id, revoked, session_id, created_at) VALUES
            ('tok-a1', '\(userA)', false, 'aaaaaaaa-0000-4000-8000-00000000005a', now()),
            ('tok-b1', '\(userB)', false, 'bbbbbbbb-0000-4000-8000-00000000005a', now());
        """

    /// Changes as the worker inserts them (the fan-out writes the adapter's rows): (type, sub, old sub).
    public func insertChanges(_ changes: [(String, String, String?)]) throws {
        for (type, sub, oldSub) in changes {
            try siwa.connection.execute(
                """
                INSERT INTO siwa.changes (type, sub, old_sub, event_time, applied_at, jti)
                VALUES ($1, $2, $3, now(), now(), 'apple-' || gen_random_uuid())
                """, [.text(type), .text(sub), oldSub.map { .text($0) }])
        }
    }

    public func sessions(of user: String) throws -> Int {
        try auth.value(
            "SELECT count(*)::integer FROM auth.sessions WHERE user_id = $1::uuid", [.text(user)],
            as: Int.self)
    }

    public func linkedUser(sub: String) throws -> String? {
        try auth.connection.firstValue(
            "SELECT user_id::text FROM auth.identities WHERE provider = 'apple' AND provider_id = $1",
            [.text(sub)],
            as: String.self)
    }

    public func rows() throws -> [(state: String, sub: String?, result: String?, error: String?)] {
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
