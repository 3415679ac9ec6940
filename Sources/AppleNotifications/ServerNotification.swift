public import Foundation

/// The `type` of a Sign in with Apple server-to-server event.
///
/// Unknown types are kept (``isKnown`` is `false`) rather than refused, so a new event Apple
/// introduces is stored instead of bounced. `account-deleted` (Apple's documentation spelling) is
/// normalised to `account-delete` (the spelling seen in real traffic).
public struct EventType: Sendable, Hashable, Codable, RawRepresentable, CustomStringConvertible {
    /// The canonical type string.
    public let rawValue: String

    /// Creates a type from Apple's string, normalising `account-deleted`.
    public init(rawValue: String) {
        self.rawValue = rawValue == "account-deleted" ? "account-delete" : rawValue
    }

    /// The user stopped forwarding email through the private relay.
    public static let emailDisabled = EventType(rawValue: "email-disabled")
    /// The user started forwarding email through the private relay again.
    public static let emailEnabled = EventType(rawValue: "email-enabled")
    /// The user stopped using Sign in with Apple with this app.
    public static let consentRevoked = EventType(rawValue: "consent-revoked")
    /// The user deleted their Apple account.
    public static let accountDelete = EventType(rawValue: "account-delete")

    /// The four types Apple documents.
    public static let known: Set<EventType> = [
        .emailDisabled, .emailEnabled, .consentRevoked, .accountDelete,
    ]

    /// Whether this is one of the four documented types.
    public var isKnown: Bool { Self.known.contains(self) }

    public var description: String { rawValue }

    public init(from decoder: any Decoder) throws {
        self.init(rawValue: try decoder.singleValueContainer().decode(String.self))
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }
}

/// A verified server-to-server notification: what happened, to whom, and the JWT facts around it.
public struct ServerNotification: Sendable, Equatable, Codable {
    /// The event type (possibly unknown; see ``EventType/isKnown``).
    public var eventType: EventType
    /// The team-scoped user identifier (`sub`).
    public var subject: String
    /// The email address, sent only with the email events.
    public var email: String?
    /// Whether ``email`` is a private relay address, sent only with the email events.
    public var isPrivateEmail: Bool?
    /// When the event happened (`event_time`, in milliseconds or seconds on the wire), at the latest
    /// `iat` + the verifier's leeway: the time every effect and ordering uses (see
    /// ``claimedEventTime``).
    public var eventTime: Date
    /// The signed `event_time` when it was later than `iat` + the verifier's leeway (an event dated
    /// after Apple signed the token about it); ``eventTime`` is then `iat` + leeway. `nil` otherwise.
    /// Stored in `siwa.notification_log.claimed_event_time` for admins; never used for effects.
    public var claimedEventTime: Date?
    /// The token's unique identifier; duplicates mean re-delivery.
    public var jti: String
    /// The configured client ID that the token's `aud` matched.
    public var audience: String
    /// Every audience the token named.
    public var audiences: [String]
    /// The token's `iat`.
    public var issuedAt: Date
    /// The token's `exp`, when present.
    public var expiresAt: Date?

    /// Creates a notification; the verifier is the usual source.
    public init(
        eventType: EventType, subject: String, email: String? = nil, isPrivateEmail: Bool? = nil,
        eventTime: Date, jti: String, audience: String, audiences: [String], issuedAt: Date,
        expiresAt: Date? = nil, claimedEventTime: Date? = nil
    ) {
        self.eventType = eventType
        self.subject = subject
        self.email = email
        self.isPrivateEmail = isPrivateEmail
        self.eventTime = eventTime
        self.jti = jti
        self.audience = audience
        self.audiences = audiences
        self.issuedAt = issuedAt
        self.expiresAt = expiresAt
        self.claimedEventTime = claimedEventTime
    }
}
