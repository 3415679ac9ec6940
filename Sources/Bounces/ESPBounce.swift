public import Foundation

/// The email service providers whose bounce events the mail gate takes (docs/operations.md, "Bounces").
public enum ESPProvider: String, Sendable, CaseIterable, Equatable {
    case mailgun, sendgrid, postmark, ses
}

/// One recipient's bounce as an ESP reported it, in the terms of a delivery status report.
public struct ESPBounce: Sendable, Equatable {
    /// Who reported it.
    public var provider: ESPProvider
    /// The bounced address, as the ESP sent it.
    public var recipient: String
    /// failed (the ESP gave up) or delayed (it tries again).
    public var action: String
    /// The enhanced status code (RFC 3463), taken from the reply when it carries one.
    public var status: String
    /// The remote server's reply, or the ESP's text for it.
    public var diagnostic: String
    /// The server that answered, when given.
    public var remoteMTA: String?
    /// The envelope sender's domain (lower case), when the event names the sender.
    public var sendingDomain: String?
    /// The provider's id of the event that reported it (sg_event_id, SNS MessageId, Postmark ID): an
    /// event already seen is not recorded again.
    public var eventID: String?

    public init(
        provider: ESPProvider, recipient: String, action: String, status: String, diagnostic: String,
        remoteMTA: String? = nil, sendingDomain: String? = nil, eventID: String? = nil
    ) {
        self.provider = provider
        self.recipient = recipient
        self.action = action
        self.status = status
        self.diagnostic = diagnostic
        self.remoteMTA = remoteMTA.map { String($0.prefix(255)) }
        self.sendingDomain = sendingDomain
        self.eventID = eventID
    }

    /// The class ``BounceClassifier`` gives the reply.
    public var bounceClass: BounceClass {
        BounceClassifier.classify(diagnostic: diagnostic, status: status, action: action)
    }

    /// The first enhanced status code (`class.subject.detail`, RFC 3463) in `text`, else `fallback`.
    public static func status(in text: String, fallback: String) -> String {
        let pattern = #"(?<![0-9.])[245]\.[0-9]{1,3}\.[0-9]{1,3}(?![0-9.])"#
        guard let range = text.range(of: pattern, options: .regularExpression) else { return fallback }
        return String(text[range])
    }

    /// A bounce whose action is `failed` when `permanent`, `delayed` otherwise; its status from the reply,
    /// else 5.0.0 or 4.0.0.
    static func make(
        _ provider: ESPProvider, recipient: String, permanent: Bool, reply: String, status: String? = nil,
        remoteMTA: String? = nil, sender: String? = nil, eventID: String? = nil
    ) -> ESPBounce {
        let fallback = permanent ? "5.0.0" : "4.0.0"
        let given = status.map { ESPBounce.status(in: $0, fallback: "") } ?? ""
        return ESPBounce(
            provider: provider, recipient: recipient, action: permanent ? "failed" : "delayed",
            status: given.isEmpty ? ESPBounce.status(in: reply, fallback: fallback) : given,
            diagnostic: String(reply.prefix(2000)), remoteMTA: remoteMTA,
            sendingDomain: sender.flatMap(BounceClassifier.domain(of:)), eventID: eventID)
    }
}

/// The age bound of a signed ESP request (SendGrid's and SNS's timestamps; Mailgun has its own).
public enum ESPSignatureAge {
    /// 25 hours: SendGrid retries a batch for up to 24 hours, and a retry refused for its age would be
    /// lost; a captured batch is replayable no longer than this (its event ids are kept as long).
    public static let defaultMaximum: TimeInterval = 25 * 3600
    /// How far ahead of this host's clock a timestamp may be.
    public static let maximumSkew: TimeInterval = 300

    /// Refuses a signature time older than `maximumAge` or more than ``maximumSkew`` ahead of `now`.
    /// - Throws: ``ESPEventError`` `.stale`.
    public static func check(
        _ signedAt: Date, now: Date, maximumAge: TimeInterval, provider: ESPProvider
    ) throws(ESPEventError) {
        let age = now.timeIntervalSince(signedAt)
        guard age <= maximumAge else {
            throw .stale("the \(provider.rawValue) signature's timestamp is older than \(Int(maximumAge)) s")
        }
        guard age >= -maximumSkew else {
            throw .stale(
                "the \(provider.rawValue) signature's timestamp is more than \(Int(maximumSkew)) s ahead")
        }
    }
}

/// Why an ESP's request was refused; its description names the check that failed, never a secret, an
/// address or the body.
public struct ESPEventError: Error, Equatable, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        /// The request is not from the provider (signature, credentials, age, replay, certificate, topic).
        case unauthenticated
        /// The body is not the provider's JSON.
        case malformed
        /// The signature verifies but its timestamp is past the age bound, or ahead of the clock: a
        /// replay (or a clock far off).
        case stale
    }

    public var kind: Kind
    public var reason: String

    public init(_ kind: Kind, _ reason: String) {
        self.kind = kind
        self.reason = reason
    }

    public var description: String { reason }

    static func unauthenticated(_ reason: String) -> ESPEventError { ESPEventError(.unauthenticated, reason) }
    static func malformed(_ reason: String) -> ESPEventError { ESPEventError(.malformed, reason) }
    static func stale(_ reason: String) -> ESPEventError { ESPEventError(.stale, reason) }
}

/// What a provider's request held: bounces, and the number of its events that were not bounces.
public struct ESPEventBatch: Sendable, Equatable {
    public var bounces: [ESPBounce]
    public var otherEvents: Int
    /// The token a replay cache took from the request (Mailgun's): handed back by
    /// ``MailgunWebhook/forget(_:)`` when the request could not be recorded, so the ESP's retry is taken.
    public var replayToken: String?
    /// When the request was signed (SendGrid's and SNS's timestamps), when the provider signs one.
    public var signedAt: Date?

    public init(bounces: [ESPBounce] = [], otherEvents: Int = 0) {
        self.bounces = bounces
        self.otherEvents = otherEvents
    }
}

/// JSON read from a request body, top-level objects and arrays only.
enum ESPJSON {
    static func object(_ body: [UInt8]) throws(ESPEventError) -> [String: Any] {
        guard let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else {
            throw .malformed("the body is not a JSON object")
        }
        return object
    }

    static func array(_ body: [UInt8]) throws(ESPEventError) -> [[String: Any]] {
        guard let array = try? JSONSerialization.jsonObject(with: Data(body)) as? [Any] else {
            throw .malformed("the body is not a JSON array")
        }
        return try array.map { element throws(ESPEventError) in
            guard let object = element as? [String: Any] else {
                throw .malformed("an event is not an object")
            }
            return object
        }
    }

    /// An event's id (a string or a number), nil when absent or empty.
    /// - Throws: ``ESPEventError`` `.malformed` when longer than 200 bytes (the table's bound).
    static func eventID(_ value: Any?) throws(ESPEventError) -> String? {
        guard let id = text(value), !id.isEmpty else { return nil }
        guard id.utf8.count <= 200 else { throw .malformed("an event id is longer than 200 bytes") }
        return id
    }

    /// A string field, or a number's decimal text (Mailgun sends its timestamp either way).
    static func text(_ value: Any?) -> String? {
        switch value {
        case let string as String: string
        case let bool as Bool: bool ? "true" : "false"
        case let number as NSNumber: number.stringValue
        default: nil
        }
    }
}
