import AppleID
import AppleKeys
import Foundation
import HTTPServer
import Postgres
import Receiver
import ServiceSupport
import SiwaSchema
import Synchronization

let receiverCommand = CommandSpec(
    name: "siwa-receiver",
    abstract: """
        Receives Sign in with Apple server-to-server notifications: verifies each token against Apple's \
        keys and stores it in PostgreSQL exactly once (by jti) before answering 200.
        """,
    options: [
        CommandOption(
            "listen", valueName: "HOST:PORT", help: "Address to listen on.",
            environmentVariable: "SIWA_LISTEN",
            defaultValue: "127.0.0.1:8080"),
        .databaseURL,
        AppleCredentialOptions.audiences(required: true),
        KeySetOptions.url, KeySetOptions.cooldown, KeySetOptions.refresh,
        CommandOption(
            "max-token-age", valueName: "SECONDS",
            help: "Oldest accepted token without exp, from its iat (plus 60 s); keep events longer.",
            environmentVariable: "SIWA_MAX_TOKEN_AGE", defaultValue: "86400"),
        CommandOption(
            "max-body-bytes", valueName: "BYTES", help: "Largest request body; larger ones get 413.",
            environmentVariable: "SIWA_MAX_BODY_BYTES", defaultValue: "65536"),
        CommandOption(
            "max-connections", valueName: "N", help: "Most concurrent HTTP connections.",
            environmentVariable: "SIWA_MAX_CONNECTIONS", defaultValue: "1024"),
        CommandOption(
            "connection-timeout", valueName: "SECONDS",
            help: "Idle or slow connections are closed after this.",
            environmentVariable: "SIWA_CONNECTION_TIMEOUT", defaultValue: "10"),
        CommandOption(
            "threads", valueName: "N",
            help:
                "HTTP handler threads, for requests that may block (readiness, metrics, a notification "
                + "whose key must be fetched); a notification waiting for its commit holds none.",
            environmentVariable: "SIWA_THREADS", defaultValue: "4"),
        CommandOption(
            "pool-size", valueName: "N", help: "Database connections.", environmentVariable: "SIWA_POOL_SIZE",
            defaultValue: "16"),
        .logLevel,
        .listenAddressFile(
            environmentVariable: "SIWA_LISTEN_ADDRESS_FILE",
            names: "notifications; signin with --signin-listen; ssf with --ssf-listen"),
    ] + signInOptions + signalTransmitterOptions, flags: signInFlags + signalTransmitterFlags,
    offersVersion: true)

/// Parses the configuration, runs until SIGTERM/SIGINT, and returns the exit status: 0 stopped by a
/// signal, 1 failure (e.g. the port is taken), 2 usage error.
func runReceiver(arguments: [String], environment: [String: String]) -> Int32 {
    let signals = TerminationSignals()
    let parsed: ParsedCommand
    do {
        parsed = try receiverCommand.parse(arguments, environment: environment)
    } catch {
        writeErrorLine("siwa-receiver", "\(error.message) (see siwa-receiver --help)")
        return 2
    }
    if parsed.helpRequested {
        writeStandardOutput(receiverCommand.helpText())
        return 0
    }
    if parsed.versionRequested {
        writeStandardOutput(SiwaBuild.versionLine("siwa-receiver") + "\n")
        return 0
    }
    for warning in receiverCommand.warnings(for: parsed) { writeErrorLine("siwa-receiver", warning) }
    let configuration: ReceiverConfiguration
    let logger: Logger
    let signIn: SignInSetup?
    let transmitter: SignalTransmitterSetup?
    do {
        (configuration, logger) = try makeConfiguration(parsed, environment: environment)
        signIn = try SignInSetup(parsed, audiences: configuration.audiences, environment: environment)
        transmitter = try SignalTransmitterSetup(parsed)
    } catch {
        writeErrorLine("siwa-receiver", "\(error)")
        return 2
    }
    // A key set other than Apple's accepts tokens nobody but its holder signed: for tests and staging
    // only, and said loudly at every start.
    if !KeySetOptions.isApple(configuration.jwks) {
        logger.warning(
            "the key set is not Apple's: notifications signed by whoever holds its keys are accepted; use this for tests and staging only, never in production",
            [
                "url": .string(configuration.jwks.description),
                "apple": .string(JWKSSource.appleURL.absoluteString),
            ])
    }
    // One service: the receiver starts its parts in order and stops them in reverse, joining every
    // thread it started (HTTP daemon and handlers, committers, key refresher) before shutdown returns.
    // It is built when the group starts it, so a signal during start-up leaves no thread behind.
    let receiver = StartedReceiver()
    let bound = BoundAddresses()
    let addressFile = parsed.value("listen-address-file").map(ListenAddressFile.init(path:))
    do {
        try addressFile?.removeStale()
    } catch {
        writeErrorLine("siwa-receiver", "\(error)")
        return 2
    }
    var services: [Service] = [
        .background(
            "siwa-receiver",
            start: {
                let started = try NotificationReceiver(configuration: configuration, logger: logger)
                try started.start()  // on failure it has released what it started
                receiver.set(started)
                bound.record("notifications", started.address)
            }, stop: { receiver.get()?.shutdown() })
    ]
    // Its heartbeat and the database's health gauges, once the receiver's registry exists.
    do {
        services.append(
            try healthService(
                configuration: configuration, metrics: { receiver.get()?.metrics.registry }, logger: logger))
    } catch {
        writeErrorLine("siwa-receiver", "\(error)")
        return 2
    }
    // The internal sign-in API, on its own listener when --signin-listen is given.
    if let signIn {
        services.append(
            signIn.service(
                jwks: configuration.jwks, keys: configuration.keys,
                metrics: { receiver.get()?.metrics.registry }, bound: bound,
                logger: logger))
    }
    // The Shared Signals transmitter API, on its own listener when --ssf-listen is given.
    if let transmitter {
        services.append(transmitter.service(bound: bound, logger: logger))
    }
    // Written once every listener above is bound (the group starts services in order).
    if let addressFile {
        services.append(.listenAddressFile(addressFile, listeners: { bound.all }))
    }
    let group = ServiceGroup(services, signals: signals, logger: logger)
    return group.run().exitStatus
}

