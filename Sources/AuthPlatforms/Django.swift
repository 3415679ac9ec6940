import Foundation
public import Postgres

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// django-allauth (65.x on Django 5.2): `socialaccount_socialaccount` (`provider` = `apple`, `uid` = the
/// `sub`, `user_id`), its `socialaccount_socialtoken` rows, `account_emailaddress`, allauth's user
/// sessions (`usersessions_usersession`) when installed, Django's `django_session` and `auth_user`
/// (`is_active` is the disable flag, a `password` not starting with `!` is a way to sign in).
///
/// Django's foreign keys are `NO ACTION` at the database, checked at commit (Django cascades in its ORM
/// only): `delete` removes every row that references the user itself, in the same transaction. See
/// docs/adapters.md for how sessions are found (``DjangoSessionLookup``).
public struct DjangoAllauth: AuthPlatform {
    /// `django-allauth`.
    public let name = "django-allauth"
    /// The provider of the social accounts (`apple` by default).
    public let provider: String
    let statements: DjangoStatements

    /// An adapter; throws when `schema`, `userTable` or a table of `alsoDelete` is not a plain identifier.
    /// - Parameters:
    ///   - schema: the schema Django's tables are in (`public`).
    ///   - userTable: the user model's table (`auth_user`; a custom `AUTH_USER_MODEL` with an integer
    ///     `id`, `is_active` and `password`).
    ///   - sessions: how the user's `django_session` rows are found.
    ///   - alsoDelete: the app's own tables referencing the user (directly or through another) whose
    ///     rows `delete` may remove, as Django's `on_delete=CASCADE` would.
    public init(
        provider: String = "apple", schema: String = "public", userTable: String = "auth_user",
        sessions: DjangoSessionLookup = .userSessionsAndSessionData, alsoDelete: [String] = []
    ) throws(AuthPlatformError) {
        self.provider = provider
        statements = try DjangoStatements(
            name: "django-allauth", library: .allauth, provider: provider, schema: schema,
            userTable: userTable,
            sessions: sessions, alsoDelete: alsoDelete)
    }

    /// Refuses forwarding `record`: Django has no app metadata column.
    public func validate(_ policy: AuthPolicy) throws(AuthPlatformError) {
        try DjangoStatements.validate(policy, platform: name)
    }

    /// The tables, columns and grants `policy` needs (allauth's optional tables only when present).
    public func check(on connection: PostgresConnection, policy: AuthPolicy) throws(AuthPlatformError)
        -> [AuthPlatformProblem]
    {
        try statements.check(on: connection, policy: policy)
    }

    /// One transaction; see ``AuthPlatform/apply(_:sub:policy:on:)``.
    public func apply(_ event: AuthEvent, sub: String, policy: AuthPolicy, on connection: PostgresConnection)
        throws(AuthPlatformError) -> AuthChange
    {
        try PolicyEngine.run(
            statements, validate: validate, event: event, sub: sub, policy: policy, connection: connection,
            dryRun: false)
    }

    /// Rolled back; see ``AuthPlatform/dryRun(_:sub:policy:on:)``.
    public func dryRun(_ event: AuthEvent, sub: String, policy: AuthPolicy, on connection: PostgresConnection)
        throws(AuthPlatformError) -> AuthChange
    {
        try PolicyEngine.run(
            statements, validate: validate, event: event, sub: sub, policy: policy, connection: connection,
            dryRun: true)
    }
}

/// python-social-auth's Django app (social-auth-app-django 8 with social-auth-core 7):
/// `social_auth_usersocialauth` (`provider` = `apple-id`, `uid` = the `sub`, `user_id`), and Django's
/// `django_session` and `auth_user` as for ``DjangoAllauth``. Its `social_auth_code`,
/// `social_auth_partial`, `social_auth_nonce` and `social_auth_association` rows are never touched
/// (keyed by address, token or server, not by user).
public struct DjangoSocialAuth: AuthPlatform {
    /// `django-social-auth`.
    public let name = "django-social-auth"
    /// The provider of the social accounts (`apple-id` by default, social-core's `AppleIdAuth`).
    public let provider: String
    let statements: DjangoStatements

    /// An adapter; see ``DjangoAllauth/init(provider:schema:userTable:sessions:alsoDelete:)``.
    public init(
        provider: String = "apple-id", schema: String = "public", userTable: String = "auth_user",
        sessions: DjangoSessionLookup = .userSessionsAndSessionData, alsoDelete: [String] = []
    ) throws(AuthPlatformError) {
        self.provider = provider
        statements = try DjangoStatements(
            name: "django-social-auth", library: .socialAuth, provider: provider, schema: schema,
            userTable: userTable, sessions: sessions, alsoDelete: alsoDelete)
    }

