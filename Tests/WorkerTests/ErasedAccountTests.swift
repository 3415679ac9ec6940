import Foundation
import Postgres
import TestSupport
import Testing
import Worker

/// A hook that records every call (event type, sub, email, jti) in `public.hook_calls`.
private func recordHookCalls(_ db: TestDatabase) throws {
    try db.connection.execute("CREATE TABLE hook_calls (event_type text, sub text, email text, jti text)")
    try db.connection.simpleQuery(
        """
        CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                 email text, jti text) RETURNS void
        LANGUAGE sql AS $$ INSERT INTO public.hook_calls VALUES (event_type, sub, email, jti) $$;
        """)
}

/// The stored token and outcome of one notification, read as the owner.
private func row(_ db: TestDatabase, _ jti: String) throws -> (
    state: String, hasToken: Bool, hasEmail: Bool, erased: Bool
) {
    let row = try #require(
        try db.query(
            """
            SELECT state, raw_token IS NOT NULL, email IS NOT NULL, personal_data_erased_at IS NOT NULL
              FROM siwa.notification_log WHERE jti = $1
            """, [.text(jti)]
        ).first)
    return (try row[0], try row[1], try row[2], try row[3])
}

/// Late events of an account whose personal data is erased, through the worker's verified path: a
/// consent-revoked or account-delete (no personal data in its token) is kept with its token, verified
/// and applied by event time; an email event stays token-less and is skipped.
@Suite("Erased accounts: late events without personal data are verified and applied")
struct ErasedAccountTests {
    @Test(
        "a second account-delete, earlier than the first, moves deleted_at back after the erasure: hook called, change written, token cleared"
    )
    func earlierSecondDeleteMovesDeletedAtBack() throws {
        let db = try TestDatabase()
        try recordHookCalls(db)
        let worker = try db.worker()
        try db.insert(jti: "d1", type: "account-delete", sub: "u", eventTime: "now() - interval '1 hour'")
        _ = try worker.drainOnce()
        let erasedAt = try db.value(
            "SELECT personal_data_erased_at::text FROM siwa.accounts WHERE sub = 'u'", as: String.self)

        try db.insert(jti: "d2", type: "account-delete", sub: "u", eventTime: "now() - interval '2 hours'")
        #expect(try row(db, "d2").hasToken, "kept for the worker to verify")
        let summary = try worker.drainOnce()
        #expect(summary.applied == 1)
        #expect(try db.state("d2") == "applied")
        #expect(
            try db.value(
                "SELECT deleted_at = (SELECT event_time FROM siwa.notification_log WHERE jti = 'd2') FROM siwa.accounts",
                as: Bool.self))
        #expect(
            try db.value("SELECT personal_data_erased_at::text FROM siwa.accounts", as: String.self)
                == erasedAt,
            "the first erasure's time is kept")
        #expect(try db.value("SELECT count(*) FROM hook_calls WHERE jti = 'd2'", as: Int.self) == 1)
        // The deletion moved back: a change (without email), and no second personal_data_erased.
        #expect(
            try db.value(
                """
                SELECT string_agg(type || ':' || jti, ',' ORDER BY position) FROM siwa.changefeed
                 WHERE email IS NULL AND is_private_email IS NULL
                """, as: String.self)
                == "siwa.account_deleted:d1,siwa.personal_data_erased:d1,siwa.account_deleted:d2")
        let d2 = try row(db, "d2")
        #expect(!d2.hasToken && d2.erased, "nothing of the erased user left behind once applied")
    }

    @Test(
        "after the erasure, a late consent-revoked is applied (hook called, token cleared) while a late email event stays skipped without token"
    )
    func lateConsentRevokedIsAppliedEmailEventSkipped() throws {
        let db = try TestDatabase()
        try recordHookCalls(db)
        let worker = try db.worker()
        try db.insert(jti: "d1", type: "account-delete", sub: "u", eventTime: "now() - interval '1 hour'")
        _ = try worker.drainOnce()

        try db.insert(jti: "c1", type: "consent-revoked", sub: "u", eventTime: "now() - interval '2 hours'")
        try db.insert(
            jti: "e1", type: "email-disabled", sub: "u", eventTime: "now() - interval '30 minutes'",
            email: "late@privaterelay.appleid.com")
        #expect(try row(db, "c1").hasToken)
        let stored = try row(db, "e1")
        #expect(!stored.hasToken && !stored.hasEmail && stored.erased, "an email event keeps nothing")

        _ = try worker.drainOnce()
        #expect(try db.state("c1") == "applied")
        #expect(
            try db.value(
                "SELECT consent_revoked_at = (SELECT event_time FROM siwa.notification_log WHERE jti = 'c1') FROM siwa.accounts",
                as: Bool.self))
        #expect(
            try db.value(
                "SELECT string_agg(jti, ',' ORDER BY jti) FROM hook_calls WHERE sub = 'u'", as: String.self)
                == "c1,d1")
        #expect(try db.value("SELECT count(*) FROM hook_calls WHERE email IS NOT NULL", as: Int.self) == 0)
        #expect(
            try db.value(
                "SELECT count(*) FROM siwa.changefeed WHERE jti = 'c1' AND type = 'siwa.consent_revoked'",
                as: Int.self) == 1)
        let consent = try row(db, "c1")
        #expect(!consent.hasToken && consent.erased)

        let email = try row(db, "e1")
        #expect(email.state == "skipped" && !email.hasToken && !email.hasEmail)
        #expect(
            try db.value("SELECT last_error FROM siwa.notification_log WHERE jti = 'e1'", as: String.self)
                == "account erased: no stored token to verify, nothing applied")
        #expect(
            try db.value("SELECT email_status IS NULL AND email IS NULL FROM siwa.accounts", as: Bool.self))
    }

    @Test(
        "a consent-revoked still pending while its account is erased keeps its token and is applied afterwards"
    )
    func pendingConsentRevokedSurvivesErasure() throws {
        let db = try TestDatabase()
        try recordHookCalls(db)
        try db.insert(jti: "d1", type: "account-delete", sub: "u", eventTime: "now() - interval '1 hour'")
        try db.insert(jti: "c1", type: "consent-revoked", sub: "u", eventTime: "now() - interval '2 hours'")
        try db.insert(
            jti: "e1", type: "email-enabled", sub: "u", eventTime: "now() - interval '3 hours'",
            email: "u@privaterelay.appleid.com")
        // Another worker holds the two late events (their queue rows claimed) while the deletion is
        // applied and the account erased.
        let other = try db.connect()
        defer { other.close() }
        try other.simpleQuery(
            "BEGIN; SELECT 1 FROM siwa.notification_queue q JOIN siwa.notification_log l USING (id) WHERE l.jti IN ('c1', 'e1') FOR UPDATE OF q"
        )
        let worker = try db.worker()
        _ = try worker.drainOnce()
        #expect(try db.state("d1") == "applied")
        #expect(try row(db, "c1").hasToken, "no personal data in it: kept until the worker has verified it")
        let pendingEmail = try row(db, "e1")
        #expect(!pendingEmail.hasToken && !pendingEmail.hasEmail)
        try other.simpleQuery("ROLLBACK")

        _ = try worker.drainOnce()
        #expect(try db.state("c1") == "applied")
        #expect(try db.state("e1") == "skipped")
        #expect(
            try db.value(
                "SELECT consent_revoked_at = (SELECT event_time FROM siwa.notification_log WHERE jti = 'c1') FROM siwa.accounts",
                as: Bool.self))
        #expect(try db.value("SELECT count(*) FROM hook_calls WHERE jti = 'c1'", as: Int.self) == 1)
        #expect(
            try db.value(
                "SELECT count(*) FROM siwa.notification_log WHERE raw_token IS NOT NULL OR email IS NOT NULL",
                as: Int.self) == 0)
    }

    @Test(
        "after A→C and C's erasure, a late consent-revoked for A is verified and applied to C, and matches C's revocation request"
    )
    func lateConsentRevokedForReplacedSubMatchesEcho() throws {
        let db = try TestDatabase()
        try recordHookCalls(db)
        try db.connection.execute(
            "INSERT INTO siwa.sub_aliases (old_sub, new_sub, transfer_id) VALUES ('old.a', 'new.c', 't1')")
        // The app deleted the user and asked for its tokens to be revoked; the revoker called Apple.
        try db.connection.execute(
            """
            INSERT INTO siwa.revocation_requests (sub, reason, state, attempts, last_attempt_at, completed_at)
            VALUES ('new.c', 'account deleted in the app', 'revoked', 1, now(), now())
            """)
        let worker = try db.worker()
        try db.insert(
            jti: "d1", type: "account-delete", sub: "new.c", eventTime: "now() - interval '1 minute'")
        _ = try worker.drainOnce()
        #expect(try db.value("SELECT personal_data_erased_at IS NOT NULL FROM siwa.accounts", as: Bool.self))

        // Apple's echo of the revocation, under the old team's sub, arrives after the erasure.
        try db.insert(
            jti: "echo", type: "consent-revoked", sub: "old.a", eventTime: "now() - interval '30 seconds'")
        #expect(try row(db, "echo").hasToken)
        _ = try worker.drainOnce()
        #expect(try db.state("echo") == "applied")
        #expect(
            try db.value(
                "SELECT consent_revoked_at = (SELECT event_time FROM siwa.notification_log WHERE jti = 'echo') FROM siwa.accounts WHERE sub = 'new.c'",
                as: Bool.self))
        #expect(try db.value("SELECT sub FROM hook_calls WHERE jti = 'echo'", as: String.self) == "new.c")
        #expect(
            try db.value(
                "SELECT echo_matched_at IS NOT NULL FROM siwa.revocation_requests WHERE sub = 'new.c'",
                as: Bool.self))
        #expect(!(try row(db, "echo").hasToken))
        #expect(try db.value("SELECT count(*) FROM siwa.accounts", as: Int.self) == 1)
    }
}
