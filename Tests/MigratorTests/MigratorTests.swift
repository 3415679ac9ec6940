import Migrator
import Postgres
import SiwaSchema
import Synchronization
import TestSupport
import Testing

/// The migration as a library, in process: the report `siwactl migrate` prints, without the command.
@Suite("Migrator in process: versions, warnings, the lock and the group roles")
struct MigratorTests {
    @Test("an empty database is brought to this build's version, and a second run finds it there")
    func migratesTwice() throws {
        let database = try TestDatabase(.empty)
        let connection = try database.connect()
        defer { connection.close() }
        let first = try Migrator.migrate(connection, lockTimeout: 5)
        #expect(first.versionBefore == Migrator.SchemaVersion.none)
        #expect(first.versionAfter == .version(SiwaSchema.version))
        #expect(first.warnings.isEmpty)
        #expect(first.roleGaps?.isEmpty == true)

        let again = try database.connect()
        defer { again.close() }
        let second = try Migrator.migrate(again, lockTimeout: 5)
        #expect(second.versionBefore == .version(SiwaSchema.version))
        #expect(second.versionAfter == .version(SiwaSchema.version))
    }

    @Test("a database newer than this build is refused before anything is applied")
    func refusesNewerDatabase() throws {
        let database = try TestDatabase()
        try database.query(
            "INSERT INTO siwa.schema_version (version, description) VALUES ($1, 'from the future')",
            [.int(Int64(SiwaSchema.version + 1))])
        let connection = try database.connect()
        defer { connection.close() }
        let error = #expect(throws: MigratorError.self) { try Migrator.migrate(connection, lockTimeout: 5) }
        #expect(error?.code == .newerDatabase)
        #expect(error?.description.contains("newer than this binary") == true)
        #expect(error?.report.versionBefore == .version(SiwaSchema.version + 1))
        #expect(error?.report.versionAfter == nil)
    }

    @Test("CREATE on public for every role is one warning, and the schema is still applied")
    func warnsAboutPublicCreate() throws {
        let database = try TestDatabase(.empty)
        try database.query("GRANT CREATE ON SCHEMA public TO PUBLIC")
        let connection = try database.connect()
        defer { connection.close() }
        let report = try Migrator.migrate(connection, lockTimeout: 5)
        #expect(report.warnings.count == 1)
        #expect(
            report.warnings.first?.hasPrefix(
                "every role (CREATE is granted to PUBLIC) may create objects in schema public") == true)
        #expect(report.warnings.first?.hasSuffix("REVOKE CREATE ON SCHEMA public FROM PUBLIC.") == true)
        #expect(report.versionAfter == .version(SiwaSchema.version))
    }

    @Test(
        "on a database without the schema, another login's advisory lock is waited for, named, then refused")
    func lockTimeoutNamesTheHolder() throws {
        let database = try TestDatabase(.empty)
        let intruder = try database.connect(asMemberOf: nil)
        defer { intruder.close() }
        try intruder.query("SELECT pg_advisory_lock(hashtextextended('siwa.migrate', 0))")
        let pid = try intruder.query("SELECT pg_backend_pid()")[0][0, as: Int.self]
        let connection = try database.connect()
        defer { connection.close() }
        let said = Mutex<[Migrator.Progress]>([])
        let error = #expect(throws: MigratorError.self) {
            try Migrator.migrate(connection, lockTimeout: 0.2) { progress in
                said.withLock { $0.append(progress) }
            }
        }
        #expect(error?.code == .lockTimeout)
        #expect(error?.description.contains("by pid \(pid) (role ") == true)
        #expect(error?.report.versionBefore == Migrator.SchemaVersion.none)
        let progress = said.withLock { $0 }
        #expect(progress.count == 1)
        if case .waitingForLock(let holders, let timeout)? = progress.first {
            #expect(holders.hasPrefix("pid \(pid) (role "))
            #expect(timeout == 0.2)
        }
        #expect(try database.value("SELECT to_regclass('siwa.schema_version') IS NULL", as: Bool.self))
    }

    @Test(
        "an owner without CREATEROLE gets the schema, the server's warnings and the missing roles with their fix"
    )
    func reportsMissingGroupRoles() throws {
        // A cluster of its own: the shared one already has the group roles.
        let cluster = try PostgresCluster.start()
        defer { cluster.destroy() }
        let owner = try PostgresConnection(
            configuration: PostgresConfiguration(try cluster.createDatabase("siwa", ownedBy: "siwa_owner")))
        defer { owner.close() }

        let report = try Migrator.migrate(owner, lockTimeout: 5)
        #expect(report.versionAfter == .version(SiwaSchema.version))
        #expect(report.roleGaps?.missing == Migrator.groupRoles)
        #expect(report.roleGaps?.ungranted == [])
        for role in Migrator.groupRoles {
            #expect(
                report.notices.contains {
                    $0.severity == "WARNING"
                        && $0.message.hasPrefix(
                            "role \(role) does not exist and siwa_owner may not create it")
                }, "\(report.notices)")
        }
        let advice = report.roleGaps?.advice ?? ""
        #expect(advice.contains("ALTER ROLE siwa_owner CREATEROLE;"))
        #expect(advice.contains("CREATE ROLE siwa_webhook_admin NOLOGIN;"))
    }
}
