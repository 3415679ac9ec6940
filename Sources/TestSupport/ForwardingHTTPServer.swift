import Foundation
import HTTPServer
import Synchronization

/// Forwards every request to a target given once it is known: for two processes that must each be
/// started with the other's address (a local Apple notifying a receiver whose sign-in API calls it).
///
/// Listens on 127.0.0.1 on a port the kernel chose; answers 503 until ``forward(to:)`` is called.
public final class ForwardingHTTPServer: Sendable {
    private final class Target: Sendable { let base = Mutex<String?>(nil) }
    private let target: Target
    private let server: HTTPServer
    /// The bound port.
    public let port: Int

    public init() throws {
        let target = Target()
        self.target = target
        server = HTTPServer(configuration: .init(host: "127.0.0.1", port: 0, threadCount: 4)) { request in
            guard let base = target.base.withLock({ $0 }) else { return .error(status: 503, "no target yet") }
            let query = request.query.map { "?" + $0 } ?? ""
            let headers = request.headers.fields.filter {
                !["host", "connection", "content-length"].contains($0.name.lowercased())
            }.map { ($0.name, $0.value) }
            do {
                let answer = try TestHTTPClient.request(
                    method: request.method, url: base + request.path + query, headers: headers,
                    body: request.method == "GET" || request.method == "HEAD" ? nil : request.body)
                let kept = answer.headers.fields.filter { $0.name.lowercased() != "connection" }
                return HTTPResponse(
                    status: answer.status, headers: HTTPHeaders(kept.map { ($0.name, $0.value) }),
                    body: answer.body)
            } catch {
                return .error(status: 502, "\(error)")
            }
        }
        try server.start()
        port = server.port ?? 0
    }

    /// The URL of `path` here, e.g. `http://127.0.0.1:PORT/apple/notifications`.
    public func url(_ path: String) -> String { "http://127.0.0.1:\(port)\(path)" }

    /// Forwards from now on to `base` (`http://HOST:PORT`).
    public func forward(to base: String) { target.base.withLock { $0 = base } }

    deinit { server.shutdown(gracePeriod: .seconds(1)) }
}
