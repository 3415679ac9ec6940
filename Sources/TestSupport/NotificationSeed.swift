public import AppleNotifications
public import Foundation
public import Postgres
import Receiver

/// The claims of one notification to seed a test database with: what a verified token from Apple
/// carries, with defaults for what a test does not care about.
public struct SeededNotification: Sendable {
    /// The claims, as the verifier hands them to the store.
    public var notification: ServerNotification
    /// The compact token stored as `raw_token`.
    public var rawToken: String

    /// A notification of `type` for `sub`, stored with a token ``TestSigning/apple`` signed with exactly
    /// these claims (the worker verifies every stored token) and read back by the receiver's verifier:
    /// `eventTime` is kept to the millisecond and `issuedAt` to the second, as the token carries them
    /// (an `eventTime` beyond `issuedAt` + 60 s becomes the claimed one, as the receiver stores it),
    /// and `exp` is a day after `iat` (as Apple sets it). With `rawToken`, that text is stored instead
    /// (junk, or a token of one's own) and `expiresAt` defaults to a day after `issuedAt`.
    public init(
        jti: String, type: String = "consent-revoked", sub: String, audience: String = "com.example.app",
        email: String? = nil, isPrivateEmail: Bool? = nil, eventTime: Date = Date(), issuedAt: Date = Date(),
        expiresAt: Date? = nil, rawToken: String? = nil
    ) {
        guard let rawToken else {
            let iat = issuedAt.timeIntervalSince1970.rounded(.down)
            let isPrivate =
                email.map { isPrivateEmail ?? $0.hasSuffix("@privaterelay.appleid.com") } ?? isPrivateEmail
            let signed = TestSigning.token(
                type: type, subject: sub, audience: audience, email: email, isPrivateEmail: isPrivate,
                eventTime: eventTime, issuedAt: issuedAt, jti: jti)
            // The claims as the receiver's verifier reads them (an event_time beyond iat + leeway is
            // not believed: the effective one is stored, the signed one kept beside it).
            do {
                notification = try NotificationVerifier(audiences: [audience]).verify(
                    token: signed, keys: TestSigning.appleKeySet, now: Date(timeIntervalSince1970: iat))
            } catch {
                preconditionFailure("a token TestSigning signed does not verify: \(error)")
            }
            self.rawToken = signed
            return
        }
        notification = ServerNotification(
            eventType: EventType(rawValue: type), subject: sub, email: email,
            isPrivateEmail: isPrivateEmail, eventTime: eventTime, jti: jti,
            audience: audience, audiences: [audience], issuedAt: issuedAt,
            expiresAt: expiresAt ?? issuedAt.addingTimeInterval(86_400))
        self.rawToken = rawToken
    }
}

extension PostgresConnection {
    /// Stores `notifications` the way siwa-receiver does: its statement (`NotificationStore`'s batch
    /// insert: dedupe key, log, queue and the workers' NOTIFY), in one statement, on this connection
    /// (inside the caller's transaction, if any). Returns the jtis it stored (one stored before is not).
    @discardableResult
    public func storeAsReceiver(_ notifications: [SeededNotification]) throws -> Set<String> {
        guard !notifications.isEmpty else { return [] }
        return try NotificationStore.insert(notifications.map { ($0.notification, $0.rawToken) }, on: self)
    }

    /// Stores one notification the way siwa-receiver does (``storeAsReceiver(_:)-([SeededNotification])``);
    /// returns whether it was stored (false: its jti was stored before).
    @discardableResult
    public func storeAsReceiver(_ notification: SeededNotification) throws -> Bool {
        try !storeAsReceiver([notification]).isEmpty
    }
}

extension PostgresConnection {
    /// The instant the SQL expression `sql` (e.g. `now() - interval '1 hour'`) stands for, evaluated on
    /// this connection (inside a transaction, `now()` is its start), for seeding with SQL times.
    public func instant(_ sql: String) throws -> Date {
        let seconds = try query("SELECT extract(epoch FROM (\(sql))::timestamptz)::float8")[0][
            0, as: Double.self]
        return Date(timeIntervalSince1970: seconds)
    }
}
