public import Foundation

/// A `siwa-receiver` or `siwa-worker` process of the tests, connected as a login role of its group role;
/// its standard error goes to a log file. Killed (SIGKILL) on deinit if still running.
public final class ServiceProcess: Sendable {
    /// The child process.
    public let process: Subprocess
    /// The file its standard error (its JSON log) is written to; removed on deinit.
    public let logURL: URL
    /// Where its Prometheus metrics are served.
    public let metricsURL: String
    /// The receiver's notification endpoint (nil for a worker).
    public let notificationURL: String?

    /// Starts `name` with `arguments` and a `--listen-address-file`, and returns once the file names its
    /// listeners; `urls` makes the metrics and notification URLs from them (name → `HOST:PORT`).
    private init(
        _ name: String, _ arguments: [String], databaseURL: String,
        urls: ([String: String]) throws -> (metrics: String, notification: String?)
    ) throws {
        logURL = FileManager.default.temporaryDirectory.appendingPathComponent(
            "\(name)-\(UUID().uuidString).log")
        var environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }
        environment["SIWA_DATABASE_URL"] = databaseURL
        let addresses = ListenAddresses()
        defer { addresses.remove() }
        let process = try Subprocess(
            ExecutableLocator.url(named: name).path, arguments + addresses.arguments,
            environment: environment,
            standardError: logURL.path)
        let logURL = logURL
        let listeners = try addresses.wait(for: process) {
            (try? String(contentsOf: logURL, encoding: .utf8)) ?? ""
        }
        self.process = process
        (metricsURL, notificationURL) = try urls(listeners)
    }

    /// A receiver accepting `audiences`, with Apple's keys from `jwks`, as a member of `siwa_receiver`;
    /// returns once it is ready.
    public static func receiver(_ database: TestDatabase, audiences: [String], jwks: JWKSTestServer) throws
        -> ServiceProcess
    {
        try receiver(
            database, audiences: audiences, jwksURL: jwks.url.absoluteString, answering: "/readyz",
            else: "the receiver did not become ready")
    }

    /// A receiver whose key set is at `jwksURL` (perhaps unreachable), as a member of `siwa_receiver`;
    /// returns once it answers /healthz (it is not ready without keys).
    public static func receiver(_ database: TestDatabase, audiences: [String], jwksURL: String) throws
        -> ServiceProcess
    {
        try receiver(
            database, audiences: audiences, jwksURL: jwksURL, answering: "/healthz",
            else: "the receiver did not answer /healthz")
    }

    /// A receiver started as a member of `siwa_receiver`, returned once `path` answers 200.
    private static func receiver(
        _ database: TestDatabase, audiences: [String], jwksURL: String, answering path: String,
        else failure: String
    ) throws -> ServiceProcess {
        let started = try ServiceProcess(
            "siwa-receiver",
            ["--listen", "127.0.0.1:0", "--jwks-url", jwksURL] + audiences.flatMap { ["--audience", $0] },
            databaseURL: try database.url(asMemberOf: "siwa_receiver")
        ) { listeners in
            let base = "http://" + (try ListenAddresses.address("notifications", in: listeners))
            return (base + "/metrics", base + "/apple/notifications")
        }
        let base = String(started.metricsURL.dropLast("/metrics".count))
        guard waitUntil(timeout: .seconds(20), { (try? TestHTTPClient.get(base + path).status) == 200 })
        else {
            throw ExecutableError("\(failure): \(started.log)")
        }
        return started
    }

    /// A worker (metrics on a port the kernel chose) as a member of `siwa_worker` (or with `databaseURL`); returns
    /// once /metrics answers.
    public static func worker(_ database: TestDatabase, _ extra: [String] = [], databaseURL: String? = nil)
        throws
        -> ServiceProcess
    {
        let started = try ServiceProcess(
            "siwa-worker", ["--metrics-listen", "127.0.0.1:0", "--poll-interval", "0.2"] + extra,
            databaseURL: try databaseURL ?? database.url(asMemberOf: "siwa_worker")
        ) { listeners in
            ("http://" + (try ListenAddresses.address("metrics", in: listeners)) + "/metrics", nil)
        }
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
    public func scrape() throws -> String {
        let response = try TestHTTPClient.get(metricsURL)
        guard response.status == 200 else { throw ExecutableError("/metrics answered \(response.status)") }
        return response.text
    }

    /// The value of the unlabelled series `name` in a scrape (nil when absent; NaN as `.nan`).
    public func metric(_ name: String) throws -> Double? { Self.value(of: name, in: try scrape()) }

    /// The value of the unlabelled series `name` in the scrape `text` (nil when absent; NaN as `.nan`).
    public static func value(of name: String, in text: String) -> Double? {
        for line in text.split(separator: "\n") where line.hasPrefix(name + " ") {
            let value = line.dropFirst(name.count + 1)
            return value == "NaN" ? .nan : Double(value)
        }
        return nil
    }

    /// What the process logged so far.
    public var log: String { (try? String(contentsOf: logURL, encoding: .utf8)) ?? "" }
}
