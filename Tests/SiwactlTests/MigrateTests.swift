import Foundation
import Postgres
import SiwaSchema
import TestSupport
import Testing

@Suite("siwactl migrate")
struct MigrateTests {
    @Test("the embedded schema is exactly the repository's schema.sql")
    func embeddedSchemaMatchesFile() throws {
        let file = try String(
            contentsOf: RepositoryRoot.url.appendingPathComponent("schema.sql"), encoding: .utf8)
        #expect(SiwaSchema.sql == file)
        #expect(SiwaSchema.version >= 1)
    }

    @Test("migrates an empty database, then again without changing or dropping anything")
    func migratesTwice() throws {
        let database = try TestDatabase(withSchema: false)
        let first = try siwactl(["migrate", "--database-url", database.url])
        #expect(first.status == 0, "\(first.standardError)")
        #expect(first.standardOutput.contains("schema version before: none"))
        #expect(first.standardOutput.contains("schema version after: \(SiwaSchema.version)"))
        let recorded = try database.query("SELECT max(version) FROM siwa.schema_version")[0][0, as: Int.self]
        #expect(recorded == SiwaSchema.version)

        try database.insert(jti: "kept-across-migrations", state: "dead")
        let second = try siwactl(["migrate", "--database-url", database.url])
        #expect(second.status == 0, "\(second.standardError)")
        #expect(second.standardOutput.contains("schema version before: \(SiwaSchema.version)"))
        #expect(second.standardOutput.contains("schema version after: \(SiwaSchema.version)"))
        #expect(try database.state(of: "kept-across-migrations") == "dead")
    }

    @Test("a copy of the binary far from the source tree migrates (the schema is embedded)")
    func copiedBinaryMigrates() throws {
        let database = try TestDatabase(withSchema: false)
        let directory = try scratchDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let copy = directory.appendingPathComponent("siwactl")
        try FileManager.default.copyItem(at: ExecutableLocator.url(named: "siwactl"), to: copy)
        let result = try Subprocess.run(
            copy.path, ["migrate"],
            environment: ProcessInfo.processInfo.environment.merging(["SIWA_DATABASE_URL": database.url]) {
                $1
            },
            workingDirectory: directory.path)
        #expect(result.status == 0, "\(result.standardError)")
        #expect(try database.query("SELECT count(*) FROM siwa.event_history")[0][0, as: Int.self] == 0)
    }

    @Test("refuses a database whose schema is newer than the binary")
    func refusesNewerDatabase() throws {
        let database = try TestDatabase()
        try database.query(
            "INSERT INTO siwa.schema_version (version, description) VALUES ($1, 'from the future')",
            [.int(Int64(SiwaSchema.version + 1))])
        let result = try siwactl(["migrate", "--database-url", database.url])
        #expect(result.status == 1)
        #expect(result.standardError.contains("newer than this binary"))
    }

    @Test("without a database URL it is a usage error")
    func needsDatabaseURL() throws {
        let result = try siwactl(["migrate"])
        #expect(result.status == 2)
        #expect(result.standardError.contains("SIWA_DATABASE_URL"))
    }
}
