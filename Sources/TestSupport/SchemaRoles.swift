import AppleNotifications
public import Foundation
public import Postgres
public import Receiver

/// The group roles schema.sql creates, each with a login role (member of it) that tests connect as.
public enum AdminRole: String, CaseIterable, Sendable, CustomStringConvertible {
    /// The admins.
    case admin = "siwa_admin"
    /// siwa-receiver: stores notifications.
    case receiver = "siwa_receiver"
    /// siwa-worker: applies them.
    case worker = "siwa_worker"
    /// The app: records and revokes its sessions and refresh tokens, asks the validity rule.
    case app = "siwa_app"
    /// The sign-in API of siwa-receiver.
    case signin = "siwa_signin"
    /// A login role that belongs to no group role: what PUBLIC may do.
    case nobody = "nobody"

    /// The group role's name.
    public var description: String { rawValue }

    /// The group role (nil for ``nobody``).
    public var group: String? { self == .nobody ? nil : rawValue }

    /// The login role the tests use for this group role (`PostgresCluster.loginRole`).
    public var loginName: String { "siwa_test_\(rawValue)_login" }
}

/// The SQL tests' name for `TestDatabase`: schema.sql, reachable as the superuser and as each role's login.
public typealias AdminDatabase = TestDatabase

extension TestDatabase {
    /// A fresh database with schema.sql applied.
    public static func make() throws -> AdminDatabase { try TestDatabase() }

    /// A connection as the superuser (owner of everything).
    public func connectAsOwner() throws -> PostgresConnection { try connect() }

    /// A configuration for `role`'s login role.
    public func configuration(as role: AdminRole) throws -> PostgresConfiguration {
        try configuration(asMemberOf: role.group)
    }

    /// A connection as `role`'s login role.
    public func connect(as role: AdminRole) throws -> PostgresConnection {
        try PostgresConnection(configuration: configuration(as: role))
    }
}

/// The SQLSTATE of the `PostgresError` that `body` throws, or nil when it does not throw.
public func sqlState(_ body: () throws -> Void) -> String? {
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
public let permissionDenied = "42501"

/// Replaces the admins' hook `siwa.on_event` with one whose PL/pgSQL body is `body`, written the way an
/// admin writes it today: no `SET` clause of its own.
public func replaceHook(on connection: PostgresConnection, body: String) throws {
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
public func storeAsReceiver(
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

/// The iat of every token ``storeAsReceiver(_:jti:sub:eventType:email:role:issuedAt:)`` stores: this
/// process's start, in whole seconds.
public let storeAsReceiverIssuedAt = Date(
    timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down))
