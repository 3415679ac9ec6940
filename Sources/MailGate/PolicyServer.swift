import Foundation
public import ServiceSupport
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// The Postfix policy delegation listener: TCP, one thread per connection, at most
/// ``Configuration/maximumConnections`` of them.
///
/// A thread per connection because each request waits (on the cache or a lookup ticket) before its
/// answer and smtpd sends the next only after it: a blocking read-decide-write loop is the protocol's own
/// shape, and a few hundred mostly idle threads cost address space, not CPU. Connections over the bound
/// are closed at once (Postfix then applies its `default_action`).
public final class PolicyServer: Sendable {
    /// Where it listens and what it tolerates.
    public struct Configuration: Sendable {
        /// A numeric IPv4/IPv6 address, or `localhost` (127.0.0.1).
        public var host: String
        /// The port; 0 lets the kernel choose (read ``PolicyServer/address`` after start).
        public var port: Int
        /// The most connections served at once.
        public var maximumConnections: Int
        /// A connection idle this long between requests is closed (Postfix reconnects).
        public var idleTimeout: Duration
        /// At shutdown, how long a request already begun may take to arrive and be answered.
        public var shutdownGrace: Duration
        /// The most bytes and attribute lines of one request.
        public var maximumRequestBytes: Int
        public var maximumAttributes: Int

        public init(
            host: String = "127.0.0.1", port: Int = 10_033, maximumConnections: Int = 512,
            idleTimeout: Duration = .seconds(300), shutdownGrace: Duration = .seconds(5),
            maximumRequestBytes: Int = 64 * 1024, maximumAttributes: Int = 200
        ) {
            self.host = host
            self.port = port
            self.maximumConnections = maximumConnections
            self.idleTimeout = idleTimeout
            self.shutdownGrace = shutdownGrace
            self.maximumRequestBytes = maximumRequestBytes
            self.maximumAttributes = maximumAttributes
        }
    }

    /// Answers one request with its `action=` value; may block (up to the decision deadline).
    public typealias Answer = @Sendable (PolicyRequest) -> String

    public let configuration: Configuration
    private let answer: Answer
    private let metrics: MailGateMetrics
    private let logger: Logger

    private struct State {
        var listener: Int32 = -1
        var address: String?
        var acceptThread: JoinableThread?
        var connections: [Int: JoinableThread] = [:]
        var finished: [Int] = []
        var nextID = 0
        var active = 0
    }

    private let state = Mutex(State())
    /// Readable once shutdown starts (a byte written, never read): wakes every poll at once.
    private let wake: (read: Int32, write: Int32)

    public init(
        configuration: Configuration, metrics: MailGateMetrics, logger: Logger, answer: @escaping Answer
    ) {
        self.configuration = configuration
        self.metrics = metrics
        self.logger = logger
        self.answer = answer
        var fds: [Int32] = [-1, -1]
        precondition(pipe(&fds) == 0, "pipe failed")
        for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        wake = (fds[0], fds[1])
    }

    deinit {
        close(wake.read)
        close(wake.write)
    }

    /// The bound `HOST:PORT`, once started.
    public var address: String? { state.withLock { $0.address } }

    /// Binds and listens, then accepts on a thread of its own.
    /// - Throws: ``MailGateError`` (`listenFailed`) naming the address and the system's reason.
    public func start() throws(MailGateError) {
        let (fd, bound) = try Self.listen(host: configuration.host, port: configuration.port)
        state.withLock { state in
            state.listener = fd
            state.address = bound
            state.acceptThread = JoinableThread(name: "mailgate-accept") { [self] in acceptLoop(fd) }
        }
        logger.info("policy service listening", ["address": .string(bound)])
    }

    /// Stops accepting, lets every connection finish the request it is in (within the grace period), and
    /// returns once every connection's thread has ended.
    public func shutdown() {
        var byte: UInt8 = 1
        _ = write(wake.write, &byte, 1)
        let accept = state.withLock { $0.acceptThread }
        accept?.join()
        let (listener, connections) = state.withLock { state in
            defer {
                state.listener = -1
                state.connections = [:]
            }
            return (state.listener, Array(state.connections.values))
        }
        for thread in connections { thread.join() }
        if listener >= 0 { close(listener) }
    }

    private func acceptLoop(_ listener: Int32) {
        var fds = [
            pollfd(fd: listener, events: Int16(POLLIN), revents: 0),
            pollfd(fd: wake.read, events: Int16(POLLIN), revents: 0),
        ]
        while true {
            reapFinished()
            fds[0].revents = 0
            fds[1].revents = 0
            let ready = poll(&fds, 2, -1)
            if ready < 0 && errno == EINTR { continue }
            if fds[1].revents != 0 || ready < 0 { return }
            let client = accept(listener, nil, nil)
            guard client >= 0 else {
                // Out of descriptors (EMFILE, ENFILE): the listener stays readable, so wait a little
                // (woken at once by shutdown) instead of spinning.
                if errno == EMFILE || errno == ENFILE { _ = poll(&fds[1], 1, 100) }
                continue
            }
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            var on: Int32 = 1
            _ = setsockopt(client, Int32(IPPROTO_TCP), TCP_NODELAY, &on, socklen_t(4))
            let remote = Self.peer(of: client)
            let admitted = state.withLock { state -> Int? in
                guard state.active < configuration.maximumConnections else { return nil }
                state.active += 1
                state.nextID += 1
                return state.nextID
            }
            guard let id = admitted else {
                metrics.policyRefused("connection_limit")  // counted before the peer can see the close
                close(client)
                logger.warning(
                    "policy connection refused: at the connection limit",
                    ["remote": .string(remote), "limit": .int(configuration.maximumConnections)])
                continue
            }
            metrics.policyConnectionsAccepted.increment()
            metrics.policyConnections.increment()
            let thread = JoinableThread(name: "mailgate-conn") { [self] in
                serve(client, remote: remote)
                close(client)
                metrics.policyConnections.decrement()
                state.withLock { state in
                    state.active -= 1
                    state.finished.append(id)
                }
            }
            state.withLock { $0.connections[id] = thread }
        }
    }