    /// Refuses forwarding `record`: Django has no app metadata column.
    public func validate(_ policy: AuthPolicy) throws(AuthPlatformError) {
        try DjangoStatements.validate(policy, platform: name)
    }

    /// The tables, columns and grants `policy` needs.
    public func check(on connection: PostgresConnection, policy: AuthPolicy) throws(AuthPlatformError)
        -> [AuthPlatformProblem]
    {
        try statements.check(on: connection, policy: policy)
    }

    /// One transaction; see ``AuthPlatform/apply(_:sub:policy:on:)``.
    public func apply(_ event: AuthEvent, sub: String, policy: AuthPolicy, on connection: PostgresConnection)
        throws(AuthPlatformError) -> AuthChange
    {
        try PolicyEngine.run(
            statements, validate: validate, event: event, sub: sub, policy: policy, connection: connection,
            dryRun: false)
    }

    /// Rolled back; see ``AuthPlatform/dryRun(_:sub:policy:on:)``.
    public func dryRun(_ event: AuthEvent, sub: String, policy: AuthPolicy, on connection: PostgresConnection)
        throws(AuthPlatformError) -> AuthChange
    {
        try PolicyEngine.run(
            statements, validate: validate, event: event, sub: sub, policy: policy, connection: connection,
            dryRun: true)
    }
}

/// How a Django adapter finds the user's rows in `django_session`, whose only link to the user is the
/// `_auth_user_id` inside the encoded `session_data`.
public enum DjangoSessionLookup: String, Sendable, Hashable, CaseIterable {
    /// allauth's `usersessions_usersession` (`user_id`, `session_key`) when the table exists, and also
    /// every live `django_session` row whose decoded payload names the user (default: complete, and a
    /// scan of the live sessions per event).
    case userSessionsAndSessionData = "usersessions-and-session-data"
    /// Only allauth's `usersessions_usersession` (no scan). Sessions it did not record — made before it
    /// was installed, or without its middleware — stay signed in.
    case userSessionsOnly = "usersessions-only"
}

/// Decodes Django's `session_data` (Django 5.2, `signing.dumps`: `[.]base64url(payload):timestamp:signature`,
/// the payload JSON, zlib-compressed when the `.` prefix says so) far enough to read `_auth_user_id`.
///
/// The signature is not checked: it protects the data's integrity, not its secrecy, and the only use of
/// the answer is to delete the row, which can only sign someone out.
public enum DjangoSessionData {
    /// The `_auth_user_id` of `sessionData`, or nil when it holds none or cannot be decoded.
    public static func userID(_ sessionData: String) -> String? {
        guard let payload = sessionData.split(separator: ":", maxSplits: 1).first else { return nil }
        var encoded = Substring(payload)
        let compressed = encoded.hasPrefix(".")
        if compressed { encoded = encoded.dropFirst() }
        var base64 = encoded.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        guard var data = Data(base64Encoded: base64) else { return nil }
        if compressed {
            guard let inflated = Zlib.uncompress(data) else { return nil }
            data = inflated
        }
        guard let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else { return nil }
        switch object["_auth_user_id"] {
        case let text as String: return text
        case let number as NSNumber: return number.stringValue
        default: return nil
        }
    }
}

/// zlib's `uncompress`, from the system's libz.so.1 (Debian's `zlib1g`, always installed), loaded at run
/// time so that building needs no zlib headers.
enum Zlib {
    private typealias Uncompress =
        @convention(c) (UnsafeMutablePointer<UInt8>, UnsafeMutablePointer<UInt>, UnsafePointer<UInt8>, UInt)
        -> Int32
    private static let function: Uncompress? = {
        for library in ["libz.so.1", "libz.so", "libz.dylib"] {
            if let handle = dlopen(library, RTLD_NOW), let symbol = dlsym(handle, "uncompress") {
                return unsafeBitCast(symbol, to: Uncompress.self)
            }
        }
        return nil
    }()

    /// `data` inflated (zlib format), at most 1 MiB, or nil.
    static func uncompress(_ data: Data) -> Data? {
        guard let function, !data.isEmpty else { return nil }
        var capacity = max(4096, data.count * 8)
        while capacity <= 1 << 20 {
            var output = [UInt8](repeating: 0, count: capacity)
            var length = UInt(capacity)
            let status = data.withUnsafeBytes { input in
                function(&output, &length, input.bindMemory(to: UInt8.self).baseAddress!, UInt(data.count))
            }
            if status == 0 { return Data(output[0..<Int(length)]) }
            if status != -5 { return nil }  // Z_BUF_ERROR: a bigger buffer
            capacity *= 4
        }
        return nil
    }
}

