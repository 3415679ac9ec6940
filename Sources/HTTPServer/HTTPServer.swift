import CHTTPShim
import Foundation
import Synchronization

/// A small HTTP/1.1 server on libmicrohttpd with an internal thread pool of poll() loops.
///
/// libmicrohttpd's I/O threads read requests and write responses; once a request's body has
/// arrived, its connection is suspended and the request is handed over. An asynchronous handler
/// (``init(configuration:onResponse:asynchronous:)``) sees it right there on the I/O thread and answers
/// through an ``HTTPResponder`` whenever its answer is ready, from any thread: a request waiting for
/// something (a database commit) holds no thread. A blocking handler
/// (``init(configuration:onResponse:handler:)``) runs on one of ``Configuration/threadCount`` handler
/// threads, taking requests in arrival order from one shared queue, and may block without delaying any
/// other connection. Bodies larger than ``Configuration/maxBodyBytes`` are answered with 413 by the
/// server itself, and requests whose framing is ambiguous (see ``HTTPFraming``) with 400, before any
/// of their body is read.
public final class HTTPServer: Sendable {
    /// How the server listens and what it tolerates. Build once; every field has a default.
    public struct Configuration: Sendable {
        /// A numeric IPv4/IPv6 address to bind, or `localhost` (meaning 127.0.0.1).
        public var host: String
        /// The TCP port; 0 picks a free ephemeral port (read it from ``HTTPServer/port`` after start).
        public var port: Int
        /// Handler threads: the most requests being handled at once by blocking handlers (and by
        /// ``HTTPResponder/respondBlocking(_:)``). Requests answered asynchronously use none.
        public var threadCount: Int
        /// libmicrohttpd's I/O threads, each with its own poll() loop; they never run a handler.
        public var ioThreadCount: Int
        /// The largest accepted request body. A larger `Content-Length` gets 413 before any body is
        /// read; a chunked body stops being buffered once past the limit and gets 413 at its end
        /// (or the connection is closed if it streams on past twice the limit).
        public var maxBodyBytes: Int
        /// The most simultaneous connections; further ones are not accepted until one closes (they
        /// wait in the listen backlog).
        public var connectionLimit: Int
        /// Idle time after which a connection is closed, and the most time a request body may take
        /// to arrive after its headers (so a body trickling in byte by byte is cut off too); whole
        /// seconds, rounded up. Headers trickling in are bounded only by the idle time and
        /// ``connectionMemoryLimit``: put a proxy with a total header timeout in front.
        public var connectionTimeout: Duration
        /// Memory per connection for request line and headers; larger headers are refused.
        public var connectionMemoryLimit: Int
        /// The listen backlog passed to `listen(2)`.
        public var listenBacklog: Int

        /// The default number of handler threads: twice the core count, at least 8.
        public static var defaultThreadCount: Int {
            max(8, 2 * ProcessInfo.processInfo.activeProcessorCount)
        }

        /// The default number of I/O threads: one per core, at most 8.
        public static var defaultIOThreadCount: Int {
            min(8, max(1, ProcessInfo.processInfo.activeProcessorCount))
        }

        /// Creates a configuration; every parameter has a production-sensible default.
        public init(
            host: String = "127.0.0.1",
            port: Int = 8080,
            threadCount: Int = Configuration.defaultThreadCount,
            ioThreadCount: Int = Configuration.defaultIOThreadCount,
            maxBodyBytes: Int = 64 * 1024,
            connectionLimit: Int = 1024,
            connectionTimeout: Duration = .seconds(10),
            connectionMemoryLimit: Int = 32 * 1024,
            listenBacklog: Int = 511
        ) {
            self.host = host
            self.port = port
            self.threadCount = threadCount
            self.ioThreadCount = ioThreadCount
            self.maxBodyBytes = maxBodyBytes
            self.connectionLimit = connectionLimit
            self.connectionTimeout = connectionTimeout
            self.connectionMemoryLimit = connectionMemoryLimit
            self.listenBacklog = listenBacklog
        }

        /// The bind address with `localhost` resolved to its IPv4 loopback literal.
        var numericHost: String {
            host.lowercased() == "localhost" ? "127.0.0.1" : host
        }

        var timeoutSeconds: Int {
            let (seconds, attoseconds) = connectionTimeout.components
            return Int(seconds) + (attoseconds > 0 ? 1 : 0)
        }