/// The addresses the process's listeners bound, by name, in the order they started.
final class BoundAddresses: Sendable {
    private let value = Mutex<[(name: String, address: String)]>([])
    func record(_ name: String, _ address: String?) {
        guard let address else { return }
        value.withLock { $0.append((name, address)) }
    }
    var all: [(name: String, address: String)] { value.withLock { $0 } }
}

/// The receiver once started, for the group's stop.
private final class StartedReceiver: Sendable {
    private let value = Mutex<NotificationReceiver?>(nil)
    func set(_ receiver: NotificationReceiver) { value.withLock { $0 = receiver } }
    func get() -> NotificationReceiver? { value.withLock { $0 } }
}

/// The receiver's configuration from the parsed command line; `environment` supplies the key fetch's
/// proxy (`https_proxy`, `no_proxy`) and CA file (`SSL_CERT_FILE`).
/// - Throws: ``ConfigurationError`` or ``CommandLineError``, whose descriptions name the unusable setting
///   (never quoting the database URL).
private func makeConfiguration(_ parsed: ParsedCommand, environment: [String: String]) throws -> (
    ReceiverConfiguration, Logger
) {
    let logger = try parsed.logger(label: "siwa-receiver")
    guard let listen = try parsed.listenAddress("listen") else {
        throw ConfigurationError("--listen must be HOST:PORT")
    }
    var http = HTTPServer.Configuration(host: listen.host, port: listen.port)
    http.maxBodyBytes = try parsed.integer("max-body-bytes", in: 256...(16 << 20)) ?? http.maxBodyBytes
    http.connectionLimit = try parsed.integer("max-connections", in: 1...1_000_000) ?? http.connectionLimit
    http.connectionTimeout =
        try parsed.seconds("connection-timeout", positive: true) ?? http.connectionTimeout
    http.threadCount = try parsed.integer("threads", in: 1...1024) ?? http.threadCount
    // 16 KiB per connection for the request line, headers and read buffer (nginx's own limit for a
    // header line is 8 KiB): libmicrohttpd clears a connection's whole pool between two requests on it,
    // so a larger pool costs every request, and memory per idle keep-alive connection.
    http.connectionMemoryLimit = 16 * 1024
    let audiences = AppleCredentialOptions.audiences(parsed)
    let keys = try KeySetOptions.storeConfiguration(parsed)
    let database: PostgresConfiguration
    do {
        database = try PostgresConfiguration(
            parsed.value("database-url") ?? "", applicationName: "siwa-receiver")
    } catch {
        throw ConfigurationError("invalid --database-url: \(error.message)")
    }
    var configuration = try ReceiverConfiguration(
        database: database,
        audiences: Set(audiences), jwks: try KeySetOptions.source(parsed, environment: environment),
        keys: keys,
        poolSize: try parsed.integer("pool-size", in: 1...1000) ?? 16, http: http)
    configuration.maxTokenAge =
        try parsed.seconds("max-token-age", positive: true) ?? configuration.maxTokenAge
    // The database keeps each jti's dedupe key for 7 days after iat (siwa.notification_jtis): an older
    // token accepted here could be stored a second time.
    guard configuration.maxTokenAge <= maximumTokenAge else {
        throw ConfigurationError(
            "--max-token-age must be at most \(Int(maximumTokenAge.inSeconds)) seconds (6 days): the database keeps each jti's dedupe key for 7 days"
        )
    }
    return (configuration, logger)
}

/// The largest `--max-token-age`: below the database's 7-day dedupe window, with a day to spare.
let maximumTokenAge: Duration = .seconds(6 * 86_400)
