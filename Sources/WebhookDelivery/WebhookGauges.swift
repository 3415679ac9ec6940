import Foundation
public import Postgres
public import ServiceSupport
import Synchronization
public import WebhookAdministration

/// The webhook endpoints' gauges on siwa-worker's `/metrics`, read from the database
/// (`siwa.webhook_endpoint_gauges()`).
///
/// A thread of its own reads them every ``Configuration/refreshInterval`` on a connection of its own
/// and publishes the reading; a scrape only copies the last published reading, so it never waits for
/// the database, a lock on the webhook tables, or the reading in progress. The reading's statements
/// give up after ``Configuration/lockTimeout`` waiting for a lock and ``Configuration/statementTimeout``
/// in all: then `siwa_webhook_gauges_up` is 0, the totals are NaN and no per-endpoint series is shown
/// (never a stale value) until a reading succeeds again.
///
/// Per-endpoint series are labelled `endpoint` (its id) and `host` (the URL's host and port only: the
/// path and query may hold a token). At most ``Configuration/maxLabelledEndpoints`` endpoints get them,
/// those in trouble (disabled, failing, with dead deliveries) first, then by id; the totals cover every
/// endpoint and `siwa_webhook_endpoints_without_series` says how many were left out.
public final class WebhookGauges: Sendable {
    /// The settings, built once by the executable.
    public struct Configuration: Sendable {
        /// The database holding schema.sql (the worker's own URL and role).
        public var database: PostgresConfiguration
        /// How often the gauges are read.
        public var refreshInterval: Duration = .seconds(5)
        /// The most endpoints given labelled series (the label cardinality's bound).
        public var maxLabelledEndpoints: Int = 50
        /// How long a reading waits for a lock before it gives up (`lock_timeout`).
        public var lockTimeout: Duration = .seconds(2)
        /// How long a reading may take in all (`statement_timeout`).
        public var statementTimeout: Duration = .seconds(10)

        public init(database: PostgresConfiguration) {
            self.database = database
        }
    }

    /// One endpoint's row of `siwa.webhook_endpoint_gauges()`.
    public typealias Endpoint = WebhookAdministration.EndpointStats

    /// The configuration it runs with.
    public let configuration: Configuration
    private let logger: Logger
    /// The last reading (`nil`: none yet, or the last one failed).
    private let published = Mutex<[Endpoint]?>(nil)
    private let running = Mutex<(thread: JoinableThread, stop: StopSignal)?>(nil)

    public init(configuration: Configuration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
    }

    /// The last published reading; never waits for the database.
    public func snapshot() -> [Endpoint]? { published.withLock { $0 } }

    // MARK: Metrics

