import Foundation
import Postgres
import TestSupport
import Testing

/// What a role that may create objects in `public` plants there (PostgreSQL ≤ 14 lets every role do so
/// by default): functions and an operator that win overload resolution over PostgreSQL's own for calls
/// the schema's functions make, each copying what it can reach (raw tokens, emails) into `public.loot`.
let plantedInPublic = """
    CREATE TABLE public.loot (what text, by_role text DEFAULT current_user);
    GRANT INSERT ON public.loot TO PUBLIC;
    -- An integer second argument matches this exactly; pg_catalog's takes bigint.
    CREATE FUNCTION public.hashtextextended(text, integer) RETURNS bigint LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO public.loot (what) VALUES ('hashtextextended');
        INSERT INTO public.loot (what)
        SELECT 'hashtextextended ' || coalesce(n.email, '') || ' ' || coalesce(n.raw_token, '')
          FROM siwa.notifications n;
        RETURN 42;
    END $$;
    -- pg_catalog has power(float8, float8) and power(numeric, numeric) only.
    CREATE FUNCTION public.power(integer, integer) RETURNS double precision LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO public.loot (what) VALUES ('power');
        RETURN pg_catalog.power($1::float8, $2::float8);
    END $$;
    -- pg_catalog has no / (double precision, integer): random() / 2 would pick this one.
    CREATE FUNCTION public.steal_division(double precision, integer) RETURNS double precision
    LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO public.loot (what) VALUES ('division');
        RETURN $1 OPERATOR(pg_catalog./) $2::float8;
    END $$;
    CREATE OPERATOR public./ (LEFTARG = double precision, RIGHTARG = integer, FUNCTION = public.steal_division);
    -- pg_catalog's unnest takes anyarray: text[] matches this one better. It would see every raw token
    -- the receiver stores, were its multi-argument unnest not expanded into pg_catalog.unnest calls.
    CREATE FUNCTION public.unnest(text[]) RETURNS SETOF text LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO public.loot (what) VALUES ('unnest ' || pg_catalog.array_to_string($1, ','));
        RETURN QUERY SELECT * FROM pg_catalog.unnest($1);
    END $$;
    -- format(text, VARIADIC "any") is pg_catalog's; (text, text) is an exact match for format('%I', v_role).
    CREATE FUNCTION public.format(text, text) RETURNS text LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO public.loot (what) VALUES ('format');
        RETURN pg_catalog.format($1, VARIADIC ARRAY[$2]);
    END $$;
    """

@Suite("search_path: what another role plants in public never runs inside schema siwa")
struct SearchPathTests {
    @Test("every function in schema siwa pins its search_path to pg_catalog, pg_temp")
    func everyFunctionPinsItsPath() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let unpinned = try owner.query(
            """
            SELECT p.oid::regprocedure::text FROM pg_proc p
             WHERE p.pronamespace = 'siwa'::regnamespace
               AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)
             ORDER BY 1
            """
        ).map { try $0[0, as: String.self] }
        #expect(unpinned == [])
        let functions = try owner.query(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'siwa'::regnamespace")[0][0, as: Int.self]
        #expect(functions >= 13)
    }

    @Test("every CREATE FUNCTION in schema.sql carries a SET search_path clause before its body")
    func everyDefinitionSetsThePath() throws {
        var definitions = 0
        var rest = Substring(TestSchema.sql)
        while let start = rest.range(
            of: #"(?m)^\s*CREATE (OR REPLACE )?FUNCTION"#, options: .regularExpression)
        {
            let header = rest[start.lowerBound...].prefix { $0 != "$" }  // up to the body's dollar quote
            #expect(header.contains("SET search_path = pg_catalog, pg_temp"), "\(header.prefix(80))")
            definitions += 1
            rest = rest[start.upperBound...]
        }
        #expect(definitions >= 13)
    }

    @Test("upgraded from the released version 1, the never-replaced default hook is pinned too")
    func upgradePinsDefaultHook() throws {
        let owner = try PostgresConnection(
            configuration: PostgresCluster.shared.createDatabase(applying: try releasedVersion1()))
        defer { owner.close() }
        #expect(
            try owner.query(
                "SELECT proconfig IS NULL FROM pg_proc WHERE oid = 'siwa.on_event(text, text, timestamptz, text, text)'::regprocedure"
            )[0][0, as: Bool.self])
        try TestSchema.apply(on: owner)
        let config = try owner.query(
            "SELECT proconfig::text FROM pg_proc WHERE oid = 'siwa.on_event(text, text, timestamptz, text, text)'::regprocedure"
        )[0][0, as: String?.self]
        #expect(config == #"{"search_path=pg_catalog, pg_temp"}"#)
    }

    @Test("upgraded from the released version 1, a replaced hook is left exactly as its admin wrote it")
    func upgradeKeepsReplacedVersion1Hook() throws {
        let owner = try PostgresConnection(
            configuration: PostgresCluster.shared.createDatabase(applying: try releasedVersion1()))
        defer { owner.close() }
        try owner.simpleQuery(
            """
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text)
            RETURNS void LANGUAGE plpgsql AS $$ BEGIN NULL; END $$;
            COMMENT ON FUNCTION siwa.on_event(text, text, timestamptz, text, text) IS 'ours';
            """)
        let hook = """
            SELECT proconfig::text, prosrc, obj_description(oid, 'pg_proc') FROM pg_proc
             WHERE oid = 'siwa.on_event(text, text, timestamptz, text, text)'::regprocedure
            """
        let before = try owner.query(hook)[0]
        try TestSchema.apply(on: owner)
        let after = try owner.query(hook)[0]
        #expect(try after[0, as: String?.self] == nil)
        #expect(try after[1, as: String.self] == (try before[1, as: String.self]))
        #expect(try after[2, as: String?.self] == "ours")
    }

