import BounceEvents
import Foundation
import HTTPServer
import MailGate
import Postgres
import ServiceSupport
import SiwaSchema
import Synchronization

let mailGateCommand = CommandSpec(
    name: "siwa-mailgate",
    abstract: """
        The relay-mail gate: a Postfix policy service (check_policy_service) that refuses mail to Apple \
        relay addresses whose forwarding is off or whose account is deleted, and an HTTP check of the same \
        decision for the app's mail code and bulk lists. Connects as a member of siwa_mail only.
        """,
    options: [
        CommandOption(
            "policy-listen", valueName: "HOST:PORT", help: "Postfix policy delegation listener (TCP).",
            environmentVariable: "SIWA_MAILGATE_POLICY_LISTEN", defaultValue: "127.0.0.1:10033"),
        CommandOption(
            "database-url", valueName: "URL",
            help: "PostgreSQL URL or conninfo string of a login that is a member of siwa_mail only.",
            isRequired: true, environmentVariable: "SIWA_MAILGATE_DATABASE_URL"
        ).secret(.connectionString),
        CommandOption(
            "decision-timeout", valueName: "SECONDS",
            help:
                "Longest wait for the database before a policy answer goes without it (--on-database-error).",
            environmentVariable: "SIWA_MAILGATE_DECISION_TIMEOUT", defaultValue: "0.5"),
        CommandOption(
            "on-database-error", valueName: "ACTION",
            help:
                "Answer when the database is down or slower than --decision-timeout: dunno (fail open) or defer (DEFER_IF_PERMIT 4.3.0).",
            environmentVariable: "SIWA_MAILGATE_ON_DATABASE_ERROR", defaultValue: "dunno"),
        CommandOption(
            "unknown-relay", valueName: "ACTION",
            help:
                "Answer for an address Apple did not give this app on one of Apple's relay domains: dunno or reject (550 5.1.1).",
            environmentVariable: "SIWA_MAILGATE_UNKNOWN_RELAY", defaultValue: "dunno"),
        CommandOption(
            "cache-ttl", valueName: "SECONDS",
            help: "Longest time a decision is served from the cache, counted from its query (0: no cache).",
            environmentVariable: "SIWA_MAILGATE_CACHE_TTL", defaultValue: "5"),
        CommandOption(
            "cache-size", valueName: "N", help: "Most decisions held in the cache.",
            environmentVariable: "SIWA_MAILGATE_CACHE_SIZE", defaultValue: "100000"),
        CommandOption(
            "max-connections", valueName: "N",
            help:
                "Most concurrent policy connections; more are closed at once (Postfix's default_action applies).",
            environmentVariable: "SIWA_MAILGATE_MAX_CONNECTIONS", defaultValue: "512"),
        CommandOption(
            "idle-timeout", valueName: "SECONDS", help: "A policy connection idle this long is closed.",
            environmentVariable: "SIWA_MAILGATE_IDLE_TIMEOUT", defaultValue: "300"),
        CommandOption(
            "pool-size", valueName: "N", help: "Database connections (one lookup thread each, less one).",
            environmentVariable: "SIWA_MAILGATE_POOL_SIZE", defaultValue: "4"),
        CommandOption(
            "http-listen", valueName: "HOST:PORT",
            help:
                "Serve the HTTP check (GET /v1/relay-mail/decision, POST /v1/relay-mail/decisions) here; off by default.",
            environmentVariable: "SIWA_MAILGATE_HTTP_LISTEN"),
        CommandOption(
            "http-token", valueName: "TOKEN",
            help: "The HTTP check's bearer token (32+ characters). Required with --http-listen.",
            environmentVariable: "SIWA_MAILGATE_HTTP_TOKEN"
        ).secret(),
        CommandOption(
            "metrics-listen", valueName: "HOST:PORT", help: "Serve Prometheus metrics at /metrics here.",
            environmentVariable: "SIWA_MAILGATE_METRICS_LISTEN"),
        CommandOption(
            "log-level", valueName: "LEVEL", help: "debug, info, warning or error.",
            environmentVariable: "SIWA_MAILGATE_LOG_LEVEL", defaultValue: "info"),
        .listenAddressFile(
            environmentVariable: "SIWA_MAILGATE_LISTEN_ADDRESS_FILE",
            names:
                "policy; http with --http-listen; esp_events with --esp-events-listen; metrics with --metrics-listen"
        ),
    ] + espEventsOptions,
    flags: [
        CommandFlag(
            "http-tls-terminated-in-front",
            help:
                "TLS for the HTTP check terminates in front of it (a proxy or sidecar): allows a non-loopback --http-listen.",
            environmentVariable: "SIWA_MAILGATE_HTTP_TLS_TERMINATED_IN_FRONT")
    ] + espEventsFlags, offersVersion: true)

