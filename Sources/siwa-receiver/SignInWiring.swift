import AppleID
import AppleKeys
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
            "signin-database-url", valueName: "URL",
            help:
                "The sign-in API's own PostgreSQL login (a member of siwa_signin only, never the receiver's). Required with --signin-listen.",
            environmentVariable: "SIWA_SIGNIN_DATABASE_URL"
        ).secret(.connectionString),
        CommandOption(
            "signin-token-file", valueName: "FILE",
            help: "File holding the API's bearer token (32+ characters). Required with --signin-listen.",
            environmentVariable: "SIWA_SIGNIN_TOKEN_FILE"),
        CommandOption(
            "token-key-file", valueName: "FILE",
            help: "Refresh-token encryption keys, 'KEY_ID BASE64' per line, the first encrypts (chmod 600).",
            environmentVariable: "SIWA_TOKEN_KEY_FILE"),
    ] + AppleCredentialOptions.credentials()

/// The sign-in API's switches.
let signInFlags: [CommandFlag] = [
    CommandFlag(
        "signin-tls-terminated-in-front",
        help:
            "TLS for the sign-in API terminates in front of siwa-receiver (a proxy or sidecar): allows a non-loopback --signin-listen; the API itself speaks plain HTTP.",
        environmentVariable: "SIWA_SIGNIN_TLS_TERMINATED_IN_FRONT")
]

/// The sign-in API built from the command line, or nil when it is off.
struct SignInSetup: Sendable {
    let configuration: SignInConfiguration
    let providers: [ClientSecretProvider]

    init?(_ parsed: ParsedCommand, audiences: Set<String>, environment: [String: String]) throws {
        guard let listen = try parsed.listenAddress("signin-listen") else {
            // The Apple and key-file settings may be shared with siwa-worker's revoker: ignored here.
            for name in ["signin-token-file", "signin-database-url"] where parsed.value(name) != nil {
                throw ConfigurationError("--\(name) needs --signin-listen")
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
        // Its own credential: the receiver's login (internet-facing) never needs siwa_signin.
        guard let url = parsed.value("signin-database-url"), !url.isEmpty else {
            throw ConfigurationError(
                "--signin-listen needs --signin-database-url: a login of its own, a member of siwa_signin only (docs/operations.md § 12)"
            )
        }
        let database: PostgresConfiguration
        do {
            database = try PostgresConfiguration(url, applicationName: "siwa-receiver-signin")
        } catch {
            throw ConfigurationError("invalid --signin-database-url: \(error.message)")
        }
        let cipher: TokenCipher
        do {
            cipher = try TokenCipher(keyFile: try required("token-key-file"))
        } catch let error as TokenCipherError {
            throw ConfigurationError("--token-key-file: \(error.description)")
        }
        let apple = try AppleCredentials(parsed, neededBy: "--signin-listen").clients(
            audiences, environment: environment)
        configuration = try SignInConfiguration(
            http: HTTPServer.Configuration(host: listen.host, port: listen.port, threadCount: 8),
            bearerToken: token, clients: apple.clients, cipher: cipher, database: database,
            tlsTerminatedInFront: parsed.flag("signin-tls-terminated-in-front"))
        self.providers = apple.providers
    }

    /// The sign-in API as a service of the group: its own key store (same key set as the receiver's), its
    /// listener, and the client-secret expiry gauge on the receiver's /metrics.
    func service(
        jwks: JWKSSource, keys: KeyStore.Configuration, metrics: @escaping @Sendable () -> MetricsRegistry?,
        bound: BoundAddresses, logger: Logger
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
                let service = SignInService(
                    configuration: configuration, logger: logger, metrics: metrics() ?? MetricsRegistry()
                ) {
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
                bound.record("signin", service.address)
            },
            stop: {
                guard let (service, store) = running.withLock({ $0 }) else { return }
                service.shutdown()
                store.stop()
            })
    }
}
