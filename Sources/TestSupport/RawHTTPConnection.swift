import Foundation
import HTTPServer

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// One client TCP connection for hostile tests: send arbitrary bytes, read, wait for the server
/// to close. Not thread-safe; the socket is closed when the object goes away.
public final class RawHTTPConnection {
    private let fd: Int32
    private var buffered: [UInt8] = []

    /// Connects to `host` (numeric or `localhost`) and `port`; reads and writes time out after
    /// `timeout`.
    public init(host: String, port: Int, timeout: Duration = .seconds(10)) throws {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        #if canImport(Glibc)
            hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        #else
            hints.ai_socktype = SOCK_STREAM
        #endif
        var list: UnsafeMutablePointer<addrinfo>?
        let lookup = getaddrinfo(host == "localhost" ? "127.0.0.1" : host, String(port), &hints, &list)
        guard lookup == 0, let first = list else { throw TestHTTPError("cannot resolve \(host)") }
        defer { freeaddrinfo(list) }

        let socketFD = socket(first.pointee.ai_family, first.pointee.ai_socktype, 0)
        guard socketFD >= 0 else { throw TestHTTPError("socket: \(Self.errorText())") }
        let (seconds, attoseconds) = timeout.components
        var interval = timeval(
            tv_sec: Int(seconds), tv_usec: Int(attoseconds / 1_000_000_000_000))
        let size = socklen_t(MemoryLayout<timeval>.size)
        _ = setsockopt(socketFD, SOL_SOCKET, SO_RCVTIMEO, &interval, size)
        _ = setsockopt(socketFD, SOL_SOCKET, SO_SNDTIMEO, &interval, size)
        var noSigpipe: Int32 = 1
        #if canImport(Darwin)
            _ = setsockopt(socketFD, SOL_SOCKET, SO_NOSIGPIPE, &noSigpipe, socklen_t(4))
        #endif
        _ = noSigpipe
        guard connect(socketFD, first.pointee.ai_addr, first.pointee.ai_addrlen) == 0 else {
            let text = Self.errorText()
            close(socketFD)
            throw TestHTTPError("connect to \(host):\(port): \(text)")
        }
        fd = socketFD
    }

    deinit { close(fd) }

