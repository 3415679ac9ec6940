public import AppleKeys
import AppleNotifications
import Foundation
public import HTTPServer
public import Postgres
public import ServiceSupport

/// Everything the receiver needs to run, validated at construction.
public struct ReceiverConfiguration: Sendable {
    /// The database holding schema.sql.
    public var database: PostgresConfiguration
    /// Client IDs (bundle IDs, Services IDs) whose notifications are accepted. Never empty.
    public let audiences: Set<String>
    /// Where Apple's keys are fetched.
    public var jwks: JWKSSource
    /// Key-set refresh timing.
    public var keys: KeyStore.Configuration
    /// Database connections (the most requests that can be storing at once).
    public var poolSize: Int
    /// How long a request may wait for a database connection before answering 503.
    public var poolTimeout: Duration
    /// Group commit: committer threads, batch size, commit timeout.
    public var storage: NotificationStore.Configuration
    /// Where to listen (``HTTPServer/Configuration/host`` and ``HTTPServer/Configuration/port``; port 0:
    /// any free port) and the HTTP limits: body size, connections, timeouts, threads.
    public var http: HTTPServer.Configuration
    /// How long shutdown waits for requests in flight.
    public var shutdownGracePeriod: Duration
    /// The oldest a token without `exp` may be after its `iat` (see
    /// ``NotificationVerifier/maxTokenAge``); keep stored rows longer than this.
    public var maxTokenAge: Duration = .seconds(NotificationVerifier.defaultMaxTokenAge)

    /// - Throws: ``ConfigurationError`` when `audiences` is empty.
    public init(
        database: PostgresConfiguration, audiences: Set<String>,
        jwks: JWKSSource, keys: KeyStore.Configuration = KeyStore.Configuration(), poolSize: Int = 16,
        poolTimeout: Duration = .seconds(5), storage: NotificationStore.Configuration = .init(),
        http: HTTPServer.Configuration = HTTPServer.Configuration(),
        shutdownGracePeriod: Duration = .seconds(10)
    ) throws {
        let audiences = Set(audiences.map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty })
        guard !audiences.isEmpty else {
            throw ConfigurationError("at least one audience (client ID) is required")
        }
        guard poolSize > 0 else { throw ConfigurationError("the pool size must be at least 1") }
        var storage = storage
        storage.committers = min(storage.committers, poolSize)  // each committer holds one connection
        self.database = database
        self.audiences = audiences
        self.jwks = jwks
        self.keys = keys
        self.poolSize = poolSize
        self.poolTimeout = poolTimeout
        self.storage = storage
        self.http = http
        self.shutdownGracePeriod = shutdownGracePeriod
    }
}

/// The receiver service: HTTP server, key store, verifier and storage, wired together.
///
/// Verification cannot be switched off: every notification passes ``NotificationVerifier`` with the
/// configured audiences and keys fetched from ``ReceiverConfiguration/jwks``.
public final class NotificationReceiver: Sendable {
    /// The configuration it runs with.
    public let configuration: ReceiverConfiguration
    /// The metrics served at `/metrics`.
    public let metrics: ReceiverMetrics
    private let keys: KeyStore
    private let pool: PostgresPool
    private let store: NotificationStore
    private let server: HTTPServer
    private let logger: Logger

    public init(configuration: ReceiverConfiguration, logger: Logger) throws {
        self.configuration = configuration
        self.logger = logger
        let metrics = ReceiverMetrics()
        self.metrics = metrics
        let source = configuration.jwks
        keys = KeyStore(configuration: configuration.keys, source: { try source.fetch() }) { outcome in
            metrics.record(outcome)
            switch outcome {
            case .success(let count):
                logger.info(
                    "fetched Apple's key set", ["keys": .int(count), "url": .string(source.description)])
            case .failure(let reason, let held):
                logger.warning(
                    held > 0
                        ? "could not fetch Apple's key set; keeping the last good keys"
                        : "could not fetch Apple's key set; no keys held: notifications are answered 503 until a fetch succeeds",
                    ["reason": .string(reason), "url": .string(source.description), "held_keys": .int(held)])
            }
        }
        pool = PostgresPool(
            configuration: configuration.database, maxConnections: configuration.poolSize,
            acquireTimeout: configuration.poolTimeout)
        store = NotificationStore(pool: pool, configuration: configuration.storage) { size, duration in
            metrics.recordBatch(size: size, duration: duration)
        }
        let endpoint = NotificationEndpoint(
            verifier: try NotificationVerifier(
                audiences: configuration.audiences, maxTokenAge: configuration.maxTokenAge.inSeconds),
            keys: keys,
            store: store, logger: logger, metrics: metrics)
        server = HTTPServer(configuration: configuration.http) { request, responder in
            endpoint.handle(request, responder: responder)
        }
    }

    /// Starts listening and loading keys; returns once the port is bound. When it throws (e.g. the port is
    /// taken), nothing it started is left running.
    public func start() throws {
        keys.start()
        do {
            try server.start()
        } catch {
            release()
            throw error
        }
        logger.info(
            "siwa-receiver listening",
            [
                "host": .string(configuration.http.host),
                "port": .int(server.port ?? configuration.http.port),
                "address": .string(server.address ?? ""),
                "audiences": .int(configuration.audiences.count),
            ])
    }

    /// The bound port, once started.
    public var port: Int? { server.port }

    /// The bound address (`HOST:PORT`), once started.
    public var address: String? { server.address }

    /// Stops accepting, lets requests in flight finish (up to the grace period), then releases
    /// everything, in the reverse order of starting: the HTTP server (its daemon and handler threads
    /// joined), the store (queued rows committed, committer threads joined), the key refresher (joined;
    /// a fetch in progress is waited for, bounded by the source's timeout), the connections. When it
    /// returns, no thread the receiver started is running. Returns whether every request in flight
    /// finished within the grace period.
    @discardableResult
    public func shutdown() -> Bool {
        let drained = server.shutdown(gracePeriod: configuration.shutdownGracePeriod)
        release()
        logger.info("siwa-receiver stopped", ["drained": .bool(drained)])
        return drained
    }

    private func release() {
        store.close()
        keys.stop()
        pool.close()
    }
}
