public import Foundation

/// Security Event Tokens (RFC 8417) in the shape of OpenID Shared Signals 1.0, CAEP 1.0 and RISC 1.0.
///
/// One SET per signal and stream: `iss`, `aud` (the stream's), `iat`, `jti`, `txn` (Apple's `jti`),
/// `sub_id` in the `iss_sub` format, and `events` with exactly one member; never `exp` nor a JWT `sub`.
public enum SecurityEventToken {
    /// The media type of a pushed SET (RFC 8935): `application/secevent+jwt`.
    public static let mediaType = "application/secevent+jwt"
    /// The JWS `typ` of every SET (RFC 8417 § 2.3).
    public static let mediaTypeSuffix = "secevent+jwt"
    /// The issuer of the subjects' identifiers: Apple's, whose `sub` the SETs carry.
    public static let subjectIssuer = "https://appleid.apple.com"

    /// The event type URIs the transmitter emits, in ``AccountSignal/Kind`` order.
    public enum EventType {
        /// CAEP 1.0 § 3.1: the user revoked the app's consent, so its sessions end.
        public static let sessionRevoked =
            "https://schemas.openid.net/secevent/caep/event-type/session-revoked"
        /// RISC 1.0 § 2.2: the account was deleted at Apple.
        public static let accountPurged = "https://schemas.openid.net/secevent/risc/event-type/account-purged"
        /// Ours (docs/shared-signals.md): a team transfer replaced the user's `sub`; carries the old one.
        public static let subjectTransferred = "urn:siwa:secevent:event-type:subject-transferred"
        /// Ours: the user stopped mail forwarding from the private relay address; no address is sent.
        public static let emailForwardingDisabled = "urn:siwa:secevent:event-type:email-forwarding-disabled"
        /// Ours: the user turned mail forwarding back on; no address is sent.
        public static let emailForwardingEnabled = "urn:siwa:secevent:event-type:email-forwarding-enabled"

        /// SSF 1.0 § 8.1.4: the verification event a receiver asks for; its `state` echoed.
        public static let verification = "https://schemas.openid.net/secevent/ssf/event-type/verification"
        /// SSF 1.0 § 8.1.5: the stream's status changed.
        public static let streamUpdated = "https://schemas.openid.net/secevent/ssf/event-type/stream-updated"

        /// Every account type, for `events_supported` (the stream events are always delivered).
        public static let all = [
            sessionRevoked, accountPurged, subjectTransferred, emailForwardingDisabled,
            emailForwardingEnabled,
        ]

        /// The type a signal is sent as.
        public static func of(_ kind: AccountSignal.Kind) -> String {
            switch kind {
            case .consentRevoked: sessionRevoked
            case .accountDeleted: accountPurged
            case .subjectTransferred: subjectTransferred
            case .emailDisabled: emailForwardingDisabled
            case .emailEnabled: emailForwardingEnabled
            }
        }
    }

    /// Why a consent revocation ended the sessions, as CAEP's `reason_admin` (language tag → text).
    public static let consentRevokedReason = [
        "en": "The user revoked this app's consent to Sign in with Apple (Apple: consent-revoked)."
    ]

    /// The SET's claims as JSON bytes (sorted keys): deterministic for the same arguments.
    public static func claimsJSON(
        for signal: AccountSignal, issuer: String, audience: String, jti: String, issuedAt: Date
    ) throws -> Data {
        var claims: [String: Any] = [
            "iss": issuer, "aud": audience, "iat": Int64(issuedAt.timeIntervalSince1970.rounded(.down)),
            "jti": jti, "sub_id": subjectIdentifier(signal.subject),
            "events": [EventType.of(signal.kind): payload(for: signal)],
        ]
        if !signal.notificationJTI.isEmpty { claims["txn"] = signal.notificationJTI }
        return try JSONSerialization.data(withJSONObject: claims, options: jsonWritingOptions)
    }

    /// The signed SET (compact JWS) for one signal and one stream's audience.
    public static func sign(
        _ signal: AccountSignal, with key: SETSigningKey, issuer: String, audience: String, jti: String,
        issuedAt: Date
    ) throws -> String {
        try key.sign(
            claimsJSON: claimsJSON(
                for: signal, issuer: issuer, audience: audience, jti: jti, issuedAt: issuedAt))
    }

    /// A stream's own event (verification, stream-updated): `sub_id` is `{"format":"opaque","id":stream_id}`
    /// (SSF 1.0 § 8.1.4.1), the event's members are `members`; no `txn`.
    public static func signStreamEvent(
        type: String, members: [String: String], streamID: String, with key: SETSigningKey, issuer: String,
        audience: String, jti: String, issuedAt: Date
    ) throws -> String {
        let claims: [String: Any] = [
            "iss": issuer, "aud": audience, "iat": Int64(issuedAt.timeIntervalSince1970.rounded(.down)),
            "jti": jti, "sub_id": ["format": "opaque", "id": streamID], "events": [type: members],
        ]
        return try key.sign(
            claimsJSON: JSONSerialization.data(withJSONObject: claims, options: jsonWritingOptions))
    }

    /// SSF 1.0's `iss_sub` subject identifier for an Apple `sub`.
    public static func subjectIdentifier(_ sub: String) -> [String: String] {
        ["format": "iss_sub", "iss": subjectIssuer, "sub": sub]
    }

    private static func payload(for signal: AccountSignal) -> [String: Any] {
        let timestamp = Int64(signal.eventTime.timeIntervalSince1970.rounded(.down))
        switch signal.kind {
        case .consentRevoked:
            return [
                "initiating_entity": "user", "reason_admin": consentRevokedReason,
                "event_timestamp": timestamp,
            ]
        case .accountDeleted:
            return [:]
        case .subjectTransferred:
            return [
                "previous_sub_id": subjectIdentifier(signal.previousSubject ?? ""),
                "event_timestamp": timestamp,
            ]
        case .emailDisabled, .emailEnabled:
            return ["event_timestamp": timestamp]
        }
    }
}
