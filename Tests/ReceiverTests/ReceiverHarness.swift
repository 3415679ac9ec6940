import AppleNotifications
import Foundation
import HTTPServer
import Postgres
import Receiver
import ServiceSupport
import Synchronization
import TestSupport

/// A running receiver against its own database and a local stand-in for Apple's key endpoint.
final class ReceiverHarness: @unchecked Sendable {
    let database: PostgresConfiguration
    let jwks: JWKSTestServer
    let receiver: NotificationReceiver
    let logs = LogCapture()
    let url: String

    init(
        cluster: PostgresCluster? = nil, cooldown: Duration = .seconds(30), poolSize: Int = 8,
        maxBodyBytes: Int = 65536, keySet: Data = TestSigning.apple.jwksJSON(), waitForKeys: Bool = true,
        connectionTimeout: Duration? = nil, connectionLimit: Int? = nil, maxTokenAge: Duration? = nil
    ) throws {
        database = try (cluster ?? PostgresCluster.shared).createDatabase(applying: try Self.schema())
        jwks = try JWKSTestServer(body: keySet)
        var http = HTTPServer.Configuration(host: "127.0.0.1", port: 0)
        http.maxBodyBytes = maxBodyBytes
        http.threadCount = 16
        if let connectionTimeout { http.connectionTimeout = connectionTimeout }
        if let connectionLimit { http.connectionLimit = connectionLimit }
        var configuration = try ReceiverConfiguration(
            database: database, audiences: [TestSigning.audience],
            jwks: try JWKSSource(url: jwks.url, timeout: 2),
            keys: KeyStore.Configuration(refreshInterval: .seconds(3600), cooldown: cooldown),
            poolSize: poolSize, poolTimeout: .seconds(2), http: http)
        if let maxTokenAge { configuration.maxTokenAge = maxTokenAge }
        let logs = self.logs
        receiver = try NotificationReceiver(
            configuration: configuration,
            logger: Logger(label: "test", level: .debug, sink: { logs.append($0) }))
        try receiver.start()
        url = "http://127.0.0.1:\(receiver.port!)"
        if waitForKeys {
            // As a load balancer would: send traffic once the receiver is ready.
            guard try waitUntil({ try get("/readyz").status == 200 }) else {
                throw ExecutableError("the receiver did not become ready")
            }
        }
    }

    deinit {
        receiver.shutdown()
        jwks.stop()
    }

    static func schema() throws -> String {
        try String(contentsOf: RepositoryRoot.url.appendingPathComponent("schema.sql"), encoding: .utf8)
    }

    /// Posts a `{"payload": token}` body to the notification endpoint.
    func deliver(_ token: String) throws -> TestHTTPResponse {
        try post(Array(#"{"payload":"\#(token)"}"#.utf8))
    }

    func post(_ body: [UInt8], path: String = NotificationEndpoint.notificationPath) throws
        -> TestHTTPResponse
    {
        try TestHTTPClient.post(url + path, body: body, headers: [("Content-Type", "application/json")])
    }

    func get(_ path: String) throws -> TestHTTPResponse {
        try TestHTTPClient.get(url + path)
    }

    /// Runs a query on a fresh connection to the harness's database.
    func query(_ sql: String, _ parameters: [PostgresData?] = []) throws -> PostgresRows {
        let connection = try PostgresConnection(configuration: database)
        return try connection.query(sql, parameters)
    }

    func rowCount(jti: String) throws -> Int {
        let rows = try query("SELECT count(*) FROM siwa.event_history WHERE jti = $1", [.text(jti)])
        return try rows[0][0, as: Int.self]
    }

    func totalRows() throws -> Int {
        try query("SELECT count(*) FROM siwa.notifications")[0][0, as: Int.self]
    }
}

/// Collects log lines written by the receiver.
final class LogCapture: Sendable {
    private let lines = Mutex<[String]>([])
    func append(_ line: String) { lines.withLock { $0.append(line) } }
    var all: String { lines.withLock { $0.joined() } }
}

extension TestSigning {
    /// A JWKS document publishing the public keys of all `signers`.
    static func keySet(of signers: [NotificationSigner]) -> Data {
        var keys: [Any] = []
        for signer in signers {
            let document = try! JSONSerialization.jsonObject(with: signer.jwksJSON()) as! [String: Any]
            keys += document["keys"] as! [Any]
        }
        return try! JSONSerialization.data(withJSONObject: ["keys": keys])
    }
}
