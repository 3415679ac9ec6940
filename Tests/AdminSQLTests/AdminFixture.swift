import AppleNotifications
import Foundation
import Postgres
import Receiver
import TestSupport

/// The group roles schema.sql creates, each with a login role (member of it) that tests connect as.
enum AdminRole: String, CaseIterable, Sendable, CustomStringConvertible {
    case admin = "siwa_admin"
    case receiver = "siwa_receiver"
    case worker = "siwa_worker"
    /// The app: records and revokes its sessions and refresh tokens, asks the validity rule.
    case app = "siwa_app"
    /// The sign-in API of siwa-receiver.
    case signin = "siwa_signin"
    /// A login role that belongs to no group role: what PUBLIC may do.
    case nobody = "nobody"

    var description: String { rawValue }

    /// The group role (nil for ``nobody``).
    var group: String? { self == .nobody ? nil : rawValue }

    /// The login role the tests use for this group role (TestSupport's `PostgresCluster.loginRole`).
    var loginName: String { "siwa_test_\(rawValue)_login" }
}

/// The admin SQL tests' name for TestSupport's `TestDatabase`: schema.sql, reachable as the superuser
/// and as each role's login.
typealias AdminDatabase = TestDatabase

extension TestDatabase {
    /// A fresh database with schema.sql applied.
    static func make() throws -> AdminDatabase { try TestDatabase() }

    /// A connection as the superuser (owner of everything).
    func connectAsOwner() throws -> PostgresConnection { try connect() }

    /// A configuration for `role`'s login role.
    func configuration(as role: AdminRole) throws -> PostgresConfiguration {
        try configuration(asMemberOf: role.group)
    }

    /// A connection as `role`'s login role.
    func connect(as role: AdminRole) throws -> PostgresConnection {
        try PostgresConnection(configuration: configuration(as: role))
    }
}

/// The SQLSTATE of the `PostgresError` that `body` throws, or nil when it does not throw.
func sqlState(_ body: () throws -> Void) -> String? {
    do {
        try body()
        return nil
    } catch let error as PostgresError {
        return error.sqlState ?? "(no SQLSTATE: \(error.code))"
    } catch {
        return "(not a PostgresError: \(error))"
    }
}

/// insufficient_privilege.
let permissionDenied = "42501"

/// Replaces the admins' hook `siwa.on_event` with one whose PL/pgSQL body is `body`, written the way an
/// admin writes it today: no `SET` clause of its own.
func replaceHook(on connection: PostgresConnection, body: String) throws {
    try connection.simpleQuery(
        """
        CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                 email text, jti text)
        RETURNS void LANGUAGE plpgsql AS $$
        BEGIN
        \(body)
        END $$;
        """)
}

/// Stores a notification exactly as siwa-receiver does (its `NotificationStore`), connected as `role`.
@discardableResult
func storeAsReceiver(
    _ database: AdminDatabase, jti: String, sub: String, eventType: String = "consent-revoked",
    email: String? = nil, role: AdminRole = .receiver, issuedAt: Date = storeAsReceiverIssuedAt
) throws -> NotificationStore.Outcome {
    let pool = PostgresPool(configuration: try database.configuration(as: role), maxConnections: 1)
    defer { pool.close() }
    let store = NotificationStore(pool: pool, configuration: .init(committers: 1))
    defer { store.close() }
    let now = Date()
    // A redelivery is usually the same signed token: the same iat (whole seconds, as in a JWT).
    let notification = ServerNotification(
        eventType: EventType(rawValue: eventType), subject: sub, email: email,
        isPrivateEmail: email.map { _ in true }, eventTime: now.addingTimeInterval(-60),
        jti: jti,
        audience: "com.example.app", audiences: ["com.example.app"], issuedAt: issuedAt,
        expiresAt: issuedAt.addingTimeInterval(86_400))
    return try store.store(notification, rawToken: "header.payload.signature")
}

/// The iat of every token ``storeAsReceiver`` stores: this process's start, in whole seconds.
let storeAsReceiverIssuedAt = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down))

/// The users of the seeded data set, and what happened to them.
enum Seed {
    /// Email disabled, then enabled; revoked consent (2 sessions revoked), signed in again; one more
    /// email-disabled still pending.
    static let alice = "001000.alice"
    /// Relay email disabled; one refresh token.
    static let bob = "001000.bob"
    /// Email enabled long ago, then deleted the account: sessions revoked, personal data erased.
    static let carol = "001000.carol"
    /// Only an event type the worker does not know: skipped, no account.
    static let dave = "001000.dave"
    /// Email enabled, then a consent-revoked that the on_event hook refuses: dead.
    static let erin = "001000.erin"
    /// One email event still pending after two failed attempts, next attempt in an hour.
    static let frank = "001000.frank"

    /// Inserted by the owner before the worker runs: sessions, refresh tokens, notifications, and an
    /// on_event hook that refuses erin's consent-revoked.
    static let beforeWorker = """
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
    static let workerPass = """
        SELECT outcome FROM siwa.process_due_notifications(100, 1, interval '1 second')
        """

    /// Inserted by the owner after the worker ran: two pending notifications.
    static let afterWorker = """
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
    static func make() throws -> AdminDatabase {
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
    static let shared: Result<AdminDatabase, any Error> = Result { try make() }
}
