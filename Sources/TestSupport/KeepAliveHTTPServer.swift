import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A raw TCP server on 127.0.0.1 that keeps connections open between requests (HTTP/1.1 keep-alive),
/// counts the connections it accepted, and lets a script answer each request and decide what becomes
/// of its connection: kept open, closed, half-closed (no more answers; the client's end is read until
/// it closes), or left hanging with no answer at all. Each request's head and its body (by
/// `Content-Length`) are read and recorded.
///
/// TEST ONLY. One thread per connection; fine for the handful a test makes.
public final class KeepAliveHTTPServer: Sendable {
    /// One request as it arrived.
    public struct Exchange: Sendable {
        /// Which accepted connection it came on (0 for the first).
        public let connection: Int
        /// Its position on that connection (0 for the first request).
        public let request: Int
        /// The request line and header fields, as sent.
        public let head: String
        /// The body.
        public let body: [UInt8]

        /// The first value of header `name` (case-insensitive), trimmed.
        public func header(_ name: String) -> String? {
            for line in head.split(separator: "\r\n").dropFirst() {
                guard let colon = line.firstIndex(of: ":") else { continue }
                if line[..<colon].lowercased() == name.lowercased() {
                    return line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
                }
            }
            return nil
        }

        /// The request line's target, e.g. `/hook`.
        public var path: String {
            String(head.split(separator: " ", maxSplits: 2).dropFirst().first ?? "")
        }
    }

    /// What becomes of the connection once the answer is written.
    public enum Then: Sendable {
        /// Kept open for the next request.
        case keepOpen
        /// Closed.
        case close
        /// Half-closed: nothing more is written (FIN sent); the client's end is read until it closes.
        case halfClose
        /// The answer is not written at all: the connection stays open, silent, until the client closes.
        case hang
    }

    /// Answers one request: the bytes to write and what happens to the connection after.
    public typealias Script = @Sendable (Exchange) -> (answer: [UInt8], then: Then)

    /// The bound port.
    public let port: Int
    private let listener: Int32
    private let stopped = Atomic<Bool>(false)
    private let accepted = Atomic<Int>(0)
    private let seen = Mutex<[Exchange]>([])

    /// Starts listening; `script` answers every request.
    public init(script: @escaping Script) throws {
        (listener, port) = try LoopbackSocket.bound(listenBacklog: 64)
        let thread = Thread { [self] in acceptLoop(script) }
        thread.name = "keep-alive-http-accept"
        thread.start()
    }

    deinit { stop() }

    /// An HTTP/1.1 answer with `Content-Length` (keep-alive unless a header says otherwise).
    public static func answer(status: Int = 204, headers: [String] = [], body: [UInt8] = []) -> [UInt8] {
        let head = ["HTTP/1.1 \(status) Whatever"] + headers + ["Content-Length: \(body.count)"]
        return Array((head.joined(separator: "\r\n") + "\r\n\r\n").utf8) + body
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    public func url(_ path: String = "/hook") -> String { "http://127.0.0.1:\(port)\(path)" }

    /// Connections accepted so far.
    public var connectionsAccepted: Int { accepted.load(ordering: .sequentiallyConsistent) }

    /// The requests received so far, in arrival order.
    public var exchanges: [Exchange] { seen.withLock { $0 } }

    /// Stops accepting (connections being served go on until their client closes them).
    public func stop() {
        if !stopped.exchange(true, ordering: .sequentiallyConsistent) {
            shutdown(listener, Int32(SHUT_RDWR))
        }
    }

    private func acceptLoop(_ script: @escaping Script) {
        defer { close(listener) }
        while !stopped.load(ordering: .sequentiallyConsistent) {
            let client = accept(listener, nil, nil)
            if client < 0 {
                if errno == EINTR { continue }
                return
            }
            let number = accepted.add(1, ordering: .sequentiallyConsistent).newValue - 1
            let thread = Thread { [self] in serve(client, number: number, script) }
            thread.start()
        }
    }

    private func serve(_ client: Int32, number: Int, _ script: Script) {
        defer { close(client) }
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        _ = setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        _ = setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var buffered: [UInt8] = []
        var index = 0
        while let (head, body) = readRequest(client, &buffered) {
            let exchange = Exchange(connection: number, request: index, head: head, body: body)
            index += 1
            seen.withLock { $0.append(exchange) }
            let (answer, then) = script(exchange)
            if then == .hang {
                drainUntilClosed(client)
                return
            }
            guard write(client, answer) else { return }
            switch then {
            case .keepOpen: continue
            case .close, .hang: return
            case .halfClose:
                shutdown(client, Int32(SHUT_WR))
                drainUntilClosed(client)
                return
            }
        }
    }

    /// The next request's head and `Content-Length` body, or nil once the client closed or stalled.
    private func readRequest(_ client: Int32, _ buffered: inout [UInt8]) -> (String, [UInt8])? {
        let end: [UInt8] = Array("\r\n\r\n".utf8)
        while buffered.firstRange(of: end) == nil {
            guard buffered.count < 65536, receive(client, into: &buffered) else { return nil }
        }
        let headEnd = buffered.firstRange(of: end)!.upperBound
        let head = String(decoding: buffered[..<headEnd], as: UTF8.self)
        let exchange = Exchange(connection: 0, request: 0, head: head, body: [])
        let length = exchange.header("Content-Length").flatMap { Int($0) } ?? 0
        while buffered.count < headEnd + length {
            guard receive(client, into: &buffered) else { return nil }
        }
        let body = Array(buffered[headEnd..<(headEnd + length)])
        buffered.removeFirst(headEnd + length)
        return (head, body)
    }

    private func receive(_ client: Int32, into buffered: inout [UInt8]) -> Bool {
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = chunk.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
            if count < 0, errno == EINTR { continue }
            guard count > 0 else { return false }
            buffered.append(contentsOf: chunk[0..<count])
            return true
        }
    }

    /// Reads and drops what the client sends until it closes (or the server is stopped).
    private func drainUntilClosed(_ client: Int32) {
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = chunk.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
            if count > 0 || (count < 0 && errno == EINTR) { continue }
            // The receive timeout passed: keep waiting unless the server was stopped.
            if count < 0, errno == EAGAIN || errno == EWOULDBLOCK,
                !stopped.load(ordering: .sequentiallyConsistent)
            {
                continue
            }
            return
        }
    }

    private func write(_ client: Int32, _ bytes: [UInt8]) -> Bool {
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
        }
        return true
    }
}
