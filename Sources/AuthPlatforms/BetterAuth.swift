public import Postgres

/// Better Auth (v1.7): `user`, `session` (`userId`), `account` (`providerId` = the provider,
/// `accountId` = the `sub`, `userId`; a `credential` account holds a password), with the names Better
/// Auth lets an app configure (``Naming``; camelCase defaults). Disable needs the admin plugin's
/// `banned`/`banReason`/`banExpires` columns (``Naming/ban``); without them a policy that may disable
/// is refused. Forwarding cannot be recorded (no app metadata column).
public struct BetterAuth: AuthPlatform {
    /// Table and column names, as configured in Better Auth (`modelName`, `fields`).
    public struct Naming: Sendable, Hashable {
        /// The schema the tables are in.
        public var schema = "public"
        /// The user table and its columns.
        public var user = "user"
        public var userID = "id"
        public var userUpdatedAt = "updatedAt"
        /// The session table and its columns.
        public var session = "session"
        public var sessionUserID = "userId"
        /// The account table and its columns.
        public var account = "account"
        public var accountUserID = "userId"
        public var accountProviderID = "providerId"
        public var accountAccountID = "accountId"
        public var accountUpdatedAt = "updatedAt"
        /// The admin plugin's ban columns on the user table (`banned`, `banReason`, `banExpires`), or nil
        /// when the plugin is not installed.
        public var ban: Ban?
        /// The SQL type of user ids: `text` (the default), `uuid`, `integer` or `bigint` (`useNumberId`).
        public var idType = "text"

        /// The admin plugin's columns.
        public struct Ban: Sendable, Hashable {
            public var banned = "banned"
            public var banReason = "banReason"
            public var banExpires = "banExpires"
            /// The default names.
            public init() {}
        }

        /// The default names; `ban` when the admin plugin is installed.
        public init(ban: Ban? = nil) { self.ban = ban }
    }

    /// `better-auth`.
    public let name = "better-auth"
    /// The provider id of the accounts (`apple` by default).
    public let provider: String
    /// The names in use.
    public let naming: Naming
    /// The reason written into `banReason` when a user is disabled.
    public let banReason: String
    let statements: BetterAuthStatements

    /// An adapter; throws when a configured name is not a plain identifier or `idType` is not one of
    /// `text`, `uuid`, `integer`, `bigint`.
    public init(
        provider: String = "apple", naming: Naming = Naming(),
        banReason: String = "Apple account deleted (Sign in with Apple)"
    ) throws(AuthPlatformError) {
        self.provider = provider
        self.naming = naming
        self.banReason = banReason
        statements = try BetterAuthStatements(
            name: "better-auth", provider: provider, naming: naming, banReason: banReason)
    }

