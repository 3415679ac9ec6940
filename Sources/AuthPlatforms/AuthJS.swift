public import Postgres

/// Auth.js (NextAuth.js) with @auth/pg-adapter 1.11: `users`, `accounts` (`provider`,
/// `"providerAccountId"` = the `sub`, `"userId"`), `sessions` (`"userId"`), integer ids, and **no
/// foreign keys**: a delete removes the user's sessions and accounts itself. Auth.js has no disable flag
/// and no app metadata: policies that disable or record are refused. Sessions under the `jwt` strategy
/// are not in the database and cannot be ended here.
public struct AuthJS: AuthPlatform {
    /// `authjs-pg`.
    public let name = "authjs-pg"
    /// The provider of the accounts (`apple` by default).
    public let provider: String
    /// The schema the tables are in (`public` by default).
    public let schema: String
    let statements: AuthJSStatements

    /// An adapter; throws when `schema` is not a plain identifier.
    public init(provider: String = "apple", schema: String = "public") throws(AuthPlatformError) {
        self.provider = provider
        self.schema = schema
        statements = try AuthJSStatements(
            name: "authjs-pg", provider: provider, schema: schema,
            tables: .init(users: "users", accounts: "accounts", sessions: "sessions", extra: []),
            idType: "integer",
            accountUpdatedAt: nil)
    }

    /// Refuses what Auth.js cannot express; see ``AuthJSPolicies/validate(_:platform:)``.
    public func validate(_ policy: AuthPolicy) throws(AuthPlatformError) {
        try AuthJSPolicies.validate(policy, platform: name)
    }

