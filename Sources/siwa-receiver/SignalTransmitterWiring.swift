import Foundation
import HTTPServer
import Postgres
import ServiceSupport
import SharedSignals
import SignalTransmitter
import Synchronization

/// The Shared Signals transmitter API's settings (off unless --ssf-listen is given).
let signalTransmitterOptions: [CommandOption] = [
    CommandOption(
        "ssf-listen", valueName: "HOST:PORT",
        help:
            "Serve the Shared Signals transmitter API (SSF 1.0, docs/shared-signals.md) here; off by default.",
        environmentVariable: "SIWA_SSF_LISTEN"),
    CommandOption(
        "ssf-database-url", valueName: "URL",
        help:
            "The transmitter API's own PostgreSQL login (a member of siwa_ssf only, never the receiver's). Required with --ssf-listen.",
        environmentVariable: "SIWA_SSF_DATABASE_URL"
    ).secret(.connectionString),
    CommandOption(
        "ssf-key-file", valueName: "FILE",
        help:
            "The SET signing key (siwactl ssf keygen), shared with siwa-worker. Required with --ssf-listen.",
        environmentVariable: "SIWA_SSF_KEY_FILE"),
    CommandOption(
        "ssf-issuer", valueName: "URL",
        help: "The SETs' iss and the base URL of the API's endpoints. Required with --ssf-listen.",
        environmentVariable: "SIWA_SSF_ISSUER"),
    CommandOption(
        "ssf-published-key-files", valueName: "FILE,…",
        help:
            "More SET keys published in the JWKS, signing nothing: for a rotation, the next key before it signs and the previous one afterwards.",
        environmentVariable: "SIWA_SSF_PUBLISHED_KEY_FILES"),
    CommandOption(
        "ssf-authorization-dir", valueName: "DIR",
        help:
            "Where a push stream's authorization_header is written (a file per stream, mode 0600) for siwa-worker; without it such streams are refused.",
        environmentVariable: "SIWA_SSF_AUTHORIZATION_DIR"),
    CommandOption(
        "ssf-default-subjects", valueName: "ALL|NONE",
        help: "The subjects a new stream carries before any is added or removed.",
        environmentVariable: "SIWA_SSF_DEFAULT_SUBJECTS", defaultValue: "ALL"),
    CommandOption(
        "ssf-token-lifetime", valueName: "SECONDS", help: "Lifetime of an access token of POST /ssf/token.",
        environmentVariable: "SIWA_SSF_TOKEN_LIFETIME", defaultValue: "3600"),
    CommandOption(
        "ssf-min-verification-interval", valueName: "SECONDS",
        help: "A new stream's min_verification_interval: sooner verification requests get 429.",
        environmentVariable: "SIWA_SSF_MIN_VERIFICATION_INTERVAL", defaultValue: "30"),
    CommandOption(
        "ssf-long-poll", valueName: "SECONDS", help: "The longest a poll without returnImmediately waits.",
        environmentVariable: "SIWA_SSF_LONG_POLL", defaultValue: "30"),
    CommandOption(
        "ssf-poll-lease", valueName: "SECONDS",
        help: "How long a polled SET waits for its ack before it is served again.",
        environmentVariable: "SIWA_SSF_POLL_LEASE", defaultValue: "60"),
]

/// The transmitter API's switches.
let signalTransmitterFlags: [CommandFlag] = [
    CommandFlag(
        "ssf-tls-terminated-in-front",
        help:
            "TLS for the Shared Signals API terminates in front of siwa-receiver: allows a non-loopback --ssf-listen.",
        environmentVariable: "SIWA_SSF_TLS_TERMINATED_IN_FRONT")
]

/// The transmitter API built from the command line, or nil when it is off.
struct SignalTransmitterSetup: Sendable {
    let configuration: TransmitterConfiguration

    init?(_ parsed: ParsedCommand) throws {
        guard let listen = try parsed.listenAddress("ssf-listen") else {
            // The key file and issuer may be shared with siwa-worker's push lanes: ignored here.
            if parsed.value("ssf-database-url") != nil {
                throw ConfigurationError("--ssf-database-url needs --ssf-listen")
            }
            return nil
        }
        func required(_ name: String) throws -> String {
            guard let value = parsed.value(name), !value.isEmpty else {
                throw ConfigurationError("--ssf-listen needs --\(name)")
            }
            return value
        }
        let url = try required("ssf-database-url")
        let database: PostgresConfiguration
        do {
            database = try PostgresConfiguration(url, applicationName: "siwa-receiver-ssf")
        } catch {
            throw ConfigurationError("invalid --ssf-database-url: \(error.message)")
        }
        func load(_ file: String, _ setting: String) throws -> SETSigningKey {
            guard let pem = try? String(contentsOfFile: file, encoding: .utf8),
                let key = try? SETSigningKey(privateKeyPEM: pem)
            else { throw ConfigurationError("--\(setting): \(file) holds no usable RSA private key") }
            return key
        }
        let key = try load(try required("ssf-key-file"), "ssf-key-file")
        let published = try (parsed.value("ssf-published-key-files") ?? "").split(separator: ",").map {
            try load(String($0), "ssf-published-key-files")
        }
        guard
            let subjects = TransmitterConfiguration.DefaultSubjects(
                rawValue: (parsed.value("ssf-default-subjects") ?? "ALL").uppercased())
        else { throw ConfigurationError("--ssf-default-subjects is ALL or NONE") }
        var http = HTTPServer.Configuration(host: listen.host, port: listen.port, threadCount: 16)
        http.maxBodyBytes = 1 << 20
        configuration = try TransmitterConfiguration(
            http: http, database: database, issuer: try required("ssf-issuer"), key: key,
            tokenLifetime: try parsed.seconds("ssf-token-lifetime", positive: true) ?? .seconds(3600),
            defaultSubjects: subjects,
            minVerificationInterval: try parsed.integer("ssf-min-verification-interval", in: 0...86_400)
                ?? 30,
            longPollLimit: try parsed.seconds("ssf-long-poll", positive: true) ?? .seconds(30),
            pollLease: try parsed.seconds("ssf-poll-lease", positive: true) ?? .seconds(60),
            authorizationDirectory: parsed.value("ssf-authorization-dir"), publishedKeys: published,
            tlsTerminatedInFront: parsed.flag("ssf-tls-terminated-in-front"))
    }

    /// The transmitter API as a service of the group, on its own listener.
    func service(bound: BoundAddresses, logger: Logger) -> Service {
        let running = Mutex<SignalTransmitter?>(nil)
        let configuration = self.configuration
        return .background(
            "shared signals API",
            start: {
                let transmitter = SignalTransmitter(configuration: configuration, logger: logger)
                try transmitter.start()
                running.withLock { $0 = transmitter }
                bound.record("ssf", transmitter.address)
            },
            stop: { running.withLock({ $0 })?.shutdown() })
    }
}
