import BounceEvents
import Bounces
import Foundation
import HTTPClient
import HTTPServer
import Postgres
import ServiceSupport

/// The ESP bounce listener's settings (off unless --esp-events-listen is given); each provider is
/// served only when its secret is configured.
let espEventsOptions: [CommandOption] = [
    CommandOption(
        "esp-events-listen", valueName: "HOST:PORT",
        help:
            "Serve the ESPs' bounce webhooks (POST /v1/esp/{mailgun,sendgrid,postmark,ses}) here; off by default.",
        environmentVariable: "SIWA_MAILGATE_ESP_EVENTS_LISTEN"),
    CommandOption(
        "esp-events-database-url", valueName: "URL",
        help:
            "The bounce listener's own PostgreSQL login (a member of siwa_bounce only, never the gate's). Required with --esp-events-listen.",
        environmentVariable: "SIWA_MAILGATE_ESP_EVENTS_DATABASE_URL"
    ).secret(.connectionString),
    // 25 hours: past SendGrid's 24 hours of retries, so a late retry is not refused (and lost).
    CommandOption(
        "esp-events-max-age", valueName: "SECONDS",
        help:
            "Oldest a SendGrid or SNS signature's timestamp may be (at least SendGrid's 24 hours of retries); their event ids are kept as long. Mailgun has --mailgun-max-age.",
        environmentVariable: "SIWA_MAILGATE_ESP_EVENTS_MAX_AGE", defaultValue: "90000"),
    CommandOption(
        "mailgun-signing-key", valueName: "KEY",
        help: "Mailgun's HTTP webhook signing key: serves /v1/esp/mailgun.",
        environmentVariable: "SIWA_MAILGATE_MAILGUN_SIGNING_KEY"
    ).secret(),
    CommandOption(
        "mailgun-max-age", valueName: "SECONDS",
        help:
            "Oldest (or furthest ahead) a Mailgun signature's timestamp may be; its tokens are kept as long.",
        environmentVariable: "SIWA_MAILGATE_MAILGUN_MAX_AGE", defaultValue: "300"),
    CommandOption(
        "sendgrid-verification-key", valueName: "BASE64",
        help:
            "SendGrid's Signed Event Webhook verification key (base64 DER public key, P-256): serves /v1/esp/sendgrid.",
        environmentVariable: "SIWA_MAILGATE_SENDGRID_VERIFICATION_KEY"),
    CommandOption(
        "postmark-credentials", valueName: "USER:PASSWORD",
        help: "The HTTP Basic credentials of Postmark's bounce webhook URL: serves /v1/esp/postmark.",
        environmentVariable: "SIWA_MAILGATE_POSTMARK_CREDENTIALS"
    ).secret(),
    CommandOption(
        "ses-topic-arn", valueName: "ARN",
        help: "An SNS topic whose SES bounce notifications are taken: serves /v1/esp/ses.",
        isRepeatable: true, environmentVariable: "SIWA_MAILGATE_SES_TOPIC_ARNS"),
    CommandOption(
        "sns-certificate-hosts", valueName: "REGEX",
        help:
            "Hosts (a whole-host regular expression) an SNS SigningCertURL or SubscribeURL may name over https; unset: sns.<region>.amazonaws.com (and .com.cn).",
        environmentVariable: "SIWA_MAILGATE_SNS_CERTIFICATE_HOSTS"),
]

let espEventsFlags: [CommandFlag] = [
    CommandFlag(
        "esp-events-tls-terminated-in-front",
        help:
            "TLS for the bounce listener terminates in front of it (a proxy): allows a non-loopback --esp-events-listen.",
        environmentVariable: "SIWA_MAILGATE_ESP_EVENTS_TLS_TERMINATED_IN_FRONT")
]

