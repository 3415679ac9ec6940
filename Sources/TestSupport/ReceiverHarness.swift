import AppleKeys
public import AppleNotifications
public import Foundation
import HTTPServer
public import Postgres
public import Receiver
public import ServiceSupport
import Synchronization

/// A receiver running in this test process against its own fresh database (holding ``TestSchema``),
/// trusting keys served by a local stand-in for Apple's key endpoint or fetched from a given URL.
///
/// Two modes, as in HummingbirdTesting's setups:
/// - ``Mode/live``: a whole `NotificationReceiver` listening on a loopback port; requests go over HTTP.
/// - ``Mode/direct``: the same endpoint, key store and storage without an HTTP server; requests are
///   handed to `NotificationEndpoint.handle(_:)` directly (no port, no framing, no HTTP limits).
public final class ReceiverHarness: Sendable {
    /// Where the receiver fetches its keys.
    public struct Keys: Sendable {
        let body: Data?
        let url: URL?

        /// A local server (``JWKSTestServer``) serving `keySet`; by default ``TestSigning/apple``'s keys.
        public static func served(_ keySet: Data = TestSigning.apple.jwksJSON()) -> Keys {
            Keys(body: keySet, url: nil)
        }

        /// Keys fetched from `url` (e.g. `siwactl fake-apple`).
        public static func url(_ url: URL) -> Keys { Keys(body: nil, url: url) }
    }

    /// How requests reach the receiver.
    public struct Mode: Sendable, Hashable, CustomStringConvertible {
        private let name: String
        public var description: String { name }

        /// Over HTTP to a `NotificationReceiver` listening on 127.0.0.1.
        public static let live = Mode(name: "live")
        /// Straight to the endpoint's handler, in process.
        public static let direct = Mode(name: "direct")
    }

    private struct Direct: Sendable {
        let endpoint: NotificationEndpoint
        let keys: KeyStore
        let store: NotificationStore
        let pool: PostgresPool
    }

    /// The receiver's database.
    public let database: PostgresConfiguration
    /// The local key server, when the keys are ``Keys/served(_:)``.
    public let jwks: JWKSTestServer?
    /// Everything the receiver logged (at debug level and above).
    public let logs = LogCapture()
    /// The audience (client ID) the receiver accepts.
    public let audience: String
    /// The mode requests are sent in.
    public let mode: Mode
    private let receiver: NotificationReceiver?
    private let direct: Direct?

    /// Starts a receiver; unless `waitForKeys` is false, returns once `/readyz` answers 200 (keys
    /// loaded, database reachable), as a load balancer would wait before sending traffic.
    public init(
        mode: Mode = .live, keys: Keys = .served(), audience: String = TestSigning.audience,
        cluster: PostgresCluster? = nil, cooldown: Duration = .seconds(30), poolSize: Int = 8,
        maxBodyBytes: Int = 65536, waitForKeys: Bool = true, connectionTimeout: Duration? = nil,
        connectionLimit: Int? = nil, maxTokenAge: Duration? = nil, commitTimeout: Duration? = nil,
        handlerThreads: Int = 16, shutdownGracePeriod: Duration? = nil
    ) throws {
        self.mode = mode
        self.audience = audience
        database = try (cluster ?? PostgresCluster.shared).createSchemaDatabase()
        let served = try keys.body.map { try JWKSTestServer(body: $0) }
        jwks = served
        guard let keysURL = served?.url ?? keys.url else {
            throw ExecutableError("no key set: give Keys.served(_:) or Keys.url(_:)")
        }
        var http = HTTPServer.Configuration(host: "127.0.0.1", port: 0)
        http.maxBodyBytes = maxBodyBytes
        http.threadCount = handlerThreads
        if let connectionTimeout { http.connectionTimeout = connectionTimeout }
        if let connectionLimit { http.connectionLimit = connectionLimit }
        var configuration = try ReceiverConfiguration(
            database: database, audiences: [audience],
            jwks: try JWKSSource(url: keysURL, timeout: 2),
            keys: KeyStore.Configuration(refreshInterval: .seconds(3600), cooldown: cooldown),
            poolSize: poolSize, poolTimeout: .seconds(2), http: http)
        if let maxTokenAge { configuration.maxTokenAge = maxTokenAge }
        if let commitTimeout { configuration.storage.commitTimeout = commitTimeout }
        if let shutdownGracePeriod { configuration.shutdownGracePeriod = shutdownGracePeriod }
        let logger = logs.logger(level: .debug)
        if mode == .live {
            let receiver = try NotificationReceiver(configuration: configuration, logger: logger)
            try receiver.start()
            self.receiver = receiver
            direct = nil
        } else {
            // NotificationReceiver's wiring, minus the HTTP server.
            let source = configuration.jwks
            let keyStore = KeyStore(configuration: configuration.keys, source: { try source.fetch() })
            let pool = PostgresPool(
                configuration: database, maxConnections: poolSize, acquireTimeout: configuration.poolTimeout)
            let store = NotificationStore(pool: pool, configuration: configuration.storage)
            let endpoint = NotificationEndpoint(
                verifier: try NotificationVerifier(
                    audiences: configuration.audiences, maxTokenAge: configuration.maxTokenAge.inSeconds),
                keys: keyStore, store: store, logger: logger, metrics: ReceiverMetrics())
            keyStore.start()
            receiver = nil
            direct = Direct(endpoint: endpoint, keys: keyStore, store: store, pool: pool)
        }
        if waitForKeys {
            guard try waitUntil({ try get("/readyz").status == 200 }) else {
                throw ExecutableError("the receiver did not become ready")
            }
        }
    }

