public import Foundation
import Postgres

/// A Supabase Auth database (the fixture Tests/Fixtures/auth-platforms/supabase-auth.sql) holding two
/// users linked to Apple: A (sub `001.a`, Apple only, one session and refresh token) and B (`001.b`, with
/// a password too). For the auth adapters' tests (the dispatcher, `siwactl adapters test`).
public enum SupabaseAuthFixture {
    public static let userA = "aaaaaaaa-0000-4000-8000-000000000001"
    public static let userB = "bbbbbbbb-0000-4000-8000-000000000001"

    /// A new database with the fixture and ``seed``.
    public static func database() throws -> TestDatabase {
        let fixture = try String(
            contentsOf: RepositoryRoot.url.appendingPathComponent(
                "Tests/Fixtures/auth-platforms/supabase-auth.sql"),
            encoding: .utf8)
        return try TestDatabase(
            .applying(
                """
                DO $$ BEGIN CREATE ROLE supabase_auth_admin NOLOGIN NOINHERIT;
                EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
                """ + "\n"
                    + fixture.split(separator: "\n").filter { !$0.hasPrefix("\\") }.joined(separator: "\n")
                    + "\n" + seed))
    }

    /// The two users, their Apple identities, a session and a refresh token each.
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

    /// Every row of the auth schema's tables the adapters touch, as text, in a stable order: equal
    /// before and after means nothing changed.
    public static func snapshot(_ database: TestDatabase) throws -> [String] {
        try database.query(
            """
            SELECT t, r FROM (
                SELECT 'users' AS t, to_jsonb(u)::text AS r FROM auth.users u
                UNION ALL SELECT 'identities', to_jsonb(i)::text FROM auth.identities i
                UNION ALL SELECT 'sessions', to_jsonb(s)::text FROM auth.sessions s
                UNION ALL SELECT 'refresh_tokens', to_jsonb(k)::text FROM auth.refresh_tokens k) AS rows
             ORDER BY t, r
            """
        ).map { row in "\(try row[0, as: String.self]) \(try row[1, as: String.self])" }
    }
}
