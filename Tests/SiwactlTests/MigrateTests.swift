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

@Suite("siwactl migrate and the search_path")
struct MigrateSearchPathTests {
    /// A login role that belongs to no siwa role, created once per cluster; never a superuser here.
    static func attacker(_ database: TestDatabase) throws -> String {
        let name = "siwa_test_mallory"
        try database.query(
            """
            DO $$ BEGIN
                IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '\(name)') THEN
                    CREATE ROLE \(name) LOGIN;
                END IF;
            END $$
            """)
        try database.query("ALTER ROLE \(name) NOSUPERUSER")
        return name
    }

    @Test("run by a superuser owner, it runs nothing a role with CREATE on public planted there")
    func plantedFunctionsNeverRun() throws {
        let database = try TestDatabase(withSchema: false)
        let attacker = try Self.attacker(database)
        try database.query("GRANT CREATE ON SCHEMA public TO PUBLIC")  // PostgreSQL ≤ 14's default
        let cluster = try PostgresCluster.shared
        let connection = try PostgresConnection(
            configuration: PostgresConfiguration(
                "host=\(cluster.socketDirectory) port=\(cluster.port) dbname=\(database.configuration.database ?? "") user=\(attacker)"
            ))
        defer { connection.close() }
        // Each would make the attacker a superuser if the owner's session called it.
        try connection.simpleQuery(
            """
            CREATE TABLE public.ran (what text);
            GRANT INSERT ON public.ran TO PUBLIC;
            CREATE FUNCTION public.hashtextextended(text, integer) RETURNS bigint LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO public.ran VALUES ('hashtextextended');
                EXECUTE 'ALTER ROLE \(attacker) SUPERUSER';
                RETURN 0;
            END $$;
            CREATE FUNCTION public.format(text, text) RETURNS text LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO public.ran VALUES ('format');
                EXECUTE 'ALTER ROLE \(attacker) SUPERUSER';
                RETURN pg_catalog.format($1, VARIADIC ARRAY[$2]);
            END $$;
            CREATE FUNCTION public.to_regclass(text) RETURNS regclass LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO public.ran VALUES ('to_regclass');
                EXECUTE 'ALTER ROLE \(attacker) SUPERUSER';
                RETURN pg_catalog.to_regclass($1);
            END $$;
            """)
        for _ in 0..<2 {  // a first migration, then an upgrade of an existing schema
            let result = try siwactl(["migrate", "--database-url", database.url])
            #expect(result.status == 0, "\(result.standardError)")
        }
        #expect(
            try database.query("SELECT rolsuper FROM pg_roles WHERE rolname = $1", [.text(attacker)])[0][
                0, as: Bool.self] == false)
        #expect(try database.query("SELECT count(*) FROM public.ran")[0][0, as: Int.self] == 0)
    }

    @Test("warns on stderr, and still migrates, when every role may create objects in public")
    func warnsWhenPublicMayCreate() throws {
        let database = try TestDatabase(withSchema: false)
        try database.query("GRANT CREATE ON SCHEMA public TO PUBLIC")
        let result = try siwactl(["migrate", "--database-url", database.url])
        #expect(result.status == 0, "\(result.standardError)")
        #expect(
            result.standardError.contains(
                "warning: every role (CREATE is granted to PUBLIC) may create objects in schema public"))
        #expect(result.standardError.contains("REVOKE CREATE ON SCHEMA public FROM PUBLIC"))
        #expect(result.standardOutput.contains("schema version after: \(SiwaSchema.version)"))
    }

    @Test("names the roles other than the owner that may create objects in a schema on the path")
    func warnsAboutOneRole() throws {
        let database = try TestDatabase(withSchema: false)
        let attacker = try Self.attacker(database)
        try database.query("GRANT CREATE ON SCHEMA public TO \(attacker)")
        let result = try siwactl(["migrate", "--database-url", database.url])
        #expect(result.status == 0, "\(result.standardError)")
        #expect(result.standardError.contains("these roles: \(attacker) may create objects in schema public"))
    }

    @Test("says nothing when only the owner and superusers may create objects on the path")
    func quietByDefault() throws {
        let database = try TestDatabase(withSchema: false)
        let result = try siwactl(["migrate", "--database-url", database.url])
        #expect(result.status == 0, "\(result.standardError)")
        #expect(!result.standardError.contains("warning"), "\(result.standardError)")
    }
}