    deinit {
        receiver?.shutdown()
        if let direct {
            direct.store.close()
            direct.keys.stop()
            direct.pool.close()
        }
        jwks?.stop()
    }

    /// The live receiver's metrics (`nil` in ``Mode/direct``).
    public var metrics: ReceiverMetrics? { receiver?.metrics }

    /// Shuts the live receiver down (see ``NotificationReceiver/shutdown()``); returns whether every
    /// request in flight finished within the grace period. Later calls return at once.
    @discardableResult
    public func shutdown() -> Bool { receiver?.shutdown() ?? true }

    /// The port the live receiver listens on (0 in ``Mode/direct``).
    public var port: Int { receiver?.port ?? 0 }

    /// `http://127.0.0.1:PORT`, the live receiver's base URL.
    public var url: String { "http://127.0.0.1:\(port)" }

    /// The URL Apple would post to.
    public var notificationURL: String { url + NotificationEndpoint.notificationPath }

    /// Posts a `{"payload": token}` body to the notification endpoint.
    public func deliver(_ token: String) throws -> TestHTTPResponse {
        try post(Array(#"{"payload":"\#(token)"}"#.utf8))
    }

    /// Posts `body` as `application/json` to `path`.
    public func post(_ body: [UInt8], path: String = NotificationEndpoint.notificationPath) throws
        -> TestHTTPResponse
    {
        let headers = [("Content-Type", "application/json")]
        guard let direct else { return try TestHTTPClient.post(url + path, body: body, headers: headers) }
        let request = HTTPRequest(
            method: "POST", path: path, headers: HTTPHeaders(headers), body: body, remoteAddress: "127.0.0.1")
        return Self.response(direct.endpoint.handle(request))
    }

    /// Sends a GET request for `path`.
    public func get(_ path: String) throws -> TestHTTPResponse {
        guard let direct else { return try TestHTTPClient.get(url + path) }
        return Self.response(
            direct.endpoint.handle(HTTPRequest(method: "GET", path: path, remoteAddress: "127.0.0.1")))
    }

    /// A fresh raw connection to the live receiver, for hostile bytes.
    public func rawConnection(timeout: Duration = .seconds(10)) throws -> RawHTTPConnection {
        try RawHTTPConnection(host: "127.0.0.1", port: port, timeout: timeout)
    }

    /// Runs a query on a fresh connection to the harness's database.
    public func query(_ sql: String, _ parameters: [PostgresData?] = []) throws -> PostgresRows {
        let connection = try PostgresConnection(configuration: database)
        defer { connection.close() }
        return try connection.query(sql, parameters)
    }

    /// How many rows `siwa.event_history` holds for `jti`.
    public func rowCount(jti: String) throws -> Int {
        let rows = try query("SELECT count(*) FROM siwa.event_history WHERE jti = $1", [.text(jti)])
        return try rows[0][0, as: Int.self]
    }

    /// How many notifications are stored.
    public func totalRows() throws -> Int {
        try query("SELECT count(*) FROM siwa.notifications")[0][0, as: Int.self]
    }

    private static func response(_ response: HTTPResponse) -> TestHTTPResponse {
        TestHTTPResponse(status: response.status, headers: response.headers, body: response.body)
    }
}

/// Collects log lines written by a component under test.
public final class LogCapture: Sendable {
    private let lines = Mutex<[String]>([])

    /// An empty capture.
    public init() {}

    /// Adds one line.
    public func append(_ line: String) { lines.withLock { $0.append(line) } }

    /// A logger at `level` that appends here.
    public func logger(level: Logger.Level = .info) -> Logger {
        Logger(label: "test", level: level, sink: { [self] line in append(line) })
    }

    /// Everything captured so far, in order.
    public var all: String { lines.withLock { $0.joined() } }
}
