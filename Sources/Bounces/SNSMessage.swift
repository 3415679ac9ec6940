import Crypto
public import Foundation
import Synchronization

/// An Amazon SNS message posted to an HTTP(S) subscription (docs.aws.amazon.com/sns/latest/dg/
/// sns-message-and-json-formats.html): a Notification, or a SubscriptionConfirmation to be confirmed.
public struct SNSMessage: Sendable, Equatable {
    public var type: String
    public var messageID: String
    public var topicARN: String
    public var message: String
    public var timestamp: String
    public var subject: String?
    public var token: String?
    public var subscribeURL: String?
    public var signatureVersion: String
    public var signature: String
    public var signingCertURL: String

    /// The message of a body; every field the signature covers must be a string.
    /// - Throws: ``ESPEventError`` `.malformed`.
    public init(parsing body: [UInt8]) throws(ESPEventError) {
        let object = try ESPJSON.object(body)
        func field(_ name: String) throws(ESPEventError) -> String {
            guard let value = object[name] as? String else {
                throw .malformed("the SNS message has no \(name)")
            }
            return value
        }
        type = try field("Type")
        messageID = try field("MessageId")
        topicARN = try field("TopicArn")
        message = try field("Message")
        timestamp = try field("Timestamp")
        signatureVersion = try field("SignatureVersion")
        signature = try field("Signature")
        signingCertURL = try field("SigningCertURL")
        subject = object["Subject"] as? String
        token = object["Token"] as? String
        subscribeURL = object["SubscribeURL"] as? String
        if type != "Notification" {
            guard token != nil, subscribeURL != nil else {
                throw .malformed("the SNS \(type) has no Token or SubscribeURL")
            }
        }
    }

    /// The string SNS signs ("Verifying the signatures of Amazon SNS messages"): each field's name and
    /// value on lines of their own, in byte order of the names; Subject only when present.
    public var stringToSign: [UInt8] {
        var fields: [(String, String?)] = [("Message", message), ("MessageId", messageID)]
        if type == "Notification" {
            fields += [
                ("Subject", subject), ("Timestamp", timestamp), ("TopicArn", topicARN), ("Type", type),
            ]
        } else {
            fields += [
                ("SubscribeURL", subscribeURL), ("Timestamp", timestamp), ("Token", token),
                ("TopicArn", topicARN), ("Type", type),
            ]
        }
        var text = ""
        for case (let name, let value?) in fields { text += "\(name)\n\(value)\n" }
        return Array(text.utf8)
    }

    /// When SNS signed the message: its Timestamp (ISO 8601, with or without fractional seconds).
    public var signedAt: Date? {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        if let date = formatter.date(from: timestamp) { return date }
        formatter.formatOptions = [.withInternetDateTime]
        return formatter.date(from: timestamp)
    }
}

/// Checks SNS messages: the topic one configured, the signing certificate fetched over HTTPS from a host
/// the allow-pattern accepts (cached by URL), SignatureVersion 1 (SHA1withRSA) or 2 (SHA256withRSA).
public final class SNSVerifier: Sendable {
    public struct Configuration: Sendable {
        /// The topics whose messages are taken.
        public var topicARNs: Set<String>
        /// The hosts a SigningCertURL or SubscribeURL may name (a whole-host regular expression):
        /// `sns.<region>.amazonaws.com` (and `.com.cn`) unless a test says otherwise.
        public var hostPattern: String
        /// Certificates kept (by URL); past it the cache starts again.
        public var cachedCertificates: Int

        public static let amazonHostPattern = #"sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?"#

        public init(
            topicARNs: Set<String>, hostPattern: String = amazonHostPattern, cachedCertificates: Int = 32
        ) {
            self.topicARNs = topicARNs
            self.hostPattern = hostPattern
            self.cachedCertificates = cachedCertificates
        }
    }

    public let configuration: Configuration
    private let fetch: @Sendable (URL) throws -> [UInt8]
    private let certificates = Mutex<[String: RSA.PublicKey]>([:])

    /// - Parameter fetchCertificate: GETs a certificate URL (already checked) and returns its body.
    public init(configuration: Configuration, fetchCertificate: @escaping @Sendable (URL) throws -> [UInt8]) {
        self.configuration = configuration
        fetch = fetchCertificate
    }

