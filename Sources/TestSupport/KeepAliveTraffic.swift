import Foundation
import HTTPServer
import Synchronization

/// Clients that keep sending requests on keep-alive connections until stopped, reconnecting whenever the
/// server closes a connection: traffic that is still arriving while a server shuts down.
public final class KeepAliveTraffic: Sendable {
    /// One request to send: method, path and body (sent as `application/json`).
    public struct Request: Sendable {
        public var method: String
        public var path: String
        public var body: [UInt8]

        public init(method: String, path: String, body: [UInt8] = []) {
            self.method = method
            self.path = path
            self.body = body
        }
    }

    private let statuses = Mutex<[Int: Int]>([:])
    private let stopped = Atomic<Bool>(false)
    private let finished = DispatchGroup()

    /// Starts `clients` threads sending to 127.0.0.1:`port`, each request made by `request`.
    /// - Parameter idle: each connection stays idle for a random time up to this between a response and
    ///   its next request, so that requests also arrive on connections that were idle a moment ago.
    public init(
        port: Int, clients: Int, idle: Duration = .zero, request: @escaping @Sendable () -> Request
    ) {
        let idleSeconds = Double(idle.components.seconds) + Double(idle.components.attoseconds) / 1e18
        for index in 0..<clients {
            finished.enter()
            let thread = Thread { [self] in
                run(port: port, idleSeconds: idleSeconds, request: request)
                finished.leave()
            }
            thread.name = "test-traffic-\(index)"
            thread.start()
        }
    }

    /// Responses received with `status`.
    public func count(status: Int) -> Int {
        statuses.withLock { $0[status] ?? 0 }
    }

    /// Every status received, with its count.
    public var counts: [Int: Int] { statuses.withLock { $0 } }

    /// Stops sending and waits (up to `timeout`) for the clients to end; returns whether they did.
    @discardableResult
    public func stop(timeout: Duration = .seconds(10)) -> Bool {
        stopped.store(true, ordering: .sequentiallyConsistent)
        return finished.wait(timeout: .now() + .milliseconds(Int(timeout.components.seconds * 1000)))
            == .success
    }

    private var isStopped: Bool { stopped.load(ordering: .sequentiallyConsistent) }

    private func run(port: Int, idleSeconds: Double, request: @Sendable () -> Request) {
        while !isStopped {
            guard let connection = try? RawHTTPConnection(host: "127.0.0.1", port: port, timeout: .seconds(5))
            else {
                Thread.sleep(forTimeInterval: 0.002)  // refused: the server is starting or gone; retry
                continue
            }
            while !isStopped {
                let next = request()
                var head = "\(next.method) \(next.path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n"
                head += "Content-Type: application/json\r\nContent-Length: \(next.body.count)\r\n\r\n"
                guard (try? connection.send(Array(head.utf8) + next.body)) != nil,
                    let response = try? connection.readResponse()
                else { break }
                statuses.withLock { $0[response.status, default: 0] += 1 }
                if response.headers["Connection"]?.lowercased() == "close" { break }
                if idleSeconds > 0 { Thread.sleep(forTimeInterval: .random(in: 0...idleSeconds)) }
            }
        }
    }
}
