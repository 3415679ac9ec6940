import BounceEvents
import Bounces
import Foundation
import HTTPClient
import HTTPServer
import Postgres
import ServiceSupport
import TestSupport
import Testing

/// The relay addresses the fixture's accounts hold: forwarding off, on, and an account to be erased.
enum Relay {
    static let off = "off@privaterelay.appleid.com"
    static let on = "on@privaterelay.appleid.com"
    static let erased = "gone@privaterelay.appleid.com"
    static let foreign = "someone@example.org"
}

/// Secrets the listener is configured with (TEST ONLY).
enum Secrets {
    static let mailgunKey = "key-test-0123456789abcdef0123456789abcdef"
    static let postmarkUser = "postmark"
    static let postmarkPassword = "correct-horse-battery-staple"
    static let topic = "arn:aws:sns:us-east-1:123456789012:ses-bounces"
}

/// A database with Apple's events applied for three relay addresses, and the bounce listener on port 0
/// connected as a member of siwa_bounce.
final class Listener: Sendable {
    let database: TestDatabase
    let signers: Signers
    let registry = MetricsRegistry()
    let service: ESPEventsService
    let address: String
    let client = OutboundHTTP.Client()

    init(signers: Signers, hostPattern: String = "localhost", mailgunMaxAge: TimeInterval = 300) throws {
        self.signers = signers
        database = try TestDatabase()
        let owner = try database.connect()
        defer { owner.close() }
        let now = Date()
        try owner.storeAsReceiver(
            [
                ("b1", "email-disabled", "001000.off", Relay.off),
                ("b2", "email-enabled", "001000.on", Relay.on),
                ("b3", "email-enabled", "001000.gone", Relay.erased),
            ].enumerated().map { index, event in
                SeededNotification(
                    jti: event.0, type: event.1, sub: event.2, email: event.3, isPrivateEmail: true,
                    eventTime: now.addingTimeInterval(Double(index) - 600))
            })
        let worker = try database.connect(asMemberOf: "siwa_worker")
        defer { worker.close() }
        try worker.transaction { connection in
            _ = try connection.query("SELECT * FROM siwa.process_due_notifications(100, 5, interval '1 ms')")
        }
        var configuration = ESPEventsConfiguration(
            http: HTTPServer.Configuration(host: "127.0.0.1", port: 0, threadCount: 2),
            database: try database.configuration(asMemberOf: "siwa_bounce"),
            outbound: OutboundHTTP.Client(
                policy: OutboundHTTP.Policy(timeout: .seconds(5)),
                environment: ["SSL_CERT_FILE": signers.tlsCertificate]))
        configuration.mailgun = MailgunWebhook(
            signingKey: Array(Secrets.mailgunKey.utf8), maximumAge: mailgunMaxAge)
        configuration.sendgrid = try SendGridWebhook(verificationKey: signers.sendGridPublicKey)
        configuration.postmark = PostmarkWebhook(
            username: Secrets.postmarkUser, password: Secrets.postmarkPassword)
        // The test-only override: certificates from the loopback HTTPS server, never an AWS host.
        configuration.sns = SNSVerifier.Configuration(topicARNs: [Secrets.topic], hostPattern: hostPattern)
        service = ESPEventsService(
            configuration: configuration, metrics: ESPEventsMetrics(registry: registry), logger: quietLogger)
        try service.start()
        address = try #require(service.address)
    }

    deinit { service.shutdown() }

    /// POSTs `body` to `/v1/esp/<provider>`.
    func post(_ provider: String, _ body: [UInt8], headers: [OutboundHTTP.Header] = []) throws
        -> OutboundHTTP.Response
    {
        try client.perform(
            .init(
                method: "POST", url: "http://\(address)/v1/esp/\(provider)",
                headers: [.init("Content-Type", "application/json")] + headers, body: body))
    }

    /// The recorded bounces, in order: class, sub, gate reason, status, action, sending domain, source.
    func recorded() throws -> [[String?]] {
        let owner = try database.connect()
        defer { owner.close() }
        return try owner.query(
            "SELECT class, sub, gate_reason, status, action, sending_domain, source FROM siwa.relay_bounces ORDER BY id"
        ).map { row in try (0..<7).map { try row[$0, as: String?.self] } }
    }

    /// A series' value on /metrics, 0 when absent.
    func metric(_ name: String, _ labels: String) -> Int {
        for line in registry.render().split(separator: "\n") where line.hasPrefix("\(name){\(labels)} ") {
            return Int(line.split(separator: " ").last ?? "") ?? -1
        }
        return 0
    }