        func validate() throws(HTTPServerError) {
            func invalid(_ message: String) -> HTTPServerError {
                HTTPServerError(code: .invalidConfiguration, message: message)
            }
            guard (0...65535).contains(port) else { throw invalid("port \(port) is out of range") }
            guard (1...1024).contains(threadCount) else {
                throw invalid("threadCount must be between 1 and 1024")
            }
            guard (1...64).contains(ioThreadCount) else {
                throw invalid("ioThreadCount must be between 1 and 64")
            }
            guard maxBodyBytes >= 0 else { throw invalid("maxBodyBytes must not be negative") }
            guard (1...Int(UInt32.max)).contains(connectionLimit) else {
                throw invalid("connectionLimit must be positive")
            }
            guard (1...86_400).contains(timeoutSeconds) else {
                throw invalid("connectionTimeout must be between 1 second and 1 day")
            }
            guard connectionMemoryLimit >= 4096 else {
                throw invalid("connectionMemoryLimit must be at least 4096 bytes")
            }
            guard (1...65535).contains(listenBacklog) else {
                throw invalid("listenBacklog must be between 1 and 65535")
            }
        }
    }

    private enum Phase {
        case idle
        case running(OpaquePointer, port: Int)
        case draining(OpaquePointer, port: Int)
        case stopped
    }

    /// The configuration the server was created with.
    public let configuration: Configuration
    private let dispatcher: Dispatcher
    private let phase = Mutex<Phase>(.idle)

    /// Creates a server; nothing listens until ``start()``.
    ///
    /// - Parameters:
    ///   - onResponse: called after each handler response is queued, with the request, the
    ///     response and the handler's duration (for access logs and metrics). Responses the server
    ///     generates itself (413, 400) are not reported.
    ///   - handler: answers a complete request; called on a pool thread, may block.
    public init(
        configuration: Configuration = Configuration(),
        onResponse: (@Sendable (HTTPRequest, HTTPResponse, Duration) -> Void)? = nil,
        handler: @escaping @Sendable (HTTPRequest) -> HTTPResponse
    ) {
        self.configuration = configuration
        self.dispatcher = Dispatcher(
            route: { request, responder in responder.respondBlocking { handler(request) } },
            onResponse: onResponse, maxBodyBytes: configuration.maxBodyBytes)
    }

    /// Creates a server whose handler answers asynchronously; nothing listens until ``start()``.
    ///
    /// `handler` runs on the libmicrohttpd I/O thread that read the request, with the request's
    /// connection suspended: it must not block. It answers through the ``HTTPResponder`` exactly once,
    /// from any thread and at any time — at once, from a completion when some work is done (the
    /// connection stays suspended meanwhile, holding no thread), or from one of the server's handler
    /// threads via ``HTTPResponder/respondBlocking(_:)`` when the answer needs blocking work.
    ///
    /// - Parameters:
    ///   - onResponse: called after each handler response is queued, with the request, the
    ///     response and the time from the handler's call to its answer.
    ///   - handler: routes a complete request; called on an I/O thread, must not block.
    public init(
        configuration: Configuration = Configuration(),
        onResponse: (@Sendable (HTTPRequest, HTTPResponse, Duration) -> Void)? = nil,
        asynchronous handler: @escaping @Sendable (HTTPRequest, HTTPResponder) -> Void
    ) {
        self.configuration = configuration
        self.dispatcher = Dispatcher(
            route: handler, onResponse: onResponse, maxBodyBytes: configuration.maxBodyBytes)
    }

    deinit {
        shutdown(gracePeriod: .zero)
    }

    /// Binds the listen socket and starts serving.
    ///
    /// - Throws: ``HTTPServerError`` with code `.addressInUse` when the port is taken,
    ///   `.invalidConfiguration`, `.listenFailed`, `.startFailed`, or `.invalidState` when the
    ///   server already started.
    public func start() throws(HTTPServerError) {
        try configuration.validate()
        try phase.withLock { phase throws(HTTPServerError) in
            guard case .idle = phase else {
                throw HTTPServerError(code: .invalidState, message: "the server was already started")
            }
            dispatcher.pool.start(threads: configuration.threadCount)
            let daemon: OpaquePointer
            do throws(HTTPServerError) {
                daemon = try startDaemon()
            } catch {
                dispatcher.pool.stopAndJoin()
                throw error
            }
            phase = .running(daemon, port: Int(siwa_http_port(daemon)))
        }
    }

