import COpenSSL
import Foundation
import ServiceSupport

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// One bounded HTTP/1.1 GET of a key set over a socket (TLS by OpenSSL for `https`), written for
/// ``JWKSSource`` because URLSession (libcurl on Linux) buffers and inflates answers faster than a
/// delegate can refuse them: nothing here is read that the policy has not allowed.
///
/// - `Accept-Encoding: identity` is asked for, and any `Content-Encoding` but `identity` is refused
///   before the body is read, so nothing is ever inflated;
/// - status 200 only: a redirect (3xx) is refused, never followed;
/// - a `Content-Length` above the limit (or several disagreeing) is refused before the body is read;
///   a chunked body or one delimited by the connection's end is cut off once past the limit; the head
///   is limited to 16 KiB and a chunk-size line to 1 KiB;
/// - every connect, handshake, write and read is bounded by what is left of the deadline;
/// - TLS 1.2 or later, the peer's certificate verified against the system's CA store, and its name
///   checked against the URL's host (SNI sent).
struct KeySetDownload {
    let host: String
    let port: Int
    let pathAndQuery: String
    let useTLS: Bool
    let maxBytes: Int
    let deadline: ContinuousClock.Instant

    init(url: URL, maxBytes: Int, timeout: TimeInterval) throws {
        guard let components = URLComponents(url: url, resolvingAgainstBaseURL: false),
            let scheme = components.scheme?.lowercased(), var host = components.host, !host.isEmpty
        else { throw JWKSFetchError("invalid URL") }
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        self.host = host
        self.useTLS = scheme == "https"
        self.port = components.port ?? (useTLS ? 443 : 80)
        let path = components.percentEncodedPath.isEmpty ? "/" : components.percentEncodedPath
        self.pathAndQuery = path + (components.percentEncodedQuery.map { "?" + $0 } ?? "")
        self.maxBytes = maxBytes
        self.deadline = .now + .milliseconds(Int64(timeout * 1000))
    }

