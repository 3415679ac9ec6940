import Foundation
public import Postgres
import SiwaSchema

/// Brings a database to the schema embedded in this build (`siwactl migrate`): one migration at a time,
/// with the search_path pinned, and a report of what it found. Never prints or reads the environment.
public enum Migrator {
    /// What a migration found: the versions, the server's notices, the search_path warnings and the
    /// group roles left without grants.
    public struct Report: Sendable, Equatable {
        /// The schema version before (nil: not read, the migration stopped earlier).
        public var versionBefore: SchemaVersion?
        /// The schema version after (nil: not applied, or not read).
        public var versionAfter: SchemaVersion?
        /// Every NOTICE and WARNING the server sent, in order.
        public var notices: [PostgresNotice] = []
        /// One per schema on the session's search_path where others may create objects.
        public var warnings: [String] = []
        /// The group roles that are missing or were granted nothing (read after applying).
        public var roleGaps: RoleGaps?

        public init() {}
    }

    /// The group roles schema.sql grants to that are missing or have no USAGE on schema siwa.
    public struct RoleGaps: Sendable, Equatable {
        /// The role that ran the migration, quoted as an identifier.
        public var owner: String
        /// The group roles that do not exist (the owner may not create roles).
        public var missing: [String]
        /// The group roles that exist but were granted nothing in schema siwa.
        public var ungranted: [String]

        public var isEmpty: Bool { missing.isEmpty && ungranted.isEmpty }

        /// What is wrong and the two ways to fix it, one line each.
        public var advice: String {
            var lines: [String] = []
            if !missing.isEmpty {
                lines.append(
                    "the schema is applied, but the group roles \(missing.joined(separator: ", ")) do not exist: "
                        + "\(owner) may not create roles (no CREATEROLE), so nothing was granted to them and "
                        + "the services' login roles cannot be made members of them.")
                lines.append("Fix it in one of two ways, then run siwactl migrate again:")
                lines.append("  - as a superuser: ALTER ROLE \(owner) CREATEROLE;")
                lines.append(
                    "  - or create the roles first, as a role with CREATEROLE: "
                        + missing.map { "CREATE ROLE \($0) NOLOGIN;" }.joined(separator: " "))
            }
            if !ungranted.isEmpty {
                lines.append(
                    "the group roles \(ungranted.joined(separator: ", ")) exist but have no USAGE on schema siwa: "
                        + "run siwactl migrate as the schema's owner.")
            }
            return lines.joined(separator: "\n")
        }
    }

    /// A database's schema version: none installed, or the highest in `siwa.schema_version`.
    public enum SchemaVersion: Sendable, Equatable, CustomStringConvertible {
        case none
        case version(Int)

        public var description: String {
            switch self {
            case .none: "none"
            case .version(let version): "\(version)"
            }
        }
    }

    /// Said while the migration runs, before the report.
    public enum Progress: Sendable, Equatable {
        /// On a database without the schema, another session holds the advisory migration lock.
        case waitingForLock(holders: String, timeout: Double)
    }

    /// The group roles schema.sql creates (when missing) and grants to.
    public static let groupRoles = [
        "siwa_admin", "siwa_receiver", "siwa_worker", "siwa_signin", "siwa_app", "siwa_webhook_admin",
        "siwa_mail", "siwa_bounce", "siwa_ssf",
    ]

    /// Applies ``SiwaSchema/sql`` on `connection` in one transaction and reports what it found; the
    /// error carries the report so far. `lockTimeout` (seconds) bounds the wait for the advisory lock
    /// on a database without the schema. Leaves the session's search_path pinned to pg_catalog.
    public static func migrate(
        _ connection: PostgresConnection, lockTimeout: Double,
        progress: (Progress) -> Void = { _ in }
    ) throws(MigratorError) -> Report {
        var report = Report()
        do {
            try run(connection, lockTimeout: lockTimeout, progress: progress, into: &report)
        } catch var error {
            report.notices += connection.takeNotices()
            error.report = report
            throw error
        }
        return report
    }

