public import Foundation

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
    /// ISO 8601 in UTC with milliseconds (`2026-01-01T12:00:00.123Z`): the bytes Foundation's
    /// `JSONSerialization` (`.sortedKeys`, `.withoutEscapingSlashes`) writes for these fields, written
    /// directly (the worker builds one per attempt; Foundation's serialiser and date formatter cost
    /// most of an attempt's CPU).
    public var body: [UInt8] {
        var out = BodyWriter()
        let event = BodyWriter.timestamp(eventTime)
        out.raw(#"{"data":{"applied_at":"#)
        out.string(BodyWriter.timestamp(appliedAt))
        if let audience { out.field("audience", audience) }
        out.raw(#","change_id":"#)
        out.raw(String(changeID))
        if let email { out.field("email", email) }
        out.field("event_time", event)
        if let isPrivateEmail {
            out.raw(isPrivateEmail ? #","is_private_email":true"# : #","is_private_email":false"#)
        }
        out.field("jti", jti)
        if let oldSub { out.field("old_sub", oldSub) }
        out.raw(#","refresh_tokens_revoked":"#)
        out.raw(String(refreshTokensRevoked))
        out.raw(#","sessions_revoked":"#)
        out.raw(String(sessionsRevoked))
        out.field("sub", sub)
        out.raw(#"},"timestamp":"#)
        out.string(event)
        out.field("type", type)
        out.raw("}")
        return out.bytes
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

/// The delivery body's JSON, written as `JSONSerialization` writes it: strings with `"`, `\`, and
/// the C0 controls escaped (`\b \f \n \r \t`, others `\u00xx` in lower-case hex), everything else
/// (slashes, DEL, non-ASCII) as UTF-8.
struct BodyWriter {
    var bytes: [UInt8] = []

    init() { bytes.reserveCapacity(512) }

    mutating func raw(_ text: String) { bytes.append(contentsOf: text.utf8) }

    /// `,"name":` and `value` as a string.
    mutating func field(_ name: String, _ value: String) {
        bytes.append(UInt8(ascii: ","))
        string(name)
        bytes.append(UInt8(ascii: ":"))
        string(value)
    }

    mutating func string(_ value: String) {
        bytes.append(UInt8(ascii: "\""))
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "\""): bytes += [UInt8(ascii: "\\"), UInt8(ascii: "\"")]
            case UInt8(ascii: "\\"): bytes += [UInt8(ascii: "\\"), UInt8(ascii: "\\")]
            case 0x08: bytes += [UInt8(ascii: "\\"), UInt8(ascii: "b")]
            case 0x0C: bytes += [UInt8(ascii: "\\"), UInt8(ascii: "f")]
            case 0x0A: bytes += [UInt8(ascii: "\\"), UInt8(ascii: "n")]
            case 0x0D: bytes += [UInt8(ascii: "\\"), UInt8(ascii: "r")]
            case 0x09: bytes += [UInt8(ascii: "\\"), UInt8(ascii: "t")]
            case 0x00..<0x20:
                let hex = Array("0123456789abcdef".utf8)
                bytes += Array("\\u00".utf8) + [hex[Int(byte >> 4)], hex[Int(byte & 0xF)]]
            default: bytes.append(byte)
            }
        }
        bytes.append(UInt8(ascii: "\""))
    }

    /// `date` in UTC as `yyyy-MM-ddTHH:mm:ss.SSSZ`, rounded to the nearest millisecond, as
    /// `ISO8601DateFormatter` with `.withInternetDateTime` and `.withFractionalSeconds` writes it.
    static func timestamp(_ date: Date) -> String {
        // The formatter's arithmetic: milliseconds since 1970 from the reference-date interval, rounded.
        let milliseconds = Int64(((date.timeIntervalSinceReferenceDate + 978_307_200) * 1000).rounded())
        let (seconds, millisecond) = milliseconds.quotientAndRemainder(dividingBy: 1000)
        let (wholeSeconds, fraction) =
            millisecond < 0 ? (seconds - 1, millisecond + 1000) : (seconds, millisecond)
        var time = time_t(wholeSeconds)
        var parts = tm()
        gmtime_r(&time, &parts)
        var text = [UInt8]()
        text.reserveCapacity(24)
        func digits(_ value: Int, _ count: Int) {
            var divisor = 1
            for _ in 1..<count { divisor *= 10 }
            var rest = value
            while divisor > 0 {
                text.append(UInt8(ascii: "0") + UInt8(rest / divisor % 10))
                rest %= divisor
                divisor /= 10
            }
        }
        digits(Int(parts.tm_year) + 1900, 4)
        text.append(UInt8(ascii: "-"))
        digits(Int(parts.tm_mon) + 1, 2)
        text.append(UInt8(ascii: "-"))
        digits(Int(parts.tm_mday), 2)
        text.append(UInt8(ascii: "T"))
        digits(Int(parts.tm_hour), 2)
        text.append(UInt8(ascii: ":"))
        digits(Int(parts.tm_min), 2)
        text.append(UInt8(ascii: ":"))
        digits(Int(parts.tm_sec), 2)
        text.append(UInt8(ascii: "."))
        digits(Int(fraction), 3)
        text.append(UInt8(ascii: "Z"))
        return String(decoding: text, as: UTF8.self)
    }
}
