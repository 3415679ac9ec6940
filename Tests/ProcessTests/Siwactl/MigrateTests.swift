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
        let database = try TestDatabase(.empty)
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
        let database = try TestDatabase(.empty)
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
        let database = try TestDatabase(.empty)
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
        let database = try TestDatabase(.empty)
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
        let database = try TestDatabase(.empty)
        let attacker = try Self.attacker(database)
        try database.query("GRANT CREATE ON SCHEMA public TO \(attacker)")
        let result = try siwactl(["migrate", "--database-url", database.url])
        #expect(result.status == 0, "\(result.standardError)")
        #expect(result.standardError.contains("these roles: \(attacker) may create objects in schema public"))
    }

    @Test("says nothing when only the owner and superusers may create objects on the path")
    func quietByDefault() throws {
        let database = try TestDatabase(.empty)
        let result = try siwactl(["migrate", "--database-url", database.url])
        #expect(result.status == 0, "\(result.standardError)")
        #expect(!result.standardError.contains("warning"), "\(result.standardError)")
    }
}

/// The schema.sql of every released schema version (Tests/Fixtures/released-schemas/schema-vN.sql), by
/// version, oldest first.
func releasedSchemas() throws -> [(version: Int, sql: String)] {
    let directory = RepositoryRoot.url.appendingPathComponent("Tests/Fixtures/released-schemas")
    return try FileManager.default.contentsOfDirectory(atPath: directory.path)
        .compactMap { name -> (Int, String)? in
            guard name.hasPrefix("schema-v"), name.hasSuffix(".sql"),
                let version = Int(name.dropFirst("schema-v".count).dropLast(".sql".count))
            else { return nil }
            return (version, try String(contentsOf: directory.appendingPathComponent(name), encoding: .utf8))
        }
        .sorted { $0.0 < $1.0 }
}

/// Everything about schema `siwa` that an upgrade must get right, one line per catalog entry, without
/// OIDs or timestamps: relations with their grants, columns in order, constraints, indexes, views,
/// composite types, functions (their whole definition, SET search_path included) with grants, triggers,
/// comments, the schema's grants, and the recorded versions.
func catalog(_ connection: PostgresConnection) throws -> [String] {
    let acl = "(SELECT coalesce(string_agg(a::text, ',' ORDER BY a::text), '') FROM unnest(%@) AS a)"
    let query = """
        WITH rel AS (SELECT c.* FROM pg_class c WHERE c.relnamespace = 'siwa'::regnamespace)
        SELECT 'schema ' || \(acl.replacingOccurrences(of: "%@", with: "n.nspacl")) || ' '
               || coalesce(obj_description(n.oid, 'pg_namespace'), '')
          FROM pg_namespace n WHERE n.nspname = 'siwa'
        UNION ALL
        SELECT 'relation ' || r.relname || ' ' || r.relkind::text || ' ' || r.relpersistence::text || ' '
               || \(acl.replacingOccurrences(of: "%@", with: "r.relacl")) || ' '
               || coalesce(obj_description(r.oid, 'pg_class'), '')
          FROM rel r WHERE r.relkind <> 'i'
        UNION ALL
        SELECT 'column ' || r.relname || ' '
               || row_number() OVER (PARTITION BY r.oid ORDER BY a.attnum) || ' ' || a.attname || ' '
               || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull || ' ' || a.attidentity::text || ' '
               || coalesce(pg_get_expr(d.adbin, d.adrelid), '') || ' '
               || \(acl.replacingOccurrences(of: "%@", with: "a.attacl")) || ' '
               || coalesce(col_description(r.oid, a.attnum), '')
          FROM rel r JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
          LEFT JOIN pg_attrdef d ON d.adrelid = r.oid AND d.adnum = a.attnum
        UNION ALL
        SELECT 'constraint ' || coalesce(r.relname, '') || ' ' || c.conname || ' ' || pg_get_constraintdef(c.oid)
               || ' validated ' || c.convalidated
          FROM pg_constraint c LEFT JOIN pg_class r ON r.oid = c.conrelid
         WHERE c.connamespace = 'siwa'::regnamespace
        UNION ALL
        SELECT 'index ' || pg_get_indexdef(r.oid) FROM rel r WHERE r.relkind = 'i'
        UNION ALL
        SELECT 'view ' || r.relname || ' ' || pg_get_viewdef(r.oid) FROM rel r WHERE r.relkind = 'v'
        UNION ALL
        SELECT 'type ' || t.typname || ' ' || t.typtype::text || ' '
               || \(acl.replacingOccurrences(of: "%@", with: "t.typacl")) || ' '
               || coalesce(obj_description(t.oid, 'pg_type'), '')
          FROM pg_type t WHERE t.typnamespace = 'siwa'::regnamespace
        UNION ALL
        SELECT 'function ' || pg_get_functiondef(p.oid) || ' '
               || \(acl.replacingOccurrences(of: "%@", with: "p.proacl")) || ' '
               || coalesce(obj_description(p.oid, 'pg_proc'), '')
          FROM pg_proc p WHERE p.pronamespace = 'siwa'::regnamespace
        UNION ALL
        SELECT 'trigger ' || pg_get_triggerdef(t.oid) || ' ' || t.tgenabled::text
          FROM pg_trigger t JOIN rel r ON r.oid = t.tgrelid WHERE NOT t.tgisinternal
        UNION ALL
        SELECT 'version ' || v.version || ' ' || v.description FROM siwa.schema_version v
        ORDER BY 1
        """
    return try connection.query(query).map { try $0[0, as: String.self] }
}

