public import Foundation

/// One change of `siwa.changes` as Shared Signals see it: what happened to which subject, and when.
///
/// Carries no personal data: never the email of an email event, so a SET built from it has none either.
public struct AccountSignal: Sendable, Hashable {
    /// What happened, one to one with the changefeed's types that Shared Signals carry.
    public enum Kind: String, Sendable, CaseIterable {
        case consentRevoked = "siwa.consent_revoked"
        case accountDeleted = "siwa.account_deleted"
        case subjectTransferred = "siwa.sub_transferred"
        case emailDisabled = "siwa.email_disabled"
        case emailEnabled = "siwa.email_enabled"
    }

    public var kind: Kind
    /// The user's team-scoped Apple `sub` (after a transfer: the new one).
    public var subject: String
    /// For ``Kind/subjectTransferred``: the `sub` the transfer replaced.
    public var previousSubject: String?
    /// Apple's `event_time` of the notification (for a transfer: when it was applied).
    public var eventTime: Date
    /// The `jti` of Apple's notification that caused it; becomes the SET's `txn` (omitted when empty).
    public var notificationJTI: String

    public init(
        kind: Kind, subject: String, previousSubject: String? = nil, eventTime: Date, notificationJTI: String
    ) {
        self.kind = kind
        self.subject = subject
        self.previousSubject = previousSubject
        self.eventTime = eventTime
        self.notificationJTI = notificationJTI
    }

    /// The signal for a changefeed type, or nil for one Shared Signals do not carry (`siwa.personal_data_erased`).
    public init?(
        changeType: String, subject: String, previousSubject: String?, eventTime: Date,
        notificationJTI: String
    ) {
        guard let kind = Kind(rawValue: changeType) else { return nil }
        self.init(
            kind: kind, subject: subject, previousSubject: previousSubject, eventTime: eventTime,
            notificationJTI: notificationJTI)
    }
}
