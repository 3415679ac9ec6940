import Foundation
import Postgres
import TestSupport
import Testing
import Worker

/// The set-based pass (siwa.apply_claimed_batch): one statement per effect for a claimed batch, and the
/// only implementation of the effects: its fallback runs it on each notification alone (a batch of one,
/// in a subtransaction of its own). It must leave exactly what applying the batch one notification at a
/// time, in claim order, leaves; ReleasedEffectsTests compares both with the released version 4.
@Suite("The set-based pass applies a batch as one-at-a-time application would")
struct SetPassTests {
    /// Runs siwa.process_due_notifications once and returns the outcomes by jti, in claim order.
    private func processBatch(_ db: TestDatabase, limit: Int = 64) throws -> [String: String] {
        var outcomes: [String: String] = [:]
        for row in try db.connection.query(
            "SELECT jti, outcome FROM siwa.process_due_notifications($1::integer, 5, interval '1 second')",
            [.int(Int64(limit))])
        {
            outcomes[try row[0, as: String.self]] = try row[1, as: String.self]
        }
        return outcomes
    }

    @Test(
        "two email events of one user in one batch converge on the newer by event_time, whatever their order")
    func emailEventsOfOneUserInOneBatch() throws {
        for newerFirst in [true, false] {
            let db = try TestDatabase()
            let newer = (
                "new", "email-enabled", "now() - interval '1 minute'", "new@privaterelay.appleid.com"
            )
            let older = ("old", "email-disabled", "now() - interval '1 hour'", "old@privaterelay.appleid.com")
            for event in newerFirst ? [newer, older] : [older, newer] {
                try db.insert(jti: event.0, type: event.1, sub: "u", eventTime: event.2, email: event.3)
            }
            #expect(try processBatch(db) == ["new": "applied", "old": "applied"])
            let row = try #require(
                try db.connection.query("SELECT email, email_status, email_status_at FROM siwa.accounts")
                    .first)
            #expect(try row[0, as: String?.self] == "new@privaterelay.appleid.com")
            #expect(try row[1, as: String?.self] == "enabled")
            #expect(
                try db.value(
                    """
                    SELECT a.email_status_at = n.event_time FROM siwa.accounts a
                      JOIN siwa.notifications n ON n.jti = 'new'
                    """, as: Bool.self))
        }
    }

    @Test(
        "the hook sees the batch's known events once each, in claim order, after the batch's built-in effects"
    )
    func hookSeesEventsInOrder() throws {
        let db = try TestDatabase()
        try db.connection.simpleQuery(
            """
            CREATE TABLE public.hook_calls (n serial, jti text, email text, revoked bigint);
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text) RETURNS void
            LANGUAGE sql AS $$
                INSERT INTO hook_calls (jti, email, revoked)
                SELECT jti, email, count(*) FROM siwa.sessions WHERE revoked_at IS NOT NULL
            $$;
            INSERT INTO siwa.sessions (sub, created_at) VALUES ('late', now() - interval '1 day');
            """)
        try db.insert(jti: "e1", type: "email-enabled", sub: "u1", email: "a@privaterelay.appleid.com")
        try db.insert(jti: "x1", type: "brand-new-type", sub: "u2")
        try db.insert(jti: "c1", type: "consent-revoked", sub: "u3")
        try db.insert(jti: "c2", type: "consent-revoked", sub: "late")
        try db.insert(jti: "e2", type: "email-disabled", sub: "u1", email: "b@privaterelay.appleid.com")
        #expect(
            try processBatch(db)
                == ["e1": "applied", "x1": "skipped", "c1": "applied", "c2": "applied", "e2": "applied"])
        let calls = try db.connection.query("SELECT jti, email, revoked FROM hook_calls ORDER BY n")
        #expect(try calls.map { try $0[0, as: String.self] } == ["e1", "c1", "c2", "e2"])
        #expect(
            try calls.map { try $0[1, as: String?.self] }
                == ["a@privaterelay.appleid.com", nil, nil, "b@privaterelay.appleid.com"])
        // Already for the first event, the session the fourth one revokes is revoked.
        #expect(try calls.map { try $0[2, as: Int.self] } == [1, 1, 1, 1])
        // One batch, one subtransaction: every row the hook wrote has the same xmin.
        #expect(try db.value("SELECT count(DISTINCT xmin::text)::integer FROM hook_calls", as: Int.self) == 1)
    }

    @Test(
        "an account-delete erases the user's rows of its own batch; the hook of a later event gets no email")
    func deletionInsideTheBatch() throws {
        let db = try TestDatabase()
        try db.connection.simpleQuery(
            """
            CREATE TABLE public.hook_calls (n serial, jti text, email text);
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text) RETURNS void
            LANGUAGE sql AS $$ INSERT INTO hook_calls (jti, email) VALUES (jti, email) $$;
            INSERT INTO siwa.sessions (sub, created_at) VALUES ('u', now() + interval '1 day');
            """)
        try db.insert(jti: "before", type: "email-enabled", sub: "u", email: "a@privaterelay.appleid.com")
        try db.insert(jti: "delete", type: "account-delete", sub: "u")
        try db.insert(jti: "after", type: "email-disabled", sub: "u", email: "b@privaterelay.appleid.com")
        try db.insert(jti: "other", type: "email-enabled", sub: "o", email: "o@privaterelay.appleid.com")
        #expect(
            try processBatch(db) == [
                "before": "applied", "delete": "applied", "after": "applied", "other": "applied",
            ])
        let calls = try db.connection.query("SELECT jti, email FROM hook_calls ORDER BY n")
        #expect(try calls.map { try $0[0, as: String.self] } == ["before", "delete", "after", "other"])
        #expect(
            try calls.map { try $0[1, as: String?.self] }
                == ["a@privaterelay.appleid.com", nil, nil, "o@privaterelay.appleid.com"])
        #expect(
            try db.value(
                """
                SELECT count(*)::integer FROM siwa.notifications
                 WHERE sub = 'u' AND email IS NULL AND raw_token IS NULL AND personal_data_erased_at IS NOT NULL
                """, as: Int.self) == 3)
        // The email event before the deletion set the status; the one after it changed nothing.
        let account = try #require(
            try db.connection.query(
                "SELECT email, email_status, personal_data_erased_at IS NOT NULL FROM siwa.accounts WHERE sub = 'u'"
            ).first)
        #expect(try account[0, as: String?.self] == nil)
        #expect(try account[1, as: String?.self] == "enabled")
        #expect(try account[2, as: Bool.self])
        #expect(
            try db.value("SELECT revoke_reason FROM siwa.sessions WHERE sub = 'u'", as: String?.self)
                == "account-delete")
        #expect(
            try db.value("SELECT email FROM siwa.accounts WHERE sub = 'o'", as: String?.self)
                == "o@privaterelay.appleid.com")
    }

    @Test(
        "a batch whose set-based pass fails falls back within the same call: the bad event retries, the rest apply"
    )
    func failingSetPassFallsBack() throws {
        let db = try TestDatabase()
        try db.connection.simpleQuery(
            """
            CREATE TABLE public.hook_calls (jti text);
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text) RETURNS void
            LANGUAGE plpgsql AS $$
            BEGIN
                IF jti = 'bad' THEN RAISE EXCEPTION 'refusing %', jti; END IF;
                INSERT INTO public.hook_calls VALUES (jti);
            END $$;
            INSERT INTO siwa.sessions (sub, created_at)
            SELECT 'user-' || g, now() - interval '1 day' FROM generate_series(0, 9) AS g;
            INSERT INTO siwa.sessions (sub, created_at) VALUES ('poison', now() - interval '1 day');
            """)
        for index in 0..<5 { try db.insert(jti: "a-\(index)", type: "consent-revoked", sub: "user-\(index)") }
        try db.insert(jti: "bad", type: "consent-revoked", sub: "poison")
        for index in 5..<10 {
            try db.insert(jti: "b-\(index)", type: "consent-revoked", sub: "user-\(index)")
        }
        let outcomes = try processBatch(db)
        #expect(outcomes.count == 11)
        #expect(outcomes["bad"] == "retry")
        #expect(outcomes.filter { $0.value == "applied" }.count == 10)
        #expect(try db.value("SELECT count(*)::integer FROM hook_calls", as: Int.self) == 10)
        #expect(
            try db.value(
                "SELECT count(*)::integer FROM siwa.sessions WHERE revoked_at IS NOT NULL", as: Int.self)
                == 10)
        #expect(
            try db.value("SELECT count(*)::integer FROM siwa.accounts WHERE sub = 'poison'", as: Int.self)
                == 0)
        #expect(
            try db.value("SELECT last_error FROM siwa.notifications WHERE jti = 'bad'", as: String?.self)
                == "P0001: refusing bad")
        // The fallback's subtransactions: one per applied event (the failed one gave its XID back).
        #expect(
            try db.value("SELECT count(DISTINCT xmin::text)::integer FROM hook_calls", as: Int.self) == 10)
    }

    @Test("a user whose account row another transaction holds is busy in the set-based pass; the rest apply")
    func busyUserInTheSetPass() throws {
        let db = try TestDatabase()
        try db.connection.execute("INSERT INTO siwa.accounts (sub) VALUES ('held')")
        try db.insert(jti: "h1", type: "consent-revoked", sub: "held")
        try db.insert(jti: "f1", type: "email-enabled", sub: "free", email: "f@privaterelay.appleid.com")
        try db.insert(jti: "h2", type: "account-delete", sub: "held")
        let app = try PostgresConnection(configuration: db.configuration)
        defer { app.close() }
        try app.simpleQuery("BEGIN; SELECT 1 FROM siwa.accounts WHERE sub = 'held' FOR UPDATE")
        #expect(try processBatch(db) == ["h1": "busy", "f1": "applied", "h2": "busy"])
        #expect(
            try db.value(
                """
                SELECT bool_and(state = 'pending' AND attempts = 0 AND busy_since IS NOT NULL
                                AND next_attempt_at > busy_since AND email IS NULL AND raw_token IS NOT NULL)
                  FROM siwa.notifications WHERE sub = 'held'
                """, as: Bool.self))
        #expect(
            try db.value("SELECT deleted_at IS NULL FROM siwa.accounts WHERE sub = 'held'", as: Bool.self))
        try app.simpleQuery("ROLLBACK")
    }
}