/// Per notification (by jti): email, raw token, error and whether it is marked erased.
func personalData(_ connection: PostgresConnection) throws -> [String: String] {
    var result: [String: String] = [:]
    for row in try connection.query(
        """
        SELECT jti, concat_ws(' | ', coalesce(email, ''), coalesce(raw_token, ''), coalesce(last_error, ''),
                             (personal_data_erased_at IS NOT NULL)::text)
          FROM siwa.notifications
        """)
    {
        result[try row[0, as: String.self]] = try row[1, as: String.self]
    }
    return result
}

/// The pending notifications' next attempt and attempts, by jti.
func queued(_ connection: PostgresConnection) throws -> [String: String] {
    var result: [String: String] = [:]
    for row in try connection.query(
        "SELECT jti, next_attempt_at::text || ' ' || attempts FROM siwa.notifications WHERE state = 'pending'"
    ) {
        result[try row[0, as: String.self]] = try row[1, as: String.self]
    }
    return result
}

/// The rows of the tables, as JSON objects in id order, without the columns in `without`.
func contents(_ connection: PostgresConnection, without: [String] = []) throws -> [String: String] {
    let drop = without.map { " - '\($0)'" }.joined()
    var result: [String: String] = [:]
    for (table, order) in [
        ("notifications", "id"), ("accounts", "sub"), ("sessions", "id"), ("refresh_tokens", "id"),
        ("settings", "singleton"),
    ] {
        result[table] = try connection.query(
            "SELECT coalesce(jsonb_agg(to_jsonb(t)\(drop) ORDER BY t.\(order))::text, '[]') FROM siwa.\(table) t"
        )[0][0, as: String.self]
    }
    return result
}

@Suite("siwactl migrate: upgrades from every released schema version")
struct MigrateUpgradeTests {
    /// The catalog of a database freshly migrated by the binary.
    static func freshCatalog() throws -> [String] {
        let fresh = try TestDatabase(.empty)
        let result = try siwactl(["migrate", "--database-url", fresh.url])
        guard result.status == 0 else {
            throw ExecutableError("fresh migrate failed: \(result.standardError)")
        }
        let connection = try fresh.connect()
        defer { connection.close() }
        return try catalog(connection)
    }

