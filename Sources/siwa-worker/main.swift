import AppleKeys
import Dispatch
import Foundation
import HTTPServer
import Postgres
import ServiceSupport
import SiwaSchema
import Worker

// siwa-worker: applies stored Sign in with Apple notifications. This file only parses the configuration
// and wires the Worker library to signals, logs and metrics. Exit codes: 0 done (stopped by SIGTERM/SIGINT,
// or --once drained), 1 failure, 2 usage error.

let spec = CommandSpec(
    name: "siwa-worker",
    abstract: """
        Applies stored Sign in with Apple notifications exactly once: claims due ones, applies their effects \
        and the siwa.on_event hook in one transaction, retries failures with backoff, prunes old data.
        """,
    options: [
        .databaseURL,
        CommandOption(
            "concurrency", valueName: "N", help: "Lanes (threads, each with its own connection).",
            environmentVariable: "SIWA_WORKER_CONCURRENCY", defaultValue: "1"),
        CommandOption(
            "batch-size", valueName: "N",
            help: """
                Notifications claimed per transaction, at most 64 (one subtransaction each; PostgreSQL \
                caches 64 per transaction). Lower it for a siwa.on_event hook with its own EXCEPTION blocks.
                """,
            environmentVariable: "SIWA_WORKER_BATCH_SIZE", defaultValue: "64"),
        CommandOption(
            "max-attempts", valueName: "N", help: "Failed attempts before a notification is dead.",
            environmentVariable: "SIWA_WORKER_MAX_ATTEMPTS", defaultValue: "20"),
        CommandOption(
            "retry-base-delay", valueName: "SECONDS",
            help: "First retry delay (fractional allowed); doubles per attempt, with jitter, at most 1 h.",
            environmentVariable: "SIWA_WORKER_RETRY_BASE_DELAY", defaultValue: "1"),
        CommandOption(
            "poll-interval", valueName: "SECONDS",
            help: "Look for due work at least this often even without a notification.",
            environmentVariable: "SIWA_WORKER_POLL_INTERVAL", defaultValue: "1"),
        CommandOption(
            "statement-timeout", valueName: "SECONDS",
            help: "Server-side limit per statement (0: none); a batch over it is retried one by one.",
            environmentVariable: "SIWA_WORKER_STATEMENT_TIMEOUT", defaultValue: "30"),
        CommandOption(
            "lock-timeout", valueName: "SECONDS",
            help: """
                Longest wait for a row lock (0: none; below --statement-timeout); an event that waits longer \
                is retried with backoff while the rest of its batch applies.
                """,
            environmentVariable: "SIWA_WORKER_LOCK_TIMEOUT", defaultValue: "5"),
        CommandOption(
            "retain-tokens-days", valueName: "DAYS",
            help: "Clear raw tokens of finished notifications older than this (default: keep).",
            environmentVariable: "SIWA_WORKER_RETAIN_TOKENS_DAYS"),
        CommandOption(
            "retain-events-days", valueName: "DAYS",
            help:
                "Drop the months of history that ended more than this ago; pending and dead rows are kept (default: keep).",
            environmentVariable: "SIWA_WORKER_RETAIN_EVENTS_DAYS"),
        .logLevel,
        CommandOption(
            "metrics-listen", valueName: "HOST:PORT", help: "Serve Prometheus metrics at /metrics here.",
            environmentVariable: "SIWA_WORKER_METRICS_LISTEN"),
        .listenAddressFile(environmentVariable: "SIWA_WORKER_LISTEN_ADDRESS_FILE", names: "metrics"),
    ] + KeySetOptions.all + revokerOptions + webhookOptions,
    flags: [
        CommandFlag(
            "once", help: "Drain everything that is due, run maintenance once, then exit.",
            environmentVariable: "SIWA_WORKER_ONCE")
    ], offersVersion: true)

/// Reports a usage or configuration error on one line of stderr and ends the process (no thread of ours
/// runs yet).
func fail(_ message: String, status: Int32) -> Never {
    writeErrorLine("siwa-worker", message)
    terminateProcess(status: status)
}

let parsed: ParsedCommand
do {
    parsed = try spec.parse(
        Array(CommandLine.arguments.dropFirst()), environment: ProcessInfo.processInfo.environment)
} catch {
    fail(error.message, status: 2)
}
if parsed.helpRequested {
    writeStandardOutput(spec.helpText())
    terminateProcess(status: 0)
}
if parsed.versionRequested {
    writeStandardOutput(SiwaBuild.versionLine("siwa-worker") + "\n")
    terminateProcess(status: 0)
}
for warning in spec.warnings(for: parsed) { writeErrorLine("siwa-worker", warning) }

