import AppleID
import AppleNotifications
import Foundation
import HTTPServer
import Postgres
import Receiver
import ServiceSupport
import SignIn
import Synchronization
import TokenVault

/// The sign-in API's settings (off unless --signin-listen is given; then all of them are required).
let signInOptions: [CommandOption] =
    [
        CommandOption(
            "signin-listen", valueName: "HOST:PORT",
            help: "Serve the internal sign-in API (POST /v1/sign-ins, /v1/revocations) here; off by default.",
            environmentVariable: "SIWA_SIGNIN_LISTEN"),
        CommandOption(
            "signin-token-file", valueName: "FILE",
            help: "File holding the API's bearer token (32+ characters). Required with --signin-listen.",
            environmentVariable: "SIWA_SIGNIN_TOKEN_FILE"),
        CommandOption(
            "token-key-file", valueName: "FILE",
            help: "Refresh-token encryption keys, 'KEY_ID BASE64' per line, the first encrypts (chmod 600).",
            environmentVariable: "SIWA_TOKEN_KEY_FILE"),
    ] + AppleCredentialOptions.credentials()

/// The sign-in API built from the command line, or nil when it is off.
struct SignInSetup: Sendable {
    let configuration: SignInConfiguration
    let providers: [ClientSecretProvider]

    init?(_ parsed: ParsedCommand, audiences: Set<String>, environment: [String: String]) throws {
        guard let listen = try parsed.listenAddress("signin-listen") else {
            // The Apple and key-file settings may be shared with siwa-worker's revoker: ignored here.
            if parsed.value("signin-token-file") != nil {
                throw ConfigurationError("--signin-token-file needs --signin-listen")
            }
            return nil
        }
        func required(_ name: String) throws -> String {
            guard let value = parsed.value(name), !value.isEmpty else {
                throw ConfigurationError("--signin-listen needs --\(name)")
            }
            return value
        }
        let tokenFile = try required("signin-token-file")
        let tokenData = try SecretFile.read(tokenFile, setting: "--signin-token-file")
        guard
            let token = String(data: tokenData, encoding: .utf8)?.trimmingCharacters(
                in: .whitespacesAndNewlines)
        else { throw ConfigurationError("--signin-token-file \(tokenFile) is not UTF-8 text") }
        let cipher: TokenCipher
        do {
            cipher = try TokenCipher(keyFile: try required("token-key-file"))
        } catch let error as TokenCipherError {
            throw ConfigurationError("--token-key-file: \(error.description)")
        }
        let apple = try AppleCredentials(parsed, neededBy: "--signin-listen").clients(
            audiences, environment: environment)
        let database = try PostgresConfiguration(
            parsed.value("database-url") ?? "", applicationName: "siwa-receiver-signin")
        configuration = try SignInConfiguration(
            http: HTTPServer.Configuration(host: listen.host, port: listen.port, threadCount: 8),
            bearerToken: token, clients: apple.clients, cipher: cipher, database: database)
        self.providers = apple.providers
    }

    /// The sign-in API as a service of the group: its own key store (same key set as the receiver's), its
    /// listener, and the client-secret expiry gauge on the receiver's /metrics.
    func service(
        jwks: JWKSSource, keys: KeyStore.Configuration, metrics: @escaping @Sendable () -> MetricsRegistry?,
        logger: Logger
    )
        -> Service
    {
        let running = Mutex<(SignInService, KeyStore)?>(nil)
        let providers = self.providers
        let configuration = self.configuration
        return .background(
            "sign-in API",
            start: {
                let store = KeyStore(configuration: keys, source: { try jwks.fetch() })
                store.start()
                let service = SignInService(configuration: configuration, logger: logger) {
                    kid throws(NotificationError) in
                    try store.key(id: kid)
                }
                do {
                    try service.start()
                } catch {
                    store.stop()
                    throw error
                }
                metrics()?.computedGauge(
                    "siwa_apple_client_secret_expiry_seconds",
                    help:
                        "Seconds until the soonest-expiring client secret for Apple's token API expires (negative: expired)."
                ) { providers.map { $0.secondsUntilExpiry() }.min() ?? 0 }
                running.withLock { $0 = (service, store) }
            },
            stop: {
                guard let (service, store) = running.withLock({ $0 }) else { return }
                service.shutdown()
                store.stop()
            })
    }
}