    /// The tables, columns and grants `policy` needs.
    public func check(on connection: PostgresConnection, policy: AuthPolicy) throws(AuthPlatformError)
        -> [AuthPlatformProblem]
    {
        try PolicyEngine.check(statements.requirements(for: policy), platform: name, connection: connection)
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

/// Auth.js with @auth/prisma-adapter 2.11 on PostgreSQL: Prisma's quoted model names `"User"`,
/// `"Account"` (keyed by `provider`, `"providerAccountId"`), `"Session"`, `"Authenticator"`, text ids, and
/// foreign keys that cascade (deleted explicitly anyway, for the counts). No disable flag, no app metadata.
public struct AuthJSPrisma: AuthPlatform {
    /// `authjs-prisma`.
    public let name = "authjs-prisma"
    /// The provider of the accounts (`apple` by default).
    public let provider: String
    /// The schema the tables are in (`public` by default).
    public let schema: String
    let statements: AuthJSStatements

    /// An adapter; throws when `schema` is not a plain identifier.
    public init(provider: String = "apple", schema: String = "public") throws(AuthPlatformError) {
        self.provider = provider
        self.schema = schema
        statements = try AuthJSStatements(
            name: "authjs-prisma", provider: provider, schema: schema,
            tables: .init(users: "User", accounts: "Account", sessions: "Session", extra: ["Authenticator"]),
            idType: "text", accountUpdatedAt: "updatedAt")
    }

    /// Refuses what Auth.js cannot express; see ``AuthJSPolicies/validate(_:platform:)``.
    public func validate(_ policy: AuthPolicy) throws(AuthPlatformError) {
        try AuthJSPolicies.validate(policy, platform: name)
    }

    /// The tables, columns and grants `policy` needs.
    public func check(on connection: PostgresConnection, policy: AuthPolicy) throws(AuthPlatformError)
        -> [AuthPlatformProblem]
    {
        try PolicyEngine.check(statements.requirements(for: policy), platform: name, connection: connection)
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

/// The policies both Auth.js adapters refuse.
public enum AuthJSPolicies {
    /// Refuses `disable` (also as `unlink`'s fallback: choose `keep`) and forwarding `record`.
    public static func validate(_ policy: AuthPolicy, platform: String) throws(AuthPlatformError) {
        if policy.onAccountDeleted == .disable {
            throw AuthPlatformError(
                .policyNotSupported, platform: platform,
                cause: "onAccountDeleted disable is not supported: Auth.js has no disable flag")
        }
        if policy.mayDisable {
            throw AuthPlatformError(
                .policyNotSupported, platform: platform,
                cause:
                    "whenUnlinkLeavesNoLogin disable is not supported: Auth.js has no disable flag; choose keep"
            )
        }
        if policy.onForwardingChange == .record {
            throw AuthPlatformError(
                .policyNotSupported, platform: platform,
                cause: "onForwardingChange record is not supported: Auth.js has no app metadata")
        }
    }
}

struct AuthJSStatements: AccountStatements {
    struct Tables: Sendable {
        var users, accounts, sessions: String
        var extra: [String]
    }

    let name: String
    let provider: String
    let schema: String
    let tables: Tables
    let users, accounts, sessions: String
    let extra: [(name: String, quoted: String)]
    let id: String
    let accountUpdatedAt: String?

    init(
        name: String, provider: String, schema: String, tables: Tables, idType: String,
        accountUpdatedAt: String?
    ) throws(AuthPlatformError) {
        self.name = name
        self.provider = provider
        self.schema = schema
        self.tables = tables
        let quotedSchema = try SQLName.quoted(schema, platform: name)
        users = quotedSchema + "." + (try SQLName.quoted(tables.users, platform: name))
        accounts = quotedSchema + "." + (try SQLName.quoted(tables.accounts, platform: name))
        sessions = quotedSchema + "." + (try SQLName.quoted(tables.sessions, platform: name))
        var extra: [(name: String, quoted: String)] = []
        for table in tables.extra {
            extra.append((table, quotedSchema + "." + (try SQLName.quoted(table, platform: name))))
        }
        self.extra = extra
        id = idType
        self.accountUpdatedAt = try accountUpdatedAt.map { column throws(AuthPlatformError) in
            try SQLName.quoted(column, platform: name)
        }
    }

    func findUser(sub: String, _ run: Runner) throws(AuthPlatformError) -> String? {
        // Nothing in @auth/pg-adapter's schema makes (provider, providerAccountId) unique.
        let found = try run.texts(
            """
            SELECT u.id::text FROM \(accounts) a JOIN \(users) u ON u.id = a."userId"
             WHERE a.provider = $1 AND a."providerAccountId" = $2
               FOR UPDATE OF a
            """, [.text(provider), .text(sub)], table: accounts)
        guard Set(found).count <= 1 else {
            throw AuthPlatformError(
                .ambiguous, platform: name, table: accounts, cause: "the sub is linked to more than one user")
        }
        return found.first
    }

    func hasOtherLogin(user: String, sub: String, _ run: Runner) throws(AuthPlatformError) -> Bool {
        try run.flag(
            """
            SELECT EXISTS (SELECT 1 FROM \(accounts)
                            WHERE "userId" = $1::\(id) AND NOT (provider = $2 AND "providerAccountId" = $3))
            """, [.text(user), .text(provider), .text(sub)], table: accounts)
    }

    func endSessions(user: String, _ run: Runner, into counts: inout AuthCounts) throws(AuthPlatformError) {
        counts.sessionsEnded += try run.count(
            "DELETE FROM \(sessions) WHERE \"userId\" = $1::\(id)", [.text(user)], table: sessions)
    }

    func unlink(user: String, sub: String, _ run: Runner, into counts: inout AuthCounts)
        throws(AuthPlatformError)
    {
        counts.identitiesUnlinked += try run.count(
            "DELETE FROM \(accounts) WHERE provider = $1 AND \"providerAccountId\" = $2",
            [.text(provider), .text(sub)], table: accounts)
    }

    func disable(user: String, _ run: Runner, into counts: inout AuthCounts) throws(AuthPlatformError) {
        throw AuthPlatformError(.policyNotSupported, platform: name, table: users, cause: "no disable flag")
    }

    func delete(user: String, _ run: Runner, into counts: inout AuthCounts) throws(AuthPlatformError) {
        counts.sessionsEnded += try run.count(
            "DELETE FROM \(sessions) WHERE \"userId\" = $1::\(id)", [.text(user)], table: sessions)
        counts.identitiesUnlinked += try run.count(
            "DELETE FROM \(accounts) WHERE \"userId\" = $1::\(id)", [.text(user)], table: accounts)
        for table in extra {
            try run.count(
                "DELETE FROM \(table.quoted) WHERE \"userId\" = $1::\(id)", [.text(user)], table: table.quoted
            )
        }
        counts.usersDeleted += try run.count(
            "DELETE FROM \(users) WHERE id = $1::\(id)", [.text(user)], table: users)
    }

    func move(
        user: String, from oldSub: String, to newSub: String, _ run: Runner, into counts: inout AuthCounts
    )
        throws(AuthPlatformError)
    {
        let touch = accountUpdatedAt.map { ", \($0) = now()" } ?? ""
        counts.identitiesMoved += try run.count(
            "UPDATE \(accounts) SET \"providerAccountId\" = $3\(touch) WHERE provider = $1 AND \"providerAccountId\" = $2",
            [.text(provider), .text(oldSub), .text(newSub)], table: accounts)
    }

    func recordForwarding(user: String, on: Bool, _ run: Runner, into counts: inout AuthCounts)
        throws(AuthPlatformError)
    {
        throw AuthPlatformError(.policyNotSupported, platform: name, cause: "onForwardingChange record")
    }

    func requirements(for policy: AuthPolicy) -> [TableRequirement] {
        let deletes = policy.onAccountDeleted == .delete
        var accountPrivileges = ["SELECT", "UPDATE"]  // UPDATE: the lookup locks the row (FOR UPDATE)
        if policy.onAccountDeleted == .unlink || deletes { accountPrivileges.append("DELETE") }
        var requirements = [
            TableRequirement(
                schema: schema, table: tables.users, columns: ["id"],
                privileges: deletes ? ["SELECT", "DELETE"] : ["SELECT"]),
            TableRequirement(
                schema: schema, table: tables.accounts,
                columns: ["userId", "provider", "providerAccountId"]
                    + (accountUpdatedAt == nil ? [] : ["updatedAt"]),
                privileges: accountPrivileges),
            TableRequirement(
                schema: schema, table: tables.sessions, columns: ["userId"], privileges: ["SELECT", "DELETE"]),
        ]
        if deletes {
            for table in tables.extra {
                requirements.append(
                    TableRequirement(
                        schema: schema, table: table, columns: ["userId"], privileges: ["SELECT", "DELETE"]))
            }
        }
        return requirements
    }
}