    /// Notifications in every state, accounts (one deleted and erased), sessions and refresh tokens, made
    /// by the released version's own functions where it has them.
    static func seed(_ connection: PostgresConnection) throws {
        try connection.simpleQuery(
            """
            INSERT INTO siwa.sessions (sub, created_at) VALUES
                ('001.alice', now() - interval '2 days'), ('001.alice', now() + interval '1 day'),
                ('001.carol', now() - interval '2 days'), ('001.erin', now());
            INSERT INTO siwa.refresh_tokens (sub, client_id, token_sha256, token_ciphertext, created_at) VALUES
                ('001.alice', 'com.example.app', '\\x01', '\\x0a', now() - interval '2 days'),
                ('001.carol', 'com.example.app', '\\x02', '\\x0b', now() - interval '2 days');
            INSERT INTO siwa.notifications (jti, event_type, sub, audience, email, is_private_email, event_time,
                                            issued_at, expires_at, raw_token) VALUES
                ('u-applied', 'consent-revoked', '001.alice', 'com.example.app', NULL, NULL, now(), now(),
                 now() + interval '1 day', 'h.p.s1'),
                ('u-email', 'email-disabled', '001.bob', 'com.example.app', 'bob@privaterelay.appleid.com',
                 true, now(), now(), NULL, 'h.p.s2'),
                ('u-erased-email', 'email-enabled', '001.carol', 'com.example.app',
                 'carol@privaterelay.appleid.com', true, now() - interval '1 hour', now(), NULL, 'h.p.s3'),
                ('u-deleted', 'account-delete', '001.carol', 'com.example.app', NULL, NULL, now(), now(), NULL,
                 'h.p.s4'),
                ('u-skipped', 'some-future-type', '001.dave', 'com.example.app', NULL, NULL, now(), now(), NULL,
                 'h.p.s5'),
                ('u-dead', 'consent-revoked', '001.erin', 'com.example.app', NULL, NULL, now(), now(), NULL,
                 'h.p.s6');
            SELECT count(*) FROM siwa.process_due_notifications(100, 5, interval '1 second');
            -- What the released record_failure leaves after its last attempt.
            UPDATE siwa.notifications SET state = 'dead', attempts = 5, applied_at = NULL,
                   last_error = 'P0001: the hook refused ''erin@example.com'' for erin@example.com'
             WHERE jti = 'u-dead';
            -- After carol's erasure, version 1 kept a late event's email and token, and its error's text.
            INSERT INTO siwa.notifications (jti, event_type, sub, audience, email, is_private_email, event_time,
                                            issued_at, raw_token, state, attempts, last_error)
            VALUES ('u-late', 'email-disabled', '001.carol', 'com.example.app', 'carol@privaterelay.appleid.com',
                    true, now(), now(), 'h.p.s9', 'dead', 5, 'P0001: refused carol@privaterelay.appleid.com');
            -- Waiting: one never tried, one retrying after a failure.
            INSERT INTO siwa.notifications (jti, event_type, sub, audience, event_time, issued_at, raw_token)
            VALUES ('u-pending', 'consent-revoked', '001.erin', 'com.example.app', now(), now(), 'h.p.s7'),
                   ('u-retrying', 'email-enabled', '001.bob', 'com.example.app', now(), now(), 'h.p.s8');
            UPDATE siwa.notifications SET attempts = 2, last_error = '55P03: lock timeout',
                   next_attempt_at = now() + interval '1 hour'
             WHERE jti = 'u-retrying';
            """)
    }

    @Test(
        "from each released version, with data in every state, it ends identical to a fresh install and keeps every row",
        arguments: try releasedSchemas().map(\.version))
    func upgradesReleasedVersion(version: Int) throws {
        let released = try #require(try releasedSchemas().first { $0.version == version })
        #expect(released.version <= SiwaSchema.version)
        let database = try TestDatabase(.empty)
        let connection = try database.connect()
        defer { connection.close() }
        try connection.simpleQuery(released.sql)
        try Self.seed(connection)
        let states = try connection.query("SELECT DISTINCT state FROM siwa.notifications ORDER BY 1")
            .map { try $0[0, as: String.self] }
        #expect(states == ["applied", "dead", "pending", "skipped"])
        #expect(
            try connection.query(
                "SELECT count(*) FROM siwa.accounts WHERE personal_data_erased_at IS NOT NULL")[0][
                    0, as: Int.self] == 1)
        let personal = ["email", "raw_token", "last_error", "personal_data_erased_at"]
        // A finished notification has no next attempt from version 3 on (NULL); a pending one keeps it.
        // service_format came with version 5 (false for rows the app stored, as these are).
        let before = try contents(
            connection,
            without: [
                "busy_since", "hook_search_path", "changes_retention", "next_attempt_at", "service_format",
                // auto-disable's columns, new in version 5
                "webhook_auto_disable_after", "failing_since", "disabled_reason",
                // the relay-mail gate's setting, new in version 5
                "relay_mail_after_consent_revoked",
            ]
                + personal)
        let personalBefore = try personalData(connection)
        let queuedBefore = try queued(connection)

