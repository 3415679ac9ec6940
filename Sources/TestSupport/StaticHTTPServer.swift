public import Foundation
import HTTPServer
import Synchronization

/// Serves a mutable body at one path, e.g. a JWKS at `/auth/keys`, and can be told to misbehave.
///
/// Built on ``HTTPServer``, listening on 127.0.0.1 with an ephemeral port. Every request it
/// receives is counted, on any path; other paths get 404.
public final class StaticHTTPServer: Sendable {
    private struct Behavior {
        var body: Data
        var contentType: String
        var failureStatus: Int?
        var garbage = false
        var delay: Duration = .zero
    }

    private final class Shared: Sendable {
        let behavior: Mutex<Behavior>
        let served = Atomic<Int>(0)

        init(_ behavior: Behavior) { self.behavior = Mutex(behavior) }
    }

    /// The path that is served, e.g. `/auth/keys`.
    public let path: String
    /// The bound port.
    public let port: Int
    private let shared: Shared
    private let server: HTTPServer

    /// Starts serving `body` at `path` on an ephemeral port.
    public init(
        path: String = "/auth/keys", body: Data = Data(#"{"keys":[]}"#.utf8),
        contentType: String = "application/json"
    ) throws {
        let shared = Shared(Behavior(body: body, contentType: contentType))
        let servedPath = path
        let server = HTTPServer(configuration: .init(host: "127.0.0.1", port: 0, threadCount: 4)) {
            request in
            shared.served.add(1, ordering: .sequentiallyConsistent)
            let behavior = shared.behavior.withLock { $0 }
            if behavior.delay > .zero {
                Thread.sleep(
                    forTimeInterval: Double(behavior.delay.components.seconds)
                        + Double(behavior.delay.components.attoseconds) / 1e18)
            }
            guard request.path == servedPath else { return .error(status: 404, "not found") }
            if let status = behavior.failureStatus { return .error(status: status, "failure injected") }
            if behavior.garbage {
                return HTTPResponse(
                    status: 200, headers: ["Content-Type": behavior.contentType],
                    body: Array("not json at all {".utf8))
            }
            return HTTPResponse(
                status: 200, headers: ["Content-Type": behavior.contentType], body: [UInt8](behavior.body))
        }
        try server.start()
        self.path = path
        self.port = server.port ?? 0
        self.shared = shared
        self.server = server
    }

    /// The URL of the served path, e.g. `http://127.0.0.1:PORT/auth/keys`.
    public var url: URL { URL(string: "http://127.0.0.1:\(port)\(path)")! }

    /// Replaces the served body (and returns to normal serving).
    public func setBody(_ body: Data) {
        shared.behavior.withLock {
            $0.body = body
            $0.failureStatus = nil
            $0.garbage = false
        }
    }

    /// Answers every request with `status` and a small JSON error body until ``serveNormally()``.
    public func fail(status: Int = 500) {
        shared.behavior.withLock { $0.failureStatus = status }
    }

    /// Answers with 200 and a body that is not JSON until ``serveNormally()``.
    public func serveGarbage() {
        shared.behavior.withLock { $0.garbage = true }
    }

    /// Waits `delay` before answering each request (zero to stop delaying).
    public func setDelay(_ delay: Duration) {
        shared.behavior.withLock { $0.delay = delay }
    }

    /// Stops injecting failures and garbage; the current body is served again.
    public func serveNormally() {
        shared.behavior.withLock {
            $0.failureStatus = nil
            $0.garbage = false
        }
    }

    /// How many requests have been received so far (thread-safe).
    public var requestCount: Int { shared.served.load(ordering: .sequentiallyConsistent) }

    /// Waits until at least `count` requests have been received.
    ///
    /// - Returns: `false` if `timeout` passed first.
    public func waitForRequestCount(atLeast count: Int, timeout: Duration = .seconds(5)) -> Bool {
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: timeout)
        while requestCount < count {
            if clock.now >= deadline { return false }
            Thread.sleep(forTimeInterval: 0.002)
        }
        return true
    }

    /// Stops the server; later requests are refused. Also happens when the object goes away.
    public func stop() {
        server.shutdown(gracePeriod: .seconds(1))
    }
}

/// The stand-in for Apple's key endpoint: a ``StaticHTTPServer`` serving a JWKS at `/auth/keys`.
public typealias JWKSTestServer = StaticHTTPServer
