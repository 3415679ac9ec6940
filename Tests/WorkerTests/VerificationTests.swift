import AppleNotifications
import Foundation
import Postgres
import ServiceSupport
import Synchronization
import TestSupport
import Testing
import Worker

/// The receiver's database role may store junk; it may not delete, erase, revoke or replay anyone.
/// Each attack below is what a login holding only `siwa_receiver` can write (its column grants), and
/// the worker (in process, with TestSigning's Apple key as Apple's key set) must apply none of it.
@Suite("The worker applies only what Apple signed")
struct VerificationTests {
    /// A victim with an email, a session and a refresh token, and a hook that records every call.
    private func victim(_ db: TestDatabase) throws {
        try db.connection.simpleQuery(
            """
            INSERT INTO siwa.accounts (sub, email, is_private_email) VALUES ('victim', 'v@example.com', false);
            INSERT INTO siwa.sessions (sub, created_at) VALUES ('victim', now() - interval '1 hour');
            INSERT INTO siwa.refresh_tokens (sub, created_at, token_sha256)
                VALUES ('victim', now() - interval '1 hour', '\\x01');
            CREATE TABLE public.hook_calls (jti text);
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text) RETURNS void
            LANGUAGE sql AS $$ INSERT INTO public.hook_calls VALUES (jti) $$;
            """)
    }