struct DjangoStatements: AccountStatements {
    enum Library: Sendable { case allauth, socialAuth }

    let name: String
    let library: Library
    let provider: String
    let schema: String
    let sessionLookup: DjangoSessionLookup
    // Unquoted and quoted names.
    let userTableName, identityTableName: String
    let users, identities, tokens, emailAddresses, djangoSessions, userSessions: String
    /// Tables whose rows `delete` may remove when they reference the user (unquoted names).
    let deletable: Set<String>

    /// The tables of Django, allauth and python-social-auth that reference the user (directly or through
    /// another of them) and that Django's ORM cascades to (`on_delete=CASCADE`).
    static let frameworkTables: Set<String> = [
        "account_emailaddress", "account_emailconfirmation", "auth_user_groups", "auth_user_user_permissions",
        "social_auth_usersocialauth", "socialaccount_socialaccount", "socialaccount_socialtoken",
        "usersessions_usersession", "django_admin_log", "mfa_authenticator",
    ]

    init(
        name: String, library: Library, provider: String, schema: String, userTable: String,
        sessions: DjangoSessionLookup, alsoDelete: [String]
    ) throws(AuthPlatformError) {
        self.name = name
        self.library = library
        self.provider = provider
        self.schema = schema
        sessionLookup = sessions
        userTableName = userTable
        identityTableName = library == .allauth ? "socialaccount_socialaccount" : "social_auth_usersocialauth"
        let s = try SQLName.quoted(schema, platform: name) + "."
        users = s + (try SQLName.quoted(userTable, platform: name))
        identities = s + (try SQLName.quoted(identityTableName, platform: name))
        tokens = s + "\"socialaccount_socialtoken\""
        emailAddresses = s + "\"account_emailaddress\""
        djangoSessions = s + "\"django_session\""
        userSessions = s + "\"usersessions_usersession\""
        for table in alsoDelete { _ = try SQLName.quoted(table, platform: name) }
        deletable = Self.frameworkTables.union(alsoDelete)
    }

    static func validate(_ policy: AuthPolicy, platform: String) throws(AuthPlatformError) {
        if policy.onForwardingChange == .record {
            throw AuthPlatformError(
                .policyNotSupported, platform: platform,
                cause: "onForwardingChange record is not supported: Django has no app metadata column")
        }
    }

    func findUser(sub: String, _ run: Runner) throws(AuthPlatformError) -> String? {
        try run.texts(
            """
            SELECT u.id::text FROM \(identities) i JOIN \(users) u ON u.id = i.user_id
             WHERE i.provider = $1 AND i.uid = $2
               FOR UPDATE OF i
            """, [.text(provider), .text(sub)], table: identities
        ).first
    }

    func hasOtherLogin(user: String, sub: String, _ run: Runner) throws(AuthPlatformError) -> Bool {
        // Django's unusable passwords start with "!" (UNUSABLE_PASSWORD_PREFIX); "" cannot be checked either.
        try run.flag(
            """
            SELECT EXISTS (SELECT 1 FROM \(identities)
                            WHERE user_id = $1::bigint AND NOT (provider = $2 AND uid = $3))
                OR EXISTS (SELECT 1 FROM \(users)
                            WHERE id = $1::bigint AND password <> '' AND password NOT LIKE '!%')
            """, [.text(user), .text(provider), .text(sub)], table: identities)
    }

    /// Whether allauth's user sessions are installed.
    func hasUserSessions(_ run: Runner) throws(AuthPlatformError) -> Bool {
        try run.flag(
            "SELECT to_regclass($1) IS NOT NULL", [.text("\(userSessions)")], table: userSessions)
    }