    private func startDaemon() throws(HTTPServerError) -> OpaquePointer {
        let host = configuration.numericHost
        var error: Int32 = 0
        var systemError: Int32 = 0
        let context = Unmanaged.passUnretained(dispatcher).toOpaque()
        let daemon = host.withCString { hostPointer in
            var config = siwa_http_config(
                host: hostPointer,
                port: UInt16(configuration.port),
                thread_count: UInt32(configuration.ioThreadCount),
                max_body_bytes: configuration.maxBodyBytes,
                connection_limit: UInt32(configuration.connectionLimit),
                connection_timeout_seconds: UInt32(configuration.timeoutSeconds),
                connection_memory_limit: configuration.connectionMemoryLimit,
                listen_backlog: Int32(configuration.listenBacklog),
                body_too_large: ServerAnswers.contentTooLarge.pointer,
                no_memory: ServerAnswers.overloaded.pointer,
                refused: ServerAnswers.shuttingDown.pointer)
            return siwa_http_start(&config, checkFraming, handleRequest, context, &error, &systemError)
        }
        if let daemon { return daemon }

        let address = Self.address(host: host, port: configuration.port)
        let reason = HTTPServerError.systemMessage(systemError)
        switch Int(error) {
        case Int(SIWA_HTTP_ERROR_INVALID_ADDRESS):
            throw HTTPServerError(
                code: .invalidConfiguration,
                message: "host \"\(configuration.host)\" is not a numeric IPv4/IPv6 address or localhost")
        case Int(SIWA_HTTP_ERROR_BIND) where systemError == EADDRINUSE:
            throw HTTPServerError(
                code: .addressInUse, message: "cannot listen on \(address): address already in use")
        case Int(SIWA_HTTP_ERROR_SOCKET), Int(SIWA_HTTP_ERROR_BIND), Int(SIWA_HTTP_ERROR_LISTEN):
            throw HTTPServerError(code: .listenFailed, message: "cannot listen on \(address): \(reason)")
        default:
            throw HTTPServerError(
                code: .startFailed, message: "libmicrohttpd could not start on \(address)")
        }
    }

    /// The bound port while running (the real one when 0 was configured); `nil` otherwise.
    public var port: Int? {
        phase.withLock { phase in
            switch phase {
            case .running(_, let port), .draining(_, let port): port
            case .idle, .stopped: nil
            }
        }
    }

    /// The bound address while running, as `HOST:PORT` (`[HOST]:PORT` for IPv6) with the numeric host
    /// bound and the real port (the kernel's choice when 0 was configured); `nil` otherwise.
    public var address: String? {
        port.map { Self.address(host: configuration.numericHost, port: $0) }
    }

    static func address(host: String, port: Int) -> String {
        host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
    }

    /// Requests received but not yet finished (including ones still uploading), for metrics.
    public var inFlightRequests: Int {
        phase.withLock { phase in
            switch phase {
            case .running(let daemon, _), .draining(let daemon, _): Int(siwa_http_in_flight(daemon))
            case .idle, .stopped: 0
            }
        }
    }

