public import Foundation
import ServiceSupport
import Synchronization

/// Mailgun's webhooks (documentation.mailgun.com, "Securing Webhooks" and "Tracking Failures"): a JSON
/// body `{"signature": {timestamp, token, signature}, "event-data": {…}}`, signed with the webhook signing
/// key as hex HMAC-SHA256 of timestamp + token. A request is taken once: its timestamp within
/// ``maximumAge`` of now, its token never seen before (kept for as long as its timestamp is fresh).
public final class MailgunWebhook: Sendable {
    /// The longest a signed request stays acceptable, either side of now.
    public let maximumAge: TimeInterval
    /// The most tokens remembered; past it the oldest is forgotten (only a signed request adds one).
    public let replayCapacity: Int
    private let signingKey: [UInt8]
    private let seen: Mutex<SeenTokens>

    private struct SeenTokens {
        var order: [(token: String, expires: Date)] = []
        var head = 0
        var tokens: Set<String> = []

        /// Forgets the expired tokens and, past `capacity`, the oldest.
        mutating func prune(now: Date, capacity: Int) {
            while head < order.count, order[head].expires < now || tokens.count >= capacity {
                tokens.remove(order[head].token)
                head += 1
            }
            if head > 1024, head * 2 > order.count {
                order.removeFirst(head)
                head = 0
            }
        }
    }

    public init(signingKey: [UInt8], maximumAge: TimeInterval = 300, replayCapacity: Int = 100_000) {
        precondition(!signingKey.isEmpty, "Mailgun's signing key is empty")
        self.signingKey = signingKey
        self.maximumAge = maximumAge
        self.replayCapacity = max(1, replayCapacity)
        seen = Mutex(SeenTokens())
    }

    /// The bounces of one request, once its signature, age and token pass.
    /// - Throws: ``ESPEventError`` (unauthenticated or malformed).
    public func events(body: [UInt8], now: Date = Date()) throws(ESPEventError) -> ESPEventBatch {
        let object = try ESPJSON.object(body)
        guard let signature = object["signature"] as? [String: Any],
            let timestamp = ESPJSON.text(signature["timestamp"]), let token = signature["token"] as? String,
            let given = signature["signature"] as? String
        else { throw .unauthenticated("no Mailgun signature (signature.timestamp, token, signature)") }
        let expected = hex(hmacSHA256(key: signingKey, message: Array((timestamp + token).utf8)))
        guard constantTimeEqual(given.lowercased(), expected) else {
            throw .unauthenticated("the Mailgun signature does not verify")
        }
        guard let seconds = Double(timestamp), abs(now.timeIntervalSince1970 - seconds) <= maximumAge else {
            throw .stale(
                "the Mailgun timestamp is older than \(Int(maximumAge)) s (or in the future)")
        }
        let fresh = seen.withLock { seen in
            seen.prune(now: now, capacity: replayCapacity)
            guard seen.tokens.insert(token).inserted else { return false }
            seen.order.append((token, Date(timeIntervalSince1970: seconds + maximumAge)))
            return true
        }
        guard fresh else { throw .unauthenticated("the Mailgun token was already used (a replay)") }
        guard let event = object["event-data"] as? [String: Any] else {
            throw .malformed("no event-data object")
        }
        var batch = try Self.batch(event)
        batch.replayToken = token
        return batch
    }

    /// Forgets a token taken by ``events(body:now:)`` whose request was then not recorded (the database
    /// down): Mailgun's retry of it is taken.
    public func forget(_ token: String?) {
        guard let token else { return }
        _ = seen.withLock { $0.tokens.remove(token) }
    }

    /// A `failed` event is a bounce: severity permanent or temporary, the reply in delivery-status.
    static func batch(_ event: [String: Any]) throws(ESPEventError) -> ESPEventBatch {
        guard event["event"] as? String == "failed" else { return ESPEventBatch(otherEvents: 1) }
        guard let recipient = event["recipient"] as? String, !recipient.isEmpty else {
            throw .malformed("a failed event has no recipient")
        }
        let delivery = event["delivery-status"] as? [String: Any] ?? [:]
        let code = ESPJSON.text(delivery["code"]).map { $0 + " " } ?? ""
        let message = delivery["message"] as? String ?? ""
        let description = delivery["description"] as? String ?? ""
        let reply = code + [message, description].filter { !$0.isEmpty }.joined(separator: " ")
        let envelope = event["envelope"] as? [String: Any]
        return ESPEventBatch(bounces: [
            .make(
                .mailgun, recipient: recipient, permanent: event["severity"] as? String != "temporary",
                reply: reply, status: delivery["enhanced-code"] as? String,
                remoteMTA: delivery["mx-host"] as? String, sender: envelope?["sender"] as? String)
        ])
    }
}
