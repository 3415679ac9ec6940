import Foundation
import Postgres
import ServiceSupport
import Suppressions

/// The ESP suppression lanes' settings: off unless --suppressions names providers; each named provider
/// needs its credential file (never a credential on the command line).
let suppressionOptions: [CommandOption] = [
    CommandOption(
        "suppressions", valueName: "NAMES",
        help: """
            Keep these ESPs' suppression lists in step with the relay events (comma-separated: sendgrid, \
            postmark, mailgun, ses; each a row of siwa.suppression_providers). Default: off.
            """,
        environmentVariable: "SIWA_SUPPRESSIONS"),
    CommandOption(
        "sendgrid-key-file", valueName: "FILE",
        help: "SendGrid's API key (mode 0600), for --suppressions sendgrid.",
        environmentVariable: "SIWA_SENDGRID_KEY_FILE"),
    CommandOption(
        "sendgrid-api-url", valueName: "URL",
        help: "SendGrid's API origin (EU: https://api.eu.sendgrid.com).",
        environmentVariable: "SIWA_SENDGRID_API_URL", defaultValue: "https://api.sendgrid.com"),
    CommandOption(
        "postmark-token-file", valueName: "FILE",
        help: "Postmark's server token (mode 0600), for --suppressions postmark.",
        environmentVariable: "SIWA_POSTMARK_TOKEN_FILE"),
    CommandOption(
        "postmark-stream", valueName: "ID", help: "The Postmark message stream whose suppressions are kept.",
        environmentVariable: "SIWA_POSTMARK_STREAM", defaultValue: "outbound"),
    CommandOption(
        "postmark-api-url", valueName: "URL", help: "Postmark's API origin.",
        environmentVariable: "SIWA_POSTMARK_API_URL", defaultValue: "https://api.postmarkapp.com"),
    CommandOption(
        "mailgun-key-file", valueName: "FILE",
        help: "Mailgun's API key (mode 0600), for --suppressions mailgun.",
        environmentVariable: "SIWA_MAILGUN_KEY_FILE"),
    CommandOption(
        "mailgun-domain", valueName: "DOMAIN",
        help: "The Mailgun sending domain whose unsubscribes are kept.",
        environmentVariable: "SIWA_MAILGUN_DOMAIN"),
    CommandOption(
        "mailgun-api-url", valueName: "URL", help: "Mailgun's API origin (EU: https://api.eu.mailgun.net).",
        environmentVariable: "SIWA_MAILGUN_API_URL", defaultValue: "https://api.mailgun.net"),
    CommandOption(
        "ses-credentials-file", valueName: "FILE",
        help: """
            Amazon SES's access key (mode 0600): lines aws_access_key_id = …, aws_secret_access_key = … and \
            optionally aws_session_token = …, for --suppressions ses. Read again when it changes.
            """,
        environmentVariable: "SIWA_SES_CREDENTIALS_FILE"),
    CommandOption(
        "ses-region", valueName: "REGION", help: "The SES region whose account suppression list is kept.",
        environmentVariable: "SIWA_SES_REGION"),
    CommandOption(
        "ses-endpoint", valueName: "URL",
        help: "SES's API origin. Default: https://email.REGION.amazonaws.com.",
        environmentVariable: "SIWA_SES_ENDPOINT"),
    CommandOption(
        "ses-reason", valueName: "REASON", help: "The Reason our SES adds give: BOUNCE or COMPLAINT.",
        environmentVariable: "SIWA_SES_REASON", defaultValue: "BOUNCE"),
    CommandOption(
        "suppression-timeout", valueName: "SECONDS", help: "Deadline of one call to an ESP.",
        environmentVariable: "SIWA_SUPPRESSION_TIMEOUT",
        defaultValue: SuppressionDispatcher.Configuration.defaultTimeout.secondsText),
    CommandOption(
        "suppression-retention-days", valueName: "DAYS",
        help: "Finished suppression rows older than this are pruned (each address's latest is kept).",
        environmentVariable: "SIWA_SUPPRESSION_RETENTION_DAYS", defaultValue: "30"),
    CommandOption(
        "suppression-max-attempts", valueName: "N",
        help: "A suppression row still failing after this many calls is dead.",
        environmentVariable: "SIWA_SUPPRESSION_MAX_ATTEMPTS",
        defaultValue: String(SuppressionDispatcher.Configuration.defaultMaxAttempts)),
]

