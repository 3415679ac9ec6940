import Postgres

/// The statements of one platform, each run inside the transaction the engine holds. The one policy
/// logic (``PolicyEngine``) calls them; a platform says only how each effect is done in its tables.
protocol AccountStatements: Sendable {
    /// The platform's name.
    var name: String { get }
    /// The provider.
    var provider: String { get }
    /// The user linked to `sub` of ``provider``, the identity's row locked (`FOR UPDATE`), or nil.
    func findUser(sub: String, _ run: Runner) throws(AuthPlatformError) -> String?
    /// Whether `user` can still sign in without the identity of `sub` (another identity, a password).
    func hasOtherLogin(user: String, sub: String, _ run: Runner) throws(AuthPlatformError) -> Bool
    /// Ends `user`'s sessions (and the platform's refresh tokens).
    func endSessions(user: String, _ run: Runner, into counts: inout AuthCounts) throws(AuthPlatformError)
    /// Removes the identity of `sub`.
    func unlink(user: String, sub: String, _ run: Runner, into counts: inout AuthCounts)
        throws(AuthPlatformError)
    /// Marks `user` disabled (only called when ``AuthPlatform/validate(_:)`` allowed it).
    func disable(user: String, _ run: Runner, into counts: inout AuthCounts) throws(AuthPlatformError)
    /// Deletes `user` and every row of theirs, leaving no orphan.
    func delete(user: String, _ run: Runner, into counts: inout AuthCounts) throws(AuthPlatformError)
    /// Moves the identity from `oldSub` to `newSub`.
    func move(
        user: String, from oldSub: String, to newSub: String, _ run: Runner, into counts: inout AuthCounts)
        throws(AuthPlatformError)
    /// Records the forwarding state (only called when ``AuthPlatform/validate(_:)`` allowed `record`).
    func recordForwarding(user: String, on: Bool, _ run: Runner, into counts: inout AuthCounts)
        throws(AuthPlatformError)
    /// The tables, columns and privileges `policy`'s statements need.
    func requirements(for policy: AuthPolicy) -> [TableRequirement]
}

/// A table the statements use: its schema and name (unquoted), the columns and the privileges needed.
struct TableRequirement: Sendable {
    var schema: String
    var table: String
    var columns: [String]
    var privileges: [String]

    var qualified: String { "\(schema).\(table)" }
}

/// Runs one statement inside the engine's transaction, turning a PostgreSQL error into an
/// ``AuthPlatformError`` that names the table and the cause (never the server's text).
struct Runner {
    let platform: String
    let connection: PostgresConnection

    /// The statement's rows.
    func rows(_ sql: String, _ parameters: [PostgresData?], table: String) throws(AuthPlatformError)
        -> PostgresRows
    {
        do {
            return try connection.query(sql, parameters)
        } catch {
            throw Runner.describe(error, platform: platform, table: table)
        }
    }

    /// The number of rows the statement changed.
    @discardableResult
    func count(_ sql: String, _ parameters: [PostgresData?], table: String) throws(AuthPlatformError) -> Int {
        try rows(sql, parameters, table: table).affectedRows
    }

    /// The text values of the statement's first column.
    func texts(_ sql: String, _ parameters: [PostgresData?], table: String) throws(AuthPlatformError)
        -> [String]
    {
        let result = try rows(sql, parameters, table: table)
        var values: [String] = []
        for row in result {
            do {
                if let value = try row.text(at: 0) { values.append(value) }
            } catch {
                throw Runner.describe(error, platform: platform, table: table)
            }
        }
        return values
    }

    /// Whether the statement's one boolean is true.
    func flag(_ sql: String, _ parameters: [PostgresData?], table: String) throws(AuthPlatformError) -> Bool {
        try texts(sql, parameters, table: table).first == "t"
    }

    static func describe(_ error: PostgresError, platform: String, table: String?) -> AuthPlatformError {
        let cause =
            switch error.sqlState {
            case "42501": "permission denied (a missing GRANT)"
            case "42P01": "no such table"
            case "42703": "no such column"
            case "3F000": "no such schema"
            case "23505": "a unique constraint was violated"
            case "23503": "a foreign key was violated"
            case "40001": "a serialization failure"
            case "40P01": "a deadlock"
            case "55P03": "a lock was not available"
            case "57014": "the statement was cancelled (statement timeout)"
            case "25006": "the database is read-only"
            default:
                error.isConnectionError
                    ? "the connection failed or was lost"
                    : "the statement failed (\(error.sqlState.map { "SQLSTATE \($0)" } ?? error.code.rawValue))"
            }
        return AuthPlatformError(
            .statementFailed, platform: platform, table: table, cause: cause, sqlState: error.sqlState,
            isRetryable: error.isRetryable)
    }
}

