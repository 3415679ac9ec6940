import Foundation
import Postgres
import ServiceSupport
import SiwaSchema

/// `siwactl migrate`: brings a database to the schema embedded in this binary.
enum MigrateVerb {
    static let spec = CommandSpec(
        name: "siwactl migrate",
        abstract: """
            Apply the schema embedded in this binary (schema.sql, version \(SiwaSchema.version)) in one
            transaction. Re-runnable: an up-to-date database is left as it is, data is never dropped.
            Prints the schema version before and after. Refuses a database newer than this binary.
            Runs with search_path pinned to pg_catalog, and warns when a role other than this one (and
            not a superuser) may create objects in a schema on the session's search_path. Prints every
            NOTICE and WARNING the server sends (stderr), and fails (exit 1) when a group role the
            schema grants to (siwa_admin, siwa_receiver, siwa_worker, siwa_signin, siwa_app) is missing
            because this role may not create it, saying how to fix it. One migration at a time: it waits
            for another siwactl migrate by a lock only the schema's owner can take (siwa.schema_version);
            on a database without the schema, whose lock any login could hold, it waits at most
            --lock-timeout seconds and then names who holds it.
            """,
        options: [
            .databaseURL,
            CommandOption(
                "lock-timeout", valueName: "SECONDS",
                help:
                    "On a database without the schema: how long to wait for another migration's lock before refusing, naming its holder.",
                environmentVariable: "SIWA_MIGRATE_LOCK_TIMEOUT", defaultValue: "60"),
        ])

    static let verb = Verb(name: "migrate", abstract: "Apply the embedded schema.sql to a database.") {
        arguments, environment in
        switch parse(spec, arguments, environment) {
        case .failure(let exit): return exit.status
        case .success(let parsed): return await runReportingFailure(spec.name) { try run(parsed) }
        }
    }

    static func run(_ parsed: ParsedCommand) throws {
        guard let lockTimeout = Double(parsed.value("lock-timeout") ?? ""), lockTimeout.isFinite,
            (0.001...86_400).contains(lockTimeout)
        else {
            throw ToolFailure("--lock-timeout must be a number of seconds from 0.001 to 86400")
        }
        let connection = try connect(parsed)
        defer { connection.close() }
        // The schemas on this session's search_path, read before the path is pinned: objects others may
        // create there are what the warning below is about.
        let pathSchemas = try database("reading the search_path") {
            try connection.query(
                "SELECT pg_catalog.unnest(pg_catalog.current_schemas(false))::pg_catalog.text"
            ).map { try $0[0, as: String.self] }
        }
        // From here on nothing this session runs can resolve to an object in a schema that another role
        // may create objects in (a public.hashtextextended(text, integer) would otherwise win overload
        // resolution and run as the owner): schema.sql names everything else by schema.
        try database("pinning the search_path") {
            try connection.simpleQuery("SET search_path = pg_catalog, pg_temp")
        }
        let warnings = try database("checking who may create objects on the search_path") {
            try creatorWarnings(pathSchemas, on: connection)
        }
        for warning in warnings { writeErrorLine("siwactl migrate", "warning: \(warning)") }
        let before = try database("reading the schema version") { try currentVersion(connection) }
        writeStandardOutput("schema version before: \(before.map(String.init) ?? "none")\n")
        if let before, before > SiwaSchema.version {
            throw ToolFailure(
                "the database is at schema version \(before), newer than this binary's \(SiwaSchema.version); not migrating"
            )
        }
        printNotices(connection)
        do {
            try database("applying the schema") {
                try connection.transaction { connection in
                    // One migration at a time: a second siwactl waits here, then finds nothing to do.
                    try takeMigrationLock(connection, timeout: lockTimeout)
                    try connection.simpleQuery(SiwaSchema.sql)
                }
            }
        } catch {
            printNotices(connection)
            throw error
        }
        printNotices(connection)
        let after = try database("reading the schema version") { try currentVersion(connection) }
        writeStandardOutput("schema version after: \(after.map(String.init) ?? "none")\n")
        let (owner, missing, ungranted) = try database("checking the group roles") {
            try roleGaps(connection)
        }
        if !missing.isEmpty || !ungranted.isEmpty {
            throw ToolFailure(roleGapMessage(owner: owner, missing: missing, ungranted: ungranted))
        }
    }