    // MARK: the providers' requests, signed as each documents

    func mailgunBody(
        recipient: String, severity: String = "permanent", message: String,
        sender: String = "bounce+x@mail.sender.example",
        token: String = UUID().uuidString, timestamp: Int = Int(Date().timeIntervalSince1970),
        signature: String? = nil
    ) throws -> [UInt8] {
        let signed = try signature ?? signers.hmac(key: Secrets.mailgunKey, "\(timestamp)\(token)")
        let object: [String: Any] = [
            "signature": ["timestamp": "\(timestamp)", "token": token, "signature": signed],
            "event-data": [
                "event": "failed", "severity": severity, "recipient": recipient,
                "envelope": ["sender": sender],
                "delivery-status": ["code": 550, "message": message, "description": ""],
            ],
        ]
        return [UInt8](try JSONSerialization.data(withJSONObject: object))
    }

    func sendGrid(
        _ events: [[String: Any]], tamper: Bool = false, timestamp: Int = Int(Date().timeIntervalSince1970)
    ) throws -> OutboundHTTP.Response {
        let body = [UInt8](try JSONSerialization.data(withJSONObject: events))
        let timestamp = "\(timestamp)"
        let signature = try signers.sign(
            Array(timestamp.utf8) + body, key: signers.directory.appendingPathComponent("sendgrid.pem").path)
        return try post(
            "sendgrid", tamper ? body + Array(" ".utf8) : body,
            headers: [
                .init(SendGridWebhook.signatureHeader, signature.base64EncodedString()),
                .init(SendGridWebhook.timestampHeader, timestamp),
            ])
    }

    func postmark(_ object: [String: Any], password: String = Secrets.postmarkPassword) throws
        -> OutboundHTTP.Response
    {
        let credentials = Data("\(Secrets.postmarkUser):\(password)".utf8).base64EncodedString()
        return try post(
            "postmark", [UInt8](try JSONSerialization.data(withJSONObject: object)),
            headers: [.init("Authorization", "Basic \(credentials)")])
    }

    /// An SNS Notification carrying SES's `message`, signed by `key` (sns.key, or other.key to forge).
    func sns(
        message: [String: Any], certificateURL: String, version: String = "2", key: String = "sns.key",
        topic: String = Secrets.topic, type: String = "Notification", subscribeURL: String? = nil,
        messageID: String = UUID().uuidString, signedAt: Date = Date()
    ) throws -> [UInt8] {
        let text = String(decoding: try JSONSerialization.data(withJSONObject: message), as: UTF8.self)
        var parsedFields: [String: String] = [
            "Type": type, "MessageId": messageID, "TopicArn": topic, "Message": text,
            "Timestamp": Self.snsTime(signedAt),
            "SignatureVersion": version,
            "SigningCertURL": certificateURL,
        ]
        if type != "Notification" {
            parsedFields["Token"] = "2336412f37fb687f5d51e6e2425dacbba"
            parsedFields["SubscribeURL"] =
                subscribeURL ?? "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription"
        } else {
            parsedFields["Subject"] = "Amazon SES Email Event Notification"
        }
        // The canonical string as AWS's "Verifying the signatures of Amazon SNS messages" lists it.
        let names =
            type == "Notification"
            ? ["Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"]
            : ["Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"]
        let canonical = names.map { "\($0)\n\(parsedFields[$0]!)\n" }.joined()
        let signature = try signers.sign(
            Array(canonical.utf8), key: signers.directory.appendingPathComponent(key).path,
            digest: version == "1" ? "sha1" : "sha256")
        parsedFields["Signature"] = signature.base64EncodedString()
        return [UInt8](try JSONSerialization.data(withJSONObject: parsedFields))
    }

    /// SNS's Timestamp form: ISO 8601 in UTC with milliseconds.
    static func snsTime(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.string(from: date)
    }

    static func sesBounce(
        _ recipient: String, diagnostic: String, type: String = "Permanent", status: String = "5.1.1"
    )
        -> [String: Any]
    {
        [
            "notificationType": "Bounce",
            "bounce": [
                "bounceType": type, "bounceSubType": "General",
                "reportingMTA": "dsn; a1-2.smtp-out.amazonses.com",
                "bouncedRecipients": [
                    [
                        "emailAddress": recipient, "action": "failed", "status": status,
                        "diagnosticCode": diagnostic,
                    ]
                ],
            ],
            "mail": ["source": "news@mail.sender.example"],
        ]
    }
}
