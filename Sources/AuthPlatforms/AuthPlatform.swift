public import Postgres

/// An auth platform whose users live in PostgreSQL, and how Apple's events are applied there.
///
/// Each call runs on the platform's own database through the connection it is given (its own login,
/// with only the grants docs/adapters.md lists). ``apply(_:sub:policy:on:)`` is one transaction;
/// ``dryRun(_:sub:policy:on:)`` runs the same statements and rolls them back. Every statement is
/// parameterised; table and column names go through ``SQLName``.
public protocol AuthPlatform: Sendable {
    /// The platform's name in errors and problems (`supabase-auth`, `better-auth`, …).
    var name: String { get }
    /// The identity provider whose `sub` the events carry (`apple` by default, `apple-id` for
    /// python-social-auth): another provider can drive the same effects.
    var provider: String { get }

    /// Refuses a policy the platform cannot express, naming the choice (e.g. `disable` without a
    /// disable flag).
    func validate(_ policy: AuthPolicy) throws(AuthPlatformError)

    /// The problems that would make `policy`'s statements fail or silently change nothing: a missing
    /// table or column, a missing grant, row-level security the login does not bypass. Empty when the
    /// login is ready.
    func check(on connection: PostgresConnection, policy: AuthPolicy) throws(AuthPlatformError)
        -> [AuthPlatformProblem]

    /// Applies `event` for `sub` under `policy` in one transaction on `connection`, and returns what
    /// changed (``AuthChange/noUser`` when `sub` links no user). Validates `policy` first.
    func apply(_ event: AuthEvent, sub: String, policy: AuthPolicy, on connection: PostgresConnection)
        throws(AuthPlatformError) -> AuthChange

    /// The statements of ``apply(_:sub:policy:on:)``, rolled back: what the event would change,
    /// changing nothing (`siwactl adapters test`).
    func dryRun(_ event: AuthEvent, sub: String, policy: AuthPolicy, on connection: PostgresConnection)
        throws(AuthPlatformError) -> AuthChange
}

extension AuthPlatform {
    /// ``check(on:policy:)`` for the default policy.
    public func check(on connection: PostgresConnection) throws(AuthPlatformError) -> [AuthPlatformProblem] {
        try check(on: connection, policy: AuthPolicy())
    }
}

/// Why an adapter's call failed. It names the platform, the table and the cause; it never holds a
/// `sub`, an address, a token or the server's message text (which may quote row data).
public struct AuthPlatformError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The kind of failure.
    public enum Kind: String, Sendable, Hashable {
        /// The policy asks for something the platform cannot express.
        case policyNotSupported = "policy_not_supported"
        /// A configured table or column name is not a plain SQL identifier.
        case invalidName = "invalid_name"
        /// A statement failed (missing table or column, short grants, a lost connection, …).
        case statementFailed = "statement_failed"
        /// The `sub` is linked to more than one user (Auth.js declares no unique key).
        case ambiguous
        /// A transfer's new `sub` already belongs to another user.
        case conflict
    }

    /// The kind of failure.
    public var kind: Kind
    /// The platform (``AuthPlatform/name``).
    public var platform: String
    /// The table involved, qualified as the platform names it, when there is one.
    public var table: String?
    /// What went wrong, in words that never quote data.
    public var cause: String
    /// The SQLSTATE of a failed statement.
    public var sqlState: String?
    /// Whether trying again later may succeed (a lost connection, a serialization failure, a deadlock).
    public var isRetryable: Bool

    /// An error.
    public init(
        _ kind: Kind, platform: String, table: String? = nil, cause: String, sqlState: String? = nil,
        isRetryable: Bool = false
    ) {
        self.kind = kind
        self.platform = platform
        self.table = table
        self.cause = cause
        self.sqlState = sqlState
        self.isRetryable = isRetryable
    }

    /// `<platform>: <table>: <cause>`.
    public var description: String {
        [platform, table, cause].compactMap { $0 }.joined(separator: ": ")
    }
}

/// One finding of ``AuthPlatform/check(on:policy:)``.
public struct AuthPlatformProblem: Sendable, Hashable, CustomStringConvertible {
    /// The kind of finding.
    public enum Kind: String, Sendable, Hashable {
        /// The table does not exist.
        case missingTable = "missing_table"
        /// The table lacks a column the statements use.
        case missingColumn = "missing_column"
        /// The login lacks a privilege the statements need.
        case missingPrivilege = "missing_privilege"
        /// Row-level security is enabled and the login neither owns the table nor has BYPASSRLS: its
        /// statements would see and change 0 rows, without an error.
        case rowLevelSecurity = "row_level_security"
    }

    /// The kind of finding.
    public var kind: Kind
    /// The table, qualified.
    public var table: String
    /// The column, or the privilege, concerned.
    public var detail: String?

    /// A finding.
    public init(_ kind: Kind, table: String, detail: String? = nil) {
        self.kind = kind
        self.table = table
        self.detail = detail
    }

    /// In words, naming the table and the column or privilege.
    public var description: String {
        switch kind {
        case .missingTable: "\(table): no such table"
        case .missingColumn: "\(table): no column \(detail ?? "")"
        case .missingPrivilege: "\(table): the login lacks \(detail ?? "") (GRANT it)"
        case .rowLevelSecurity:
            "\(table): row-level security is enabled and the login neither owns the table nor has BYPASSRLS:"
                + " its statements would see 0 rows"
        }
    }
}

/// The one way a table or column name gets into a statement: checked against
/// `[A-Za-z_][A-Za-z0-9_]*` and double-quoted.
public enum SQLName {
    /// Whether `name` is a plain identifier.
    public static func isValid(_ name: String) -> Bool {
        guard let first = name.unicodeScalars.first, name.unicodeScalars.count <= 63 else { return false }
        func letter(_ scalar: Unicode.Scalar) -> Bool {
            (scalar >= "A" && scalar <= "Z") || (scalar >= "a" && scalar <= "z") || scalar == "_"
        }
        return letter(first) && name.unicodeScalars.allSatisfy { letter($0) || ($0 >= "0" && $0 <= "9") }
    }

    /// `name` double-quoted, or an ``AuthPlatformError/Kind/invalidName`` error naming `platform`.
    public static func quoted(_ name: String, platform: String) throws(AuthPlatformError) -> String {
        guard isValid(name) else {
            throw AuthPlatformError(
                .invalidName, platform: platform,
                cause:
                    "a configured table or column name is not an identifier matching [A-Za-z_][A-Za-z0-9_]*")
        }
        return "\"\(name)\""
    }
}
