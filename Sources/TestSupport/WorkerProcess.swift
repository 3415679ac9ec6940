import AppleNotifications
public import Foundation

/// A running `siwa-worker` process; killed (SIGKILL) on deinit if still running.
public final class WorkerProcess: Sendable {
    /// The child process.
    public let process: Subprocess
    /// The file its standard error (its JSON log) is written to; removed on deinit.
    public let logURL: URL
    /// Apple's key set as the worker sees it (``TestSigning/apple``'s key, which signs the seeds'
    /// tokens), unless `SIWA_JWKS_URL` is given.
    private let keys: StaticHTTPServer?

    /// Starts the built `siwa-worker` with `arguments` on `databaseURL` (as `SIWA_DATABASE_URL`), with this
    /// process's environment minus every `SIWA_*` setting, plus `extra`. Without `SIWA_JWKS_URL` in
    /// `extra` (or `--jwks-url` in `arguments`), the worker verifies stored tokens against a local key
    /// set publishing ``TestSigning/apple``'s key.
    public init(_ arguments: [String], databaseURL: String, environment extra: [String: String] = [:]) throws
    {
        logURL = FileManager.default.temporaryDirectory.appendingPathComponent(
            "siwa-worker-\(UUID().uuidString).log")
        var environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }
        environment["SIWA_DATABASE_URL"] = databaseURL
        if extra["SIWA_JWKS_URL"] == nil && !arguments.contains("--jwks-url") {
            let keys = try StaticHTTPServer(body: TestSigning.apple.jwksJSON())
            environment["SIWA_JWKS_URL"] = keys.url.absoluteString
            self.keys = keys
        } else {
            keys = nil
        }
        environment.merge(extra) { $1 }
        process = try Subprocess(
            ExecutableLocator.url(named: "siwa-worker").path, arguments, environment: environment,
            standardError: logURL.path)
    }

    deinit {
        process.send(SIGKILL)
        process.wait()
        keys?.stop()
        try? FileManager.default.removeItem(at: logURL)
    }

    /// Sends `signal` to the process.
    public func send(_ signal: Int32) { process.send(signal) }

    /// Waits up to `timeout` for the process to exit; returns its exit status (128 + signal when killed by
    /// one), or nil if it is still running.
    public func waitForExit(timeout: Duration) -> Int32? {
        switch process.wait(timeout: timeout) {
        case .exited(let status): status
        case .signaled(let signal): 128 + signal
        case nil: nil
        }
    }

    /// What the process logged so far.
    public var log: String { (try? String(contentsOf: logURL, encoding: .utf8)) ?? "" }
}
