import AppleID
import AppleNotifications
import Foundation
import Postgres
import Revoker
import ServiceSupport
import TokenVault

/// The revoker's settings: on when --apple-key-file is given, and then the rest are required.
/// The Apple settings are the shared declaration (``AppleCredentialOptions``): --apple-key-file turns the
/// revoker on; --audience (old name --client-id) lists the client IDs tokens were issued to.
let revokerOptions: [CommandOption] =
    AppleCredentialOptions.credentials() + [
        AppleCredentialOptions.audiences(required: false),
        CommandOption(
            "token-key-file", valueName: "FILE",
            help: "Refresh-token encryption keys, 'KEY_ID BASE64' per line (the sign-in API's file).",
            environmentVariable: "SIWA_TOKEN_KEY_FILE"),
        CommandOption(
            "revocation-poll-interval", valueName: "SECONDS",
            help: "Look for due revocation requests at least this often.",
            environmentVariable: "SIWA_REVOCATION_POLL_INTERVAL",
            defaultValue: Revoker.Configuration.defaultPollInterval.secondsText),
        CommandOption(
            "revocation-retry-base-delay", valueName: "SECONDS",
            help:
                "First retry delay after a retryable failure at Apple; doubles per attempt, with jitter, at most 1 h.",
            environmentVariable: "SIWA_REVOCATION_RETRY_BASE_DELAY",
            defaultValue: Revoker.Configuration.defaultRetryBaseDelay.secondsText),
        CommandOption(
            "revocation-max-crashes", valueName: "N",
            help:
                "Calls a revocation or refresh check may be cut short by the worker stopping (killed, crashed) before it ends failed.",
            environmentVariable: "SIWA_REVOCATION_MAX_CRASHES",
            defaultValue: "\(Revoker.Configuration.defaultMaxCrashes)"),
        CommandOption(
            "refresh-check-interval", valueName: "SECONDS",
            help: """
                Refresh each stored refresh token at Apple at most this often, at least 86400 (a day, \
                Apple's limit: a shorter value is raised to it, with a warning); invalid_grant records a \
                consent-revoked of our own. Default: off.
                """,
            environmentVariable: "SIWA_REFRESH_CHECK_INTERVAL"),
    ]

/// The revoker from the command line, or nil when --apple-key-file is not given.
func makeRevoker(
    _ parsed: ParsedCommand, database: PostgresConfiguration, environment: [String: String], logger: Logger,
    metrics: MetricsRegistry
) throws -> Revoker? {
    guard parsed.value(AppleCredentialOptions.keyFile.name) != nil else {
        logger.info("revoker off: no --apple-key-file (siwa.request_revocation's requests wait)")
        return nil
    }
    func required(_ name: String) throws -> String {
        guard let value = parsed.value(name), !value.isEmpty else {
            throw ConfigurationError("--apple-key-file needs --\(name)")
        }
        return value
    }
    let credentials = try AppleCredentials(parsed, neededBy: "--apple-key-file")
    let clientIDs = AppleCredentialOptions.audiences(parsed)
    guard !clientIDs.isEmpty else { throw ConfigurationError("--apple-key-file needs --audience") }
    let cipher: TokenCipher
    do {
        cipher = try TokenCipher(keyFile: try required("token-key-file"))
    } catch let error as TokenCipherError {
        throw ConfigurationError("--token-key-file: \(error.description)")
    }
    let apple = try credentials.clients(clientIDs, environment: environment)
    let secretProviders = apple.providers
    metrics.computedGauge(
        "siwa_apple_client_secret_expiry_seconds",
        help:
            "Seconds until the soonest-expiring client secret for Apple's token API expires (negative: expired)."
    ) { secretProviders.map { $0.secondsUntilExpiry() }.min() ?? 0 }
    var revokerDatabase = database
    revokerDatabase.applicationName = "siwa-worker-revoker"
    return Revoker(
        configuration: try Revoker.Configuration(
            database: revokerDatabase, clients: apple.clients, cipher: cipher,
            pollInterval: try parsed.seconds("revocation-poll-interval", positive: true)
                ?? Revoker.Configuration.defaultPollInterval,
            retryBaseDelay: try parsed.seconds("revocation-retry-base-delay", positive: true)
                ?? Revoker.Configuration.defaultRetryBaseDelay,
            maxCrashes: try parsed.integer("revocation-max-crashes", in: 1...1000)
                ?? Revoker.Configuration.defaultMaxCrashes,
            refreshCheckInterval: try parsed.seconds("refresh-check-interval", positive: true)),
        logger: logger, metrics: metrics)
}
