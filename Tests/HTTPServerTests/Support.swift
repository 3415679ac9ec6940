import Dispatch
import Foundation
import HTTPServer
import Synchronization

/// Starts a server on 127.0.0.1 with an ephemeral port and a small pool, for one test.
func startServer(
    maxBodyBytes: Int = 64 * 1024, threadCount: Int = 4, connectionTimeout: Duration = .seconds(10),
    handler: @escaping @Sendable (HTTPRequest) -> HTTPResponse
) throws -> HTTPServer {
    let server = HTTPServer(
        configuration: .init(
            host: "127.0.0.1", port: 0, threadCount: threadCount, maxBodyBytes: maxBodyBytes,
            connectionTimeout: connectionTimeout),
        handler: handler)
    try server.start()
    return server
}

extension HTTPServer {
    /// `http://127.0.0.1:PORT` plus `path`.
    func url(_ path: String) -> String { "http://127.0.0.1:\(port ?? 0)\(path)" }
}

/// Runs `body` on a new thread; `wait` blocks until it has finished (or the timeout passed).
final class BackgroundWork: Sendable {
    private let done = DispatchSemaphore(value: 0)

    init(_ body: @escaping @Sendable () -> Void) {
        let done = self.done
        Thread {
            body()
            done.signal()
        }.start()
    }

    func wait(timeout: Duration = .seconds(10)) -> Bool {
        done.wait(timeout: .now() + .milliseconds(Int(timeout.components.seconds * 1000))) == .success
    }
}

/// A value written by one thread and read by another.
final class Box<Value: Sendable>: Sendable {
    private let storage: Mutex<Value>

    init(_ value: Value) { storage = Mutex(value) }

    var value: Value {
        get { storage.withLock { $0 } }
        set { storage.withLock { $0 = newValue } }
    }
}