    private static func run(
        _ connection: PostgresConnection, lockTimeout: Double, progress: (Progress) -> Void,
        into report: inout Report
    ) throws(MigratorError) {
        // The schemas on this session's search_path, read before the path is pinned: objects others may
        // create there are what the warnings are about.
        let pathSchemas = try step("reading the search_path") {
            try connection.query(
                "SELECT pg_catalog.unnest(pg_catalog.current_schemas(false))::pg_catalog.text"
            ).map { try $0[0, as: String.self] }
        }
        // From here on nothing this session runs can resolve to an object in a schema that another role
        // may create objects in: schema.sql names everything else by schema.
        _ = try step("pinning the search_path") {
            try connection.simpleQuery("SET search_path = pg_catalog, pg_temp")
        }
        report.warnings = try step("checking who may create objects on the search_path") {
            try creatorWarnings(pathSchemas, on: connection)
        }
        let before = try step("reading the schema version") { try currentVersion(connection) }
        report.versionBefore = before
        if case .version(let before) = before, before > SiwaSchema.version {
            throw MigratorError(
                .newerDatabase,
                "the database is at schema version \(before), newer than this binary's \(SiwaSchema.version); not migrating"
            )
        }
        report.notices += connection.takeNotices()
        try step("applying the schema") {
            try connection.transaction { connection in
                // One migration at a time: a second one waits here, then finds nothing to do.
                try takeMigrationLock(connection, timeout: lockTimeout, progress: progress)
                try connection.simpleQuery(SiwaSchema.sql)
            }
        }
        report.notices += connection.takeNotices()
        report.versionAfter = try step("reading the schema version") { try currentVersion(connection) }
        report.roleGaps = try step("checking the group roles") { try roleGaps(connection) }
    }

    /// Runs `body`, turning database errors into one naming what was being done.
    private static func step<T>(_ what: String, _ body: () throws -> T) throws(MigratorError) -> T {
        do {
            return try body()
        } catch let error as MigratorError {
            throw error
        } catch let error as PostgresError {
            throw MigratorError(.database, "\(what) failed: \(error.message)")
        } catch {
            throw MigratorError(.database, "\(what) failed: \(error)")
        }
    }

    /// Takes the migration lock in the open transaction. On a database with the schema it is
    /// siwa.schema_version in SHARE ROW EXCLUSIVE mode, the lock schema.sql's numbered changes take too:
    /// only a role that may write that table (the owner) can take a mode that conflicts with it, so no
    /// other login can make a migration wait; another migration is waited for as long as it runs. A
    /// database without the schema has nothing of ours to lock: there it is an advisory lock, which any
    /// login can hold, waited for at most `timeout` seconds and then refused with who holds it; once it is
    /// taken, a schema that another migration committed meanwhile is locked as above.
    static func takeMigrationLock(
        _ connection: PostgresConnection, timeout: Double, progress: (Progress) -> Void
    ) throws {
        func schemaExists() throws -> Bool {
            try connection.query("SELECT pg_catalog.to_regclass('siwa.schema_version') IS NOT NULL")[0][
                0, as: Bool.self]
        }
        if try !schemaExists() {
            let key = "pg_catalog.hashtextextended('siwa.migrate', 0)"
            let taken = try connection.value(
                "SELECT pg_catalog.pg_try_advisory_xact_lock(\(key))", as: Bool.self)
            if !taken {
                let holders =
                    try connection.value(
                        """
                        SELECT pg_catalog.string_agg(pg_catalog.format('pid %s (role %s, application %L, since %s)',
                                   a.pid, pg_catalog.quote_ident(a.usename),
                                   pg_catalog.regexp_replace(a.application_name, '[[:cntrl:]]', '?', 'g'),
                                   pg_catalog.to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS"Z"')),
                                   '; ' ORDER BY a.pid)
                          FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
                         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                           AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
                           AND ((l.classid::pg_catalog.int8 << 32) | l.objid::pg_catalog.int8) = \(key)
                        """, as: String?.self) ?? "a session that has ended"
                progress(.waitingForLock(holders: holders, timeout: timeout))
                let previous = try connection.query("SELECT pg_catalog.current_setting('lock_timeout')")[0][
                    0, as: String.self]
                try connection.query(
                    "SELECT pg_catalog.set_config('lock_timeout', $1, true)",
                    [.text("\(max(1, Int((timeout * 1000).rounded())))ms")])
                let timedOut: Bool
                do {
                    try connection.query("SELECT pg_catalog.pg_advisory_xact_lock(\(key))")
                    timedOut = false
                } catch {
                    guard error.sqlState == "55P03" else { throw error }
                    timedOut = true
                }
                if timedOut {
                    throw MigratorError(
                        .lockTimeout,
                        "the database has no schema yet and the migration lock (the advisory lock on hashtextextended('siwa.migrate', 0), which any login can take) was held for more than --lock-timeout \(String(format: "%g", timeout)) s by \(holders): nothing was changed. If that is not another siwactl migrate, end it (SELECT pg_terminate_backend(pid)) and run siwactl migrate again"
                    )
                }
                try connection.query(
                    "SELECT pg_catalog.set_config('lock_timeout', $1, true)", [.text(previous)])
            }
            guard try schemaExists() else { return }
        }
        try connection.simpleQuery("LOCK TABLE siwa.schema_version IN SHARE ROW EXCLUSIVE MODE")
    }

