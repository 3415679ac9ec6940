import Foundation
public import ServiceSupport

/// The Apple settings every executable shares, declared once with one name each: siwa-receiver (the
/// sign-in API), siwa-worker (the revoker), siwactl (transfer, client-secret, fake-apple, verify).
///
/// Old names stay accepted as aliases and are shown as such in `--help`: `--client-id` for
/// `--audience` (siwa-worker and siwactl fake-apple), `--team-id` and `--key-id` for `--apple-team-id`
/// and `--apple-key-id` (siwactl client-secret and fake-apple).
public enum AppleCredentialOptions {
    /// `--apple-team-id` (`SIWA_APPLE_TEAM_ID`): the team ID, client secrets' `iss`.
    public static let teamID = CommandOption(
        "apple-team-id", valueName: "ID", help: "Your Apple team ID (client secrets' iss).",
        environmentVariable: "SIWA_APPLE_TEAM_ID", aliases: ["team-id"])
    /// `--apple-key-id` (`SIWA_APPLE_KEY_ID`): the Sign in with Apple key's ID, client secrets' `kid`.
    public static let keyID = CommandOption(
        "apple-key-id", valueName: "ID", help: "The Sign in with Apple key's ID (client secrets' kid).",
        environmentVariable: "SIWA_APPLE_KEY_ID", aliases: ["key-id"])
    /// `--apple-key-file` (`SIWA_APPLE_KEY_FILE`): the `.p8` client secrets are minted from.
    public static let keyFile = CommandOption(
        "apple-key-file", valueName: "FILE",
        help: "The Sign in with Apple key (.p8), to mint client secrets.",
        environmentVariable: "SIWA_APPLE_KEY_FILE")
    /// `--apple-url` (`SIWA_APPLE_URL`): Apple's base URL.
    public static let baseURL = CommandOption(
        "apple-url", valueName: "URL",
        help: "Apple's base URL (http only to loopback, for siwactl fake-apple).",
        environmentVariable: "SIWA_APPLE_URL", defaultValue: "https://appleid.apple.com")
    /// `--audience` (`SIWA_AUDIENCES`, comma-separated): the app's client IDs, the `aud` of Apple's tokens.
    public static let audiences = CommandOption(
        "audience", valueName: "CLIENT_ID",
        help:
            "A client ID of the app (bundle ID or Services ID: the aud of Apple's tokens); repeat for several.",
        isRepeatable: true, environmentVariable: "SIWA_AUDIENCES", aliases: ["client-id"])

    /// The credentials (team ID, key ID, key file, Apple's URL), all required when `required`.
    public static func credentials(required: Bool = false) -> [CommandOption] {
        [teamID, keyID, keyFile, baseURL].map { option in
            var option = option
            option.isRequired = required && option.defaultValue == nil
            return option
        }
    }

    /// The audiences option, required or not.
    public static func audiences(required: Bool) -> CommandOption {
        var option = audiences
        option.isRequired = required
        return option
    }

    /// The client IDs given (`--audience` repeated, or comma-separated), trimmed, empty ones dropped.
    public static func audiences(_ parsed: ParsedCommand) -> [String] {
        parsed.values(audiences.name).flatMap { $0.split(separator: ",") }
            .map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
    }
}

/// The Apple credentials from the command line: what ``ConfiguredClients`` needs besides client IDs.
public struct AppleCredentials: Sendable {
    /// The team ID (`iss`).
    public var teamID: String
    /// The key ID (`kid`).
    public var keyID: String
    /// The `.p8` file.
    public var keyFile: String
    /// Apple's base URL, or nil for Apple's.
    public var baseURL: String?

    /// The credentials of `parsed` (declared with ``AppleCredentialOptions/credentials(required:)``);
    /// a missing one is refused as "`neededBy` needs --apple-…" (for instance `--signin-listen`).
    public init(_ parsed: ParsedCommand, neededBy: String? = nil) throws(ConfigurationError) {
        func required(_ option: CommandOption) throws(ConfigurationError) -> String {
            guard let value = parsed.value(option.name), !value.isEmpty else {
                throw ConfigurationError("\(neededBy ?? "this command") needs --\(option.name)")
            }
            return value
        }
        teamID = try required(AppleCredentialOptions.teamID)
        keyID = try required(AppleCredentialOptions.keyID)
        keyFile = try required(AppleCredentialOptions.keyFile)
        baseURL = parsed.value(AppleCredentialOptions.baseURL.name)
    }

    /// One Apple ID client per client ID (see ``ConfiguredClients``).
    public func clients(_ clientIDs: some Sequence<String>, environment: [String: String])
        throws(ConfigurationError) -> ConfiguredClients
    {
        try ConfiguredClients(
            keyFile: keyFile, teamID: teamID, keyID: keyID, clientIDs: clientIDs, baseURL: baseURL,
            environment: environment)
    }

    /// The client for one client ID.
    public func client(for clientID: String, environment: [String: String]) throws(ConfigurationError)
        -> AppleIDClient
    {
        guard let client = try clients([clientID], environment: environment).clients[clientID] else {
            throw ConfigurationError("Apple client settings: no client for \(clientID)")
        }
        return client
    }
}