/// Parses the configuration, runs until SIGTERM/SIGINT and returns the exit status: 0 stopped by a
/// signal, 1 failure (e.g. the port is taken), 2 usage or configuration error.
func runMailGate(arguments: [String], environment: [String: String]) -> Int32 {
    let signals = TerminationSignals()
    let parsed: ParsedCommand
    do {
        parsed = try mailGateCommand.parse(arguments, environment: environment)
    } catch {
        writeErrorLine("siwa-mailgate", "\(error.message) (see siwa-mailgate --help)")
        return 2
    }
    if parsed.helpRequested {
        writeStandardOutput(mailGateCommand.helpText())
        return 0
    }
    if parsed.versionRequested {
        writeStandardOutput(SiwaBuild.versionLine("siwa-mailgate") + "\n")
        return 0
    }
    for warning in mailGateCommand.warnings(for: parsed) { writeErrorLine("siwa-mailgate", warning) }
    let configuration: MailGateConfiguration
    let espEvents: ESPEventsConfiguration?
    let logger: Logger
    let addressFile = parsed.value("listen-address-file").map(ListenAddressFile.init(path:))
    do {
        logger = try parsed.logger(label: "siwa-mailgate")
        configuration = try makeConfiguration(parsed)
        espEvents = try makeESPEventsConfiguration(parsed, environment: environment)
        try addressFile?.removeStale()
    } catch {
        writeErrorLine("siwa-mailgate", "\(error)")
        return 2
    }
    let metrics = MailGateMetrics()
    metrics.registry.buildInfo(labels: SiwaBuild.metricLabels)
    let gate = MailGateService(configuration: configuration, logger: logger, metrics: metrics)
    var services: [Service] = [
        .background("siwa-mailgate", start: { try gate.start() }, stop: { gate.shutdown() })
    ]
    let bounceListener = espEvents.map {
        ESPEventsService(
            configuration: $0, metrics: ESPEventsMetrics(registry: metrics.registry), logger: logger)
    }
    if let bounceListener {
        services.append(
            .background(
                "esp bounce events", start: { try bounceListener.start() },
                stop: { bounceListener.shutdown() }))
    }
    if let addressFile {
        services.append(
            .listenAddressFile(addressFile) {
                gate.addresses + (bounceListener?.address.map { [("esp_events", $0)] } ?? [])
            })
    }
    return ServiceGroup(services, signals: signals, logger: logger).run().exitStatus
}

/// The gate's configuration from the parsed command line.
/// - Throws: ``ConfigurationError`` or ``CommandLineError`` naming the unusable setting (never quoting the
///   database URL or the token).
private func makeConfiguration(_ parsed: ParsedCommand) throws -> MailGateConfiguration {
    guard let listen = try parsed.listenAddress("policy-listen") else {
        throw ConfigurationError("--policy-listen must be HOST:PORT")
    }
    let database: PostgresConfiguration
    do {
        database = try PostgresConfiguration(
            parsed.value("database-url") ?? "", applicationName: "siwa-mailgate", connectTimeout: .seconds(2))
    } catch {
        throw ConfigurationError("invalid --database-url: \(error.message)")
    }
    var policy = PolicyServer.Configuration(host: listen.host, port: listen.port)
    policy.maximumConnections = try parsed.integer("max-connections", in: 1...100_000) ?? 512
    policy.idleTimeout = try parsed.seconds("idle-timeout", positive: true) ?? .seconds(300)
    var configuration = MailGateConfiguration(policy: policy, database: database)
    configuration.poolSize = try parsed.integer("pool-size", in: 2...64) ?? 4
    configuration.decisionTimeout =
        try parsed.seconds("decision-timeout", positive: true) ?? .milliseconds(500)
    guard configuration.decisionTimeout <= .seconds(1.5) else {
        // Postfix's own policy timeout is 2 s (timeout=2s in main.cf): answer before it gives up.
        throw ConfigurationError("--decision-timeout must be at most 1.5 seconds (Postfix waits 2 s)")
    }
    configuration.cacheTTL = try parsed.seconds("cache-ttl") ?? .seconds(5)
    configuration.cacheCapacity = try parsed.integer("cache-size", in: 1...10_000_000) ?? 100_000
    let onError = parsed.value("on-database-error") ?? "dunno"
    guard let onDatabaseError = PolicyChoices.OnDatabaseError(rawValue: onError) else {
        throw ConfigurationError("--on-database-error must be dunno or defer, not '\(onError)'")
    }
    let unknown = parsed.value("unknown-relay") ?? "dunno"
    guard let unknownRelay = PolicyChoices.UnknownRelay(rawValue: unknown) else {
        throw ConfigurationError("--unknown-relay must be dunno or reject, not '\(unknown)'")
    }
    configuration.choices = PolicyChoices(onDatabaseError: onDatabaseError, unknownRelay: unknownRelay)
    if let metrics = try parsed.listenAddress("metrics-listen") {
        configuration.metrics = HTTPServer.Configuration(
            host: metrics.host, port: metrics.port, threadCount: 2, ioThreadCount: 1)
    }
    if let http = try parsed.listenAddress("http-listen") {
        guard let token = parsed.value("http-token") else {
            throw ConfigurationError("--http-listen needs --http-token-file (or SIWA_MAILGATE_HTTP_TOKEN)")
        }
        guard http.isLoopback || parsed.flag("http-tls-terminated-in-front") else {
            throw ConfigurationError(
                "the HTTP check speaks plain HTTP (its bearer token and addresses in clear): listen on a loopback address, or terminate TLS in front of it and say so with --http-tls-terminated-in-front"
            )
        }
        guard token.utf8.count >= 32, !token.contains(where: \.isWhitespace) else {
            throw ConfigurationError("--http-token: the token must be at least 32 characters, without spaces")
        }
        var server = HTTPServer.Configuration(host: http.host, port: http.port, threadCount: 8)
        server.maxBodyBytes = 4 << 20  // 10,000 addresses of up to 320 bytes, JSON-quoted
        configuration.http = (server, token)
    } else if parsed.value("http-token") != nil {
        throw ConfigurationError("--http-token needs --http-listen")
    }
    return configuration
}
