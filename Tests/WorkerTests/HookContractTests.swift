import Foundation
import Postgres
import TestSupport
import Testing

/// The hook contract: exactly when the worker calls siwa.on_event and the optional
/// siwa.on_change, and what they are told. Both paths make the same calls (SetPassTests compares them).
@Suite("The hooks: when siwa.on_event and siwa.on_change are called, and with what")
struct HookContractTests {
    /// A database whose hooks record every call in public.hook_calls, in order: on_event as
    /// "event <type> <jti> <email>", on_change as "change <type> <jti> superseded=<bool> stored=<bool>
    /// <audience> <is_private_email> <sessions>/<tokens> <email>".
    static func recordingDatabase() throws -> (AdminDatabase, PostgresConnection) {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        try owner.simpleQuery(
            """
            CREATE TABLE public.hook_calls (n bigint GENERATED ALWAYS AS IDENTITY, call text);
            GRANT INSERT ON public.hook_calls TO siwa_worker;
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text) RETURNS void
            LANGUAGE sql AS $$
                INSERT INTO public.hook_calls (call)
                VALUES (concat_ws(' ', 'event', event_type, jti, coalesce(email, '-')))
            $$;
            CREATE FUNCTION siwa.on_change(change siwa.changes, superseded boolean) RETURNS void
            LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
                INSERT INTO public.hook_calls (call)
                VALUES (concat_ws(' ', 'change', change.type, change.jti, 'superseded=' || superseded,
                                  'stored=' || (change.id IS NOT NULL), coalesce(change.audience, '-'),
                                  coalesce(change.is_private_email::text, '-'),
                                  change.sessions_revoked || '/' || change.refresh_tokens_revoked,
                                  coalesce(change.email, '-')))
            $$;
            GRANT EXECUTE ON FUNCTION siwa.on_change(siwa.changes, boolean) TO siwa_worker;
            """)
        return (database, owner)
    }

    static func calls(_ owner: PostgresConnection) throws -> [String] {
        try owner.query("SELECT call FROM public.hook_calls ORDER BY n").map { try $0[0, as: String.self] }
    }

    static func drain(_ database: AdminDatabase) throws -> [String] {
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        return try worker.query(
            "SELECT outcome FROM siwa.process_due_notifications(64, 5, interval '1 second')"
        ).map { try $0[0, as: String.self] }
    }