    func endSessions(user: String, _ run: Runner, into counts: inout AuthCounts) throws(AuthPlatformError) {
        var keys = Set<String>()
        let tracked = try hasUserSessions(run)
        if tracked {
            keys.formUnion(
                try run.texts(
                    "SELECT session_key FROM \(userSessions) WHERE user_id = $1::bigint", [.text(user)],
                    table: userSessions))
        }
        if sessionLookup == .userSessionsAndSessionData {
            let rows = try run.rows(
                "SELECT session_key, session_data FROM \(djangoSessions) WHERE expire_date > now()", [],
                table: djangoSessions)
            for row in rows {
                guard let key = try? row.text(at: 0), let data = try? row.text(at: 1) else { continue }
                if DjangoSessionData.userID(data) == user { keys.insert(key) }
            }
        }
        if !keys.isEmpty {
            // Session keys are [a-z0-9]{32} (Django's get_random_string): no comma in them.
            counts.sessionsEnded += try run.count(
                "DELETE FROM \(djangoSessions) WHERE session_key = ANY (string_to_array($1, ','))",
                [.text(keys.sorted().joined(separator: ","))], table: djangoSessions)
        }
        if tracked {
            // As allauth's UserSession.end() does: the record goes with the session.
            try run.count(
                "DELETE FROM \(userSessions) WHERE user_id = $1::bigint", [.text(user)], table: userSessions)
        }
    }

    func unlink(user: String, sub: String, _ run: Runner, into counts: inout AuthCounts)
        throws(AuthPlatformError)
    {
        if library == .allauth {
            try run.count(
                """
                DELETE FROM \(tokens) WHERE account_id IN
                    (SELECT id FROM \(identities) WHERE provider = $1 AND uid = $2)
                """, [.text(provider), .text(sub)], table: tokens)
        }
        counts.identitiesUnlinked += try run.count(
            "DELETE FROM \(identities) WHERE provider = $1 AND uid = $2", [.text(provider), .text(sub)],
            table: identities)
    }

    func disable(user: String, _ run: Runner, into counts: inout AuthCounts) throws(AuthPlatformError) {
        counts.usersDisabled += try run.count(
            "UPDATE \(users) SET is_active = false WHERE id = $1::bigint AND is_active", [.text(user)],
            table: users)
    }

    /// A foreign key referencing a table: (schema, table, column) of the referencing side and the
    /// referenced column.
    struct Reference {
        var schema, table, column, referenced: String
    }

    func references(to schema: String, _ table: String, _ run: Runner) throws(AuthPlatformError)
        -> [Reference]
    {
        let rows = try run.rows(
            """
            SELECT n.nspname::text, c.relname::text, a.attname::text, ra.attname::text
              FROM pg_catalog.pg_constraint k
              JOIN pg_catalog.pg_class c ON c.oid = k.conrelid
              JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
              JOIN pg_catalog.pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = k.conkey[1]
              JOIN pg_catalog.pg_attribute ra ON ra.attrelid = k.confrelid AND ra.attnum = k.confkey[1]
             WHERE k.contype = 'f' AND cardinality(k.conkey) = 1
               AND k.confrelid = (SELECT r.oid FROM pg_catalog.pg_class r
                                   JOIN pg_catalog.pg_namespace rn ON rn.oid = r.relnamespace
                                  WHERE rn.nspname = $1 AND r.relname = $2)
             ORDER BY 1, 2, 3
            """, [.text(schema), .text(table)], table: "pg_catalog.pg_constraint")
        var references: [Reference] = []
        for row in rows {
            guard let s = try? row.text(at: 0), let t = try? row.text(at: 1), let c = try? row.text(at: 2),
                let r = try? row.text(at: 3)
            else { continue }
            references.append(Reference(schema: s, table: t, column: c, referenced: r))
        }
        return references
    }

    /// Deletes the rows of `table` that `predicate` selects (`$1` is the user), and first every row that
    /// references them, found in `pg_constraint` (Django's keys are NO ACTION: nothing cascades).
    func purge(
        schema: String, table: String, predicate: String, user: String, depth: Int, _ run: Runner,
        into counts: inout AuthCounts
    ) throws(AuthPlatformError) -> Int {
        let quoted =
            try SQLName.quoted(schema, platform: name) + "." + (try SQLName.quoted(table, platform: name))
        for reference in try references(to: schema, table, run)
        where !(reference.schema == schema && reference.table == table) {
            let child =
                try SQLName.quoted(reference.schema, platform: name) + "."
                + (try SQLName.quoted(reference.table, platform: name))
            let column = try SQLName.quoted(reference.column, platform: name)
            let referenced = try SQLName.quoted(reference.referenced, platform: name)
            let childPredicate = "\(column) IN (SELECT \(referenced) FROM \(quoted) WHERE \(predicate))"
            guard reference.schema == self.schema, deletable.contains(reference.table), depth < 4 else {
                // The app's own table: Django's ORM decides (CASCADE, SET_NULL, PROTECT), not us.
                if try run.flag(
                    "SELECT EXISTS (SELECT 1 FROM \(child) WHERE \(childPredicate))", [.text(user)],
                    table: child)
                {
                    throw AuthPlatformError(
                        .statementFailed, platform: name, table: child,
                        cause:
                            "rows of this table reference the user and it is not among the tables delete may"
                            + " remove (name it in alsoDelete, or choose disable); nothing was deleted")
                }
                continue
            }
            let removed = try purge(
                schema: reference.schema, table: reference.table, predicate: childPredicate, user: user,
                depth: depth + 1, run, into: &counts)
            if reference.table == identityTableName { counts.identitiesUnlinked += removed }
        }
        return try run.count("DELETE FROM \(quoted) WHERE \(predicate)", [.text(user)], table: quoted)
    }