    /// The role running this, the group roles that do not exist, and those that exist but were granted
    /// nothing in schema siwa (no USAGE).
    static func roleGaps(_ connection: PostgresConnection) throws -> RoleGaps {
        let owner = try connection.query("SELECT pg_catalog.quote_ident(current_user::text)")[0][
            0, as: String.self]
        var gaps = RoleGaps(owner: owner, missing: [], ungranted: [])
        for row in try connection.query(
            """
            SELECT r.name, r.oid IS NOT NULL AS exists,
                   r.oid IS NOT NULL AND has_schema_privilege(r.oid, 'siwa', 'USAGE') AS granted
              FROM (SELECT g.name, (SELECT oid FROM pg_roles WHERE rolname = g.name) AS oid
                      FROM unnest($1::text[]) AS g(name)) r
            """, [.array(groupRoles.map { .text($0) })])
        {
            let role = try GroupRoleRow(row: row)
            if !role.exists {
                gaps.missing.append(role.name)
            } else if !role.granted {
                gaps.ungranted.append(role.name)
            }
        }
        return gaps
    }

    /// One group role: whether it exists and has USAGE on schema siwa.
    struct GroupRoleRow {
        var name: String
        var exists: Bool
        var granted: Bool

        init(row: PostgresRow) throws(PostgresError) {
            name = try row["name"]
            exists = try row["exists"]
            granted = try row["granted"]
        }
    }

    /// One warning per schema of `schemas` (the session's search_path) in which a role other than the
    /// current one, and not a superuser, may create objects: such a role can plant functions and
    /// operators that shadow PostgreSQL's for every session and hook using that path
    /// (docs/operations.md). Runs with the search_path already pinned to pg_catalog.
    static func creatorWarnings(_ schemas: [String], on connection: PostgresConnection) throws -> [String] {
        var warnings: [String] = []
        for schema in schemas {
            guard
                let row = try connection.query(
                    """
                    SELECT quote_ident(n.nspname) AS name,
                           EXISTS (SELECT 1 FROM aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) g
                                    WHERE g.grantee = 0 AND g.privilege_type = 'CREATE') AS everyone,
                           (SELECT string_agg(quote_ident(r.rolname), ', ' ORDER BY r.rolname)
                              FROM pg_roles r
                             WHERE r.rolcanlogin AND NOT r.rolsuper AND r.rolname <> current_user
                               AND has_schema_privilege(r.oid, n.oid, 'CREATE')) AS roles
                      FROM pg_namespace n
                     WHERE n.nspname = $1
                    """, [.text(schema)]
                ).first
            else { continue }
            let creators = try SchemaCreatorsRow(row: row)
            guard creators.everyone || creators.roles != nil else { continue }
            let name = creators.name
            let who =
                creators.everyone
                ? "every role (CREATE is granted to PUBLIC)" : "these roles: \(creators.roles ?? "")"
            warnings.append(
                "\(who) may create objects in schema \(name), which is on this session's search_path: "
                    + "such objects can take the place of PostgreSQL's own in sessions and hooks that use this "
                    + "path. Unless that is intended: REVOKE CREATE ON SCHEMA \(name) FROM "
                    + (creators.everyone ? "PUBLIC." : "\(creators.roles ?? "")."))
        }
        return warnings
    }

    /// Who besides the owner may create objects in one schema.
    struct SchemaCreatorsRow {
        /// The schema's name, quoted as an identifier.
        var name: String
        /// Whether CREATE is granted to PUBLIC.
        var everyone: Bool
        /// The login roles (not superusers, not this one) that may, quoted and comma-separated.
        var roles: String?

        init(row: PostgresRow) throws(PostgresError) {
            name = try row["name"]
            everyone = try row["everyone"]
            roles = try row["roles"]
        }
    }

    /// The highest version recorded in `siwa.schema_version`, or none on a database without the schema.
    static func currentVersion(_ connection: PostgresConnection) throws -> SchemaVersion {
        guard
            try connection.query("SELECT to_regclass('siwa.schema_version') IS NOT NULL")[0][
                0, as: Bool.self],
            let version = try connection.query("SELECT max(version) FROM siwa.schema_version")[0][
                0, as: Int?.self]
        else { return .none }
        return .version(version)
    }
}

/// Why a migration stopped, safe to print; ``report`` holds what was found before.
public struct MigratorError: Error, Sendable, CustomStringConvertible {
    /// What kind of stop.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        let rawValue: String
        public var description: String { rawValue }
        /// A statement failed (the step is named in the description).
        public static let database = Code(rawValue: "database")
        /// The database's schema is newer than this build's.
        public static let newerDatabase = Code(rawValue: "newerDatabase")
        /// On a database without the schema, the advisory lock stayed held past the timeout.
        public static let lockTimeout = Code(rawValue: "lockTimeout")
    }

    public var code: Code
    public var description: String
    /// The report up to the stop.
    public var report = Migrator.Report()

    init(_ code: Code, _ description: String) {
        self.code = code
        self.description = description
    }
}