    /// Stops gracefully: refuses new connections at once, lets in-flight requests finish for up to
    /// `gracePeriod` (responses sent meanwhile carry `Connection: close`), answers any request that
    /// completes after that with 503 `{"error":"shutting down"}` (Apple retries it), then closes every
    /// connection. Requests still unanswered after the grace period (a handler still running, a
    /// suspended request whose responder has not answered) are waited for (libmicrohttpd cannot stop
    /// while a request awaits its answer), so every request must be answered in bounded time. Returns
    /// once every thread the server started (libmicrohttpd's and the handler threads) has ended. Must
    /// not be called from a handler. Calling it again, or on a server that never started, returns at
    /// once.
    ///
    /// - Returns: `true` when every in-flight request finished within the grace period.
    @discardableResult
    public func shutdown(gracePeriod: Duration = .seconds(10)) -> Bool {
        let daemon: OpaquePointer? = phase.withLock { phase in
            switch phase {
            case .running(let daemon, let port):
                siwa_http_quiesce(daemon)
                phase = .draining(daemon, port: port)
                return daemon
            case .idle:
                phase = .stopped
                return nil
            case .draining, .stopped:
                return nil
            }
        }
        guard let daemon else { return true }

        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: gracePeriod)
        var drained = siwa_http_in_flight(daemon) == 0
        while !drained && clock.now < deadline {
            Thread.sleep(forTimeInterval: 0.002)
            drained = siwa_http_in_flight(daemon) == 0
        }
        // Every request handed to a handler must be answered before the daemon may stop
        // (libmicrohttpd aborts the process otherwise). Past the grace period no further request
        // reaches a handler (a keep-alive connection may still send one: it gets 503 and is closed),
        // so once the unanswered ones are answered none can follow.
        siwa_http_refuse_requests(daemon)
        while siwa_http_unanswered(daemon) > 0 { Thread.sleep(forTimeInterval: 0.002) }
        dispatcher.pool.waitUntilIdle()
        // Give the answers just queued a moment to be written before the connections close.
        let flushDeadline = clock.now.advanced(by: .seconds(1))
        while siwa_http_in_flight(daemon) > 0 && clock.now < flushDeadline {
            Thread.sleep(forTimeInterval: 0.002)
        }
        phase.withLock { $0 = .stopped }
        siwa_http_stop(daemon)  // joins libmicrohttpd's own threads
        dispatcher.pool.stopAndJoin()
        return drained
    }
}

/// Holds the handler for the C callback; the server keeps it alive for as long as the daemon runs.
final class Dispatcher: Sendable {
    let route: @Sendable (HTTPRequest, HTTPResponder) -> Void
    let onResponse: (@Sendable (HTTPRequest, HTTPResponse, Duration) -> Void)?
    let maxBodyBytes: Int
    let pool = HandlerPool()

    init(
        route: @escaping @Sendable (HTTPRequest, HTTPResponder) -> Void,
        onResponse: (@Sendable (HTTPRequest, HTTPResponse, Duration) -> Void)?, maxBodyBytes: Int
    ) {
        self.route = route
        self.onResponse = onResponse
        self.maxBodyBytes = maxBodyBytes
    }

    /// On an I/O thread, once the headers are in and before any body is read: the framing verdict.
    func checkFraming(_ exchange: OpaquePointer, version: String) -> CannedResponse? {
        var scan = HTTPFraming.Scan()
        withUnsafeMutablePointer(to: &scan) { pointer in
            siwa_http_each_header(exchange, scanFramingHeader, pointer)
        }
        return HTTPFraming.refusal(scan, version: version, maxBodyBytes: maxBodyBytes)
    }

    /// On an I/O thread, with the connection suspended: copies the request and routes it; the route
    /// answers through the responder now or later, from any thread.
    func serve(_ exchange: OpaquePointer, _ view: siwa_http_request_view) {
        let request = makeRequest(exchange, view)  // stamped receivedAt: now
        route(request, HTTPResponder(exchange, request: request, dispatcher: self))
    }

    private func makeRequest(_ exchange: OpaquePointer, _ view: siwa_http_request_view) -> HTTPRequest {
        var fields: [HTTPHeaders.Field] = []
        withUnsafeMutablePointer(to: &fields) { pointer in
            siwa_http_each_header(exchange, collectHeader, pointer)
        }
        var query: String?
        if let rawURI = view.raw_uri {
            let uri = String(cString: rawURI)
            if let mark = uri.firstIndex(of: "?") {
                query = String(uri[uri.index(after: mark)...])
            }
        }
        var body: [UInt8] = []
        if let bytes = view.body, view.body_length > 0 {
            body = Array(UnsafeBufferPointer(start: bytes, count: view.body_length))
        }
        // INET6_ADDRSTRLEN is 46: 64 bytes hold any numeric address and its terminator.
        let address = withUnsafeTemporaryAllocation(of: CChar.self, capacity: 64) { buffer in
            siwa_http_remote_address(exchange, buffer.baseAddress, buffer.count)
            return String(cString: buffer.baseAddress!)
        }
        return HTTPRequest(
            method: view.method.map { String(cString: $0) } ?? "",
            path: view.path.map { String(cString: $0) } ?? "/",
            query: query,
            headers: HTTPHeaders(fields: fields),
            body: body,
            remoteAddress: address)
    }