    @Test("upgraded from a released version 1 whose hook an admin dropped, the default hook is created")
    func upgradeWithoutHook() throws {
        let owner = try PostgresConnection(
            configuration: PostgresCluster.shared.createDatabase(applying: try releasedVersion1()))
        defer { owner.close() }
        try owner.simpleQuery("DROP FUNCTION siwa.on_event(text, text, timestamptz, text, text)")
        try TestSchema.apply(on: owner)
        let config = try owner.query(
            "SELECT proconfig::text FROM pg_proc WHERE oid = 'siwa.on_event(text, text, timestamptz, text, text)'::regprocedure"
        )[0][0, as: String?.self]
        #expect(config == #"{"search_path=pg_catalog, pg_temp"}"#)
        #expect(try owner.query("SELECT max(version) FROM siwa.schema_version")[0][0, as: Int.self] >= 2)
    }

    @Test("a replaced hook is left as its admin wrote it when schema.sql is applied again")
    func upgradeKeepsReplacedHook() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.simpleQuery(
            """
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text)
            RETURNS void LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE 'mine'; END $$;
            """)
        try TestSchema.apply(on: owner)
        let row = try owner.query(
            """
            SELECT proconfig::text, prosrc FROM pg_proc
             WHERE oid = 'siwa.on_event(text, text, timestamptz, text, text)'::regprocedure
            """)[0]
        #expect(try row[0, as: String?.self] == nil)
        #expect(try row[1, as: String.self].contains("mine"))
    }

    @Test(
        "functions and operators planted in public by a role that merely connects never run in the worker's or owner's calls"
    )
    func plantedObjectsNeverRun() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        // PostgreSQL 15 revokes CREATE on public from PUBLIC; ≤ 14 grants it: reproduce that.
        try owner.simpleQuery("GRANT CREATE ON SCHEMA public TO PUBLIC")
        let attacker = try database.connect(as: .nobody)
        defer { attacker.close() }
        try attacker.simpleQuery(plantedInPublic)

        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        // The plants are live: a session of the worker's role that calls these unqualified runs them.
        _ = try worker.query(
            """
            SELECT hashtextextended('x', 0), power(2, 3), random() / 2, format('%I', 'x'::text),
                   (SELECT count(*) FROM unnest('{a}'::text[]))
            """)
        #expect(try owner.query("SELECT count(*) FROM public.loot")[0][0, as: Int.self] == 5)
        try owner.query("DELETE FROM public.loot")

        // A hook as admins write it (no SET clause), refusing one user: failures take the retry path.
        try owner.simpleQuery(
            """
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text)
            RETURNS void LANGUAGE plpgsql AS $$
            BEGIN
                IF sub = '001000.fay' THEN RAISE EXCEPTION 'hook refused'; END IF;
            END $$;
            UPDATE siwa.settings SET erase_personal_data_after = interval '0';
            """)
        try storeAsReceiver(
            database, jti: "sp-1", sub: "001000.gus", eventType: "email-enabled",
            email: "gus@privaterelay.appleid.com")
        try storeAsReceiver(database, jti: "sp-2", sub: "001000.gus", eventType: "account-delete")
        try storeAsReceiver(database, jti: "sp-3", sub: "001000.fay", eventType: "consent-revoked")
        try storeAsReceiver(database, jti: "sp-4", sub: "001000.hal", eventType: "consent-revoked")

        let outcomes = try worker.transaction { connection in
            try connection.query("SELECT outcome FROM siwa.process_due_notifications(10, 5, interval '1 ms')")
                .map { try $0[0, as: String.self] }
        }
        #expect(outcomes.sorted() == ["applied", "applied", "applied", "retry"])
        let fay = try owner.query("SELECT id FROM siwa.notifications WHERE jti = 'sp-3'")[0][0, as: Int.self]
        try owner.query("UPDATE siwa.notifications SET next_attempt_at = now() WHERE jti = 'sp-3'")
        _ = try worker.transaction { connection in
            try connection.query(
                "SELECT * FROM siwa.process_notification($1, 5, interval '1 ms')", [.int(Int64(fay))])
        }
        _ = try worker.query(
            "SELECT siwa.record_failure($1, 'P0001: from the worker', 5, interval '1 ms')", [.int(Int64(fay))]
        )
        try owner.query("UPDATE siwa.settings SET erase_personal_data_after = interval '1 day'")
        try owner.query(
            "UPDATE siwa.accounts SET deleted_at = now() - interval '2 days', personal_data_erased_at = NULL")
        _ = try worker.query("SELECT siwa.erase_due_personal_data(100)")
        _ = try worker.query("SELECT * FROM siwa.prune(interval '0', interval '0')")
        _ = try owner.query("SELECT siwa.requeue(NULL, 'pending')")
        _ = try owner.query("SELECT siwa.requeue('sp-4')")

        let loot = try owner.query("SELECT what FROM public.loot").map { try $0[0, as: String.self] }
        #expect(loot == [])
    }
}

/// schema.sql as released at schema version 1 (Tests/Fixtures/released-schemas).
func releasedVersion1() throws -> String {
    try String(
        contentsOf: RepositoryRoot.url.appendingPathComponent(
            "Tests/Fixtures/released-schemas/schema-v1.sql"),
        encoding: .utf8)
}