/// The suppression dispatcher from the command line, or nil without --suppressions.
func makeSuppressionDispatcher(
    _ parsed: ParsedCommand, database: PostgresConfiguration, environment: [String: String], logger: Logger,
    metrics: MetricsRegistry
) throws -> SuppressionDispatcher? {
    let names = (parsed.value("suppressions") ?? "").split(separator: ",")
        .map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
    guard !names.isEmpty else { return nil }
    func credential(_ option: String, for name: String) throws -> String {
        guard let path = parsed.value(option), !path.isEmpty else {
            throw ConfigurationError("--suppressions \(name) needs --\(option)")
        }
        let text = String(decoding: try SecretFile.read(path, setting: "--\(option)"), as: UTF8.self)
            .trimmingCharacters(in: .whitespacesAndNewlines)
        guard !text.isEmpty else { throw ConfigurationError("--\(option) \(path) is empty") }
        return text
    }
    var providers: [String: any SuppressionProvider] = [:]
    for name in names {
        switch name {
        case "sendgrid":
            providers[name] = SendGridProvider(
                apiKey: try credential("sendgrid-key-file", for: name),
                baseURL: parsed.value("sendgrid-api-url") ?? "https://api.sendgrid.com")
        case "postmark":
            providers[name] = PostmarkProvider(
                serverToken: try credential("postmark-token-file", for: name),
                stream: parsed.value("postmark-stream") ?? "outbound",
                baseURL: parsed.value("postmark-api-url") ?? "https://api.postmarkapp.com")
        case "mailgun":
            guard let domain = parsed.value("mailgun-domain"), !domain.isEmpty else {
                throw ConfigurationError("--suppressions mailgun needs --mailgun-domain")
            }
            providers[name] = MailgunProvider(
                apiKey: try credential("mailgun-key-file", for: name), domain: domain,
                baseURL: parsed.value("mailgun-api-url") ?? "https://api.mailgun.net")
        case "ses":
            guard let region = parsed.value("ses-region"), !region.isEmpty else {
                throw ConfigurationError("--suppressions ses needs --ses-region")
            }
            let reason = parsed.value("ses-reason") ?? "BOUNCE"
            guard ["BOUNCE", "COMPLAINT"].contains(reason) else {
                throw ConfigurationError("--ses-reason must be BOUNCE or COMPLAINT")
            }
            let endpoint = parsed.value("ses-endpoint").flatMap { $0.isEmpty ? nil : $0 }
            guard let path = parsed.value("ses-credentials-file"), !path.isEmpty else {
                throw ConfigurationError("--suppressions ses needs --ses-credentials-file")
            }
            // Read again whenever the file changes: a rotated key needs no restart.
            providers[name] = SESProvider(
                credentialsFile: try SESCredentialsFile(path: path, logger: logger),
                region: region, endpoint: endpoint, reason: reason)
        default:
            throw ConfigurationError(
                "--suppressions: unknown provider \(name) (sendgrid, postmark, mailgun, ses)")
        }
    }
    var suppressionDatabase = database
    suppressionDatabase.applicationName = "siwa-worker-suppressions"
    return SuppressionDispatcher(
        configuration: try SuppressionDispatcher.Configuration(
            database: suppressionDatabase, providers: providers,
            timeout: try parsed.seconds("suppression-timeout", positive: true)
                ?? SuppressionDispatcher.Configuration.defaultTimeout,
            maxAttempts: try parsed.integer("suppression-max-attempts", in: 1...1000)
                ?? SuppressionDispatcher.Configuration.defaultMaxAttempts,
            retention: try parsed.number("suppression-retention-days").map { days in
                guard days > 0 else {
                    throw ConfigurationError("--suppression-retention-days must be positive")
                }
                return .seconds(days * 86_400)
            } ?? SuppressionDispatcher.Configuration.defaultRetention,
            environment: environment),
        logger: logger, metrics: metrics)
}
