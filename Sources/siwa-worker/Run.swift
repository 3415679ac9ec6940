import AppleKeys
import AuthAdapters
import Dispatch
import Foundation
import HTTPServer
import Postgres
import QueueConsumer
import Revoker
import ServiceSupport
import SignalDelivery
import SiwaSchema
import Suppressions
import WebhookDelivery
import Worker

let workerCommand = CommandSpec(
    name: "siwa-worker",
    abstract: """
        Applies stored Sign in with Apple notifications exactly once: claims due ones, applies their effects \
        and the siwa.on_event hook in one transaction, retries failures with backoff, prunes old data.
        """,
    options: [
        .databaseURL,
        CommandOption(
            "concurrency", valueName: "N", help: "Lanes (threads, each with its own connection).",
            environmentVariable: "SIWA_WORKER_CONCURRENCY",
            defaultValue: String(Worker.Configuration.defaultConcurrency)),
        CommandOption(
            "batch-size", valueName: "N",
            help: """
                Notifications claimed per transaction, at most 64 (one subtransaction each; PostgreSQL \
                caches 64 per transaction). Lower it for a siwa.on_event hook with its own EXCEPTION blocks.
                """,
            environmentVariable: "SIWA_WORKER_BATCH_SIZE",
            defaultValue: String(Worker.Configuration.defaultBatchSize)),
        CommandOption(
            "max-attempts", valueName: "N", help: "Failed attempts before a notification is dead.",
            environmentVariable: "SIWA_WORKER_MAX_ATTEMPTS",
            defaultValue: String(Worker.Configuration.defaultMaxAttempts)),
        CommandOption(
            "retry-base-delay", valueName: "SECONDS",
            help: "First retry delay (fractional allowed); doubles per attempt, with jitter, at most 1 h.",
            environmentVariable: "SIWA_WORKER_RETRY_BASE_DELAY",
            defaultValue: Worker.Configuration.defaultRetryBaseDelay.secondsText),
        CommandOption(
            "poll-interval", valueName: "SECONDS",
            help: "Look for due work at least this often even without a notification.",
            environmentVariable: "SIWA_WORKER_POLL_INTERVAL",
            defaultValue: Worker.Configuration.defaultPollInterval.secondsText),
        CommandOption(
            "statement-timeout", valueName: "SECONDS",
            help: "Server-side limit per statement (0: none); a batch over it is retried one by one.",
            environmentVariable: "SIWA_WORKER_STATEMENT_TIMEOUT",
            defaultValue: Worker.Configuration.defaultStatementTimeout.secondsText),
        CommandOption(
            "lock-timeout", valueName: "SECONDS",
            help: """
                Longest wait for a row lock (0: none; below --statement-timeout); an event that waits longer \
                is retried with backoff while the rest of its batch applies.
                """,
            environmentVariable: "SIWA_WORKER_LOCK_TIMEOUT",
            defaultValue: Worker.Configuration.defaultLockTimeout.secondsText),
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
    ] + KeySetOptions.all + revokerOptions + webhookOptions + sharedSignalsOptions + suppressionOptions
        + authAdapterOptions,
    flags: [
        CommandFlag(
            "once", help: "Drain everything that is due, run maintenance once, then exit.",
            environmentVariable: "SIWA_WORKER_ONCE"),
        CommandFlag(
            "print-connections",
            help: """
                Print how many PostgreSQL connections these settings open, per user and in total, then exit \
                without connecting.
                """),
    ], offersVersion: true)