    @Test(
        "both hooks are called for a superseded event, in arrival order whatever the event_time; on_change says superseded"
    )
    func supersededEventsAndOrder() throws {
        let (database, owner) = try Self.recordingDatabase()
        defer { owner.close() }
        try owner.execute(
            "INSERT INTO siwa.sessions (sub, created_at) VALUES ('u', now() - interval '1 day')")
        // Newer first: the older email event arrives second and changes nothing.
        try ChangefeedTests.insert(
            owner, jti: "new", type: "email-enabled", sub: "u", eventTime: "now() - interval '1 minute'",
            email: "new@privaterelay.appleid.com", isPrivateEmail: true, audience: "com.example.web")
        try ChangefeedTests.insert(
            owner, jti: "old", type: "email-disabled", sub: "u", eventTime: "now() - interval '1 hour'",
            email: "old@privaterelay.appleid.com", isPrivateEmail: false)
        try ChangefeedTests.insert(
            owner, jti: "revoke", type: "consent-revoked", sub: "u", eventTime: "now() - interval '1 hour'")
        try ChangefeedTests.insert(owner, jti: "unknown", type: "brand-new-type", sub: "u")
        #expect(try Self.drain(database) == ["applied", "applied", "applied", "skipped"])
        #expect(
            try Self.calls(owner) == [
                "event email-enabled new new@privaterelay.appleid.com",
                "change siwa.email_enabled new superseded=false stored=true com.example.web true 0/0 new@privaterelay.appleid.com",
                "event email-disabled old old@privaterelay.appleid.com",
                "change siwa.email_disabled old superseded=true stored=false com.example.app false 0/0 old@privaterelay.appleid.com",
                "event consent-revoked revoke -",
                "change siwa.consent_revoked revoke superseded=false stored=true com.example.app - 1/0 -",
            ])
    }

    @Test(
        "a redelivery stored again after its dedupe key was pruned is skipped without hooks while its first row is kept; once the history is pruned too, hooks hear it again"
    )
    func redeliveryAfterPruning() throws {
        let (database, owner) = try Self.recordingDatabase()
        defer { owner.close() }
        func deliver(issuedAgo seconds: Int) throws {
            try owner.storeAsReceiver(
                SeededNotification(
                    jti: "again", sub: "u", eventTime: owner.instant("timestamptz '2026-01-01 00:00:00+00'"),
                    issuedAt: Date().addingTimeInterval(-Double(seconds))))
        }
        try deliver(issuedAgo: 30)
        #expect(try Self.drain(database) == ["applied"])
        // The dedupe key is pruned (past its window); the same jti is stored again, with another iat.
        try owner.execute("DELETE FROM siwa.notification_jtis WHERE jti = 'again'")
        try deliver(issuedAgo: 20)
        #expect(try Self.drain(database) == ["skipped"])
        #expect(try Self.calls(owner).count == 2)
        // The history of it is pruned as well: nothing tells it from a new event any more.
        try owner.execute("DELETE FROM siwa.notifications WHERE jti = 'again'")
        try deliver(issuedAgo: 10)
        #expect(try Self.drain(database) == ["applied"])
        #expect(
            try Self.calls(owner) == [
                "event consent-revoked again -",
                "change siwa.consent_revoked again superseded=false stored=true com.example.app - 0/0 -",
                "event consent-revoked again -",
                "change siwa.consent_revoked again superseded=true stored=false com.example.app - 0/0 -",
            ])
    }

    @Test(
        "an erasure at the deletion reaches siwa.on_change after the deletion; a delayed erasure reaches only siwa.on_change"
    )
    func erasure() throws {
        let (database, owner) = try Self.recordingDatabase()
        defer { owner.close() }
        try ChangefeedTests.insert(owner, jti: "now", type: "account-delete", sub: "erased-now")
        #expect(try Self.drain(database) == ["applied"])
        try owner.execute("UPDATE siwa.settings SET erase_personal_data_after = interval '1 hour'")
        try ChangefeedTests.insert(
            owner, jti: "later", type: "account-delete", sub: "erased-later",
            eventTime: "now() - interval '2 hours'")
        #expect(try Self.drain(database) == ["applied"])
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        #expect(try worker.query("SELECT siwa.erase_due_personal_data(64)")[0][0, as: Int.self] == 1)
        #expect(
            try Self.calls(owner) == [
                "event account-delete now -",
                "change siwa.account_deleted now superseded=false stored=true com.example.app - 0/0 -",
                "change siwa.personal_data_erased now superseded=false stored=true com.example.app - 0/0 -",
                "event account-delete later -",
                "change siwa.account_deleted later superseded=false stored=true com.example.app - 0/0 -",
                "change siwa.personal_data_erased later superseded=false stored=true com.example.app - 0/0 -",
            ])
    }

    @Test("a raising siwa.on_change undoes its event's application like a raising siwa.on_event")
    func raisingOnChange() throws {
        let (database, owner) = try Self.recordingDatabase()
        defer { owner.close() }
        try owner.simpleQuery(
            """
            CREATE OR REPLACE FUNCTION siwa.on_change(change siwa.changes, superseded boolean) RETURNS void
            LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
            BEGIN
                IF change.sub = 'bad' THEN RAISE EXCEPTION 'refused'; END IF;
            END $$;
            """)
        try ChangefeedTests.insert(owner, jti: "good", type: "consent-revoked", sub: "good")
        try ChangefeedTests.insert(owner, jti: "bad", type: "consent-revoked", sub: "bad")
        #expect(try Self.drain(database) == ["applied", "retry"])
        #expect(
            try owner.query("SELECT string_agg(jti, ' ' ORDER BY id) FROM siwa.changes")[0][
                0, as: String.self]
                == "good")
        #expect(
            try owner.query("SELECT consent_revoked_at IS NULL FROM siwa.accounts WHERE sub = 'bad'").first?[
                0, as: Bool.self] ?? true)
    }
}
