import Foundation
public import ServiceSupport

/// The key-set settings of every executable that verifies Apple's tokens (siwa-receiver, siwa-worker):
/// one declaration, its defaults taken from ``JWKSSource`` and ``KeyStore/Configuration``.
public enum KeySetOptions {
    /// `--jwks-url`: where the keys come from (Apple's by default).
    public static let url = CommandOption(
        "jwks-url", valueName: "URL",
        help: "Apple's key set (https; http only for loopback): every token is verified against it.",
        environmentVariable: "SIWA_JWKS_URL", defaultValue: JWKSSource.appleURL.absoluteString)
    /// `--jwks-cooldown`: the least time between refetches for unknown kids.
    public static let cooldown = CommandOption(
        "jwks-cooldown", valueName: "SECONDS", help: "Least time between refetches caused by unknown kids.",
        environmentVariable: "SIWA_JWKS_COOLDOWN",
        defaultValue: KeyStore.Configuration.defaultCooldown.secondsText)
    /// `--jwks-refresh`: the periodic refresh.
    public static let refresh = CommandOption(
        "jwks-refresh", valueName: "SECONDS", help: "Periodic key-set refresh interval.",
        environmentVariable: "SIWA_JWKS_REFRESH",
        defaultValue: KeyStore.Configuration.defaultRefreshInterval.secondsText)

    /// The group, in the order `--help` lists it.
    public static let all: [CommandOption] = [url, cooldown, refresh]

    /// The key set's source from the parsed command line; `environment` supplies its proxy and CA file.
    /// - Throws: ``ConfigurationError`` when `--jwks-url` is not a URL the fetch policy allows.
    public static func source(_ parsed: ParsedCommand, environment: [String: String]) throws -> JWKSSource {
        guard let address = URL(string: parsed.value(Self.url.name) ?? JWKSSource.appleURL.absoluteString)
        else {
            throw ConfigurationError("--jwks-url is not a URL")
        }
        return try JWKSSource(url: address, environment: environment)
    }

    /// The key cache's timing from the parsed command line.
    public static func storeConfiguration(_ parsed: ParsedCommand) throws(CommandLineError)
        -> KeyStore.Configuration
    {
        KeyStore.Configuration(
            refreshInterval: try parsed.seconds(refresh.name, positive: true)
                ?? KeyStore.Configuration.defaultRefreshInterval,
            cooldown: try parsed.seconds(cooldown.name, positive: true)
                ?? KeyStore.Configuration.defaultCooldown)
    }

    /// Whether the configured key set is Apple's (anything else is for tests and staging only).
    public static func isApple(_ source: JWKSSource) -> Bool {
        source.url.absoluteString == JWKSSource.appleURL.absoluteString
    }
}
