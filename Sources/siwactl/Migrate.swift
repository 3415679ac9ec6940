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
            """,
        options: [databaseOption])

    static let verb = Verb(name: "migrate", abstract: "Apply the embedded schema.sql to a database.") {
        arguments, environment in
        switch parse(spec, arguments, environment) {
        case .failure(let exit): return exit.status
        case .success(let parsed): return await runReportingFailure(spec.name) { try run(parsed) }
        }
    }

    static func run(_ parsed: ParsedCommand) throws {
        let connection = try connect(parsed)
        defer { connection.close() }
        let before = try database("reading the schema version") { try currentVersion(connection) }
        writeOut("schema version before: \(before.map(String.init) ?? "none")\n")
        if let before, before > SiwaSchema.version {
            throw ToolFailure(
                "the database is at schema version \(before), newer than this binary's \(SiwaSchema.version); not migrating"
            )
        }
        try database("applying the schema") {
            try connection.transaction { connection in
                // One migration at a time: a second siwactl waits here, then finds nothing to do.
                try connection.query("SELECT pg_advisory_xact_lock(hashtextextended('siwa.migrate', 0))")
                try connection.simpleQuery(SiwaSchema.sql)
            }
        }
        let after = try database("reading the schema version") { try currentVersion(connection) }
        writeOut("schema version after: \(after.map(String.init) ?? "none")\n")
    }

    /// The highest version recorded in `siwa.schema_version`, or nil on a database without the schema.
    static func currentVersion(_ connection: PostgresConnection) throws -> Int? {
        guard try relationExists("siwa.schema_version", on: connection) else { return nil }
        return try connection.query("SELECT max(version) FROM siwa.schema_version")[0][0, as: Int?.self]
    }
}
