import AppleID
import AppleNotifications
import Foundation
import Postgres
import ServiceSupport
import TokenVault
import Worker

/// The revoker's settings: on when --apple-key-file is given, and then the rest are required.
let revokerOptions: [CommandOption] = [
    CommandOption(
        "apple-key-file", valueName: "FILE",
        help: "The Sign in with Apple key (.p8): turns on the revoker (siwa.request_revocation's consumer).",
        environmentVariable: "SIWA_APPLE_KEY_FILE"),
    CommandOption(
        "apple-team-id", valueName: "ID", help: "Your Apple team ID (client secrets' iss).",
        environmentVariable: "SIWA_APPLE_TEAM_ID"),
    CommandOption(
        "apple-key-id", valueName: "ID", help: "The Sign in with Apple key's ID (client secrets' kid).",
        environmentVariable: "SIWA_APPLE_KEY_ID"),
    CommandOption(
        "client-id", valueName: "CLIENT_ID",
        help: "A client ID tokens were issued to (bundle ID or Services ID); repeat for several.",
        isRepeatable: true, environmentVariable: "SIWA_AUDIENCES"),
    CommandOption(
        "token-key-file", valueName: "FILE",
        help: "Refresh-token encryption keys, 'KEY_ID BASE64' per line (the sign-in API's file).",
        environmentVariable: "SIWA_TOKEN_KEY_FILE"),
    CommandOption(
        "apple-url", valueName: "URL",
        help: "Apple's base URL (http only to loopback, for siwactl fake-apple).",
        environmentVariable: "SIWA_APPLE_URL", defaultValue: "https://appleid.apple.com"),
    CommandOption(
        "revocation-poll-interval", valueName: "SECONDS",
        help: "Look for due revocation requests at least this often.",
        environmentVariable: "SIWA_REVOCATION_POLL_INTERVAL", defaultValue: "5"),
    CommandOption(
        "revocation-retry-base-delay", valueName: "SECONDS",
        help:
            "First retry delay after a retryable failure at Apple; doubles per attempt, with jitter, at most 1 h.",
        environmentVariable: "SIWA_REVOCATION_RETRY_BASE_DELAY", defaultValue: "5"),
    CommandOption(
        "refresh-check-interval", valueName: "SECONDS",
        help: """
            Refresh each stored refresh token at Apple at most this often (86400: daily); invalid_grant \
            records a consent-revoked of our own. Default: off.
            """,
        environmentVariable: "SIWA_REFRESH_CHECK_INTERVAL"),
]

/// The revoker from the command line, or nil when --apple-key-file is not given.
func makeRevoker(
    _ parsed: ParsedCommand, database: PostgresConfiguration, environment: [String: String], logger: Logger,
    metrics: MetricsRegistry
) throws -> Revoker? {
    guard let keyFile = parsed.value("apple-key-file") else {
        logger.info("revoker off: no --apple-key-file (siwa.request_revocation's requests wait)")
        return nil
    }
    func required(_ name: String) throws -> String {
        guard let value = parsed.value(name), !value.isEmpty else {
            throw ConfigurationError("--apple-key-file needs --\(name)")
        }
        return value
    }
    let teamID = try required("apple-team-id")
    let keyID = try required("apple-key-id")
    let clientIDs = parsed.values("client-id").flatMap { $0.split(separator: ",").map(String.init) }
        .map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
    guard !clientIDs.isEmpty else { throw ConfigurationError("--apple-key-file needs --client-id") }
    let cipher: TokenCipher
    do {
        cipher = try TokenCipher(keyFile: try required("token-key-file"))
    } catch let error as TokenCipherError {
        throw ConfigurationError("--token-key-file: \(error.description)")
    }
    let apple = try ConfiguredClients(
        keyFile: keyFile, teamID: teamID, keyID: keyID, clientIDs: clientIDs,
        baseURL: parsed.value("apple-url"),
        environment: environment)
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
            pollInterval: try parsed.seconds("revocation-poll-interval", positive: true) ?? .seconds(5),
            retryBaseDelay: try parsed.seconds("revocation-retry-base-delay", positive: true) ?? .seconds(5),
            refreshCheckInterval: try parsed.seconds("refresh-check-interval", positive: true)),
        logger: logger, metrics: metrics)
}
