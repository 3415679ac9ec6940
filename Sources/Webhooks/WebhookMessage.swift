import Foundation

// MARK: - The delivery body (the worker's and `siwactl webhooks send`'s one builder)

/// One change of the changefeed as a webhook delivery carries it: the fields of a `siwa.changes` row
/// that the body holds. ``body`` is the one builder of delivery bodies: `siwa-worker` fills this from
/// the change row when it sends, `siwactl webhooks send` from ``sample(type:changeID:now:)``, so a
/// sample is byte-for-byte what a real delivery of its type looks like.
public struct WebhookChange: Sendable, Equatable {
    /// The change type, e.g. `siwa.account_deleted`.
    public var type: String
    /// `siwa.changes.id`.
    public var changeID: Int
    /// The user's team-scoped Apple identifier.
    public var sub: String
    /// The event's time at Apple (also the body's `timestamp`).
    public var eventTime: Date
    /// When the worker applied it.
    public var appliedAt: Date
    /// Apple's notification id (empty for `siwa.sub_transferred`).
    public var jti: String
    /// The client ID the notification was for, when known.
    public var audience: String?
    /// Sessions the change revoked.
    public var sessionsRevoked: Int
    /// Refresh tokens the change revoked.
    public var refreshTokensRevoked: Int
    /// The email, on email events of accounts not erased.
    public var email: String?
    /// Whether the email is a private relay address, with ``email``.
    public var isPrivateEmail: Bool?
    /// The sub before a team transfer (`siwa.sub_transferred` only).
    public var oldSub: String?

    /// A change with these fields.
    public init(
        type: String, changeID: Int, sub: String, eventTime: Date, appliedAt: Date, jti: String,
        audience: String? = nil, sessionsRevoked: Int = 0, refreshTokensRevoked: Int = 0,
        email: String? = nil, isPrivateEmail: Bool? = nil, oldSub: String? = nil
    ) {
        self.type = type
        self.changeID = changeID
        self.sub = sub
        self.eventTime = eventTime
        self.appliedAt = appliedAt
        self.jti = jti
        self.audience = audience
        self.sessionsRevoked = sessionsRevoked
        self.refreshTokensRevoked = refreshTokensRevoked
        self.email = email
        self.isPrivateEmail = isPrivateEmail
        self.oldSub = oldSub
    }

    /// Every change type a delivery may carry, in the changefeed's order of documentation.
    public static let types = [
        "siwa.email_disabled", "siwa.email_enabled", "siwa.consent_revoked", "siwa.account_deleted",
        "siwa.personal_data_erased", "siwa.sub_transferred",
    ]

    /// Why a subscription to `types` (an endpoint's `--types`; nil: every type) loses something the app
    /// should hear of, or nil when it does not: `siwa.account_deleted` without `siwa.personal_data_erased`
    /// leaves the app holding the personal data it received (the emails of email events, whatever it
    /// stored of the user) after siwa erased its own copy. The one home of that advice: `siwactl webhooks
    /// add` and `listen --forward-to` print it as a warning.
    public static func subscriptionWarning(_ types: [String]?) -> String? {
        guard let types, types.contains("siwa.account_deleted"), !types.contains("siwa.personal_data_erased")
        else { return nil }
        return "--types has siwa.account_deleted without siwa.personal_data_erased: the app would never hear"
            + " that a deleted user's personal data was erased here and would keep what it received (emails"
            + " of email events, anything it stored); add siwa.personal_data_erased, or leave out --types to"
            + " receive every type"
    }

    /// The `webhook-id` of this change's delivery to endpoint `endpoint`: `msg_<change id>_<endpoint id>`.
    public func webhookID(endpoint: Int) -> String { "msg_\(changeID)_\(endpoint)" }

    /// The delivery body: `{"data":{…},"timestamp":…,"type":…}`, keys sorted, slashes unescaped, times
    /// ISO 8601 with milliseconds.
    public var body: [UInt8] {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        let event = formatter.string(from: eventTime)
        var data: [String: Any] = [
            "change_id": changeID, "sub": sub, "event_time": event,
            "applied_at": formatter.string(from: appliedAt), "jti": jti,
            "sessions_revoked": sessionsRevoked, "refresh_tokens_revoked": refreshTokensRevoked,
        ]
        if let audience { data["audience"] = audience }
        if let email { data["email"] = email }
        if let isPrivateEmail { data["is_private_email"] = isPrivateEmail }
        if let oldSub { data["old_sub"] = oldSub }
        let object: [String: Any] = ["type": type, "timestamp": event, "data": data]
        // Strings, integers and booleans only: serialisation cannot fail.
        return [UInt8](
            try! JSONSerialization.data(
                withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes]))
    }

    /// A sample change of `type` shaped as the worker writes that type: an email and its relay flag on
    /// email events, a revoked session on consent and account events, `old_sub` and an empty `jti` on a
    /// team transfer. Made-up values (`…sample…` subs, a `privaterelay` address): never a real user.
    public static func sample(type: String, changeID: Int, now: Date = Date()) -> WebhookChange {
        // Whole milliseconds, as the body shows them: the event a second before it was applied.
        let applied = Date(timeIntervalSince1970: (now.timeIntervalSince1970 * 1000).rounded(.down) / 1000)
        var change = WebhookChange(
            type: type, changeID: changeID, sub: "000000.5a3b1e0000000000000000000000sample.0000",
            eventTime: applied.addingTimeInterval(-1), appliedAt: applied,
            jti: UUID().uuidString.lowercased(), audience: "com.example.app")
        switch type {
        case "siwa.email_disabled", "siwa.email_enabled":
            change.email = "sample.relay@privaterelay.appleid.com"
            change.isPrivateEmail = true
        case "siwa.consent_revoked", "siwa.account_deleted":
            change.sessionsRevoked = 1
        case "siwa.sub_transferred":
            change.oldSub = "000000.01d5a3b1e000000000000000000sample.0000"
            change.jti = ""
        default: break
        }
        return change
    }
}
