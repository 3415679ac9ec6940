import Foundation
import Postgres
import TestSupport

/// A `siwa-receiver` or `siwa-worker` process of the tests, connected as a login role of its group role;
/// its standard error goes to a log file. Killed (SIGKILL) on deinit if still running.
final class ServiceProcess: @unchecked Sendable {
    let process: Subprocess
    let logURL: URL
    /// Where its Prometheus metrics are served.
    let metricsURL: String
    /// The receiver's notification endpoint (nil for a worker).
    let notificationURL: String?

    private init(
        _ name: String, _ arguments: [String], databaseURL: String, metricsURL: String,
        notificationURL: String?
    ) throws {
        logURL = FileManager.default.temporaryDirectory.appendingPathComponent(
            "\(name)-\(UUID().uuidString).log")
        var environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }
        environment["SIWA_DATABASE_URL"] = databaseURL
        process = try Subprocess(
            ExecutableLocator.url(named: name).path, arguments, environment: environment,
            standardError: logURL.path)
        self.metricsURL = metricsURL
        self.notificationURL = notificationURL
    }

    /// A receiver accepting `audiences`, with Apple's keys from `jwks`, as a member of `siwa_receiver`;
    /// returns once it is ready.
    static func receiver(_ database: TestDatabase, audiences: [String], jwks: JWKSTestServer) throws
        -> ServiceProcess
    {
        let port = try ExecutableLocator.freePort()
        let base = "http://127.0.0.1:\(port)"
        let started = try ServiceProcess(
            "siwa-receiver",
            ["--listen", "127.0.0.1:\(port)", "--jwks-url", jwks.url.absoluteString]
                + audiences.flatMap { ["--audience", $0] },
            databaseURL: try database.url(asMemberOf: "siwa_receiver"), metricsURL: base + "/metrics",
            notificationURL: base + "/apple/notifications")
        guard waitUntil(timeout: .seconds(20), { (try? TestHTTPClient.get(base + "/readyz").status) == 200 })
        else {
            throw ExecutableError("the receiver did not become ready: \(started.log)")
        }
        return started
    }

    /// A receiver whose key set is at `jwksURL` (perhaps unreachable), as a member of `siwa_receiver`;
    /// returns once it answers /healthz (it is not ready without keys).
    static func receiver(_ database: TestDatabase, audiences: [String], jwksURL: String) throws
        -> ServiceProcess
    {
        let port = try ExecutableLocator.freePort()
        let base = "http://127.0.0.1:\(port)"
        let started = try ServiceProcess(
            "siwa-receiver",
            ["--listen", "127.0.0.1:\(port)", "--jwks-url", jwksURL]
                + audiences.flatMap { ["--audience", $0] },
            databaseURL: try database.url(asMemberOf: "siwa_receiver"), metricsURL: base + "/metrics",
            notificationURL: base + "/apple/notifications")
        guard waitUntil(timeout: .seconds(20), { (try? TestHTTPClient.get(base + "/healthz").status) == 200 })
        else {
            throw ExecutableError("the receiver did not answer /healthz: \(started.log)")
        }
        return started
    }

    /// A worker (metrics on a free port) as a member of `siwa_worker` (or with `databaseURL`); returns
    /// once /metrics answers.
    static func worker(_ database: TestDatabase, _ extra: [String] = [], databaseURL: String? = nil) throws
        -> ServiceProcess
    {
        let port = try ExecutableLocator.freePort()
        let started = try ServiceProcess(
            "siwa-worker", ["--metrics-listen", "127.0.0.1:\(port)", "--poll-interval", "0.2"] + extra,
            databaseURL: try databaseURL ?? database.url(asMemberOf: "siwa_worker"),
            metricsURL: "http://127.0.0.1:\(port)/metrics", notificationURL: nil)
        guard waitUntil(timeout: .seconds(20), { (try? started.scrape()) != nil }) else {
            throw ExecutableError("the worker's metrics did not answer: \(started.log)")
        }
        return started
    }

    deinit {
        process.send(SIGKILL)
        process.wait()
        try? FileManager.default.removeItem(at: logURL)
    }

    /// Its /metrics as text.
    func scrape() throws -> String {
        let response = try TestHTTPClient.get(metricsURL)
        guard response.status == 200 else { throw ExecutableError("/metrics answered \(response.status)") }
        return response.text
    }

    /// The value of the unlabelled series `name` in a scrape (nil when absent; NaN as `.nan`).
    func metric(_ name: String) throws -> Double? { Self.value(of: name, in: try scrape()) }

    static func value(of name: String, in text: String) -> Double? {
        for line in text.split(separator: "\n") where line.hasPrefix(name + " ") {
            let value = line.dropFirst(name.count + 1)
            return value == "NaN" ? .nan : Double(value)
        }
        return nil
    }

    /// What the process logged so far.
    var log: String { (try? String(contentsOf: logURL, encoding: .utf8)) ?? "" }
}

extension TestDatabase {
    /// A URL of this database for a login role that is a member of `group` (created once per cluster).
    func url(asMemberOf group: String) throws -> String {
        let login = "siwa_test_ctl_\(group)_login"
        try query(
            """
            DO $$ BEGIN
                IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '\(login)') THEN
                    CREATE ROLE \(login) LOGIN IN ROLE \(group);
                END IF;
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;
            END $$
            """)
        let cluster = try PostgresCluster.shared
        return
            "postgresql://\(login)@/\(configuration.database ?? "")?host=\(cluster.socketDirectory)&port=\(cluster.port)"
    }
}