    /// Joins the threads of connections that ended.
    private func reapFinished() {
        let done = state.withLock { state -> [JoinableThread] in
            // A thread may end before the accept loop has recorded it: its id waits for the next round.
            let (known, early) = (
                state.finished.filter { state.connections[$0] != nil },
                state.finished.filter { state.connections[$0] == nil }
            )
            state.finished = early
            return known.compactMap { state.connections.removeValue(forKey: $0) }
        }
        for thread in done { thread.join() }
    }

    /// The request loop of one connection: read until a request is complete, answer it, repeat.
    private func serve(_ fd: Int32, remote: String) {
        var reader = PolicyReader(
            maximumBytes: configuration.maximumRequestBytes,
            maximumAttributes: configuration.maximumAttributes)
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        var stopDeadline: ContinuousClock.Instant?
        while true {
            while let next = reader.next() {
                switch next {
                case .success(let request):
                    let started = ContinuousClock.now
                    let action = answer(request)
                    // Counted before it is sent: whoever has the answer sees it counted.
                    metrics.policySeconds.observe((ContinuousClock.now - started).inSeconds)
                    metrics.policyAnswered(state: request.protocolState, action: action)
                    guard send(fd, "action=\(action)\n\n") else { return }
                case .failure(let refusal):
                    metrics.policyRefused(refusal.rawValue)
                    logger.warning(
                        "policy request refused, connection closed without an answer",
                        ["reason": .string(refusal.rawValue), "remote": .string(remote)])
                    return
                }
            }
            if stopDeadline != nil && reader.isIdle { return }
            let now = ContinuousClock.now
            let timeout = stopDeadline.map { $0 - now } ?? configuration.idleTimeout
            guard timeout > .zero else { return }
            var fds = [
                pollfd(fd: fd, events: Int16(POLLIN), revents: 0),
                pollfd(fd: wake.read, events: Int16(POLLIN), revents: 0),
            ]
            let ready = poll(&fds, stopDeadline == nil ? 2 : 1, Int32(min(timeout.inSeconds * 1000 + 1, 1e9)))
            if ready < 0 {
                if errno == EINTR { continue }
                return
            }
            if ready == 0 { return }  // idle, or the grace period is over
            if stopDeadline == nil && fds[1].revents != 0 {
                stopDeadline = ContinuousClock.now + configuration.shutdownGrace
            }
            if fds[0].revents != 0 {
                let count = recv(fd, &buffer, buffer.count, 0)
                if count < 0 && errno == EINTR { continue }
                guard count > 0 else { return }  // closed by smtpd, or an error
                reader.feed(buffer[0..<count])
            }
        }
    }

    private func send(_ fd: Int32, _ text: String) -> Bool {
        var bytes = Array(text.utf8)[...]
        while !bytes.isEmpty {
            let written = bytes.withUnsafeBytes {
                Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            if written < 0 && errno == EINTR { continue }
            guard written > 0 else { return false }
            bytes = bytes.dropFirst(written)
        }
        return true
    }

    /// Binds and listens on `host:port`; returns the socket and the bound `HOST:PORT`.
    static func listen(host: String, port: Int) throws(MailGateError) -> (Int32, String) {
        let numeric = host.lowercased() == "localhost" ? "127.0.0.1" : host
        var hints = addrinfo()
        hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(numeric, String(port), &hints, &list) == 0, let info = list else {
            throw MailGateError(.listenFailed, "--policy-listen \(host):\(port): not a numeric address")
        }
        defer { freeaddrinfo(list) }
        let fd = socket(info.pointee.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw failure(host, port, "socket") }
        var on: Int32 = 1
        _ = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, socklen_t(4))
        guard bind(fd, info.pointee.ai_addr, info.pointee.ai_addrlen) == 0, Glibc.listen(fd, 511) == 0 else {
            let error = failure(host, port, "bind")
            close(fd)
            throw error
        }
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let boundPort = withUnsafeMutablePointer(to: &storage) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address -> Int in
                guard getsockname(fd, address, &length) == 0 else { return port }
                return Self.port(of: pointer)
            }
        }
        return (fd, ListenAddress(host: numeric, port: boundPort).description)
    }

    private static func failure(_ host: String, _ port: Int, _ call: String) -> MailGateError {
        MailGateError(
            .listenFailed,
            "--policy-listen \(ListenAddress(host: host, port: port)): \(call): \(String(cString: strerror(errno)))"
        )
    }

    private static func port(of storage: UnsafeMutablePointer<sockaddr_storage>) -> Int {
        if Int32(storage.pointee.ss_family) == AF_INET6 {
            return storage.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) {
                Int(UInt16(bigEndian: $0.pointee.sin6_port))
            }
        }
        return storage.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
            Int(UInt16(bigEndian: $0.pointee.sin_port))
        }
    }

    /// The peer's address as text, for logs.
    private static func peer(of fd: Int32) -> String {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        var host = [CChar](repeating: 0, count: Int(NI_MAXHOST))
        let ok = withUnsafeMutablePointer(to: &storage) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address in
                getpeername(fd, address, &length) == 0
                    && getnameinfo(address, length, &host, socklen_t(host.count), nil, 0, NI_NUMERICHOST) == 0
            }
        }
        return ok ? String(cString: host) : ""
    }
}