    /// Refuses `record` (no metadata column) and any disable without the admin plugin's columns.
    public func validate(_ policy: AuthPolicy) throws(AuthPlatformError) {
        if policy.onForwardingChange == .record {
            throw AuthPlatformError(
                .policyNotSupported, platform: name,
                cause: "onForwardingChange record is not supported: Better Auth has no app metadata column")
        }
        if policy.mayDisable && naming.ban == nil {
            throw AuthPlatformError(
                .policyNotSupported, platform: name,
                cause: policy.onAccountDeleted == .disable
                    ? "onAccountDeleted disable needs the admin plugin's ban columns (naming.ban)"
                    : "whenUnlinkLeavesNoLogin disable needs the admin plugin's ban columns (naming.ban);"
                        + " choose keep, or configure them")
        }
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

struct BetterAuthStatements: AccountStatements {
    let name: String
    let provider: String
    let naming: BetterAuth.Naming
    let banReason: String
    // Quoted names.
    let user, userID, userUpdatedAt, session, sessionUserID, account, accountUserID, providerID, accountID,
        accountUpdatedAt: String
    let banned, banReasonColumn, banExpires: String?
    let id: String

    init(name: String, provider: String, naming: BetterAuth.Naming, banReason: String)
        throws(AuthPlatformError)
    {
        self.name = name
        self.provider = provider
        self.naming = naming
        self.banReason = banReason
        func q(_ name: String) throws(AuthPlatformError) -> String {
            try SQLName.quoted(name, platform: "better-auth")
        }
        let schema = try q(naming.schema)
        user = schema + "." + (try q(naming.user))
        session = schema + "." + (try q(naming.session))
        account = schema + "." + (try q(naming.account))
        userID = try q(naming.userID)
        userUpdatedAt = try q(naming.userUpdatedAt)
        sessionUserID = try q(naming.sessionUserID)
        accountUserID = try q(naming.accountUserID)
        providerID = try q(naming.accountProviderID)
        accountID = try q(naming.accountAccountID)
        accountUpdatedAt = try q(naming.accountUpdatedAt)
        banned = try naming.ban.map { ban throws(AuthPlatformError) in try q(ban.banned) }
        banReasonColumn = try naming.ban.map { ban throws(AuthPlatformError) in try q(ban.banReason) }
        banExpires = try naming.ban.map { ban throws(AuthPlatformError) in try q(ban.banExpires) }
        guard ["text", "uuid", "integer", "bigint"].contains(naming.idType) else {
            throw AuthPlatformError(
                .invalidName, platform: name, cause: "idType must be text, uuid, integer or bigint")
        }
        id = naming.idType
    }

    func findUser(sub: String, _ run: Runner) throws(AuthPlatformError) -> String? {
        try run.texts(
            """
            SELECT u.\(userID)::text FROM \(account) a JOIN \(user) u ON u.\(userID) = a.\(accountUserID)
             WHERE a.\(providerID) = $1 AND a.\(accountID) = $2
               FOR UPDATE OF a
            """, [.text(provider), .text(sub)], table: account
        ).first
    }

    func hasOtherLogin(user: String, sub: String, _ run: Runner) throws(AuthPlatformError) -> Bool {
        // Any other account counts, the `credential` account (a password) among them.
        try run.flag(
            """
            SELECT EXISTS (SELECT 1 FROM \(account)
                            WHERE \(accountUserID) = $1::\(id) AND NOT (\(providerID) = $2 AND \(accountID) = $3))
            """, [.text(user), .text(provider), .text(sub)], table: account)
    }

    func endSessions(user: String, _ run: Runner, into counts: inout AuthCounts) throws(AuthPlatformError) {
        counts.sessionsEnded += try run.count(
            "DELETE FROM \(session) WHERE \(sessionUserID) = $1::\(id)", [.text(user)], table: session)
    }

    func unlink(user: String, sub: String, _ run: Runner, into counts: inout AuthCounts)
        throws(AuthPlatformError)
    {
        counts.identitiesUnlinked += try run.count(
            "DELETE FROM \(account) WHERE \(providerID) = $1 AND \(accountID) = $2",
            [.text(provider), .text(sub)],
            table: account)
    }

    func disable(user: String, _ run: Runner, into counts: inout AuthCounts) throws(AuthPlatformError) {
        guard let banned, let banReasonColumn, let banExpires else {
            throw AuthPlatformError(
                .policyNotSupported, platform: name, table: self.user, cause: "no ban columns")
        }
        counts.usersDisabled += try run.count(
            """
            UPDATE \(self.user) SET \(banned) = true, \(banReasonColumn) = $2, \(banExpires) = NULL,
                   \(userUpdatedAt) = now()
             WHERE \(userID) = $1::\(id) AND (\(banned) IS NOT TRUE OR \(banExpires) IS NOT NULL)
            """, [.text(user), .text(banReason)], table: self.user)
    }

    func delete(user: String, _ run: Runner, into counts: inout AuthCounts) throws(AuthPlatformError) {
        // Explicit, although Better Auth's own keys cascade: a database migrated without them leaves no orphans either.
        counts.sessionsEnded += try run.count(
            "DELETE FROM \(session) WHERE \(sessionUserID) = $1::\(id)", [.text(user)], table: session)
        counts.identitiesUnlinked += try run.count(
            "DELETE FROM \(account) WHERE \(accountUserID) = $1::\(id)", [.text(user)], table: account)
        counts.usersDeleted += try run.count(
            "DELETE FROM \(self.user) WHERE \(userID) = $1::\(id)", [.text(user)], table: self.user)
    }

    func move(
        user: String, from oldSub: String, to newSub: String, _ run: Runner, into counts: inout AuthCounts
    )
        throws(AuthPlatformError)
    {
        counts.identitiesMoved += try run.count(
            """
            UPDATE \(account) SET \(accountID) = $3, \(accountUpdatedAt) = now()
             WHERE \(providerID) = $1 AND \(accountID) = $2
            """, [.text(provider), .text(oldSub), .text(newSub)], table: account)
    }

    func recordForwarding(user: String, on: Bool, _ run: Runner, into counts: inout AuthCounts)
        throws(AuthPlatformError)
    {
        throw AuthPlatformError(.policyNotSupported, platform: name, cause: "onForwardingChange record")
    }

    func requirements(for policy: AuthPolicy) -> [TableRequirement] {
        let deletes = policy.onAccountDeleted == .delete
        var userColumns = [naming.userID]
        var userPrivileges = ["SELECT"]
        if policy.mayDisable, let ban = naming.ban {
            userColumns += [naming.userUpdatedAt, ban.banned, ban.banReason, ban.banExpires]
            userPrivileges.append("UPDATE")
        }
        if deletes { userPrivileges.append("DELETE") }
        var accountPrivileges = ["SELECT", "UPDATE"]  // UPDATE: the lookup locks the row (FOR UPDATE)
        if policy.onAccountDeleted == .unlink || deletes { accountPrivileges.append("DELETE") }
        return [
            TableRequirement(
                schema: naming.schema, table: naming.user, columns: userColumns, privileges: userPrivileges),
            TableRequirement(
                schema: naming.schema, table: naming.session, columns: [naming.sessionUserID],
                privileges: ["SELECT", "DELETE"]),
            TableRequirement(
                schema: naming.schema, table: naming.account,
                columns: [
                    naming.accountUserID, naming.accountProviderID, naming.accountAccountID,
                    naming.accountUpdatedAt,
                ], privileges: accountPrivileges),
        ]
    }
}