let logger: Logger
do {
    logger = try parsed.logger(label: "siwa-worker")
} catch {
    fail(error.message, status: 2)
}
let metrics = MetricsRegistry()
metrics.buildInfo(labels: SiwaBuild.metricLabels)
let configuration: Worker.Configuration
let metricsAddress: ListenAddress?
let revoker: Revoker?
let webhooks: WebhookDispatcher?
let keys: KeyStore
do {
    metricsAddress = try parsed.listenAddress("metrics-listen")
    if parsed.value("listen-address-file") != nil && metricsAddress == nil {
        throw ConfigurationError("--listen-address-file needs --metrics-listen (the worker's only listener)")
    }
    let database: PostgresConfiguration
    do {
        database = try PostgresConfiguration(
            parsed.value("database-url") ?? "", applicationName: "siwa-worker")
    } catch {
        throw ConfigurationError("invalid --database-url: \(error.message)")
    }
    let statementTimeout = try parsed.seconds("statement-timeout") ?? .zero
    let lockTimeout = try parsed.seconds("lock-timeout") ?? .seconds(5)
    let verification: StoredTokenVerification
    (keys, verification) = try makeVerification(
        parsed, environment: ProcessInfo.processInfo.environment, logger: logger, metrics: metrics)
    configuration = try Worker.Configuration(
        database: database, verification: verification,
        concurrency: try parsed.integer("concurrency", in: 1...256) ?? 1,
        batchSize: try parsed.integer("batch-size", in: 1...10_000) ?? Worker.Configuration.defaultBatchSize,
        maxAttempts: try parsed.integer("max-attempts", in: 1...1_000_000) ?? 20,
        retryBaseDelay: try parsed.seconds("retry-base-delay") ?? .seconds(1),
        pollInterval: try parsed.seconds("poll-interval") ?? .seconds(1),
        statementTimeout: statementTimeout > .zero ? statementTimeout : nil,
        lockTimeout: lockTimeout > .zero ? lockTimeout : nil,
        retainTokens: try parsed.number("retain-tokens-days").map { .seconds($0 * 86_400) },
        retainEvents: try parsed.number("retain-events-days").map { .seconds($0 * 86_400) })
    webhooks = try makeWebhookDispatcher(
        parsed, database: database, environment: ProcessInfo.processInfo.environment, logger: logger,
        metrics: metrics)
    revoker = try makeRevoker(
        parsed, database: database, environment: ProcessInfo.processInfo.environment, logger: logger,
        metrics: metrics)
} catch let error as CommandLineError {
    fail(error.message, status: 2)
} catch let error as ConfigurationError {
    fail(error.message, status: 2)
} catch {
    fail("\(error)", status: 2)
}

// Signals first, so that one arriving during start-up is not lost.
let signals = TerminationSignals()
let worker = Worker(configuration: configuration, logger: logger, metrics: metrics)

// The services, started in this order and stopped in the reverse order (see ServiceGroup): the metrics
// server, then the worker's lanes. The worker ending by itself (--once) or failing stops the group too.
var services: [Service] = []
if let metricsAddress {
    let server = HTTPServer(
        configuration: HTTPServer.Configuration(
            host: metricsAddress.host, port: metricsAddress.port, threadCount: 2)
    ) {
        request in
        guard request.path == "/metrics" else { return .text(status: 404, "not found\n") }
        var response = HTTPResponse.text(metrics.render())
        response.headers.replaceOrAdd(name: "Content-Type", value: "text/plain; version=0.0.4; charset=utf-8")
        return response
    }
    services.append(
        .background(
            "metrics server",
            start: {
                do {
                    try server.start()
                } catch {
                    throw WorkerFailure(
                        "cannot serve metrics: \((error as? HTTPServerError)?.message ?? "\(error)")")
                }
                logger.info(
                    "serving metrics",
                    [
                        "port": .int(server.port ?? metricsAddress.port),
                        "address": .string(server.address ?? ""),
                    ])
            },
            stop: { server.shutdown(gracePeriod: .seconds(2)) }))
    if let path = parsed.value("listen-address-file") {
        let file = ListenAddressFile(path: path)
        do { try file.removeStale() } catch { fail(error.message, status: 2) }
        services.append(.listenAddressFile(file, listeners: { [("metrics", server.address ?? "")] }))
    }
}
// Apple's keys: loaded at start and refreshed in the background (a --once drain fetches on first use).
if !parsed.flag("once") {
    services.append(.background("key set", start: { keys.start() }, stop: { keys.stop() }))
}
// Its heartbeat and the database's health gauges on /metrics; not for a --once drain.
if !parsed.flag("once") {
    do {
        services.append(
            try healthService(
                parsed, database: configuration.database, revokerOn: revoker != nil, metrics: metrics,
                logger: logger))
    } catch {
        fail("\(error)", status: 2)
    }
    // ---- webhook visibility: the per-endpoint webhook gauges on /metrics ----
    services.append(webhookGaugesService(database: configuration.database, metrics: metrics, logger: logger))
    // ---- end of webhook visibility ----
}
if parsed.flag("once") {
    services.append(
        .task(
            "siwa-worker",
            run: {
                do {
                    let summary = try worker.drainOnce()
                    logger.info(
                        "drained",
                        [
                            "applied": .int(summary.applied), "skipped": .int(summary.skipped),
                            "retried": .int(summary.retried), "dead": .int(summary.dead),
                            "rejected": .int(summary.rejected), "refused": .int(summary.refused),
                            "deferred": .int(summary.deferred),
                        ])
                } catch {
                    let code = (error as? WorkerError)?.code.description ?? "unknown"
                    logger.error("drain failed", ["error_code": .string(code)])
                    throw WorkerFailure("drain failed (\(code))")  // the code only, as logged above
                }
            }, stop: { worker.stop() }))
} else {
    services.append(
        .task(
            "siwa-worker", run: { worker.run() },
            stop: {
                logger.info("stopping: finishing the current batches")
                worker.stop()
            }))
}

// The revocation outbox's consumer, its own thread and connection, when configured.
if let revoker, !parsed.flag("once") {
    services.append(.task("revoker", run: { revoker.run() }, stop: { revoker.stop() }))
}

// Signed outbound webhooks: their own lanes and connections, unless --webhook-concurrency 0.
if let webhooks, !parsed.flag("once") {
    services.append(.task("webhooks", run: { webhooks.run() }, stop: { webhooks.stop() }))
}

/// Why a service could not start or failed, for the group's log line (no database message in it).
struct WorkerFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

let outcome = ServiceGroup(services, signals: signals, logger: logger).run()
// Every thread of ours has ended (the group joined them); `_exit` skips the atexit teardown that races
// with threads we do not own.
terminateProcess(status: outcome.exitStatus)