/// Parses the configuration, runs until SIGTERM/SIGINT (or, with --once, until the drain is done), and
/// returns the exit status: 0 done, 1 failure, 2 usage error.
func runWorker(arguments: [String], environment: [String: String]) -> Int32 {
    func fail(_ message: String) -> Int32 {
        writeErrorLine("siwa-worker", message)
        return 2
    }
    let parsed: ParsedCommand
    do {
        parsed = try workerCommand.parse(arguments, environment: environment)
    } catch {
        return fail(error.message)
    }
    if parsed.helpRequested {
        writeStandardOutput(workerCommand.helpText())
        return 0
    }
    if parsed.versionRequested {
        writeStandardOutput(SiwaBuild.versionLine("siwa-worker") + "\n")
        return 0
    }
    for warning in workerCommand.warnings(for: parsed) { writeErrorLine("siwa-worker", warning) }
    let once = parsed.flag("once")

    let logger: Logger
    do {
        logger = try parsed.logger(label: "siwa-worker")
    } catch {
        return fail(error.message)
    }
    let metrics = MetricsRegistry()
    metrics.buildInfo(labels: SiwaBuild.metricLabels)
    let configuration: Worker.Configuration
    let metricsAddress: ListenAddress?
    let revoker: Revoker?
    let webhooks: WebhookDispatcher?
    let sharedSignals: SignalDispatcher?
    let suppressions: SuppressionDispatcher?
    let authAdapters: (service: AuthAdapterService, enabled: [AuthAdapterDispatcher.Adapter])?
    let keys: KeyStore
    do {
        metricsAddress = try parsed.listenAddress("metrics-listen")
        if parsed.value("listen-address-file") != nil && metricsAddress == nil {
            throw ConfigurationError(
                "--listen-address-file needs --metrics-listen (the worker's only listener)")
        }
        let database: PostgresConfiguration
        do {
            database = try PostgresConfiguration(
                parsed.value("database-url") ?? "", applicationName: "siwa-worker")
        } catch {
            throw ConfigurationError("invalid --database-url: \(error.message)")
        }
        // 0 turns either timeout off.
        let statementTimeout =
            try parsed.seconds("statement-timeout") ?? Worker.Configuration.defaultStatementTimeout
        let lockTimeout = try parsed.seconds("lock-timeout") ?? Worker.Configuration.defaultLockTimeout
        let verification: StoredTokenVerification
        (keys, verification) = try makeVerification(
            parsed, environment: environment, logger: logger, metrics: metrics)
        configuration = try Worker.Configuration(
            database: database, verification: verification,
            concurrency: try parsed.integer("concurrency", in: 1...256)
                ?? Worker.Configuration.defaultConcurrency,
            batchSize: try parsed.integer("batch-size", in: 1...10_000)
                ?? Worker.Configuration.defaultBatchSize,
            maxAttempts: try parsed.integer("max-attempts", in: 1...1_000_000)
                ?? Worker.Configuration.defaultMaxAttempts,
            retryBaseDelay: try parsed.seconds("retry-base-delay")
                ?? Worker.Configuration.defaultRetryBaseDelay,
            pollInterval: try parsed.seconds("poll-interval") ?? Worker.Configuration.defaultPollInterval,
            statementTimeout: statementTimeout > .zero ? statementTimeout : nil,
            lockTimeout: lockTimeout > .zero ? lockTimeout : nil,
            retainTokens: try parsed.number("retain-tokens-days").map { .seconds($0 * 86_400) },
            retainEvents: try parsed.number("retain-events-days").map { .seconds($0 * 86_400) })
        webhooks = try makeWebhookDispatcher(
            parsed, database: database, environment: environment, logger: logger, metrics: metrics)
        sharedSignals = try makeSignalDispatcher(
            parsed, database: database, environment: environment, logger: logger)
        suppressions = try makeSuppressionDispatcher(
            parsed, database: database, environment: environment, logger: logger, metrics: metrics)
        authAdapters = try makeAuthAdapterService(
            parsed, database: database, environment: environment, logger: logger, metrics: metrics)
        revoker = try makeRevoker(
            parsed, database: database, environment: environment, logger: logger, metrics: metrics)
    } catch let error as CommandLineError {
        return fail(error.message)
    } catch let error as ConfigurationError {
        return fail(error.message)
    } catch {
        return fail("\(error)")
    }

    if parsed.flag("print-connections") {
        writeStandardOutput(
            ConnectionPlan(
                worker: configuration, once: once, webhooks: webhooks, sharedSignals: sharedSignals,
                suppressions: suppressions, authAdapters: authAdapters?.enabled.map(\.name), revoker: revoker
            ).text)
        return 0
    }

    // Signals first, so that one arriving during start-up is not lost.
    let signals = TerminationSignals()
    let worker = Worker(configuration: configuration, logger: logger, metrics: metrics)

    // The services, started in this order and stopped in the reverse order (see ServiceGroup): the
    // metrics server, then the worker's lanes. Each that opens database connections has its row in
    // ConnectionPlan (Connections.swift), the one count of them. The worker ending by itself (--once) or failing stops the
    // group too.
    var services: [Service] = []
    if let metricsAddress {
        let server = metricsServer(metricsAddress, metrics: metrics)
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
            do { try file.removeStale() } catch { return fail(error.message) }
            services.append(.listenAddressFile(file, listeners: { [("metrics", server.address ?? "")] }))
        }
    }
    if once {
        // A --once drain: the lanes until nothing is due, maintenance once (keys fetched on first use).
        services.append(
            .task("siwa-worker", run: { try drainOnce(worker, logger: logger) }, stop: { worker.stop() }))
    } else {
        // Apple's keys: loaded at start and refreshed in the background.
        services.append(.background("key set", start: { keys.start() }, stop: { keys.stop() }))
        // Its heartbeat and the database's health gauges on /metrics.
        do {
            services.append(
                try healthService(
                    parsed, database: configuration.database, revokerOn: revoker != nil, metrics: metrics,
                    logger: logger))
        } catch {
            return fail("\(error)")
        }
        // The per-endpoint webhook gauges on /metrics.
        services.append(
            webhookGaugesService(database: configuration.database, metrics: metrics, logger: logger))
        services.append(
            .task(
                "siwa-worker", run: { worker.run() },
                stop: {
                    logger.info("stopping: finishing the current batches")
                    worker.stop()
                }))
        // The revocation outbox's consumer, its own thread and connection, when configured.
        if let revoker {
            services.append(.task("revoker", run: { revoker.run() }, stop: { revoker.stop() }))
        }
        // Signed outbound webhooks: their own lanes and connections, unless --webhook-concurrency 0.
        if let webhooks {
            services.append(.task("webhooks", run: { webhooks.run() }, stop: { webhooks.stop() }))
        }
        // Shared Signals push lanes, when --ssf-key-file is given.
        if let sharedSignals {
            services.append(
                .task("shared signals", run: { sharedSignals.run() }, stop: { sharedSignals.stop() }))
        }
        // ESP suppression lists: a lane per provider, when --suppressions names any.
        if let suppressions {
            services.append(.task("suppressions", run: { suppressions.run() }, stop: { suppressions.stop() }))
        }
        // Auth adapters: a lane per enabled adapter, with --auth-adapters on.
        if let authAdapters = authAdapters?.service {
            services.append(
                .task("auth adapters", run: { authAdapters.run() }, stop: { authAdapters.stop() }))
        }
    }
    return ServiceGroup(services, signals: signals, logger: logger).run().exitStatus
}

/// The worker's /metrics server (its only listener).
private func metricsServer(_ address: ListenAddress, metrics: MetricsRegistry) -> HTTPServer {
    HTTPServer(
        configuration: HTTPServer.Configuration(host: address.host, port: address.port, threadCount: 2)
    ) { request in
        guard request.path == "/metrics" else { return .text(status: 404, "not found\n") }
        var response = HTTPResponse.text(metrics.render())
        response.headers.replaceOrAdd(name: "Content-Type", value: "text/plain; version=0.0.4; charset=utf-8")
        return response
    }
}

/// A --once drain, logged as one line; a failure is thrown with its code only (no database message).
private func drainOnce(_ worker: Worker, logger: Logger) throws {
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
        logger.error("drain failed", ["error_code": .string(error.code.description)])
        throw WorkerFailure("drain failed (\(error.code))")
    }
}

/// Why a service could not start or failed, for the group's log line (no database message in it).
struct WorkerFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