    func send(_ response: HTTPResponse, on exchange: OpaquePointer) -> Int32 {
        var block: [UInt8] = []
        var count = 0
        for field in response.headers where Self.isSendable(field) {
            block.append(contentsOf: field.name.utf8)
            block.append(0)
            block.append(contentsOf: field.value.utf8)
            block.append(0)
            count += 1
        }
        let status = (100...999).contains(response.status) ? UInt32(response.status) : 500
        return block.withUnsafeBufferPointer { headers in
            response.body.withUnsafeBufferPointer { body in
                headers.withMemoryRebound(to: CChar.self) { names in
                    siwa_http_respond(
                        exchange, status, names.baseAddress, count, body.baseAddress, body.count)
                }
            }
        }
    }

    /// Drops fields that could split the response or that the server computes itself.
    private static func isSendable(_ field: HTTPHeaders.Field) -> Bool {
        func forbidden(_ byte: UInt8) -> Bool { byte == 0 || byte == 10 || byte == 13 }
        guard !field.name.isEmpty,
            !field.name.utf8.contains(where: { forbidden($0) || $0 == 58 || $0 == 32 }),
            !field.value.utf8.contains(where: forbidden)
        else { return false }
        return !field.name.utf8.elementsEqual("content-length".utf8, by: Self.sameLetter)
            && !field.name.utf8.elementsEqual("transfer-encoding".utf8, by: Self.sameLetter)
    }

    /// ASCII case-insensitive equality of a byte with a lowercase one.
    private static func sameLetter(_ byte: UInt8, _ lowercase: UInt8) -> Bool {
        (byte >= 65 && byte <= 90 ? byte + 32 : byte) == lowercase
    }
}

/// The C entry point for complete requests; `context` is the server's `Dispatcher`.
private func handleRequest(
    _ context: UnsafeMutableRawPointer?, _ exchange: OpaquePointer?,
    _ view: UnsafePointer<siwa_http_request_view>?
) -> Int32 {
    guard let context, let exchange, let view else { return 0 }
    let dispatcher = Unmanaged<Dispatcher>.fromOpaque(context).takeUnretainedValue()
    dispatcher.serve(exchange, view.pointee)
    return 1
}

/// The C entry point for the framing check; `context` is the server's `Dispatcher`. Returns the answer
/// to send at once (a static ``CannedResponse``), or `nil` to go on.
private func checkFraming(
    _ context: UnsafeMutableRawPointer?, _ exchange: OpaquePointer?, _ version: UnsafePointer<CChar>?
) -> UnsafePointer<siwa_http_canned_response>? {
    guard let context, let exchange else { return UnsafePointer(ServerAnswers.badRequest.pointer) }
    let dispatcher = Unmanaged<Dispatcher>.fromOpaque(context).takeUnretainedValue()
    let refusal = dispatcher.checkFraming(exchange, version: version.map { String(cString: $0) } ?? "")
    return refusal.map { UnsafePointer($0.pointer) }
}

/// The C callback for one request header; `context` points at the `[HTTPHeaders.Field]` being filled.
private func scanFramingHeader(
    _ context: UnsafeMutableRawPointer?, _ name: UnsafePointer<CChar>?, _ nameLength: Int,
    _ value: UnsafePointer<CChar>?, _ valueLength: Int
) {
    guard let context, let name else { return }
    let scan = context.assumingMemoryBound(to: HTTPFraming.Scan.self)
    let nameBytes = UnsafeRawBufferPointer(start: name, count: nameLength).bindMemory(to: UInt8.self)
    let valueBytes =
        value.map { UnsafeRawBufferPointer(start: $0, count: valueLength).bindMemory(to: UInt8.self) }
        ?? UnsafeBufferPointer(start: nil, count: 0)
    scan.pointee.add(name: nameBytes, value: valueBytes)
}

private func collectHeader(
    _ context: UnsafeMutableRawPointer?, _ name: UnsafePointer<CChar>?, _ nameLength: Int,
    _ value: UnsafePointer<CChar>?, _ valueLength: Int
) {
    guard let context, let name else { return }
    let fields = context.assumingMemoryBound(to: [HTTPHeaders.Field].self)
    let nameText = String(decoding: UnsafeRawBufferPointer(start: name, count: nameLength), as: UTF8.self)
    let valueText =
        value.map { String(decoding: UnsafeRawBufferPointer(start: $0, count: valueLength), as: UTF8.self) }
        ?? ""
    fields.pointee.append(HTTPHeaders.Field(name: nameText, value: valueText))
}
