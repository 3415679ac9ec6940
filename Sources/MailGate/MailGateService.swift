import Foundation
public import HTTPServer
public import Postgres
public import ServiceSupport
import Synchronization

/// The gate's settings, built once by the executable (or a test).
public struct MailGateConfiguration: Sendable {
    /// The policy delegation listener.
    public var policy: PolicyServer.Configuration
    /// The HTTP check's listener and its bearer token; nil: off.
    public var http: (configuration: HTTPServer.Configuration, bearerToken: String)?
    /// The `/metrics` and `/healthz` listener; nil: off.
    public var metrics: HTTPServer.Configuration?
    /// The database, as a login that is a member of `siwa_mail` only.
    public var database: PostgresConfiguration
    /// Database connections (the lookup threads take all but one; the bulk HTTP calls share them).
    public var poolSize: Int
    /// The longest a policy answer waits for the database before it answers without it.
    public var decisionTimeout: Duration
    /// How long a verdict may be served from the cache (zero: no cache), and how many are kept.
    public var cacheTTL: Duration
    public var cacheCapacity: Int
    /// What unanswered lookups and relay-looking unknown addresses answer.
    public var choices: PolicyChoices

    public init(
        policy: PolicyServer.Configuration, database: PostgresConfiguration, poolSize: Int = 4,
        decisionTimeout: Duration = .milliseconds(500), cacheTTL: Duration = .seconds(5),
        cacheCapacity: Int = 100_000, choices: PolicyChoices = PolicyChoices()
    ) {
        self.policy = policy
        self.database = database
        self.poolSize = poolSize
        self.decisionTimeout = decisionTimeout
        self.cacheTTL = cacheTTL
        self.cacheCapacity = cacheCapacity
        self.choices = choices
    }
}

/// The running gate: the policy service, the HTTP check and `/metrics` over one resolver and one pool.
public final class MailGateService: Sendable {
    public let configuration: MailGateConfiguration
    public let metrics: MailGateMetrics
    public let resolver: VerdictResolver
    private let pool: PostgresPool
    private let policy: PolicyServer
    private let check: HTTPServer?
    private let metricsServer: HTTPServer?
    private let logger: Logger
    private let started = Mutex<[String]>([])

    public init(
        configuration: MailGateConfiguration, logger: Logger, metrics: MailGateMetrics = MailGateMetrics()
    ) {
        self.configuration = configuration
        self.logger = logger
        self.metrics = metrics
        let pool = PostgresPool(
            configuration: configuration.database, maxConnections: max(1, configuration.poolSize),
            acquireTimeout: .seconds(2))
        self.pool = pool
        let source = PostgresVerdicts(pool: pool)
        resolver = VerdictResolver(
            configuration: .init(lookupThreads: max(1, configuration.poolSize - 1)),
            cache: VerdictCache(ttl: configuration.cacheTTL, capacity: configuration.cacheCapacity),
            metrics: metrics, logger: logger
        ) { addresses in try source.verdicts(addresses) }
        let resolver = resolver
        let timeout = configuration.decisionTimeout
        let choices = configuration.choices
        policy = PolicyServer(configuration: configuration.policy, metrics: metrics, logger: logger) {
            request in
            guard request.protocolState == "RCPT", !request.recipient.isEmpty else { return "DUNNO" }
            let lookup = resolver.lookup(request.recipient, deadline: .now + timeout)
            metrics.decided(lookup, source: "policy")
            return choices.action(for: lookup)
        }
        if let (http, token) = configuration.http {
            let api = DecisionAPI(
                bearerToken: token, resolver: resolver, bulk: { try source.verdicts($0) }, metrics: metrics,
                logger: logger)
            check = HTTPServer(configuration: http) { api.handle($0) }
        } else {
            check = nil
        }
        if let http = configuration.metrics {
            let registry = metrics.registry
            metricsServer = HTTPServer(configuration: http) { request in
                switch (request.method, request.path) {
                case ("GET", "/metrics"):
                    var response = HTTPResponse.text(registry.render())
                    response.headers.replaceOrAdd(name: "Content-Type", value: "text/plain; version=0.0.4")
                    return response
                case ("GET", "/healthz"): return .json(["status": "ok"])
                default: return .error(status: 404, "not_found")
                }
            }
        } else {
            metricsServer = nil
        }
    }

    /// The bound addresses by listener name (`policy`, `http`, `metrics`), once started.
    public var addresses: [(name: String, address: String)] {
        var all: [(String, String)] = []
        if let address = policy.address { all.append(("policy", address)) }
        if let address = check?.address { all.append(("http", address)) }
        if let address = metricsServer?.address { all.append(("metrics", address)) }
        return all
    }

    /// Starts the lookups and every listener; on failure stops what it started and throws.
    public func start() throws {
        resolver.start()
        do {
            try metricsServer?.start()
            try policy.start()
            try check?.start()
        } catch {
            shutdown()
            throw error
        }
    }

    /// Stops accepting, answers the requests in flight, then ends the lookups and closes the pool.
    public func shutdown() {
        policy.shutdown()
        _ = check?.shutdown(gracePeriod: .seconds(5))
        resolver.shutdown()
        _ = metricsServer?.shutdown(gracePeriod: .seconds(1))
        pool.close()
    }
}