    /// Nothing of the victim changed, no change row, no hook call.
    private func expectUntouched(_ db: TestDatabase) throws {
        #expect(
            try db.value(
                """
                SELECT deleted_at IS NULL AND consent_revoked_at IS NULL AND email = 'v@example.com'
                       AND personal_data_erased_at IS NULL
                  FROM siwa.accounts WHERE sub = 'victim'
                """, as: Bool.self))
        #expect(
            try db.value("SELECT count(*) FROM siwa.sessions WHERE revoked_at IS NOT NULL", as: Int.self) == 0
        )
        #expect(
            try db.value(
                "SELECT count(*) FROM siwa.refresh_tokens WHERE revoked_at IS NOT NULL", as: Int.self) == 0)
        #expect(try db.value("SELECT count(*) FROM siwa.changes", as: Int.self) == 0)
        #expect(try db.value("SELECT count(*) FROM public.hook_calls", as: Int.self) == 0)
    }

    /// Inserts a log row and its queue row as `connection` (a siwa_receiver login), column by column as
    /// its grants allow, bypassing the receiver's verifier; returns the row's id.
    @discardableResult
    private func insertAsReceiver(
        _ connection: PostgresConnection, jti: String, type: String = "account-delete",
        sub: String = "victim",
        audience: String = "com.example.app", eventTime: String = "now()", issuedAt: String = "now()",
        expiresAt: String = "now() + interval '1 day'", rawToken: String?, erased: Bool = false,
        email: String? = nil
    ) throws -> Int64 {
        let id = try connection.query(
            """
            INSERT INTO siwa.notification_log (jti, event_type, sub, audience, email, event_time, issued_at,
                                               expires_at, raw_token, personal_data_erased_at)
            VALUES ($1, $2, $3, $4, $5, \(eventTime), \(issuedAt), \(expiresAt), $6,
                    CASE WHEN $7::boolean THEN now() END)
            RETURNING id
            """,
            [
                .text(jti), .text(type), .text(sub), .text(audience), email.map { .text($0) },
                rawToken.map { .text($0) }, .bool(erased),
            ])[0][0, as: Int64.self]
        try connection.execute(
            """
            INSERT INTO siwa.notification_queue (id, jti, issued_at)
            SELECT $1, $2, issued_at FROM siwa.notification_log WHERE id = $1
            """, [.int(id), .text(jti)])
        return id
    }

    @Test(
        "an account-delete with raw_token 'not.a.signed.token' inserted by a siwa_receiver login is rejected")
    func forgedTokenChangesNothing() throws {
        let db = try TestDatabase()
        try victim(db)
        let receiver = try db.connect(asMemberOf: "siwa_receiver")
        defer { receiver.close() }
        try insertAsReceiver(receiver, jti: "forged", rawToken: "not.a.signed.token")
        let metrics = MetricsRegistry()
        let summary = try db.worker(metrics: metrics).drainOnce()
        try expectUntouched(db)
        #expect(summary.rejected == 1 && summary.applied == 0)
        #expect(try db.state("forged") == "rejected")
        #expect(
            try db.value("SELECT state || ': ' || last_error FROM siwa.event_history WHERE jti = 'forged'")
                == "rejected: bad_segments" as String)
        #expect(try db.value("SELECT count(*) FROM siwa.notification_queue", as: Int.self) == 0)
        #expect(metric(#"siwa_worker_notifications_total{outcome="rejected"}"#, in: metrics) == 1)
    }

    @Test("a token signed by a key that is not Apple's, or a genuine token under other columns, is rejected")
    func wrongKeyOrColumnsChangeNothing() throws {
        let db = try TestDatabase()
        try victim(db)
        let receiver = try db.connect(asMemberOf: "siwa_receiver")
        defer { receiver.close() }
        let now = Date()
        // Signed by another key (an attacker's), every claim as stored.
        let otherKey = TestSigning.token(
            type: "account-delete", subject: "victim", audience: "com.example.app", eventTime: now,
            issuedAt: now, jti: "other-key", signer: TestSigning.other)
        try insertAsReceiver(
            receiver, jti: "other-key", eventTime: "to_timestamp(\(Self.ms(now)))",
            issuedAt: "to_timestamp(\(Self.s(now)))", expiresAt: "to_timestamp(\(Self.s(now) + 86_400))",
            rawToken: otherKey)
        // Apple's genuine account-delete of someone else, stored as the victim's.
        let genuine = TestSigning.token(
            type: "account-delete", subject: "someone-else", audience: "com.example.app", eventTime: now,
            issuedAt: now, jti: "moved")
        try insertAsReceiver(
            receiver, jti: "moved", eventTime: "to_timestamp(\(Self.ms(now)))",
            issuedAt: "to_timestamp(\(Self.s(now)))", expiresAt: "to_timestamp(\(Self.s(now) + 86_400))",
            rawToken: genuine)
        // Apple's genuine email-enabled of the victim, stored with the attacker's address.
        let email = TestSigning.token(
            type: "email-enabled", subject: "victim", audience: "com.example.app", email: "v@example.com",
            isPrivateEmail: false, eventTime: now, issuedAt: now, jti: "email")
        try insertAsReceiver(
            receiver, jti: "email", type: "email-enabled", eventTime: "to_timestamp(\(Self.ms(now)))",
            issuedAt: "to_timestamp(\(Self.s(now)))", expiresAt: "to_timestamp(\(Self.s(now) + 86_400))",
            rawToken: email, email: "attacker@example.com")
        let summary = try db.worker().drainOnce()
        try expectUntouched(db)
        #expect(summary.rejected == 3)
        let reasons = try db.connection.query(
            "SELECT jti, last_error FROM siwa.event_history WHERE state = 'rejected' ORDER BY jti"
        ).map { try "\($0[0, as: String.self]) \($0[1, as: String.self])" }
        #expect(
            reasons == [
                "email email differs from the token", "moved sub differs from the token",
                "other-key unknown_key_id",
            ])
    }

    @Test("a genuine token inserted again after its exp is rejected (received_at is the database's)")
    func expiredReplayIsRejected() throws {
        let db = try TestDatabase()
        try victim(db)
        let receiver = try db.connect(asMemberOf: "siwa_receiver")
        defer { receiver.close() }
        let then = Date().addingTimeInterval(-3 * 86_400)
        let token = TestSigning.token(
            type: "account-delete", subject: "victim", audience: "com.example.app", eventTime: then,
            issuedAt: then, jti: "captured")
        try insertAsReceiver(
            receiver, jti: "captured", eventTime: "to_timestamp(\(Self.ms(then)))",
            issuedAt: "to_timestamp(\(Self.s(then)))", expiresAt: "to_timestamp(\(Self.s(then) + 86_400))",
            rawToken: token)
        #expect(try db.worker().drainOnce().rejected == 1)
        try expectUntouched(db)
        #expect(try db.value("SELECT last_error FROM siwa.event_history") == "expired" as String)
    }

    @Test(
        "a late event without a token for an account already deleted and erased is skipped, not rejected, and changes nothing"
    )
    func tokenlessRowOfAnErasedAccountIsSkipped() throws {
        let db = try TestDatabase()
        try db.connection.simpleQuery(
            """
            INSERT INTO siwa.accounts (sub, deleted_at, personal_data_erased_at)
                VALUES ('gone', now() - interval '1 day', now() - interval '1 day');
            CREATE TABLE public.hook_calls (jti text);
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text) RETURNS void
            LANGUAGE sql AS $$ INSERT INTO public.hook_calls VALUES (jti) $$;
            """)
        let receiver = try db.connect(asMemberOf: "siwa_receiver")
        defer { receiver.close() }
        // As the receiver stores a late event of an erased account: no email, no token.
        try insertAsReceiver(
            receiver, jti: "late", type: "email-enabled", sub: "gone", rawToken: nil, erased: true)
        let summary = try db.worker().drainOnce()
        #expect(summary.skipped == 1 && summary.rejected == 0)
        #expect(try db.state("late") == "skipped")
        #expect(try db.value("SELECT count(*) FROM siwa.changes", as: Int.self) == 0)
        #expect(try db.value("SELECT count(*) FROM public.hook_calls", as: Int.self) == 0)
    }

    @Test("a row stored without its token, or as the refresh check's without being one, is rejected")
    func tokenlessRowsChangeNothing() throws {
        let db = try TestDatabase()
        try victim(db)
        let receiver = try db.connect(asMemberOf: "siwa_receiver")
        defer { receiver.close() }
        // As the receiver stores a late event of an erased account: no email, no token.
        try insertAsReceiver(receiver, jti: "late", rawToken: nil, erased: true)
        // Shaped like the refresh check's consent-lost row (whose jti prefix was all that told it apart).
        try insertAsReceiver(
            receiver, jti: "siwa-refresh-check:00000000-0000-0000-0000-000000000000", type: "consent-revoked",
            rawToken: nil)
        #expect(
            throws: PostgresError.self,
            "the receiver's role cannot write the origin"
        ) {
            try receiver.execute(
                """
                INSERT INTO siwa.notification_log (jti, event_type, sub, audience, event_time, issued_at, origin)
                VALUES ('x', 'account-delete', 'victim', 'a', now(), now(), 'refresh-check')
                """)
        }
        #expect(try db.worker().drainOnce().rejected == 2)
        try expectUntouched(db)
        #expect(
            try db.value("SELECT count(*) FROM siwa.event_history WHERE state = 'rejected'", as: Int.self)
                == 2)
    }

    @Test("the refresh check's own consent-lost row (origin refresh-check) is applied without a token")
    func refreshCheckRowIsApplied() throws {
        let db = try TestDatabase()
        try victim(db)
        let worker = try db.connect(asMemberOf: "siwa_worker")
        defer { worker.close() }
        let jti = try worker.query("SELECT siwa.record_consent_lost('victim', 'com.example.app')")[0][
            0, as: String.self]
        let summary = try db.worker().drainOnce()
        #expect(summary.applied == 1 && summary.rejected == 0)
        #expect(try db.state(jti) == "applied")
        #expect(
            try db.value("SELECT count(*) FROM siwa.sessions WHERE revoked_at IS NOT NULL", as: Int.self) == 1
        )
    }

    @Test("a queue row inserted again for an applied notification is refused: no second hook call or change")
    func requeuedFinishedIsRefused() throws {
        let db = try TestDatabase()
        try victim(db)
        try db.insert(jti: "once", type: "consent-revoked", sub: "victim")
        #expect(try db.worker().drainOnce().applied == 1)
        #expect(try db.value("SELECT count(*) FROM public.hook_calls", as: Int.self) == 1)
        #expect(try db.value("SELECT count(*) FROM siwa.changes", as: Int.self) == 1)
        let receiver = try db.connect(asMemberOf: "siwa_receiver")
        defer { receiver.close() }
        try receiver.execute(
            """
            INSERT INTO siwa.notification_queue (id, jti, issued_at)
            SELECT id, jti, issued_at FROM siwa.notification_log WHERE jti = 'once'
            """)
        // And one whose id names no log row of that jti (a queue row cannot smuggle in another's id).
        try receiver.execute(
            """
            INSERT INTO siwa.notification_queue (id, jti, issued_at)
            SELECT id + 1000, jti, issued_at FROM siwa.notification_log WHERE jti = 'once'
            """)
        let metrics = MetricsRegistry()
        let summary = try db.worker(metrics: metrics).drainOnce()
        #expect(summary.refused == 2 && summary.applied == 0)
        #expect(try db.value("SELECT count(*) FROM public.hook_calls", as: Int.self) == 1)
        #expect(try db.value("SELECT count(*) FROM siwa.changes", as: Int.self) == 1)
        #expect(try db.state("once") == "applied")
        #expect(try db.value("SELECT count(*) FROM siwa.notification_queue", as: Int.self) == 0)
        #expect(metric(#"siwa_worker_notifications_total{outcome="refused"}"#, in: metrics) == 2)
    }

    @Test("a signed notification among forged ones is applied, the forged ones are not")
    func mixedBatch() throws {
        let db = try TestDatabase()
        try victim(db)
        let receiver = try db.connect(asMemberOf: "siwa_receiver")
        defer { receiver.close() }
        try insertAsReceiver(receiver, jti: "forged-1", rawToken: "a.b.c")
        try db.insert(jti: "real", type: "consent-revoked", sub: "someone")
        try insertAsReceiver(receiver, jti: "forged-2", rawToken: nil)
        let summary = try db.worker(concurrency: 1).drainOnce()
        #expect(summary.applied == 1 && summary.rejected == 2)
        #expect(try db.state("real") == "applied")
        try db.connection.execute("DELETE FROM siwa.changes WHERE jti = 'real'")
        try db.connection.execute("DELETE FROM public.hook_calls WHERE jti = 'real'")
        try expectUntouched(db)
    }

    @Test(
        "a notification dated beyond its iat is applied with the time the receiver stored; a forged claimed_event_time is rejected"
    )
    func futureEventTimeAsTheReceiverStoresIt() throws {
        let db = try TestDatabase()
        // Signed 30 days ahead of its iat: the receiver stores iat + 60 s, the signed time beside it.
        try db.insert(
            jti: "future", type: "consent-revoked", sub: "someone", eventTime: "now() + interval '30 days'")
        #expect(
            try db.value(
                """
                SELECT event_time = issued_at + interval '60 seconds' AND claimed_event_time > now()
                  FROM siwa.notification_log WHERE jti = 'future'
                """, as: Bool.self))
        // The same kind of token, stored with another claimed time (as the receiver's role can insert).
        try db.insert(
            jti: "moved", type: "consent-revoked", sub: "other", eventTime: "now() + interval '30 days'")
        try db.connection.execute(
            "UPDATE siwa.notification_log SET claimed_event_time = claimed_event_time + interval '1 day' WHERE jti = 'moved'"
        )
        let summary = try db.worker(concurrency: 1).drainOnce()
        #expect(summary.applied == 1 && summary.rejected == 1)
        #expect(try db.state("future") == "applied")
        #expect(try db.state("moved") == "rejected")
    }

    @Test("a key not held is fetched with no transaction open; while it cannot be, the row waits unharmed")
    func keyFetchedOutsideTransaction() throws {
        let db = try TestDatabase()
        try db.insert(jti: "k1", type: "consent-revoked", sub: "u")
        let available = Mutex(false)
        let fetches = Mutex(0)
        let openTransactions = Mutex<[Int]>([])
        let verification = StoredTokenVerification(
            audiences: ["com.example.app"],
            heldKey: { kid in available.withLock { $0 } ? TestSigning.appleKeySet.key(id: kid) : nil },
            fetchKey: { kid throws(NotificationError) in
                fetches.withLock { $0 += 1 }
                // What the lanes hold while the fetch runs: no transaction of theirs is open.
                let open =
                    (try? db.value(
                        """
                        SELECT count(*) FROM pg_stat_activity
                         WHERE application_name = 'siwa-worker-tests' AND xact_start IS NOT NULL
                        """, as: Int.self)) ?? -1
                openTransactions.withLock { $0.append(open) }
                guard available.withLock({ $0 }), let key = TestSigning.appleKeySet.key(id: kid) else {
                    throw NotificationError(.keyNotAvailable, .unknownKeyID, "key set cannot be fetched")
                }
                return key
            })
        var database = db.configuration
        database.applicationName = "siwa-worker-tests"
        let worker = Worker(
            configuration: try Worker.Configuration(
                database: database, verification: verification, concurrency: 1,
                pollInterval: .milliseconds(200)),
            logger: quietLogger)
        let first = try worker.drainOnce()
        #expect(first.deferred == 1 && first.applied == 0)
        #expect(try db.state("k1") == "pending")
        #expect(try db.value("SELECT attempts FROM siwa.notification_queue", as: Int.self) == 0)
        #expect(fetches.withLock { $0 } == 1)
        #expect(openTransactions.withLock { $0 } == [0])
        available.withLock { $0 = true }
        try db.connection.execute("UPDATE siwa.notification_queue SET next_attempt_at = now()")
        #expect(try worker.drainOnce().applied == 1)
        #expect(try db.state("k1") == "applied")
    }

    private static func ms(_ date: Date) -> String {
        String(Double((date.timeIntervalSince1970 * 1000).rounded()) / 1000)
    }
    private static func s(_ date: Date) -> Int64 { Int64(date.timeIntervalSince1970.rounded(.down)) }
}