    /// Registers the webhook gauges on `registry`; a scrape renders the last published reading.
    public func register(on registry: MetricsRegistry) {
        registry.computedGauge(
            "siwa_webhook_gauges_up",
            help: "1 when the database answered the last reading of the siwa_webhook_* gauges, else 0 "
                + "(totals NaN, no per-endpoint series)."
        ) { [self] in snapshot() == nil ? 0 : 1 }
        func total(_ name: String, _ help: String, _ value: @escaping @Sendable ([Endpoint]) -> Int) {
            registry.computedGauge(name, help: help) { [self] in snapshot().map { Double(value($0)) } ?? .nan
            }
        }
        total("siwa_webhook_endpoints", "Webhook endpoints, enabled or not.") { $0.count }
        total(
            "siwa_webhook_endpoints_without_series",
            "Webhook endpoints left out of the per-endpoint series (beyond the worker's bound; healthy ones first)."
        ) { [limit = configuration.maxLabelledEndpoints] in max($0.count - limit, 0) }
        total("siwa_webhook_pending_deliveries", "Webhook deliveries pending, every endpoint.") {
            $0.reduce(0) { $0 + $1.pending }
        }
        total(
            "siwa_webhook_dead_deliveries",
            "Webhook deliveries dead (the retry schedule ran out), every endpoint; siwactl webhooks replay requeues them."
        ) { $0.reduce(0) { $0 + $1.dead } }
        func perEndpoint(_ name: String, _ help: String, _ value: @escaping @Sendable (Endpoint) -> Double) {
            registry.computedGaugeSet(name, help: help) { [self] in
                (snapshot() ?? []).prefix(configuration.maxLabelledEndpoints).map {
                    (labels: [("endpoint", String($0.id)), ("host", $0.host)], value: value($0))
                }
            }
        }
        perEndpoint("siwa_webhook_endpoint_pending", "Deliveries pending to this endpoint.") {
            Double($0.pending)
        }
        perEndpoint("siwa_webhook_endpoint_dead", "Deliveries to this endpoint that are dead.") {
            Double($0.dead)
        }
        perEndpoint(
            "siwa_webhook_endpoint_oldest_pending_age_seconds",
            "Seconds since this endpoint's oldest pending delivery was created; 0 when none is pending."
        ) { $0.oldestPendingSeconds }
        perEndpoint(
            "siwa_webhook_endpoint_consecutive_failures",
            "Attempts to this endpoint failed since its last delivered one."
        ) { Double($0.consecutiveFailures) }
        perEndpoint(
            "siwa_webhook_endpoint_failing_since_timestamp_seconds",
            "Unix time of the first failed attempt of this endpoint's current run of failures; 0 when its last attempt was delivered."
        ) { $0.failingSince?.timeIntervalSince1970 ?? 0 }
        perEndpoint(
            "siwa_webhook_endpoint_backoff_until_timestamp_seconds",
            "Unix time until which this endpoint is backed off as a whole after consecutive failures (nothing is attempted before it); 0 when it is not."
        ) { $0.backoffUntil?.timeIntervalSince1970 ?? 0 }
        perEndpoint(
            "siwa_webhook_endpoint_disabled",
            "1 when this endpoint is disabled (siwactl webhooks disable), else 0."
        ) { $0.enabled ? 0 : 1 }
    }

    // MARK: Reading

    /// Starts the reading thread: a first reading at once, then one every interval.
    public func start() {
        let stop = StopSignal()
        let thread = JoinableThread(name: "siwa-wh-gauges") { [self] in
            var connection: PostgresConnection?
            var failed = false
            repeat {
                do {
                    let endpoints = try read(&connection)
                    published.withLock { $0 = endpoints }
                    if failed { logger.info("webhook gauges read again") }
                    failed = false
                } catch {
                    connection?.close()
                    connection = nil
                    published.withLock { $0 = nil }
                    if !failed {
                        logger.warning(
                            "cannot read the webhook gauges",
                            ["error": .string((error as? PostgresError)?.description ?? "\(error)")])
                    }
                    failed = true
                }
            } while stop.sleep(configuration.refreshInterval)
            connection?.close()
        }
        running.withLock { $0 = (thread, stop) }
    }

    /// Stops the reading thread (woken at once, and joined after the reading in progress).
    public func stop() {
        let started = running.withLock { running in
            defer { running = nil }
            return running
        }
        started?.stop.stop()
        started?.thread.join()
    }

    private func read(_ connection: inout PostgresConnection?) throws -> [Endpoint] {
        if connection == nil || connection?.isHealthy != true {
            connection?.close()
            connection = nil
            var database = configuration.database
            database.applicationName = (database.applicationName ?? "siwa") + "-webhook-gauges"
            let opened = try PostgresConnection(configuration: database)
            do {
                try opened.query(
                    WebhookQueries.gaugeSessionTimeouts,
                    [
                        .text("\(Int(configuration.statementTimeout.inSeconds * 1000))ms"),
                        .text("\(Int(configuration.lockTimeout.inSeconds * 1000))ms"),
                    ])
            } catch {
                opened.close()
                throw error
            }
            connection = opened
        }
        return try connection!.rows(Endpoint.self)
    }
}