    /// Whether `url` is https on a host the pattern accepts, with no credentials in it.
    public func isAllowedURL(_ url: String) -> Bool {
        guard let components = URLComponents(string: url), components.scheme?.lowercased() == "https",
            components.user == nil, components.password == nil, let host = components.host?.lowercased(),
            !host.isEmpty
        else { return false }
        return host.range(of: "^(\(configuration.hostPattern))$", options: .regularExpression) != nil
    }

    /// Checks `message`'s topic, certificate URL and signature, then its Timestamp's age.
    /// - Throws: ``ESPEventError`` `.unauthenticated` naming the check that failed, `.stale` for the age.
    public func verify(
        _ message: SNSMessage, now: Date = Date(), maximumAge: TimeInterval = ESPSignatureAge.defaultMaximum
    ) throws(ESPEventError) {
        guard configuration.topicARNs.contains(message.topicARN) else {
            throw .unauthenticated("the SNS topic is not one configured")
        }
        let digest: Digest.Algorithm
        switch message.signatureVersion {
        case "1": digest = .sha1
        case "2": digest = .sha256
        default: throw .unauthenticated("SNS SignatureVersion is neither 1 nor 2")
        }
        guard isAllowedURL(message.signingCertURL), let url = URL(string: message.signingCertURL),
            url.path.hasSuffix(".pem")
        else { throw .unauthenticated("the SNS SigningCertURL is not an https .pem on an allowed host") }
        let key = try certificate(url)
        guard let signature = Data(base64Encoded: message.signature),
            key.isValidSignature([UInt8](signature), for: message.stringToSign, digest: digest)
        else { throw .unauthenticated("the SNS signature does not verify") }
        guard let signedAt = message.signedAt else {
            throw .unauthenticated("the SNS Timestamp is not an ISO 8601 time")
        }
        try ESPSignatureAge.check(signedAt, now: now, maximumAge: maximumAge, provider: .ses)
    }

    private func certificate(_ url: URL) throws(ESPEventError) -> RSA.PublicKey {
        if let key = certificates.withLock({ $0[url.absoluteString] }) { return key }
        let body: [UInt8]
        do {
            body = try fetch(url)
        } catch {
            throw .unauthenticated("the SNS signing certificate could not be fetched")
        }
        guard let key = RSA.PublicKey(certificatePEM: body) else {
            throw .unauthenticated("the SNS signing certificate is not a PEM certificate of an RSA key")
        }
        let limit = configuration.cachedCertificates
        certificates.withLock { cache in
            if cache.count >= limit { cache.removeAll() }
            cache[url.absoluteString] = key
        }
        return key
    }
}

/// Amazon SES's bounce notifications (docs.aws.amazon.com/ses/latest/dg/notification-contents.html), the
/// Message of an SNS Notification: `notificationType` (or, from event publishing, `eventType`) Bounce,
/// `bounce.bounceType` Permanent, Transient or Undetermined, one entry per `bouncedRecipients`.
public enum SESNotification {
    /// The bounces of one notification's Message; other notification types are counted.
    /// - Throws: ``ESPEventError`` `.malformed`.
    public static func events(message: String) throws(ESPEventError) -> ESPEventBatch {
        let object = try ESPJSON.object(Array(message.utf8))
        guard (object["notificationType"] ?? object["eventType"]) as? String == "Bounce" else {
            return ESPEventBatch(otherEvents: 1)
        }
        guard let bounce = object["bounce"] as? [String: Any],
            let recipients = bounce["bouncedRecipients"] as? [[String: Any]]
        else { throw .malformed("an SES bounce has no bounce.bouncedRecipients") }
        let permanent = bounce["bounceType"] as? String != "Transient"
        let mail = object["mail"] as? [String: Any]
        let reportingMTA = (bounce["reportingMTA"] as? String).map {
            $0.hasPrefix("dsn;") ? String($0.dropFirst(4)).trimmingCharacters(in: .whitespaces) : $0
        }
        return try ESPEventBatch(
            bounces: recipients.map { recipient throws(ESPEventError) in
                guard let address = recipient["emailAddress"] as? String, !address.isEmpty else {
                    throw .malformed("an SES bounced recipient has no emailAddress")
                }
                var reply = recipient["diagnosticCode"] as? String ?? ""
                if reply.lowercased().hasPrefix("smtp;") {
                    reply = String(reply.dropFirst(5)).trimmingCharacters(in: .whitespaces)
                }
                return .make(
                    .ses, recipient: address,
                    permanent: permanent && recipient["action"] as? String != "delayed", reply: reply,
                    status: recipient["status"] as? String, remoteMTA: reportingMTA,
                    sender: mail?["source"] as? String)
            })
    }
}