    /// Fetches the body. - Throws: ``JWKSFetchError`` saying why.
    func run() throws -> Data {
        let connection = try Connection(host: host, port: port, useTLS: useTLS, deadline: deadline)
        defer { connection.close() }
        let hostHeader =
            (host.contains(":") ? "[\(host)]" : host)
            + (port == (useTLS ? 443 : 80) ? "" : ":\(port)")
        let request =
            "GET \(pathAndQuery) HTTP/1.1\r\nHost: \(hostHeader)\r\nAccept: application/json\r\n"
            + "Accept-Encoding: identity\r\nUser-Agent: siwa-notifications\r\nConnection: close\r\n\r\n"
        try connection.write(Array(request.utf8))
        var reader = Reader(connection: connection)
        let head = try reader.head(limit: 16 * 1024)
        let response = try Head(head)
        if (300..<400).contains(response.status) {
            throw JWKSFetchError("refused a redirect (HTTP status \(response.status))")
        }
        guard response.status == 200 else { throw JWKSFetchError("HTTP status \(response.status)") }
        if let encoding = response.single("content-encoding"), encoding.lowercased() != "identity" {
            throw JWKSFetchError("refused a compressed answer (Content-Encoding)")
        }
        if let transfer = response.values("transfer-encoding").first {
            guard response.values("transfer-encoding").count == 1, transfer.lowercased() == "chunked",
                response.values("content-length").isEmpty
            else { throw JWKSFetchError("unsupported framing (Transfer-Encoding)") }
            return try reader.chunkedBody(limit: maxBytes)
        }
        let lengths = Set(response.values("content-length"))
        if let text = lengths.first {
            guard lengths.count == 1, !text.isEmpty, text.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }) else {
                throw JWKSFetchError("invalid Content-Length")
            }
            guard let length = Int(text), length <= maxBytes else {
                throw JWKSFetchError("key set larger than \(maxBytes) bytes (Content-Length)")
            }
            return try reader.body(exactly: length)
        }
        return try reader.bodyUntilClose(limit: maxBytes)
    }

    /// A parsed status line and header fields (names lowercased, values trimmed).
    struct Head {
        var status: Int
        var fields: [(String, String)]

        init(_ bytes: [UInt8]) throws {
            let lines = String(decoding: bytes, as: UTF8.self).components(separatedBy: "\r\n")
            let statusLine = lines.first?.split(separator: " ", maxSplits: 2) ?? []
            guard statusLine.count >= 2, statusLine[0].hasPrefix("HTTP/1."), let status = Int(statusLine[1])
            else { throw JWKSFetchError("not an HTTP/1.x answer") }
            self.status = status
            fields = []
            for line in lines.dropFirst() where !line.isEmpty {
                guard let colon = line.firstIndex(of: ":") else {
                    throw JWKSFetchError("malformed header line")
                }
                let name = line[..<colon].lowercased()
                let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
                fields.append((name, value))
            }
        }

        func values(_ name: String) -> [String] { fields.filter { $0.0 == name }.map(\.1) }

        func single(_ name: String) -> String? { values(name).first }
    }

    /// Reads from a connection through a buffer that drops what has been consumed.
    struct Reader {
        let connection: Connection
        var buffer: [UInt8] = []
        var start = 0
        var closed = false

        init(connection: Connection) { self.connection = connection }

        var available: Int { buffer.count - start }

        /// Reads more bytes; returns false at the end of the stream.
        mutating func fill() throws -> Bool {
            if start > 65536 {
                buffer.removeFirst(start)
                start = 0
            }
            guard !closed else { return false }
            var chunk = [UInt8](repeating: 0, count: 16384)
            let count = try connection.read(into: &chunk)
            if count == 0 {
                closed = true
                return false
            }
            buffer.append(contentsOf: chunk[0..<count])
            return true
        }

        mutating func take(_ count: Int) -> ArraySlice<UInt8> {
            defer { start += count }
            return buffer[start..<start + count]
        }

        /// Consumes a line ending in CRLF (returned without it), of at most `limit` bytes.
        mutating func line(limit: Int) throws -> [UInt8] {
            var scanned = 0  // bytes after `start` known to hold no LF
            while true {
                if let index = buffer[(start + scanned)...].firstIndex(of: 10) {
                    let end = index > start && buffer[index - 1] == 13 ? index - 1 : index
                    let line = Array(buffer[start..<end])
                    start = index + 1
                    return line
                }
                scanned = available
                guard scanned <= limit else { throw JWKSFetchError("line too long in the answer") }
                guard try fill() else { throw JWKSFetchError("answer cut short") }
            }
        }

        /// The status line and header fields, up to the empty line.
        mutating func head(limit: Int) throws -> [UInt8] {
            var head: [UInt8] = []
            while true {
                let line = try line(limit: limit)
                if line.isEmpty { return head }
                head += line + [13, 10]
                guard head.count <= limit else { throw JWKSFetchError("answer headers too large") }
            }
        }

        mutating func body(exactly length: Int) throws -> Data {
            while available < length {
                guard try fill() else { throw JWKSFetchError("answer cut short") }
            }
            return Data(take(length))
        }

        mutating func bodyUntilClose(limit: Int) throws -> Data {
            while try fill() {
                guard available <= limit else { throw JWKSFetchError("key set larger than \(limit) bytes") }
            }
            return Data(take(available))
        }

        mutating func chunkedBody(limit: Int) throws -> Data {
            var body = Data()
            while true {
                let sizeLine = try line(limit: 1024)
                let digits = sizeLine.prefix { $0 != UInt8(ascii: ";") && $0 != 32 && $0 != 9 }
                guard !digits.isEmpty, digits.count <= 16,
                    let size = Int(String(decoding: digits, as: UTF8.self), radix: 16)
                else { throw JWKSFetchError("malformed chunk size") }
                if size == 0 { return body }  // trailers are not read: the connection closes
                guard size <= limit - body.count else {
                    throw JWKSFetchError("key set larger than \(limit) bytes")
                }
                while available < size + 2 {
                    guard try fill() else { throw JWKSFetchError("answer cut short") }
                }
                body.append(contentsOf: take(size))
                guard take(2).elementsEqual([13, 10]) else { throw JWKSFetchError("malformed chunk") }
            }
        }
    }

    /// A TCP connection, with TLS when asked, whose every operation ends by the deadline.
    final class Connection {
        private var fd: Int32 = -1
        private var context: OpaquePointer?
        private var ssl: OpaquePointer?
        private let deadline: ContinuousClock.Instant

        init(host: String, port: Int, useTLS: Bool, deadline: ContinuousClock.Instant) throws {
            self.deadline = deadline
            let list: UnsafeMutablePointer<addrinfo>? = try Resolution.resolve(
                host: host, port: port, deadline: deadline)
            defer { freeaddrinfo(list) }
            var cursor = list
            while let address = cursor {
                cursor = address.pointee.ai_next
                #if canImport(Glibc)
                    let type = address.pointee.ai_socktype | Int32(SOCK_CLOEXEC.rawValue)
                #else
                    let type = address.pointee.ai_socktype
                #endif
                let socketFD = socket(address.pointee.ai_family, type, 0)
                if socketFD < 0 { continue }
                fd = socketFD
                try applyTimeout()
                if connect(socketFD, address.pointee.ai_addr, address.pointee.ai_addrlen) == 0 { break }
                closeDescriptor(socketFD)
                fd = -1
                if ContinuousClock.now >= deadline { break }
            }
            guard fd >= 0 else { throw JWKSFetchError("cannot connect") }
            if useTLS { try startTLS(host: host) }
        }

        deinit { close() }

        func close() {
            if let ssl {
                SSL_free(ssl)
                self.ssl = nil
            }
            if let context {
                SSL_CTX_free(context)
                self.context = nil
            }
            if fd >= 0 {
                closeDescriptor(fd)
                fd = -1
            }
        }

        /// Sets the socket's send and receive timeouts to what is left before the deadline.
        private func applyTimeout() throws {
            let left = deadline - ContinuousClock.now
            guard left > .zero else { throw JWKSFetchError("timed out") }
            let (seconds, attoseconds) = left.components
            var interval = timeval(
                tv_sec: Int(seconds), tv_usec: max(1, Int(attoseconds / 1_000_000_000_000)))
            let size = socklen_t(MemoryLayout<timeval>.size)
            _ = setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &interval, size)
            _ = setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &interval, size)
        }

        private func startTLS(host: String) throws {
            guard let context = SSL_CTX_new(TLS_client_method()) else {
                throw JWKSFetchError("TLS setup failed")
            }
            self.context = context
            guard SSL_CTX_set_default_verify_paths(context) == 1, siwa_ssl_ctx_set_min_tls12(context) == 1
            else {
                throw JWKSFetchError("TLS setup failed")
            }
            SSL_CTX_set_verify(context, SSL_VERIFY_PEER, nil)
            // A peer closing without close_notify reads as the end; the framing says if it is whole.
            siwa_ssl_ctx_ignore_unexpected_eof(context)
            guard let ssl = SSL_new(context) else { throw JWKSFetchError("TLS setup failed") }
            self.ssl = ssl
            var v4 = in_addr()
            var v6 = in6_addr()
            let isAddress = inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1
            if isAddress {
                guard X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) == 1 else {
                    throw JWKSFetchError("TLS setup failed")
                }
            } else {
                guard siwa_ssl_set_tlsext_host_name(ssl, host) == 1, SSL_set1_host(ssl, host) == 1 else {
                    throw JWKSFetchError("TLS setup failed")
                }
            }
            guard SSL_set_fd(ssl, fd) == 1 else { throw JWKSFetchError("TLS setup failed") }
            try applyTimeout()
            guard SSL_connect(ssl) == 1 else {
                let verify = SSL_get_verify_result(ssl)
                ERR_clear_error()
                if verify != Int(X509_V_OK) {
                    let reason =
                        X509_verify_cert_error_string(verify).map { String(cString: $0) } ?? "\(verify)"
                    throw JWKSFetchError("TLS certificate not trusted: \(reason)")
                }
                throw JWKSFetchError("TLS handshake failed")
            }
        }

        func write(_ bytes: [UInt8]) throws {
            var offset = 0
            while offset < bytes.count {
                try applyTimeout()
                let count = bytes[offset...].withUnsafeBytes { raw -> Int in
                    if let ssl { return Int(SSL_write(ssl, raw.baseAddress, Int32(raw.count))) }
                    return send(fd, raw.baseAddress, raw.count, Int32(MSG_NOSIGNAL))
                }
                if count <= 0 {
                    if ssl == nil && errno == EINTR { continue }
                    let timedOut = errno == EAGAIN || errno == EWOULDBLOCK || ContinuousClock.now >= deadline
                    ERR_clear_error()
                    throw JWKSFetchError(timedOut ? "timed out" : "connection failed while sending")
                }
                offset += count
            }
        }

        /// Reads some bytes; 0 at the end of the stream.
        func read(into buffer: inout [UInt8]) throws -> Int {
            while true {
                try applyTimeout()
                let count = buffer.withUnsafeMutableBytes { raw -> Int in
                    if let ssl { return Int(SSL_read(ssl, raw.baseAddress, Int32(raw.count))) }
                    return recv(fd, raw.baseAddress, raw.count, 0)
                }
                if count > 0 { return count }
                let timedOut = errno == EAGAIN || errno == EWOULDBLOCK || ContinuousClock.now >= deadline
                if let ssl {
                    let error = SSL_get_error(ssl, Int32(count))
                    ERR_clear_error()
                    if error == SSL_ERROR_ZERO_RETURN { return 0 }
                } else {
                    if count == 0 { return 0 }
                    if errno == EINTR { continue }
                }
                throw JWKSFetchError(timedOut ? "timed out" : "connection failed")
            }
        }
    }
}

