import AuthPlatforms
import Foundation
import Postgres
import TestSupport
import Testing

/// Every suite of this target, one after another: the Supabase fixture creates the cluster-wide role
/// `supabase_auth_admin` when it is missing, and the row-level security test creates roles too.
@Suite("AuthPlatforms: Apple's events in the auth platforms' own tables", .serialized)
enum AuthPlatformsTests {}

/// One platform under test: its fixture (Tests/Fixtures/auth-platforms), two seeded users and the
/// queries that read their rows back.
///
/// User A signs in only with Apple (`001.a`) and has two sessions; user B (`001.b`) has another way to
/// sign in (a password, a second provider) and one session. `rows` lists every table of the fixture's
/// header that holds a user's rows, with a predicate on the user's key (`$1`).
struct PlatformCase: Sendable, CustomStringConvertible {
    var description: String
    var fixture: String
    var seed: String
    var adapter: any AuthPlatform
    /// The users' keys, as `$1` of `rows`, `identity` and `disabled`.
    var a: String
    var b: String
    /// (table, predicate on `$1`) for each table holding a user's rows.
    var rows: [(table: String, predicate: String)]
    /// The key of the user linked to the Apple sub `$1`.
    var identity: String
    /// Whether the user `$1` is disabled; nil where the platform has no flag.
    var disabled: String?
    /// The number of users.
    var users: String
    /// The sessions table, as named in `rows`.
    var sessions: String
    /// A column whose absence `check` must name: (schema-qualified table as reported, SQL to drop it, column).
    var droppedColumn: (table: String, drop: String, column: String)
    /// The policy of the tests (the defaults, with `keep` where the platform cannot disable).
    var policy: AuthPolicy

    var canDisable: Bool { disabled != nil }

    /// A database holding the fixture and the seed.
    func database() throws -> TestDatabase {
        try TestDatabase(.applying(Self.fixtureSQL(fixture) + "\n" + seed))
    }

