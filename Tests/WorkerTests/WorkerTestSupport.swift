import Foundation
import Postgres
import ServiceSupport
import TestSupport
import Worker

/// The repository's schema.sql, read once.
let schemaSQL: String = {
    let url = RepositoryRoot.url.appendingPathComponent("schema.sql")
    return (try? String(contentsOf: url, encoding: .utf8)) ?? "schema.sql not found"
}()

/// A fresh database with schema.sql applied, and a connection to it for the test's own SQL.
final class TestDatabase: @unchecked Sendable {
    let configuration: PostgresConfiguration
    let connection: PostgresConnection
    let cluster: PostgresCluster

    init(cluster: PostgresCluster? = nil) throws {
        let cluster = try cluster ?? PostgresCluster.shared
        self.cluster = cluster
        configuration = try cluster.createDatabase(applying: schemaSQL)
        connection = try PostgresConnection(configuration: configuration)
    }

    deinit { connection.close() }

    /// The database's URL, for `siwa-worker --database-url`.
    var url: String { cluster.url(database: configuration.database ?? "") }

    /// Inserts one pending notification; `eventTime` is SQL (e.g. `now() - interval '1 hour'`).
    func insert(
        jti: String, type: String, sub: String, eventTime: String = "now()", email: String? = nil
    ) throws {
        try connection.execute(
            """
            INSERT INTO siwa.notifications
                (jti, event_type, sub, audience, email, is_private_email, event_time, issued_at, raw_token)
            VALUES ($1, $2, $3, 'com.example.app', $4, $5, \(eventTime), now(), 'header.payload.signature')
            """,
            [.text(jti), .text(type), .text(sub), email.map { .text($0) }, email.map { _ in .bool(true) }])
    }

    /// The first column of the first row, decoded as `T`.
    func value<T: PostgresDecodable>(
        _ sql: String, _ parameters: [PostgresData?] = [], as type: T.Type = T.self
    )
        throws -> T
    {
        guard let row = try connection.query(sql, parameters).first else {
            throw PostgresError(code: .decoding, message: "no row for: \(sql)")
        }
        return try row[0, as: T.self]
    }

    /// The state of the notification with `jti`.
    func state(_ jti: String) throws -> String {
        try value("SELECT state FROM siwa.notifications WHERE jti = $1", [.text(jti)])
    }

    /// A worker on this database with test-friendly timings.
    func worker(
        maxAttempts: Int = 3, retryBaseDelay: Duration = .milliseconds(5),
        statementTimeout: Duration? = .seconds(30),
        retainTokens: Duration? = nil, retainEvents: Duration? = nil, logger: Logger = quietLogger
    ) throws -> Worker {
        Worker(
            configuration: try Worker.Configuration(
                database: configuration, concurrency: 2, batchSize: 10, maxAttempts: maxAttempts,
                retryBaseDelay: retryBaseDelay, pollInterval: .milliseconds(200),
                statementTimeout: statementTimeout, retainTokens: retainTokens, retainEvents: retainEvents),
            logger: logger)
    }

    /// Runs `drainOnce()` until nothing is pending (retries included) or `timeout` passes.
    @discardableResult
    func drainUntilSettled(_ worker: Worker, timeout: Duration = .seconds(30)) throws -> Bool {
        try waitUntil(timeout: timeout) {
            _ = try worker.drainOnce()
            return try value("SELECT count(*) FROM siwa.notifications WHERE state = 'pending'", as: Int.self)
                == 0
        }
    }
}

/// A logger that discards its output.
let quietLogger = Logger(label: "test", level: .error, sink: { _ in })

/// A running `siwa-worker` process; killed (SIGKILL) on deinit if still running.
final class WorkerProcess: @unchecked Sendable {
    let process: Subprocess
    let logURL: URL

    init(_ arguments: [String], databaseURL: String) throws {
        logURL = FileManager.default.temporaryDirectory.appendingPathComponent(
            "siwa-worker-\(UUID().uuidString).log")
        var environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }
        environment["SIWA_DATABASE_URL"] = databaseURL
        process = try Subprocess(
            ExecutableLocator.url(named: "siwa-worker").path, arguments, environment: environment,
            standardError: logURL.path)
    }

    deinit {
        process.send(SIGKILL)
        process.wait()
        try? FileManager.default.removeItem(at: logURL)
    }

    /// Sends `signal` to the process.
    func send(_ signal: Int32) { process.send(signal) }

    /// Waits up to `timeout` for the process to exit; returns its exit status (128 + signal when killed by
    /// one), or nil if it is still running.
    func waitForExit(timeout: Duration) -> Int32? {
        switch process.wait(timeout: timeout) {
        case .exited(let status): status
        case .signaled(let signal): 128 + signal
        case nil: nil
        }
    }

    /// What the process logged so far.
    var log: String { (try? String(contentsOf: logURL, encoding: .utf8)) ?? "" }
}