/// Name resolution on a thread of its own, so that a resolver that hangs cannot hold a fetch (and the
/// requests waiting for it) past the deadline; an abandoned lookup frees its own result.
private final class Resolution: @unchecked Sendable {
    private let lock = NSLock()
    private let done = DispatchSemaphore(value: 0)
    private var list: UnsafeMutablePointer<addrinfo>?
    private var status: Int32 = 0
    private var finished = false
    private var abandoned = false

    /// The addresses of `host` (free them with `freeaddrinfo`). - Throws: ``JWKSFetchError``.
    static func resolve(host: String, port: Int, deadline: ContinuousClock.Instant) throws
        -> UnsafeMutablePointer<addrinfo>
    {
        let lookup = Resolution()
        let thread = Thread {
            var hints = addrinfo()
            hints.ai_family = AF_UNSPEC
            #if canImport(Glibc)
                hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
            #else
                hints.ai_socktype = SOCK_STREAM
            #endif
            var list: UnsafeMutablePointer<addrinfo>?
            let status = getaddrinfo(host, String(port), &hints, &list)
            lookup.lock.lock()
            if lookup.abandoned {
                if let list { freeaddrinfo(list) }
            } else {
                lookup.list = list
                lookup.status = status
            }
            lookup.finished = true
            lookup.lock.unlock()
            lookup.done.signal()
        }
        thread.name = "siwa-jwks-resolve"
        thread.start()
        let left = max(0, (deadline - ContinuousClock.now).inSeconds)
        _ = lookup.done.wait(timeout: .now() + left)
        lookup.lock.lock()
        defer { lookup.lock.unlock() }
        guard lookup.finished else {
            lookup.abandoned = true
            throw JWKSFetchError("timed out resolving the host")
        }
        guard lookup.status == 0, let list = lookup.list else {
            if let list = lookup.list { freeaddrinfo(list) }
            throw JWKSFetchError("cannot resolve the host")
        }
        return list
    }
}

/// `close(2)`, callable where a method named `close` hides it.
private func closeDescriptor(_ fd: Int32) {
    _ = close(fd)
}