    static func fixtureSQL(_ name: String) throws -> String {
        let url = RepositoryRoot.url.appendingPathComponent("Tests/Fixtures/auth-platforms/\(name)")
        let text = try String(contentsOf: url, encoding: .utf8)
        // psql's meta-commands (\set) are not SQL.
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).filter {
            !$0.hasPrefix("\\")
        }
        return """
            DO $$ BEGIN CREATE ROLE supabase_auth_admin NOLOGIN NOINHERIT;
            EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
            """ + "\n" + lines.joined(separator: "\n")
    }

    /// Every row of `user`, table by table, as JSON text, sorted.
    func snapshot(_ database: TestDatabase, of user: String) throws -> [String: [String]] {
        var snapshot: [String: [String]] = [:]
        for (table, predicate) in rows {
            snapshot[table] = try database.query(
                "SELECT to_jsonb(t)::text FROM \(table) t WHERE \(predicate) ORDER BY 1", [.text(user)]
            ).map { row throws(PostgresError) in try row[0, as: String.self] }
        }
        return snapshot
    }

    /// The number of `user`'s rows per table.
    func counts(_ database: TestDatabase, of user: String) throws -> [String: Int] {
        try snapshot(database, of: user).mapValues(\.count)
    }

    func linkedUser(_ database: TestDatabase, sub: String) throws -> String? {
        try database.connection.firstValue(identity, [.text(sub)], as: String.self)
    }

    func isDisabled(_ database: TestDatabase, user: String) throws -> Bool? {
        guard let disabled else { return nil }
        return try database.value(disabled, [.text(user)], as: Bool.self)
    }

    func userCount(_ database: TestDatabase) throws -> Int {
        try database.value(users, as: Int.self)
    }

    // MARK: The platforms

    static let supabaseA = "aaaaaaaa-0000-4000-8000-000000000001"
    static let supabaseB = "bbbbbbbb-0000-4000-8000-000000000001"

    static let supabase = PlatformCase(
        description: "Supabase Auth", fixture: "supabase-auth.sql",
        seed: """
            INSERT INTO auth.users (id, aud, role, email, encrypted_password, raw_app_meta_data, created_at, updated_at)
            VALUES ('\(supabaseA)', 'authenticated', 'authenticated', 'a@privaterelay.appleid.com', '',
                    '{"provider": "apple"}', now(), now()),
                   ('\(supabaseB)', 'authenticated', 'authenticated', 'b@example.com',
                    '$2a$10$abcdefghijklmnopqrstuuvwxyzabcdefghijklmnopqrstuvwxy', '{"provider": "email"}', now(), now());
            INSERT INTO auth.identities (provider_id, user_id, identity_data, provider, created_at, updated_at)
            VALUES ('001.a', '\(supabaseA)', '{"sub": "001.a", "provider_id": "001.a", "email": "a@privaterelay.appleid.com"}',
                    'apple', now(), now()),
                   ('001.b', '\(supabaseB)', '{"sub": "001.b", "email": "b@example.com"}', 'apple', now(), now()),
                   ('\(supabaseB)', '\(supabaseB)', '{"sub": "\(supabaseB)", "email": "b@example.com"}', 'email', now(), now());
            INSERT INTO auth.sessions (id, user_id, created_at) VALUES
                ('aaaaaaaa-0000-4000-8000-00000000005a', '\(supabaseA)', now()),
                ('aaaaaaaa-0000-4000-8000-00000000005b', '\(supabaseA)', now()),
                ('bbbbbbbb-0000-4000-8000-00000000005a', '\(supabaseB)', now());
            INSERT INTO auth.refresh_tokens (token, user_id, revoked, session_id, created_at) VALUES
                ('tok-a1', '\(supabaseA)', false, 'aaaaaaaa-0000-4000-8000-00000000005a', now()),
                ('tok-a2', '\(supabaseA)', false, 'aaaaaaaa-0000-4000-8000-00000000005b', now()),
                ('tok-a3', '\(supabaseA)', false, NULL, now()),
                ('tok-b1', '\(supabaseB)', false, 'bbbbbbbb-0000-4000-8000-00000000005a', now());
            INSERT INTO auth.mfa_factors (id, user_id, friendly_name, factor_type, status, created_at, updated_at) VALUES
                ('aaaaaaaa-0000-4000-8000-0000000000fa', '\(supabaseA)', 'a', 'totp', 'verified', now(), now()),
                ('bbbbbbbb-0000-4000-8000-0000000000fa', '\(supabaseB)', 'b', 'totp', 'verified', now(), now());
            INSERT INTO auth.mfa_challenges (id, factor_id, created_at, ip_address) VALUES
                ('aaaaaaaa-0000-4000-8000-0000000000c1', 'aaaaaaaa-0000-4000-8000-0000000000fa', now(), '127.0.0.1'),
                ('bbbbbbbb-0000-4000-8000-0000000000c1', 'bbbbbbbb-0000-4000-8000-0000000000fa', now(), '127.0.0.1');
            INSERT INTO auth.mfa_amr_claims (session_id, created_at, updated_at, authentication_method, id) VALUES
                ('aaaaaaaa-0000-4000-8000-00000000005a', now(), now(), 'oauth', 'aaaaaaaa-0000-4000-8000-0000000000a1'),
                ('bbbbbbbb-0000-4000-8000-00000000005a', now(), now(), 'oauth', 'bbbbbbbb-0000-4000-8000-0000000000a1');
            INSERT INTO auth.one_time_tokens (id, user_id, token_type, token_hash, relates_to) VALUES
                ('aaaaaaaa-0000-4000-8000-0000000000e1', '\(supabaseA)', 'recovery_token', 'hash-a', 'a'),
                ('bbbbbbbb-0000-4000-8000-0000000000e1', '\(supabaseB)', 'recovery_token', 'hash-b', 'b');
            INSERT INTO auth.oauth_clients (id, registration_type, redirect_uris, grant_types, token_endpoint_auth_method)
            VALUES ('cccccccc-0000-4000-8000-000000000001', 'manual', 'https://app.example/cb', 'authorization_code', 'none');
            INSERT INTO auth.oauth_authorizations (id, authorization_id, client_id, user_id, redirect_uri, scope) VALUES
                ('aaaaaaaa-0000-4000-8000-0000000000d1', 'az-a', 'cccccccc-0000-4000-8000-000000000001', '\(supabaseA)',
                 'https://app.example/cb', 'email'),
                ('bbbbbbbb-0000-4000-8000-0000000000d1', 'az-b', 'cccccccc-0000-4000-8000-000000000001', '\(supabaseB)',
                 'https://app.example/cb', 'email');
            INSERT INTO auth.oauth_consents (id, user_id, client_id, scopes) VALUES
                ('aaaaaaaa-0000-4000-8000-0000000000d2', '\(supabaseA)', 'cccccccc-0000-4000-8000-000000000001', 'email'),
                ('bbbbbbbb-0000-4000-8000-0000000000d2', '\(supabaseB)', 'cccccccc-0000-4000-8000-000000000001', 'email');
            INSERT INTO auth.webauthn_credentials (id, user_id, credential_id, public_key) VALUES
                ('bbbbbbbb-0000-4000-8000-0000000000b1', '\(supabaseB)', '\\x1a', '\\x1b');
            INSERT INTO auth.webauthn_challenges (id, user_id, challenge_type, session_data, expires_at) VALUES
                ('aaaaaaaa-0000-4000-8000-0000000000b2', '\(supabaseA)', 'authentication', '{}', now() + interval '1 hour'),
                ('bbbbbbbb-0000-4000-8000-0000000000b2', '\(supabaseB)', 'authentication', '{}', now() + interval '1 hour');
            INSERT INTO auth.flow_state (id, user_id, provider_type, authentication_method, linking_target_id) VALUES
                ('aaaaaaaa-0000-4000-8000-0000000000f1', '\(supabaseA)', 'apple', 'oauth', NULL),
                ('aaaaaaaa-0000-4000-8000-0000000000f2', NULL, 'apple', 'oauth', '\(supabaseA)'),
                ('bbbbbbbb-0000-4000-8000-0000000000f1', '\(supabaseB)', 'apple', 'oauth', NULL);
            """,
        adapter: SupabaseAuth(), a: "aaaaaaaa", b: "bbbbbbbb",
        rows: [
            ("auth.users", "id::text LIKE $1 || '%'"),
            ("auth.identities", "user_id::text LIKE $1 || '%'"),
            ("auth.sessions", "user_id::text LIKE $1 || '%'"),
            ("auth.refresh_tokens", "user_id LIKE $1 || '%' OR session_id::text LIKE $1 || '%'"),
            ("auth.mfa_factors", "user_id::text LIKE $1 || '%'"),
            ("auth.mfa_challenges", "factor_id::text LIKE $1 || '%'"),
            ("auth.mfa_amr_claims", "session_id::text LIKE $1 || '%'"),
            ("auth.one_time_tokens", "user_id::text LIKE $1 || '%'"),
            ("auth.oauth_authorizations", "user_id::text LIKE $1 || '%'"),
            ("auth.oauth_consents", "user_id::text LIKE $1 || '%'"),
            ("auth.webauthn_credentials", "user_id::text LIKE $1 || '%'"),
            ("auth.webauthn_challenges", "user_id::text LIKE $1 || '%'"),
            ("auth.flow_state", "user_id::text LIKE $1 || '%' OR linking_target_id::text LIKE $1 || '%'"),
        ],
        identity:
            "SELECT left(user_id::text, 8) FROM auth.identities WHERE provider = 'apple' AND provider_id = $1",
        disabled:
            "SELECT coalesce(banned_until > now(), false) FROM auth.users WHERE id::text LIKE $1 || '%'",
        users: "SELECT count(*)::int8 FROM auth.users", sessions: "auth.sessions",
        droppedColumn: (
            "auth.identities", "ALTER TABLE auth.identities DROP COLUMN identity_data CASCADE",
            "identity_data"
        ),
        policy: AuthPolicy())

    static let betterAuth = PlatformCase(
        description: "Better Auth", fixture: "better-auth.sql",
        seed: """
            INSERT INTO "user" (id, name, email, "emailVerified", "updatedAt") VALUES
                ('user-a', 'A', 'a@privaterelay.appleid.com', true, now()), ('user-b', 'B', 'b@example.com', true, now());
            INSERT INTO account (id, issuer, "accountId", "providerId", "userId", "refreshToken", password, "updatedAt") VALUES
                ('acc-a', 'https://appleid.apple.com', '001.a', 'apple', 'user-a', 'rt-a', NULL, now()),
                ('acc-b', 'https://appleid.apple.com', '001.b', 'apple', 'user-b', 'rt-b', NULL, now()),
                ('acc-b2', 'credential', 'user-b', 'credential', 'user-b', NULL, 'scrypt-hash', now());
            INSERT INTO session (id, "expiresAt", token, "updatedAt", "userId") VALUES
                ('ses-a1', now() + interval '1 day', 'tok-a1', now(), 'user-a'),
                ('ses-a2', now() + interval '1 day', 'tok-a2', now(), 'user-a'),
                ('ses-b1', now() + interval '1 day', 'tok-b1', now(), 'user-b');
            INSERT INTO verification (id, identifier, value, "expiresAt") VALUES
                ('ver-a', 'a@privaterelay.appleid.com', 'code', now() + interval '1 hour');
            """,
        adapter: try! BetterAuth(naming: .init(ban: .init())), a: "user-a", b: "user-b",
        rows: [
            ("\"user\"", "id = $1"), ("session", "\"userId\" = $1"), ("account", "\"userId\" = $1"),
        ],
        identity: "SELECT \"userId\" FROM account WHERE \"providerId\" = 'apple' AND \"accountId\" = $1",
        disabled: "SELECT coalesce(banned, false) FROM \"user\" WHERE id = $1",
        users: "SELECT count(*)::int8 FROM \"user\"", sessions: "session",
        droppedColumn: ("public.account", "ALTER TABLE account DROP COLUMN \"providerId\"", "providerId"),
        policy: AuthPolicy())

    static let authJS = PlatformCase(
        description: "Auth.js pg adapter", fixture: "authjs-pg.sql",
        seed: """
            INSERT INTO users (id, name, email) VALUES (101, 'A', 'a@privaterelay.appleid.com'), (202, 'B', 'b@example.com');
            INSERT INTO accounts ("userId", type, provider, "providerAccountId", refresh_token) VALUES
                (101, 'oidc', 'apple', '001.a', 'rt-a'), (202, 'oidc', 'apple', '001.b', 'rt-b'),
                (202, 'oidc', 'google', 'g-b', NULL);
            INSERT INTO sessions ("userId", expires, "sessionToken") VALUES
                (101, now() + interval '1 day', 'tok-a1'), (101, now() + interval '1 day', 'tok-a2'),
                (202, now() + interval '1 day', 'tok-b1');
            """,
        adapter: try! AuthJS(), a: "101", b: "202",
        rows: [
            ("users", "id::text = $1"), ("accounts", "\"userId\"::text = $1"),
            ("sessions", "\"userId\"::text = $1"),
        ],
        identity:
            "SELECT \"userId\"::text FROM accounts WHERE provider = 'apple' AND \"providerAccountId\" = $1",
        disabled: nil, users: "SELECT count(*)::int8 FROM users", sessions: "sessions",
        droppedColumn: ("public.sessions", "ALTER TABLE sessions DROP COLUMN \"userId\"", "userId"),
        policy: AuthPolicy(whenUnlinkLeavesNoLogin: .keep))

    static let authJSPrisma = PlatformCase(
        description: "Auth.js Prisma adapter", fixture: "authjs-prisma.sql",
        seed: """
            INSERT INTO "User" (id, name, email, "updatedAt") VALUES
                ('user-a', 'A', 'a@privaterelay.appleid.com', now()), ('user-b', 'B', 'b@example.com', now());
            INSERT INTO "Account" ("userId", type, provider, "providerAccountId", "updatedAt") VALUES
                ('user-a', 'oidc', 'apple', '001.a', now()), ('user-b', 'oidc', 'apple', '001.b', now()),
                ('user-b', 'oidc', 'google', 'g-b', now());
            INSERT INTO "Session" ("sessionToken", "userId", expires, "updatedAt") VALUES
                ('tok-a1', 'user-a', now() + interval '1 day', now()), ('tok-a2', 'user-a', now() + interval '1 day', now()),
                ('tok-b1', 'user-b', now() + interval '1 day', now());
            INSERT INTO "Authenticator" ("credentialID", "userId", "providerAccountId", "credentialPublicKey", counter,
                                         "credentialDeviceType", "credentialBackedUp") VALUES
                ('cred-a', 'user-a', 'cred-a', 'pk', 0, 'singleDevice', false),
                ('cred-b', 'user-b', 'cred-b', 'pk', 0, 'singleDevice', false);
            """,
        adapter: try! AuthJSPrisma(), a: "user-a", b: "user-b",
        rows: [
            ("\"User\"", "id = $1"), ("\"Account\"", "\"userId\" = $1"), ("\"Session\"", "\"userId\" = $1"),
            ("\"Authenticator\"", "\"userId\" = $1"),
        ],
        identity:
            "SELECT \"userId\" FROM \"Account\" WHERE provider = 'apple' AND \"providerAccountId\" = $1",
        disabled: nil, users: "SELECT count(*)::int8 FROM \"User\"", sessions: "\"Session\"",
        droppedColumn: (
            "public.Account", "ALTER TABLE \"Account\" DROP COLUMN \"providerAccountId\"", "providerAccountId"
        ),
        policy: AuthPolicy(whenUnlinkLeavesNoLogin: .keep))

    static let all = [supabase, betterAuth, authJS, authJSPrisma]
}
