import Foundation
import Testing
import Webhooks

/// The delivery body is written directly, without Foundation's serialiser: it must be the bytes
/// `JSONSerialization` (`.sortedKeys`, `.withoutEscapingSlashes`) and `ISO8601DateFormatter` (internet
/// date-time with fractional seconds) make of the same fields, whatever the strings and times hold.
@Suite("The delivery body is Foundation's JSON of the change, byte for byte")
struct BodyEncodingTests {
    /// The body as Foundation writes it (the builder before it was written by hand).
    static func foundationBody(_ change: WebhookChange) -> [UInt8] {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        let event = formatter.string(from: change.eventTime)
        var data: [String: Any] = [
            "change_id": change.changeID, "sub": change.sub, "event_time": event,
            "applied_at": formatter.string(from: change.appliedAt), "jti": change.jti,
            "sessions_revoked": change.sessionsRevoked, "refresh_tokens_revoked": change.refreshTokensRevoked,
        ]
        if let audience = change.audience { data["audience"] = audience }
        if let email = change.email { data["email"] = email }
        if let isPrivateEmail = change.isPrivateEmail { data["is_private_email"] = isPrivateEmail }
        if let oldSub = change.oldSub { data["old_sub"] = oldSub }
        let object: [String: Any] = ["type": change.type, "timestamp": event, "data": data]
        return [UInt8](
            try! JSONSerialization.data(
                withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes]))
    }

    static func text(_ bytes: [UInt8]) -> String { String(decoding: bytes, as: UTF8.self) }

    @Test("every sample type, and every ASCII character, C1, U+2028 and non-BMP text in every string field")
    func strings() {
        var characters = (0..<128).map { String(UnicodeScalar(UInt8($0))) }
        characters += ["\u{85}", "\u{9B}", "\u{2028}", "\u{2029}", "é", "日本", "😀", "a/b", "\\/", "\"\""]
        for type in WebhookChange.types {
            let sample = WebhookChange.sample(type: type, changeID: 7)
            #expect(Self.text(sample.body) == Self.text(Self.foundationBody(sample)), "\(type)")
        }
        for (index, character) in characters.enumerated() {
            let text = "x\(character)y\(character)"
            var change = WebhookChange.sample(type: "siwa.email_enabled", changeID: index)
            change.sub = text
            change.jti = text
            change.audience = text
            change.email = text
            change.oldSub = text
            change.type = text
            change.isPrivateEmail = index % 2 == 0
            change.sessionsRevoked = index
            change.refreshTokensRevoked = -index
            #expect(Self.text(change.body) == Self.text(Self.foundationBody(change)), "\(index)")
            #expect(change.body == Self.foundationBody(change), "\(index)")
        }
        var bare = WebhookChange.sample(type: "siwa.consent_revoked", changeID: Int.max)
        bare.audience = nil
        #expect(bare.body == Self.foundationBody(bare))
    }

    @Test("times with microseconds, across centuries and leap days, as the ISO 8601 formatter writes them")
    func times() {
        var generator = SystemRandomNumberGenerator()
        var dates = [
            Date(timeIntervalSince1970: 0), Date(timeIntervalSince1970: 951_782_400.999_999),  // 2000-02-29
            Date(timeIntervalSince1970: 1_767_225_599.999_5),
            Date(timeIntervalSince1970: 4_102_444_800.000_001),
        ]
        for _ in 0..<2000 {
            // Microsecond precision, as PostgreSQL's timestamptz hands them over.
            let micros = Int64.random(in: 0..<4_102_444_800_000_000, using: &generator)
            dates.append(Date(timeIntervalSince1970: Double(micros) / 1_000_000))
        }
        for date in dates {
            var change = WebhookChange.sample(type: "siwa.account_deleted", changeID: 1)
            change.eventTime = date
            change.appliedAt = date.addingTimeInterval(0.000_7)
            #expect(change.body == Self.foundationBody(change), "\(date.timeIntervalSince1970)")
        }
    }
}