/// The one policy logic every platform shares: what each event does under a policy, in terms of
/// ``AccountStatements``.
enum PolicyEngine {
    /// `event` applied in one transaction (committed), or rolled back when `dryRun`.
    static func run(
        _ statements: some AccountStatements, validate: (AuthPolicy) throws(AuthPlatformError) -> Void,
        event: AuthEvent, sub: String, policy: AuthPolicy, connection: PostgresConnection, dryRun: Bool
    ) throws(AuthPlatformError) -> AuthChange {
        try validate(policy)
        let run = Runner(platform: statements.name, connection: connection)
        do {
            try connection.simpleQuery("BEGIN")
        } catch {
            throw Runner.describe(error, platform: statements.name, table: nil)
        }
        let change: AuthChange
        do {
            change = try StatementsOnConnection(statements: statements, run: run).apply(
                event, sub: sub, policy: policy)
        } catch {
            if connection.isHealthy { _ = try? connection.simpleQuery("ROLLBACK") }
            throw error
        }
        do {
            let end = try connection.simpleQuery(dryRun ? "ROLLBACK" : "COMMIT")
            if !dryRun && end.last?.commandTag == "ROLLBACK" {
                throw AuthPlatformError(
                    .statementFailed, platform: statements.name, cause: "the transaction was rolled back")
            }
        } catch let error as PostgresError {
            throw Runner.describe(error, platform: statements.name, table: nil)
        } catch let error as AuthPlatformError {
            throw error
        } catch {
            throw AuthPlatformError(.statementFailed, platform: statements.name, cause: "the commit failed")
        }
        return change
    }

    /// The problems of `requirements` as the connection's login sees them.
    static func check(_ requirements: [TableRequirement], platform: String, connection: PostgresConnection)
        throws(AuthPlatformError) -> [AuthPlatformProblem]
    {
        let run = Runner(platform: platform, connection: connection)
        var problems: [AuthPlatformProblem] = []
        for requirement in requirements {
            let table = requirement.qualified
            let found = try run.rows(
                """
                SELECT c.oid::int8, c.relrowsecurity AND (c.relforcerowsecurity
                           OR NOT pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE'))
                       AND NOT (SELECT r.rolbypassrls FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)
                  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')
                """, [.text(requirement.schema), .text(requirement.table)], table: table)
            guard let row = found.first, let oid = try? row.text(at: 0) else {
                problems.append(AuthPlatformProblem(.missingTable, table: table))
                continue
            }
            let present = Set(
                try run.texts(
                    "SELECT attname::text FROM pg_catalog.pg_attribute WHERE attrelid = $1::oid AND attnum > 0"
                        + " AND NOT attisdropped", [.text(oid)], table: table))
            for column in requirement.columns where !present.contains(column) {
                problems.append(AuthPlatformProblem(.missingColumn, table: table, detail: column))
            }
            for privilege in requirement.privileges {
                let granted = try run.flag(
                    "SELECT pg_catalog.has_table_privilege($1::oid, $2)", [.text(oid), .text(privilege)],
                    table: table)
                if !granted {
                    problems.append(AuthPlatformProblem(.missingPrivilege, table: table, detail: privilege))
                }
            }
            if (try? row.text(at: 1)) == "t" {
                problems.append(AuthPlatformProblem(.rowLevelSecurity, table: table))
            }
        }
        return problems
    }
}

/// A platform's statements on one open transaction, as the policy table combines them.
struct StatementsOnConnection<Statements: AccountStatements>: AccountOperations {
    let statements: Statements
    let run: Runner

    var platformName: String { statements.name }
    func findUser(sub: String) throws(AuthPlatformError) -> String? { try statements.findUser(sub: sub, run) }
    func hasOtherLogin(user: String, sub: String) throws(AuthPlatformError) -> Bool {
        try statements.hasOtherLogin(user: user, sub: sub, run)
    }
    func endSessions(user: String, into counts: inout AuthCounts) throws(AuthPlatformError) {
        try statements.endSessions(user: user, run, into: &counts)
    }
    func unlink(user: String, sub: String, into counts: inout AuthCounts) throws(AuthPlatformError) {
        try statements.unlink(user: user, sub: sub, run, into: &counts)
    }
    func disable(user: String, into counts: inout AuthCounts) throws(AuthPlatformError) {
        try statements.disable(user: user, run, into: &counts)
    }
    func delete(user: String, into counts: inout AuthCounts) throws(AuthPlatformError) {
        try statements.delete(user: user, run, into: &counts)
    }
    func move(user: String, from oldSub: String, to newSub: String, into counts: inout AuthCounts)
        throws(AuthPlatformError)
    {
        try statements.move(user: user, from: oldSub, to: newSub, run, into: &counts)
    }
    func recordForwarding(user: String, on: Bool, into counts: inout AuthCounts) throws(AuthPlatformError) {
        try statements.recordForwarding(user: user, on: on, run, into: &counts)
    }
    func newSubTaken() -> AuthPlatformError {
        AuthPlatformError(
            .conflict, platform: statements.name,
            cause: "the new sub of a transfer is already linked to another user; nothing was moved")
    }
}
