import Foundation
import Postgres
import TestSupport
import Testing
import Worker

@Suite("Applying each kind of notification")
struct EffectsTests {
    @Test("an email event creates the account on first sight with the relay address and status")
    func emailEventCreatesAccount() throws {
        let db = try TestDatabase()
        try db.insert(jti: "e1", type: "email-disabled", sub: "user-1", email: "a@privaterelay.appleid.com")
        let summary = try db.worker().drainOnce()
        #expect(summary.applied == 1)
        let row = try #require(
            try db.connection.query(
                "SELECT email, is_private_email, email_status FROM siwa.accounts WHERE sub = 'user-1'"
            ).first)
        #expect(try row[0, as: String?.self] == "a@privaterelay.appleid.com")
        #expect(try row[1, as: Bool?.self] == true)
        #expect(try row[2, as: String?.self] == "disabled")
        #expect(try db.state("e1") == "applied")
    }

    @Test(
        "email events delivered out of order converge on the newest by event_time",
        arguments: [false, true])
    func outOfOrderEmailEventsConverge(drainBetween: Bool) throws {
        let db = try TestDatabase()
        let worker = try db.worker()
        try db.insert(
            jti: "new", type: "email-enabled", sub: "u", eventTime: "now() - interval '1 minute'",
            email: "new@privaterelay.appleid.com")
        if drainBetween { _ = try worker.drainOnce() }
        try db.insert(
            jti: "old", type: "email-disabled", sub: "u", eventTime: "now() - interval '1 hour'",
            email: "old@privaterelay.appleid.com")
        _ = try worker.drainOnce()
        let row = try #require(try db.connection.query("SELECT email, email_status FROM siwa.accounts").first)
        #expect(try row[0, as: String?.self] == "new@privaterelay.appleid.com")
        #expect(try row[1, as: String?.self] == "enabled")
        #expect(try db.state("old") == "applied")
    }

    @Test("consent-revoked revokes earlier sessions and refresh tokens; a later session stays valid")
    func consentRevokedKeepsLaterSession() throws {
        let db = try TestDatabase()
        try db.connection.execute(
            """
            INSERT INTO siwa.sessions (id, sub, created_at) VALUES
                (1, 'u', now() - interval '2 hours'), (2, 'u', now()), (3, 'other', now() - interval '2 hours')
            """)
        try db.connection.execute(
            """
            INSERT INTO siwa.refresh_tokens (sub, created_at, token_sha256) VALUES
                ('u', now() - interval '2 hours', '\\x01'), ('u', now(), '\\x02')
            """)
        try db.insert(jti: "c1", type: "consent-revoked", sub: "u", eventTime: "now() - interval '1 hour'")
        _ = try db.worker().drainOnce()

        let sessions = try db.connection.query(
            "SELECT id, revoked_at IS NOT NULL, revoke_reason FROM siwa.sessions ORDER BY id")
        #expect(try sessions.map { try $0[1, as: Bool.self] } == [true, false, false])
        #expect(try sessions[0][2, as: String?.self] == "consent-revoked")
        #expect(
            try db.value(
                "SELECT string_agg((revoked_at IS NOT NULL)::text, ',' ORDER BY created_at) FROM siwa.refresh_tokens",
                as: String.self) == "true,false")
        #expect(
            try db.value(
                "SELECT consent_revoked_at = (SELECT event_time FROM siwa.notifications) FROM siwa.accounts",
                as: Bool.self))
    }

    @Test("account-delete revokes everything and erases the user's email everywhere")
    func accountDeleteErasesPersonalData() throws {
        let db = try TestDatabase()
        try db.connection.execute(
            "INSERT INTO siwa.sessions (sub, created_at) VALUES ('u', now() + interval '1 day'), ('keep', now())"
        )
        try db.connection.execute(
            "INSERT INTO siwa.refresh_tokens (sub, token_sha256, token_ciphertext) VALUES ('u', '\\x01', '\\x99')"
        )
        try db.insert(jti: "e1", type: "email-enabled", sub: "u", email: "a@privaterelay.appleid.com")
        try db.insert(jti: "e2", type: "email-enabled", sub: "keep", email: "b@privaterelay.appleid.com")
        let worker = try db.worker()
        _ = try worker.drainOnce()
        try db.insert(jti: "d1", type: "account-delete", sub: "u")
        _ = try worker.drainOnce()

        #expect(
            try db.value("SELECT count(*) FROM siwa.sessions WHERE revoked_at IS NULL", as: Int.self) == 1)
        #expect(
            try db.value("SELECT revoke_reason FROM siwa.sessions WHERE sub = 'u'", as: String.self)
                == "account-delete")
        #expect(
            try db.value(
                "SELECT revoked_at IS NOT NULL AND token_ciphertext IS NULL FROM siwa.refresh_tokens",
                as: Bool.self))
        let account = try #require(
            try db.connection.query("SELECT email, deleted_at IS NOT NULL FROM siwa.accounts WHERE sub = 'u'")
                .first)
        #expect(try account[0, as: String?.self] == nil)
        #expect(try account[1, as: Bool.self])
        #expect(
            try db.value(
                "SELECT count(*) FROM siwa.notifications WHERE sub = 'u' AND (email IS NOT NULL OR raw_token IS NOT NULL)",
                as: Int.self) == 0)
        #expect(
            try db.value(
                "SELECT count(*) FROM siwa.event_history WHERE sub = 'u' AND email IS NOT NULL", as: Int.self)
                == 0)
        #expect(
            try db.value("SELECT email FROM siwa.event_history WHERE sub = 'keep'", as: String?.self)
                == "b@privaterelay.appleid.com")
    }

    @Test("an email event arriving after the erasure keeps no address")
    func lateEmailEventAfterErasureKeepsNothing() throws {
        let db = try TestDatabase()
        try db.insert(jti: "d1", type: "account-delete", sub: "u")
        let worker = try db.worker()
        _ = try worker.drainOnce()
        try db.insert(
            jti: "late", type: "email-disabled", sub: "u", eventTime: "now() - interval '1 day'",
            email: "late@privaterelay.appleid.com")
        _ = try worker.drainOnce()
        #expect(try db.value("SELECT email FROM siwa.accounts", as: String?.self) == nil)
        #expect(
            try db.value("SELECT email FROM siwa.event_history WHERE jti = 'late'", as: String?.self) == nil)
    }

    @Test("with erase_personal_data_after set, the email is kept until that time has passed")
    func erasureCanBeDeferred() throws {
        let db = try TestDatabase()
        try db.connection.execute("UPDATE siwa.settings SET erase_personal_data_after = interval '30 days'")
        try db.insert(jti: "e1", type: "email-enabled", sub: "recent", email: "r@privaterelay.appleid.com")
        try db.insert(jti: "e2", type: "email-enabled", sub: "old", email: "o@privaterelay.appleid.com")
        try db.insert(jti: "d1", type: "account-delete", sub: "recent", eventTime: "now() - interval '1 day'")
        try db.insert(jti: "d2", type: "account-delete", sub: "old", eventTime: "now() - interval '31 days'")
        _ = try db.worker().drainOnce()  // Applies, then the maintenance pass erases what is due.

        #expect(try db.value("SELECT email FROM siwa.accounts WHERE sub = 'recent'", as: String?.self) != nil)
        #expect(
            try db.value("SELECT email FROM siwa.event_history WHERE jti = 'e1'", as: String?.self) != nil)
        #expect(try db.value("SELECT email FROM siwa.accounts WHERE sub = 'old'", as: String?.self) == nil)
        #expect(
            try db.value("SELECT email FROM siwa.event_history WHERE jti = 'e2'", as: String?.self) == nil)
        #expect(try db.value("SELECT siwa.erase_due_personal_data()", as: Int.self) == 0)
    }

    @Test("an unknown event type is skipped with the reason and changes nothing else")
    func unknownTypeIsSkipped() throws {
        let db = try TestDatabase()
        try db.connection.execute("CREATE TABLE hook_calls (jti text)")
        try db.connection.simpleQuery(
            """
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text) RETURNS void
            LANGUAGE sql AS $$ INSERT INTO public.hook_calls VALUES (jti) $$;
            """)
        try db.insert(jti: "x1", type: "brand-new-type", sub: "u")
        let summary = try db.worker().drainOnce()
        #expect(summary.skipped == 1)
        #expect(try db.state("x1") == "skipped")
        #expect(
            try db.value("SELECT last_error FROM siwa.notifications", as: String?.self)
                == "unknown event type 'brand-new-type'")
        // The user's account row exists (its lock serialises every event of the user, known or not, with
        // erasure), with nothing set.
        #expect(
            try db.value(
                """
                SELECT count(*) FILTER (WHERE email IS NULL AND email_status IS NULL AND consent_revoked_at IS NULL
                                          AND deleted_at IS NULL)
                     = count(*) AND count(*) = 1
                  FROM siwa.accounts
                """, as: Bool.self))
        #expect(try db.value("SELECT count(*) FROM hook_calls", as: Int.self) == 0)
    }

    @Test("the hook runs once per known event in the applying transaction, with the event's fields")
    func hookSeesEvent() throws {
        let db = try TestDatabase()
        try db.connection.execute("CREATE TABLE hook_calls (event_type text, sub text, email text, jti text)")
        try db.connection.simpleQuery(
            """
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text) RETURNS void
            LANGUAGE sql AS $$ INSERT INTO public.hook_calls VALUES (event_type, sub, email, jti) $$;
            """)
        try db.insert(jti: "e1", type: "email-disabled", sub: "u", email: "a@privaterelay.appleid.com")
        _ = try db.worker().drainOnce()
        let row = try #require(try db.connection.query("SELECT * FROM hook_calls").first)
        #expect(try row[0, as: String.self] == "email-disabled")
        #expect(try row[1, as: String.self] == "u")
        #expect(try row[2, as: String?.self] == "a@privaterelay.appleid.com")
        #expect(try row[3, as: String.self] == "e1")
        #expect(try db.value("SELECT count(*) FROM hook_calls", as: Int.self) == 1)
    }

    @Test("re-running schema.sql keeps a replaced on_event hook")
    func rerunningSchemaKeepsHook() throws {
        let db = try TestDatabase()
        try db.connection.execute("CREATE TABLE hook_calls (jti text)")
        try db.connection.simpleQuery(
            """
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text) RETURNS void
            LANGUAGE sql AS $$ INSERT INTO public.hook_calls VALUES (jti) $$;
            """)
        try TestSchema.apply(on: db.connection)
        try db.insert(jti: "c1", type: "consent-revoked", sub: "u")
        _ = try db.worker().drainOnce()
        #expect(try db.value("SELECT count(*) FROM hook_calls", as: Int.self) == 1)
    }
}
