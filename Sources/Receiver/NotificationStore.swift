import AppleNotifications
import Foundation
import Postgres

/// Durable storage of verified notifications: one row per `jti`.
///
/// A row and the wake-up for the workers (a statement trigger's `NOTIFY`) commit in one transaction;
/// ``store(_:rawToken:)`` returns only after that commit, so a 200 to Apple always means "stored".
public final class NotificationStore: Sendable {
    /// What storing did.
    public enum Outcome: String, Sendable {
        /// A new row was committed.
        case accepted
        /// A row with this `jti` was already stored; nothing was written.
        case duplicate
    }

    static let insertSQL = """
        INSERT INTO siwa.notifications
            (jti, event_type, sub, audience, email, is_private_email, event_time, issued_at, expires_at, raw_token)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
        ON CONFLICT (jti) DO NOTHING
        """

    private let pool: PostgresPool

    /// Stores into the database behind `pool`, which must hold schema.sql.
    public init(pool: PostgresPool) {
        self.pool = pool
    }

    /// Commits `notification` (with its token, for audit) unless its `jti` is already stored.
    public func store(_ notification: ServerNotification, rawToken: String) throws -> Outcome {
        let parameters: [PostgresData?] = [
            .text(notification.jti),
            .text(notification.eventType.rawValue),
            .text(notification.subject),
            .text(notification.audience),
            notification.email.map { .text($0) },
            notification.isPrivateEmail.map { .bool($0) },
            .date(notification.eventTime),
            .date(notification.issuedAt),
            notification.expiresAt.map { .date($0) },
            .text(rawToken),
        ]
        let inserted = try pool.withConnection { connection in
            try connection.execute(Self.insertSQL, parameters)
        }
        return inserted == 1 ? .accepted : .duplicate
    }

    /// Whether the database answers (readiness).
    public func isReachable() -> Bool {
        (try? pool.ping()) != nil
    }
}