/// The bounce listener's configuration from the command line, or nil when it is off.
/// - Throws: ``ConfigurationError`` naming the unusable setting, never quoting a secret.
func makeESPEventsConfiguration(_ parsed: ParsedCommand, environment: [String: String]) throws
    -> ESPEventsConfiguration?
{
    let providerSettings = [
        "esp-events-database-url", "mailgun-signing-key", "sendgrid-verification-key", "postmark-credentials",
        "ses-topic-arn",
    ]
    guard let listen = try parsed.listenAddress("esp-events-listen") else {
        for name in providerSettings where parsed.value(name) != nil {
            throw ConfigurationError("--\(name) needs --esp-events-listen")
        }
        return nil
    }
    guard listen.isLoopback || parsed.flag("esp-events-tls-terminated-in-front") else {
        throw ConfigurationError(
            "the bounce listener speaks plain HTTP: listen on a loopback address, or terminate TLS in front of it and say so with --esp-events-tls-terminated-in-front"
        )
    }
    guard let url = parsed.value("esp-events-database-url"), !url.isEmpty else {
        throw ConfigurationError(
            "--esp-events-listen needs --esp-events-database-url: a login of its own, a member of siwa_bounce only"
        )
    }
    let database: PostgresConfiguration
    do {
        database = try PostgresConfiguration(
            url, applicationName: "siwa-mailgate-esp-events", connectTimeout: .seconds(2))
    } catch {
        throw ConfigurationError("invalid --esp-events-database-url: \(error.message)")
    }
    var http = HTTPServer.Configuration(host: listen.host, port: listen.port, threadCount: 4)
    http.maxBodyBytes = 4 << 20  // SendGrid batches many events in one POST
    var configuration = ESPEventsConfiguration(
        http: http, database: database,
        outbound: OutboundHTTP.Client(
            policy: OutboundHTTP.Policy(timeout: .seconds(5), maxResponseBodyBytes: 64 << 10),
            environment: environment))
    let maxAge = try parsed.seconds("esp-events-max-age", positive: true) ?? .seconds(90_000)
    configuration.maximumAge = Double(maxAge.components.seconds)
    if let key = parsed.value("mailgun-signing-key"), !key.isEmpty {
        let maxAge = try parsed.seconds("mailgun-max-age", positive: true) ?? .seconds(300)
        configuration.mailgun = MailgunWebhook(
            signingKey: Array(key.trimmingCharacters(in: .whitespacesAndNewlines).utf8),
            maximumAge: Double(maxAge.components.seconds))
    }
    if let key = parsed.value("sendgrid-verification-key"), !key.isEmpty {
        do {
            configuration.sendgrid = try SendGridWebhook(verificationKey: key)
        } catch {
            throw ConfigurationError("--sendgrid-verification-key: \(error.reason)")
        }
    }
    if let credentials = parsed.value("postmark-credentials")?.trimmingCharacters(
        in: .whitespacesAndNewlines),
        !credentials.isEmpty
    {
        guard let colon = credentials.firstIndex(of: ":"), colon != credentials.startIndex,
            credentials[credentials.index(after: colon)...].utf8.count >= 16
        else {
            throw ConfigurationError(
                "--postmark-credentials must be USER:PASSWORD with a password of at least 16 characters")
        }
        configuration.postmark = PostmarkWebhook(
            username: String(credentials[..<colon]),
            password: String(credentials[credentials.index(after: colon)...]))
    }
    let topics = parsed.values("ses-topic-arn").filter { !$0.isEmpty }
    if !topics.isEmpty {
        let pattern = parsed.value("sns-certificate-hosts") ?? SNSVerifier.Configuration.amazonHostPattern
        guard (try? NSRegularExpression(pattern: pattern)) != nil else {
            throw ConfigurationError("--sns-certificate-hosts is not a regular expression")
        }
        configuration.sns = SNSVerifier.Configuration(topicARNs: Set(topics), hostPattern: pattern)
    }
    guard !configuration.providers.isEmpty else {
        throw ConfigurationError(
            "--esp-events-listen needs at least one provider: --mailgun-signing-key, --sendgrid-verification-key, --postmark-credentials or --ses-topic-arn"
        )
    }
    return configuration
}
