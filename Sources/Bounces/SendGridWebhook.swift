import Crypto
public import Foundation

/// SendGrid's Event Webhook (twilio.com/docs/sendgrid/for-developers/tracking-events/event and
/// "Getting Started with the Event Webhook Security Features"): a JSON array of events, signed by
/// SendGrid's ECDSA P-256 key over the `X-Twilio-Email-Event-Webhook-Timestamp` value followed by the raw
/// body, the DER signature base64 in `X-Twilio-Email-Event-Webhook-Signature`.
public struct SendGridWebhook: Sendable {
    public static let signatureHeader = "X-Twilio-Email-Event-Webhook-Signature"
    public static let timestampHeader = "X-Twilio-Email-Event-Webhook-Timestamp"

    private let key: P256.PublicKey

    /// The verification key as SendGrid's Mail Settings show it: base64 of a DER public key on P-256.
    /// - Throws: ``ESPEventError`` when it is not one.
    public init(verificationKey base64: String) throws(ESPEventError) {
        let text = base64.filter { !$0.isWhitespace }
        guard let der = Data(base64Encoded: text),
            let key = P256.PublicKey(subjectPublicKeyInfo: [UInt8](der))
        else { throw .malformed("the SendGrid verification key is not a base64 DER public key on P-256") }
        self.key = key
    }

    /// The bounces of one request, once its signature verifies and its timestamp is within `maximumAge`
    /// (``ESPSignatureAge``): `bounce` (type bounce or blocked) and `dropped` events failed, `deferred`
    /// delayed, each with its `sg_event_id`; other events counted.
    /// - Throws: ``ESPEventError`` (unauthenticated or malformed).
    public func events(
        body: [UInt8], signature: String?, timestamp: String?, now: Date = Date(),
        maximumAge: TimeInterval = ESPSignatureAge.defaultMaximum
    ) throws(ESPEventError) -> ESPEventBatch {
        guard let signature, let timestamp, !timestamp.isEmpty,
            let der = Data(base64Encoded: signature.trimmingCharacters(in: .whitespaces))
        else { throw .unauthenticated("no SendGrid signature or timestamp header") }
        guard key.isValidSignature(der: [UInt8](der), for: Array(timestamp.utf8) + body) else {
            throw .unauthenticated("the SendGrid signature does not verify")
        }
        guard let seconds = Int64(timestamp) else {
            throw .unauthenticated("the SendGrid timestamp is not unix seconds")
        }
        let signedAt = Date(timeIntervalSince1970: Double(seconds))
        try ESPSignatureAge.check(signedAt, now: now, maximumAge: maximumAge, provider: .sendgrid)
        var batch = ESPEventBatch()
        batch.signedAt = signedAt
        for event in try ESPJSON.array(body) {
            let kind = event["event"] as? String ?? ""
            guard ["bounce", "dropped", "deferred"].contains(kind) else {
                batch.otherEvents += 1
                continue
            }
            guard let email = event["email"] as? String, !email.isEmpty else {
                throw .malformed("a \(kind) event has no email")
            }
            // A bounce's reply is `reason`, a deferral's `response`; dropped names SendGrid's own reason.
            let reply = [event["reason"], event["response"]].compactMap { $0 as? String }.joined(
                separator: " ")
            batch.bounces.append(
                .make(
                    .sendgrid, recipient: email, permanent: kind != "deferred", reply: reply,
                    status: ESPJSON.text(event["status"]), remoteMTA: nil,
                    sender: event["from"] as? String, eventID: try ESPJSON.eventID(event["sg_event_id"])))
        }
        return batch
    }
}