        let result = try siwactl(["migrate", "--database-url", database.url])
        #expect(result.status == 0, "\(result.standardError)")
        #expect(result.standardOutput.contains("schema version before: \(released.version)"))
        #expect(result.standardOutput.contains("schema version after: \(SiwaSchema.version)"))

        let upgraded = try catalog(connection)
        let fresh = try Self.freshCatalog()
        #expect(upgraded.count == fresh.count)
        #expect(Array(Set(upgraded).subtracting(fresh)).sorted() == [], "only in the upgraded database")
        #expect(Array(Set(fresh).subtracting(upgraded)).sorted() == [], "only in a fresh install")
        #expect(
            try contents(
                connection,
                without: [
                    "busy_since", "hook_search_path", "changes_retention", "next_attempt_at",
                    "service_format",
                    // auto-disable's columns, new in version 5
                    "webhook_auto_disable_after", "failing_since", "disabled_reason",
                    // the relay-mail gate's setting, new in version 5
                    "relay_mail_after_consent_revoked",
                ] + personal
            )
                == before)
        #expect(
            try connection.query("SELECT count(*) FROM siwa.refresh_tokens WHERE service_format")[0][
                0, as: Int.self] == 0)
        #expect(try queued(connection) == queuedBefore)
        // Personal data and error texts are what version 2 would have written: errors redacted, and
        // nothing left of the erased account's late notification. (From version 2 on they are moved as
        // they are: what the seed wrote by hand into version 2 is the admins' own.)
        var expected = personalBefore
        if released.version < 2 {
            expected["u-dead"] = " | h.p.s6 | P0001: the hook refused '…' for …@… | false"
            expected["u-late"] = " |  | P0001: (erased with the account's personal data) | true"
        }
        #expect(try personalData(connection) == expected)

        // And it works: the waiting notifications are applied by this version's functions.
        try connection.query("UPDATE siwa.notifications SET next_attempt_at = now() WHERE state = 'pending'")
        let outcomes = try connection.query(
            "SELECT outcome FROM siwa.process_due_notifications(10, 5, interval '1 second')"
        ).map { try $0[0, as: String.self] }
        #expect(outcomes == ["applied", "applied"])
        let again = try siwactl(["migrate", "--database-url", database.url])
        #expect(again.status == 0, "\(again.standardError)")
        #expect(try catalog(connection) == fresh)
    }

    @Test("re-run on the current version, it changes nothing in the catalog")
    func rerunChangesNothing() throws {
        let database = try TestDatabase(.empty)
        let first = try siwactl(["migrate", "--database-url", database.url])
        #expect(first.status == 0, "\(first.standardError)")
        let connection = try database.connect()
        defer { connection.close() }
        let once = try catalog(connection)
        #expect(once == (try Self.freshCatalog()))
        let second = try siwactl(["migrate", "--database-url", database.url])
        #expect(second.status == 0, "\(second.standardError)")
        #expect(try catalog(connection) == once)
        #expect(
            try connection.query("SELECT array_agg(version ORDER BY version)::text FROM siwa.schema_version")[
                0][
                    0, as: String.self] == "{"
                + (1...SiwaSchema.version).map(String.init).joined(separator: ",") + "}")
    }

    @Test(
        "rows of a released version that break the new CHECK constraints stop the upgrade, named, with nothing changed"
    )
    func refusesRowsBreakingInvariants() throws {
        let released = try #require(try releasedSchemas().first)
        let database = try TestDatabase(.empty)
        let connection = try database.connect()
        defer { connection.close() }
        try connection.simpleQuery(released.sql)
        try Self.seed(connection)
        // Edited by hand: marked applied without a time, and dead without a reason.
        try connection.simpleQuery(
            """
            UPDATE siwa.notifications SET state = 'applied', applied_at = NULL WHERE jti = 'u-pending';
            UPDATE siwa.notifications SET state = 'dead' WHERE jti = 'u-applied';
            """)
        let before = try catalog(connection)
        let result = try siwactl(["migrate", "--database-url", database.url])
        #expect(result.status == 1)
        #expect(
            result.standardError.contains("notifications_applied_at_check: 2 rows"), "\(result.standardError)"
        )
        #expect(
            result.standardError.contains("notifications_dead_error_check: 1 rows"), "\(result.standardError)"
        )
        #expect(!result.standardError.contains("notifications_erased_check"), "\(result.standardError)")
        #expect(try catalog(connection) == before)

        try connection.simpleQuery(
            """
            UPDATE siwa.notifications SET state = 'pending' WHERE jti = 'u-pending';
            UPDATE siwa.notifications SET state = 'applied' WHERE jti = 'u-applied';
            """)
        let fixed = try siwactl(["migrate", "--database-url", database.url])
        #expect(fixed.status == 0, "\(fixed.standardError)")
        #expect(fixed.standardOutput.contains("schema version after: \(SiwaSchema.version)"))
    }

    @Test(
        "from version 4, the sign-in API's stored tokens are marked as the service's format and the app's are not"
    )
    func marksServiceFormatFromVersion4() throws {
        let released = try #require(try releasedSchemas().first { $0.version == 4 })
        let database = try TestDatabase(.empty)
        let connection = try database.connect()
        defer { connection.close() }
        try connection.simpleQuery(released.sql)
        // A ciphertext with the service's layout: format 1, key id "k1", 12-byte nonce, body, 16-byte tag.
        let layout = "\\x01026b31" + String(repeating: "00", count: 12 + 8 + 16)
        try connection.simpleQuery(
            """
            SELECT siwa.record_sign_in('\\x0a', 'com.example.app', '001.signed', NULL, NULL, NULL, NULL,
                                       '\\x0b', '\(layout)');
            INSERT INTO siwa.refresh_tokens (sub, client_id, token_sha256, token_ciphertext) VALUES
                ('001.app', 'com.example.app', '\\x0c', '\(layout)'),
                ('001.signed', 'com.example.app', '\\x0d', 'app-own-format');
            """)
        let result = try siwactl(["migrate", "--database-url", database.url])
        #expect(result.status == 0, "\(result.standardError)")
        #expect(
            try connection.query(
                "SELECT sub, token_sha256 = '\\x0b' FROM siwa.refresh_tokens WHERE service_format ORDER BY id"
            ).map { "\(try $0[0, as: String.self]) \(try $0[1, as: Bool.self])" } == ["001.signed true"])
    }

    @Test("schema.sql applied as psql does to a database newer than it refuses, changing nothing")
    func schemaRefusesNewerDatabase() throws {
        let database = try TestDatabase()
        let connection = try database.connect()
        defer { connection.close() }
        try connection.simpleQuery(
            """
            INSERT INTO siwa.schema_version (version, description) VALUES (\(SiwaSchema.version + 1), 'from the future');
            CREATE OR REPLACE FUNCTION siwa.requeue(p_jti text DEFAULT NULL, p_state text DEFAULT NULL,
                                                    p_since timestamptz DEFAULT NULL)
            RETURNS integer LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$ SELECT 42 $$;
            """)
        let before = try catalog(connection)
        var refusal = "(applied)"
        do {
            try connection.simpleQuery(SiwaSchema.sql)
        } catch {
            refusal = error.message
        }
        #expect(refusal.contains("newer than this schema.sql"), "\(refusal)")
        #expect(try catalog(connection) == before)
    }

    @Test("the file's refusal names the version this file brings, the one the binary reports")
    func refusalNamesTheVersion() {
        #expect(SiwaSchema.sql.contains("IF v_from > \(SiwaSchema.version) THEN"))
        #expect(SiwaSchema.sql.contains("newer than this schema.sql (version \(SiwaSchema.version))"))
    }
}