    /// Sends all of `bytes`.
    public func send(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { raw in
                #if canImport(Glibc)
                    Glibc.send(fd, raw.baseAddress, raw.count, Int32(MSG_NOSIGNAL))
                #else
                    Darwin.send(fd, raw.baseAddress, raw.count, 0)
                #endif
            }
            if written < 0 {
                if errno == EINTR { continue }
                throw TestHTTPError("send: \(Self.errorText())")
            }
            offset += written
        }
    }

    /// Sends the UTF-8 bytes of `text`.
    public func send(_ text: String) throws {
        try send(Array(text.utf8))
    }

    /// Waits until the server closes the connection, discarding anything it sends.
    ///
    /// - Returns: `true` if the connection was closed (or reset) before `timeout` passed.
    public func waitForClose(timeout: Duration) -> Bool {
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: timeout)
        while clock.now < deadline {
            var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let remaining = deadline - clock.now
            let milliseconds = max(
                1,
                Int32(
                    remaining.components.seconds * 1000 + remaining.components.attoseconds
                        / 1_000_000_000_000_000))
            let ready = poll(&descriptor, 1, milliseconds)
            if ready < 0 && errno == EINTR { continue }
            if ready <= 0 { continue }
            var scratch = [UInt8](repeating: 0, count: 4096)
            let count = scratch.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count == 0 { return true }
            if count < 0 && errno != EINTR && errno != EAGAIN { return true }
        }
        return false
    }

    /// Reads one complete response (by `Content-Length`, chunked encoding, or until close).
    public func readResponse() throws -> TestHTTPResponse {
        let separator: [UInt8] = [13, 10, 13, 10]
        var headerEnd = buffered.firstRange(of: separator)
        while headerEnd == nil {
            guard try fill() else { throw TestHTTPError("connection closed before the response head") }
            headerEnd = buffered.firstRange(of: separator)
        }
        let head = String(decoding: buffered[..<headerEnd!.lowerBound], as: UTF8.self)
        buffered.removeSubrange(..<headerEnd!.upperBound)

        var lines = head.components(separatedBy: "\r\n")
        let statusParts = lines.removeFirst().split(separator: " ", maxSplits: 2)
        guard statusParts.count >= 2, let status = Int(statusParts[1]) else {
            throw TestHTTPError("malformed status line")
        }
        var headers = HTTPHeaders()
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers.add(
                name: String(line[..<colon]),
                value: line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces))
        }

        let body: [UInt8]
        if let length = headers["Content-Length"].flatMap({ Int($0) }) {
            body = try readExactly(length)
        } else if headers["Transfer-Encoding"]?.lowercased() == "chunked" {
            body = try readChunked()
        } else {
            while try fill() {}
            body = buffered
            buffered = []
        }
        return TestHTTPResponse(status: status, headers: headers, body: body)
    }

    private func readExactly(_ count: Int) throws -> [UInt8] {
        while buffered.count < count {
            guard try fill() else { throw TestHTTPError("connection closed inside the body") }
        }
        let result = Array(buffered[..<count])
        buffered.removeSubrange(..<count)
        return result
    }

    private func readLine() throws -> String {
        let crlf: [UInt8] = [13, 10]
        var end = buffered.firstRange(of: crlf)
        while end == nil {
            guard try fill() else { throw TestHTTPError("connection closed inside a chunk") }
            end = buffered.firstRange(of: crlf)
        }
        let line = String(decoding: buffered[..<end!.lowerBound], as: UTF8.self)
        buffered.removeSubrange(..<end!.upperBound)
        return line
    }

    private func readChunked() throws -> [UInt8] {
        var body: [UInt8] = []
        while true {
            let sizeText = try readLine().split(separator: ";").first.map(String.init) ?? ""
            guard let size = Int(sizeText.trimmingCharacters(in: .whitespaces), radix: 16) else {
                throw TestHTTPError("malformed chunk size")
            }
            if size == 0 {
                while try !readLine().isEmpty {}
                return body
            }
            body += try readExactly(size)
            _ = try readLine()
        }
    }

    /// Reads more bytes into the buffer; `false` at end of stream.
    private func fill() throws -> Bool {
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                buffered += chunk[..<count]
                return true
            }
            if count == 0 { return false }
            if errno == EINTR { continue }
            if errno == EAGAIN || errno == EWOULDBLOCK { throw TestHTTPError("timed out reading") }
            if errno == ECONNRESET { return false }
            throw TestHTTPError("recv: \(Self.errorText())")
        }
    }

    private static func errorText() -> String {
        String(cString: strerror(errno))
    }
}

/// What a hostile request came to: an answer, or the server closing (or resetting) the connection
/// without one.
public enum RawHTTPOutcome: Sendable, Equatable, CustomStringConvertible {
    /// A complete response with this status arrived.
    case answered(status: Int)
    /// The server closed or reset the connection before any response byte.
    case closed

    /// Whether this is a 4xx answer or a cut-off connection: how a refused request should end.
    public var isRefusal: Bool {
        switch self {
        case .answered(let status): (400...499).contains(status)
        case .closed: true
        }
    }

    public var description: String {
        switch self {
        case .answered(let status): "answered \(status)"
        case .closed: "closed"
        }
    }
}

extension RawHTTPConnection {
    /// Reads one response, or notices that the server closed the connection without sending one.
    ///
    /// - Throws: ``TestHTTPError`` when the read timeout passes first (a server that hangs) or the
    ///   response is malformed or cut short.
    public func readOutcome() throws -> RawHTTPOutcome {
        while buffered.isEmpty {
            guard try fill() else { return .closed }
        }
        return .answered(status: try readResponse().status)
    }

    /// Sends `bytes`, reporting instead of throwing when the server has already closed or reset the
    /// connection (as it may while refusing an oversized request).
    ///
    /// - Returns: `false` if the send failed.
    @discardableResult
    public func sendUnlessClosed(_ bytes: [UInt8]) -> Bool {
        (try? send(bytes)) != nil
    }

    /// Whether the server has closed (or reset) the connection, checked without waiting; anything
    /// already received is discarded.
    public func isClosedByServer() -> Bool {
        var scratch = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = scratch.withUnsafeMutableBytes { raw in
                #if canImport(Glibc)
                    recv(fd, raw.baseAddress, raw.count, Int32(MSG_DONTWAIT))
                #else
                    recv(fd, raw.baseAddress, raw.count, MSG_DONTWAIT)
                #endif
            }
            if count > 0 { continue }
            if count == 0 { return true }
            if errno == EINTR { continue }
            return errno != EAGAIN && errno != EWOULDBLOCK
        }
    }
}
