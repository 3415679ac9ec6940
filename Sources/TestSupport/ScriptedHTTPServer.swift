public import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A raw TCP server on 127.0.0.1 for hostile answers: each connection's request head is read and
/// recorded, then a script writes whatever bytes it likes (lying headers, endless bodies, redirects)
/// and the connection is closed. Written bytes are counted, so a test can tell how much a client
/// read before hanging up.
///
/// TEST ONLY. One thread per connection; fine for the handful a test makes.
public final class ScriptedHTTPServer: Sendable {
    /// Writes bytes to the client; returns `false` once the client has gone away.
    public typealias Writer = ([UInt8]) -> Bool

    /// The bound port.
    public let port: Int
    private let listener: Int32
    private let stopped = Atomic<Bool>(false)
    private let written = Atomic<Int>(0)
    private let heads = Mutex<[String]>([])

    /// Starts listening; `script` runs once per connection with the request head (request line and
    /// headers) and a writer.
    public init(script: @escaping @Sendable (_ head: String, _ write: Writer) -> Void) throws {
        (listener, port) = try LoopbackSocket.bound(listenBacklog: 16)
        let thread = Thread { [self] in acceptLoop(script) }
        thread.name = "scripted-http-accept"
        thread.start()
    }

    deinit { stop() }

    /// `http://127.0.0.1:PORT` followed by `path`.
    public func url(_ path: String = "/auth/keys") -> URL {
        URL(string: "http://127.0.0.1:\(port)\(path)")!
    }

    /// The request heads received so far, in arrival order.
    public var requestHeads: [String] { heads.withLock { $0 } }

    /// Body and header bytes written to clients so far.
    public var bytesWritten: Int { written.load(ordering: .sequentiallyConsistent) }

    /// Stops accepting (connections being served finish their script).
    public func stop() {
        if !stopped.exchange(true, ordering: .sequentiallyConsistent) {
            shutdown(listener, Int32(SHUT_RDWR))
        }
    }

    private func acceptLoop(_ script: @escaping @Sendable (String, Writer) -> Void) {
        defer { close(listener) }
        while !stopped.load(ordering: .sequentiallyConsistent) {
            let client = accept(listener, nil, nil)
            if client < 0 {
                if errno == EINTR { continue }
                return
            }
            let thread = Thread { [self] in serve(client, script) }
            thread.start()
        }
    }

    private func serve(_ client: Int32, _ script: (String, Writer) -> Void) {
        defer { close(client) }
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        _ = setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        _ = setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        let end: [UInt8] = Array("\r\n\r\n".utf8)
        while received.count < 65536 {
            let count = buffer.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
            if count <= 0 { return }
            received.append(contentsOf: buffer[0..<count])
            if received.firstRange(of: end) != nil { break }
        }
        let head = String(decoding: received, as: UTF8.self)
        heads.withLock { $0.append(head) }
        script(head) { [self] bytes in
            var offset = 0
            while offset < bytes.count {
                let sent = bytes[offset...].withUnsafeBytes { raw in
                    send(client, raw.baseAddress, raw.count, Int32(MSG_NOSIGNAL))
                }
                if sent < 0 {
                    if errno == EINTR { continue }
                    return false
                }
                offset += sent
                written.add(sent, ordering: .sequentiallyConsistent)
            }
            return true
        }
    }
}
