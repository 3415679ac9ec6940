import Foundation
import ServiceSupport

/// Postmark's bounce webhook (postmarkapp.com/developer/webhooks/bounce-webhook): one JSON object,
/// `RecordType: "Bounce"`, its `Type` (HardBounce, SoftBounce, …), `Email` and `Details`. Postmark
/// signs nothing: the webhook URL carries HTTP Basic credentials (`https://user:password@host/…`, as
/// Postmark's webhook page documents), checked here in constant time.
public struct PostmarkWebhook: Sendable {
    /// `user:password`, compared with the decoded Basic credentials.
    private let expected: String

    /// Types that are a permanent refusal; ``softTypes`` are tried again; any other is not a bounce.
    public static let hardTypes: Set<String> = [
        "HardBounce", "BadEmailAddress", "Blocked", "DMARCPolicy", "SMTPApiError", "Unknown",
        "ManuallyDeactivated",
    ]
    public static let softTypes: Set<String> = ["SoftBounce", "Transient", "DnsError"]

    public init(username: String, password: String) {
        expected = username + ":" + password
    }

    /// The bounce of one request, once its `Authorization` header carries the credentials.
    /// - Throws: ``ESPEventError`` (unauthenticated or malformed).
    public func events(body: [UInt8], authorization: String?) throws(ESPEventError) -> ESPEventBatch {
        guard let basic = AuthorizationHeader.basicCredentials(authorization),
            constantTimeEqual(basic.user + ":" + basic.password, expected)
        else {
            throw .unauthenticated("the Postmark webhook's Basic credentials do not match")
        }
        let object = try ESPJSON.object(body)
        let type = object["Type"] as? String ?? ""
        let permanent = Self.hardTypes.contains(type)
        guard object["RecordType"] as? String == "Bounce", permanent || Self.softTypes.contains(type) else {
            return ESPEventBatch(otherEvents: 1)
        }
        guard let email = object["Email"] as? String, !email.isEmpty else {
            throw .malformed("a bounce has no Email")
        }
        // Details holds the server's reply; Description is Postmark's generic text for the type, which
        // would mislead the classifier ("unknown user" for every hard bounce), so it is not read.
        var reply = object["Details"] as? String ?? ""
        if type == "DMARCPolicy" { reply += " (DMARC policy)" }
        return ESPEventBatch(bounces: [
            .make(
                .postmark, recipient: email, permanent: permanent, reply: reply,
                sender: object["From"] as? String, eventID: try ESPJSON.eventID(object["ID"]))
        ])
    }
}
