import Foundation
import Postgres
import TestSupport
import Testing
import Worker

@Suite("The on_event hook keeps the search_path it was written for")
struct HookSearchPathTests {
    @Test("a hook written without SET search_path that updates an unqualified table in public still works")
    func unqualifiedHookStillWorks() throws {
        let db = try TestDatabase()
        try db.connection.simpleQuery(
            """
            CREATE TABLE public.app_users (apple_sub text PRIMARY KEY, deleted boolean NOT NULL DEFAULT false,
                                           relay_enabled boolean);
            INSERT INTO app_users (apple_sub) VALUES ('001.del'), ('001.mail');
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text) RETURNS void
            LANGUAGE plpgsql AS $$
            BEGIN
                IF event_type = 'account-delete' THEN
                    UPDATE app_users SET deleted = true WHERE apple_sub = $2;
                ELSIF event_type LIKE 'email-%' THEN
                    UPDATE app_users SET relay_enabled = (event_type = 'email-enabled') WHERE apple_sub = $2;
                END IF;
            END;
            $$;
            """)
        try db.insert(jti: "d", type: "account-delete", sub: "001.del")
        try db.insert(jti: "m", type: "email-disabled", sub: "001.mail", email: "m@privaterelay.appleid.com")
        let summary = try db.worker().drainOnce()
        #expect(summary.applied == 2)
        #expect(try db.value("SELECT deleted FROM app_users WHERE apple_sub = '001.del'", as: Bool.self))
        #expect(
            try db.value("SELECT relay_enabled FROM app_users WHERE apple_sub = '001.mail'", as: Bool?.self)
                == false)
    }

    @Test("siwa.settings.hook_search_path chooses the path of a hook without its own")
    func hookSearchPathSetting() throws {
        let db = try TestDatabase()
        try db.connection.simpleQuery(
            """
            CREATE SCHEMA app;
            CREATE TABLE app.calls (jti text);
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text) RETURNS void
            LANGUAGE plpgsql AS $$ BEGIN INSERT INTO calls VALUES ($5); END $$;
            UPDATE siwa.settings SET hook_search_path = 'app';
            """)
        try db.insert(jti: "c1", type: "consent-revoked", sub: "001.u")
        #expect(try db.worker().drainOnce().applied == 1)
        #expect(try db.value("SELECT count(*) FROM app.calls WHERE jti = 'c1'", as: Int.self) == 1)
    }

    @Test("the functions' own path does not leak into the worker's session after the hook ran")
    func pathDoesNotLeak() throws {
        let db = try TestDatabase()
        try db.insert(jti: "c1", type: "consent-revoked", sub: "001.u")
        let connection = try PostgresConnection(configuration: db.configuration)
        defer { connection.close() }
        let path = try connection.transaction { connection in
            _ = try connection.query(
                "SELECT * FROM siwa.process_due_notifications(10, 3, interval '1 second')")
            return try connection.query("SELECT current_setting('search_path')")[0][0, as: String.self]
        }
        #expect(path == #""$user", public"#)
    }
}
