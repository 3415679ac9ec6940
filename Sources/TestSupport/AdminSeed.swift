import Postgres

/// The admin SQL tests' seeded data set (the admin views, the cookbook, erasure): its users, and what
/// happened to them.
public enum Seed {
    /// Email disabled, then enabled; revoked consent (2 sessions revoked), signed in again; one more
    /// email-disabled still pending.
    public static let alice = "001000.alice"
    /// Relay email disabled; one refresh token.
    public static let bob = "001000.bob"
    /// Email enabled long ago, then deleted the account: sessions revoked, personal data erased.
    public static let carol = "001000.carol"
    /// Only an event type the worker does not know: skipped, no account.
    public static let dave = "001000.dave"
    /// Email enabled, then a consent-revoked that the on_event hook refuses: dead.
    public static let erin = "001000.erin"
    /// One email event still pending after two failed attempts, next attempt in an hour.
    public static let frank = "001000.frank"

    /// Inserted by the owner before the worker runs: sessions, refresh tokens, notifications, and an
    /// on_event hook that refuses erin's consent-revoked.
    public static let beforeWorker = """
        CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                 email text, jti text)
        RETURNS void LANGUAGE plpgsql AS $$
        BEGIN
            IF sub = '\(erin)' AND event_type = 'consent-revoked' THEN
                RAISE EXCEPTION 'hook refused %', sub;
            END IF;
        END;
        $$;
        INSERT INTO siwa.sessions (sub, created_at) VALUES
            ('\(alice)', now() - interval '3 days'),
            ('\(alice)', now() - interval '2 days'),
            ('\(alice)', now() - interval '1 hour'),
            ('\(carol)', now() - interval '4 days');
        INSERT INTO siwa.refresh_tokens (sub, client_id, token_sha256, token_ciphertext, created_at) VALUES
            ('\(bob)', 'com.example.app', '\\x01', '\\x02', now() - interval '1 day'),
            ('\(carol)', 'com.example.app', '\\x03', '\\x04', now() - interval '4 days');
        INSERT INTO siwa.notifications
            (jti, event_type, sub, audience, email, is_private_email, event_time, issued_at, raw_token,
             received_at)
        VALUES
            ('jti-alice-1', 'email-disabled', '\(alice)', 'com.example.app', 'alice@privaterelay.appleid.com',
             true, now() - interval '3 days', now(), 'token', now() - interval '50 minutes'),
            ('jti-alice-2', 'email-enabled', '\(alice)', 'com.example.app', 'alice@privaterelay.appleid.com',
             true, now() - interval '2 days', now(), 'token', now() - interval '40 minutes'),
            ('jti-alice-3', 'consent-revoked', '\(alice)', 'com.example.app', NULL, NULL,
             now() - interval '1 day', now(), 'token', now() - interval '30 minutes'),
            ('jti-bob-1', 'email-disabled', '\(bob)', 'com.example.web', 'bob@privaterelay.appleid.com',
             true, now() - interval '1 day', now(), 'token', now() - interval '20 minutes'),
            ('jti-carol-1', 'email-enabled', '\(carol)', 'com.example.app', 'carol@example.com',
             false, now() - interval '5 days', now(), 'token', now() - interval '2 days'),
            ('jti-carol-2', 'account-delete', '\(carol)', 'com.example.app', NULL, NULL,
             now() - interval '1 day', now(), 'token', now() - interval '10 minutes'),
            ('jti-dave-1', 'email-forwarding-changed', '\(dave)', 'com.example.app', NULL, NULL,
             now() - interval '1 hour', now(), 'token', now() - interval '5 minutes'),
            ('jti-erin-0', 'email-enabled', '\(erin)', 'com.example.web', 'erin@privaterelay.appleid.com',
             true, now() - interval '2 hours', now(), 'token', now() - interval '6 minutes'),
            ('jti-erin-1', 'consent-revoked', '\(erin)', 'com.example.web', NULL, NULL,
             now() - interval '1 hour', now(), 'token', now() - interval '5 minutes');
        """

    /// The worker's pass: every seeded notification is due; one attempt each.
    public static let workerPass = """
        SELECT outcome FROM siwa.process_due_notifications(100, 1, interval '1 second')
        """

    /// Inserted by the owner after the worker ran: two pending notifications.
    public static let afterWorker = """
        INSERT INTO siwa.notifications
            (jti, event_type, sub, audience, email, is_private_email, event_time, issued_at, raw_token,
             received_at, attempts, next_attempt_at, last_error)
        VALUES
            ('jti-frank-1', 'email-disabled', '\(frank)', 'com.example.app', 'frank@privaterelay.appleid.com',
             true, now() - interval '1 hour', now(), 'token', now() - interval '30 minutes',
             2, now() + interval '1 hour', 'P0001: simulated failure'),
            ('jti-alice-4', 'email-disabled', '\(alice)', 'com.example.app', 'alice@privaterelay.appleid.com',
             true, now() - interval '10 minutes', now(), 'token', now() - interval '2 minutes',
             0, now(), NULL);
        """

    /// A fresh database holding the seeded data set, applied by the worker's login role.
    public static func make() throws -> AdminDatabase {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.simpleQuery(beforeWorker)
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        let outcomes = try worker.transaction { connection in
            try connection.query(workerPass).map { try $0[0, as: String.self] }
        }
        guard
            outcomes.sorted() == [
                "applied", "applied", "applied", "applied", "applied", "applied",
                "applied", "dead", "skipped",
            ]
        else {
            throw PostgresError(code: .queryFailed, message: "unexpected worker outcomes \(outcomes)")
        }
        try owner.simpleQuery(afterWorker)
        return database
    }

    /// One seeded database shared by the read-only tests of this process.
    public static let shared: Result<AdminDatabase, any Error> = Result { try make() }
}
