public import Foundation
public import Postgres

/// siwa's database with a Supabase Auth adapter (named supabase-main), and the auth system's own database (``SupabaseAuthFixture``, the fixture of
/// Tests/Fixtures/auth-platforms) holding two users linked to Apple: A (001.a, Apple only) and B (001.b,
/// with an email login).
public struct AdapterFixture {
    public static let userA = SupabaseAuthFixture.userA
    public static let userB = SupabaseAuthFixture.userB
    public let siwa: TestDatabase
    public let auth: TestDatabase
    public let connectionFile: String

    public init(policy: String = "") throws {
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
    public func write(url: String) throws {
        FileManager.default.createFile(
            atPath: connectionFile, contents: Data((url + "\n").utf8), attributes: [.posixPermissions: 0o600])
        try Data((url + "\n").utf8).write(to: URL(fileURLWithPath: connectionFile))
    }

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

    /// Adds the hosted adapter `name` on `fake` (``HostedPlatformFake``): its credentials
    /// (``HostedPlatformFake/adapterCredentials(_:)``, with `extra` fields) in an owner-only file. `arguments` are more named arguments of `siwa.add_auth_adapter`.
    @discardableResult
    public func addHosted(
        _ name: String, fake: HostedPlatformFake, extra: [String: String] = [:], arguments: String = ""
    ) throws -> Int {
        let file = connectionFile + "-" + name
        let credentials = try fake.adapterCredentials(extra)
        FileManager.default.createFile(
            atPath: file, contents: credentials, attributes: [.posixPermissions: 0o600])
        return try siwa.value(
            "SELECT siwa.add_auth_adapter($1, $2, $3, $4\(arguments))",
            [
                .text(name), .text(fake.platform), .text(Self.appleProvider[fake.platform] ?? "apple"),
                .text("file:" + file),
            ], as: Int.self)
    }

    /// Each hosted platform's name for Apple.
    public static let appleProvider = [
        "keycloak": "apple", "clerk": "oauth_apple", "firebase": "apple.com", "auth0": "apple",
    ]
}