    func delete(user: String, _ run: Runner, into counts: inout AuthCounts) throws(AuthPlatformError) {
        try endSessions(user: user, run, into: &counts)
        counts.usersDeleted += try purge(
            schema: schema, table: userTableName, predicate: "id = $1::bigint", user: user, depth: 0, run,
            into: &counts)
    }

    func move(
        user: String, from oldSub: String, to newSub: String, _ run: Runner, into counts: inout AuthCounts
    ) throws(AuthPlatformError) {
        // allauth keeps the ID token's claims in extra_data (jsonb); its `sub` follows the uid.
        let extra =
            library == .allauth
            ? """
            , extra_data = CASE WHEN jsonb_typeof(extra_data) = 'object' AND extra_data ? 'sub'
                                THEN jsonb_set(extra_data, '{sub}', to_jsonb($3::text)) ELSE extra_data END
            """ : ""
        counts.identitiesMoved += try run.count(
            "UPDATE \(identities) SET uid = $3::text\(extra) WHERE provider = $1 AND uid = $2",
            [.text(provider), .text(oldSub), .text(newSub)], table: identities)
    }

    func recordForwarding(user: String, on: Bool, _ run: Runner, into counts: inout AuthCounts)
        throws(AuthPlatformError)
    {
        throw AuthPlatformError(.policyNotSupported, platform: name, cause: "onForwardingChange record")
    }

    func requirements(for policy: AuthPolicy) -> [TableRequirement] {
        let deletes = policy.onAccountDeleted == .delete
        var user = TableRequirement(
            schema: schema, table: userTableName, columns: ["id", "is_active", "password"],
            privileges: ["SELECT"])
        if policy.mayDisable { user.privileges.append("UPDATE") }
        if deletes { user.privileges.append("DELETE") }
        var identity = TableRequirement(
            schema: schema, table: identityTableName,
            columns: ["id", "user_id", "provider", "uid"] + (library == .allauth ? ["extra_data"] : []),
            privileges: ["SELECT", "UPDATE"])  // UPDATE: the lookup locks the row (FOR UPDATE)
        if policy.onAccountDeleted == .unlink || deletes { identity.privileges.append("DELETE") }
        var requirements = [
            user, identity,
            TableRequirement(
                schema: schema, table: "django_session",
                columns: ["session_key", "session_data", "expire_date"],
                privileges: ["SELECT", "DELETE"]),
        ]
        if library == .allauth && (policy.onAccountDeleted == .unlink || deletes) {
            requirements.append(
                TableRequirement(
                    schema: schema, table: "socialaccount_socialtoken", columns: ["account_id"],
                    privileges: ["SELECT", "DELETE"]))
        }
        return requirements
    }

    /// Optional tables (allauth's user sessions; with `delete`, every table that references the user)
    /// are required only when present.
    func check(on connection: PostgresConnection, policy: AuthPolicy) throws(AuthPlatformError)
        -> [AuthPlatformProblem]
    {
        var requirements = requirements(for: policy)
        let run = Runner(platform: name, connection: connection)
        if try hasUserSessions(run) {
            requirements.append(
                TableRequirement(
                    schema: schema, table: "usersessions_usersession", columns: ["user_id", "session_key"],
                    privileges: ["SELECT", "DELETE"]))
        }
        if policy.onAccountDeleted == .delete {
            var seen = Set(requirements.map(\.table))
            var queue = [(schema, userTableName)]
            while let (s, t) = queue.popLast() {
                for reference in try references(to: s, t, run)
                where reference.schema == schema && deletable.contains(reference.table)
                    && !seen.contains(reference.table)
                {
                    seen.insert(reference.table)
                    requirements.append(
                        TableRequirement(
                            schema: schema, table: reference.table, columns: [reference.column],
                            privileges: ["SELECT", "DELETE"]))
                    queue.append((schema, reference.table))
                }
            }
        }
        return try PolicyEngine.check(requirements, platform: name, connection: connection)
    }
}