    /// Takes the migration lock in the open transaction. On a database with the schema it is
    /// siwa.schema_version in SHARE ROW EXCLUSIVE mode, the lock schema.sql's numbered changes take too:
    /// only a role that may write that table (the owner) can take a mode that conflicts with it, so no
    /// other login can make a migration wait; another migration is waited for as long as it runs. A
    /// database without the schema has nothing of ours to lock: there it is an advisory lock, which any
    /// login can hold, waited for at most `timeout` seconds and then refused with who holds it; once it is
    /// taken, a schema that another migration committed meanwhile is locked as above.
    static func takeMigrationLock(_ connection: PostgresConnection, timeout: Double) throws {
        func schemaExists() throws -> Bool {
            try connection.query("SELECT pg_catalog.to_regclass('siwa.schema_version') IS NOT NULL")[0][
                0, as: Bool.self]
        }
        if try !schemaExists() {
            let key = "pg_catalog.hashtextextended('siwa.migrate', 0)"
            let taken = try connection.query("SELECT pg_catalog.pg_try_advisory_xact_lock(\(key))")[0][
                0, as: Bool.self]
            if !taken {
                let holders =
                    try connection.query(
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
                        """)[0][0, as: String?.self] ?? "a session that has ended"
                writeErrorLine(
                    "siwactl migrate",
                    "waiting up to \(String(format: "%g", timeout)) s for the migration lock, held by \(holders)"
                )
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
                    throw ToolFailure(
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

    /// The group roles schema.sql creates (when missing) and grants to.
    static let groupRoles = [
        "siwa_admin", "siwa_receiver", "siwa_worker", "siwa_signin", "siwa_app", "siwa_webhook_admin",
    ]

    /// Writes every notice and warning the server sent so far to stderr, as psql shows them.
    static func printNotices(_ connection: PostgresConnection) {
        for notice in connection.takeNotices() {
            for line in notice.description.split(separator: "\n", omittingEmptySubsequences: false) {
                writeErrorLine("siwactl migrate", "server \(line)")
            }
        }
    }

    /// The role running this, the group roles that do not exist, and those that exist but were granted
    /// nothing in schema siwa (no USAGE).
    static func roleGaps(_ connection: PostgresConnection) throws -> (String, [String], [String]) {
        let owner = try connection.query("SELECT pg_catalog.quote_ident(current_user::text)")[0][
            0, as: String.self]
        var missing: [String] = []
        var ungranted: [String] = []
        for row in try connection.query(
            """
            SELECT r.name, r.oid IS NOT NULL, r.oid IS NOT NULL AND has_schema_privilege(r.oid, 'siwa', 'USAGE')
              FROM (SELECT g.name, (SELECT oid FROM pg_roles WHERE rolname = g.name) AS oid
                      FROM unnest($1::text[]) AS g(name)) r
            """, [.array(groupRoles.map { .text($0) })])
        {
            let name = try row[0, as: String.self]
            if !(try row[1, as: Bool.self]) {
                missing.append(name)
            } else if !(try row[2, as: Bool.self]) {
                ungranted.append(name)
            }
        }
        return (owner, missing, ungranted)
    }

    /// What is wrong and the two ways to fix it.
    static func roleGapMessage(owner: String, missing: [String], ungranted: [String]) -> String {
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
                    SELECT EXISTS (SELECT 1 FROM aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) g
                                    WHERE g.grantee = 0 AND g.privilege_type = 'CREATE'),
                           (SELECT string_agg(quote_ident(r.rolname), ', ' ORDER BY r.rolname)
                              FROM pg_roles r
                             WHERE r.rolcanlogin AND NOT r.rolsuper AND r.rolname <> current_user
                               AND has_schema_privilege(r.oid, n.oid, 'CREATE'))
                      FROM pg_namespace n
                     WHERE n.nspname = $1
                    """, [.text(schema)]
                ).first
            else { continue }
            let everyone = try row[0, as: Bool.self]
            let roles = try row[1, as: String?.self]
            guard everyone || roles != nil else { continue }
            let name = try connection.query("SELECT quote_ident($1)", [.text(schema)])[0][0, as: String.self]
            let who = everyone ? "every role (CREATE is granted to PUBLIC)" : "these roles: \(roles ?? "")"
            warnings.append(
                "\(who) may create objects in schema \(name), which is on this session's search_path: "
                    + "such objects can take the place of PostgreSQL's own in sessions and hooks that use this "
                    + "path. Unless that is intended: REVOKE CREATE ON SCHEMA \(name) FROM "
                    + (everyone ? "PUBLIC." : "\(roles ?? "")."))
        }
        return warnings
    }

    /// The highest version recorded in `siwa.schema_version`, or nil on a database without the schema.
    static func currentVersion(_ connection: PostgresConnection) throws -> Int? {
        guard try relationExists("siwa.schema_version", on: connection) else { return nil }
        return try connection.query("SELECT max(version) FROM siwa.schema_version")[0][0, as: Int?.self]
    }
}
