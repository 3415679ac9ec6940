public import Foundation

/// One row of the `siwa.ssf_events` outbox, as push and poll sign it: an account change, or one of the
/// stream's own SSF events (verification, stream-updated).
public struct StoredEvent: Sendable, Equatable {
    /// `siwa.changes`' type, or `ssf.verification` / `ssf.stream_updated`.
    public var changeType: String
    /// The Apple `sub` of an account change; the stream's `stream_id` for a stream event.
    public var subject: String
    public var previousSubject: String?
    public var eventTime: Date
    /// Apple's notification `jti` (the SET's `txn`; empty: none).
    public var notificationJTI: String
    /// A stream event's members (`state`; `status`, `reason`), as the outbox's `detail` holds them.
    public var detail: [String: String]
    /// The SET's `jti` and `iat`, fixed at fan-out.
    public var jti: String
    public var issuedAt: Date

    public init(
        changeType: String, subject: String, previousSubject: String?, eventTime: Date,
        notificationJTI: String,
        detail: [String: String], jti: String, issuedAt: Date
    ) {
        self.changeType = changeType
        self.subject = subject
        self.previousSubject = previousSubject
        self.eventTime = eventTime
        self.notificationJTI = notificationJTI
        self.detail = detail
        self.jti = jti
        self.issuedAt = issuedAt
    }

    /// `detail` from the outbox's JSON text: its string members only (nil or other JSON: none).
    public static func detail(fromJSON text: String?) -> [String: String] {
        guard let text,
            let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
        else { return [:] }
        return object.compactMapValues { $0 as? String }
    }

    /// The signed SET for a stream whose SETs carry `audience`.
    /// - Throws: when the change type is neither an account change nor a stream event, or signing fails.
    public func sign(with key: SETSigningKey, issuer: String, audience: String) throws -> String {
        if let signal = AccountSignal(
            changeType: changeType, subject: subject, previousSubject: previousSubject, eventTime: eventTime,
            notificationJTI: notificationJTI)
        {
            return try SecurityEventToken.sign(
                signal, with: key, issuer: issuer, audience: audience, jti: jti, issuedAt: issuedAt)
        }
        let type: String
        switch changeType {
        case "ssf.verification": type = SecurityEventToken.EventType.verification
        case "ssf.stream_updated": type = SecurityEventToken.EventType.streamUpdated
        default: throw UnknownChangeType()
        }
        return try SecurityEventToken.signStreamEvent(
            type: type, members: detail, streamID: subject, with: key, issuer: issuer, audience: audience,
            jti: jti, issuedAt: issuedAt)
    }

    /// The outbox holds a change type this build does not sign.
    public struct UnknownChangeType: Error {}
}
