import Foundation
import Migrator
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
            schema grants to (siwa_admin, siwa_receiver, siwa_worker, siwa_signin, siwa_app,
            siwa_webhook_admin, siwa_mail) is missing because this role may not create it, saying how to
            fix it. One migration at a time: it waits for another siwactl migrate by a lock only the
            schema's owner can take (siwa.schema_version);
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
        let report: Migrator.Report
        do {
            report = try Migrator.migrate(connection, lockTimeout: lockTimeout) { progress in
                switch progress {
                case .waitingForLock(let holders, let timeout):
                    writeErrorLine(
                        spec.name,
                        "waiting up to \(String(format: "%g", timeout)) s for the migration lock, held by \(holders)"
                    )
                }
            }
        } catch {
            print(error.report)
            throw ToolFailure(error.description)
        }
        print(report)
        if let gaps = report.roleGaps, !gaps.isEmpty { throw ToolFailure(gaps.advice) }
    }

    /// Prints what a migration found: warnings and the server's notices on stderr (notices as psql
    /// shows them), the versions on stdout.
    static func print(_ report: Migrator.Report) {
        for warning in report.warnings { writeErrorLine(spec.name, "warning: \(warning)") }
        if let before = report.versionBefore { writeStandardOutput("schema version before: \(before)\n") }
        for notice in report.notices {
            for line in notice.description.split(separator: "\n", omittingEmptySubsequences: false) {
                writeErrorLine(spec.name, "server \(line)")
            }
        }
        if let after = report.versionAfter { writeStandardOutput("schema version after: \(after)\n") }
    }
}
