import Dispatch
import Foundation
import Synchronization

/// Waits for SIGTERM or SIGINT, the signals that ask a service to stop gracefully.
///
/// Create it before starting work (it ignores the default disposition of both signals at once, so a
/// signal arriving early is not lost), then call ``wait()`` from the main thread or hand it to a
/// ``ServiceGroup``.
public final class TerminationSignals: Sendable {
    private let state = SignalState()
    private let sources: SignalSources

    public init() {
        signal(SIGPIPE, SIG_IGN)
        var sources: [any DispatchSourceSignal] = []
        let state = state
        for number in [SIGTERM, SIGINT] {
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { state.receive(number) }
            source.resume()
            sources.append(source)
        }
        self.sources = SignalSources(sources)
    }

    /// Blocks until SIGTERM or SIGINT arrives; returns the signal's name.
    @discardableResult
    public func wait() -> String {
        state.semaphore.wait()
        state.semaphore.signal()  // later waits return at once too
        return Self.name(of: state.received ?? SIGTERM)
    }

    /// Blocks until a signal arrives or `timeout` passes; returns whether a signal arrived.
    public func wait(timeout: Duration) -> Bool {
        guard state.semaphore.wait(timeout: .now() + timeout.dispatchInterval) == .success else {
            return false
        }
        state.semaphore.signal()
        return true
    }

    /// Calls `handler` with the signal's name when the first SIGTERM or SIGINT arrives (at once, if one
    /// already has). Runs on a background queue; must not block.
    public func onSignal(_ handler: @escaping @Sendable (String) -> Void) {
        if let received = state.add(handler) { handler(Self.name(of: received)) }
    }

    static func name(of number: Int32) -> String {
        number == SIGINT ? "SIGINT" : "SIGTERM"
    }

    deinit {
        sources.cancel()
    }
}

/// The first signal received and who wants to hear of it.
private final class SignalState: Sendable {
    let semaphore = DispatchSemaphore(value: 0)
    private let mutex = Mutex<(received: Int32?, handlers: [@Sendable (String) -> Void])>((nil, []))

    var received: Int32? { mutex.withLock { $0.received } }

    func receive(_ number: Int32) {
        let handlers = mutex.withLock { state -> [@Sendable (String) -> Void]? in
            guard state.received == nil else { return nil }  // the first signal decides
            state.received = number
            return state.handlers
        }
        guard let handlers else { return }
        for handler in handlers { handler(TerminationSignals.name(of: number)) }
        semaphore.signal()
    }

    /// Adds `handler` unless a signal was already received; returns that signal.
    func add(_ handler: @escaping @Sendable (String) -> Void) -> Int32? {
        mutex.withLock { state in
            if state.received == nil { state.handlers.append(handler) }
            return state.received
        }
    }
}

// @unchecked: `sources` is a `let` never changed after init, and DispatchSource's `cancel` is
// thread-safe; the protocol existential is just not marked Sendable.
private final class SignalSources: @unchecked Sendable {
    private let sources: [any DispatchSourceSignal]  // immutable after init
    init(_ sources: [any DispatchSourceSignal]) { self.sources = sources }
    func cancel() { for source in sources { source.cancel() } }
}

/// One part of a process that a ``ServiceGroup`` starts and stops: an HTTP server, the receiver, a
/// worker loop.
///
/// Every service promises that its `stop` returns only once every thread it started has ended, so
/// that nothing of ours still runs when the process exits.
public struct Service: Sendable {
    enum Body: Sendable {
        case background(start: @Sendable () throws -> Void, stop: @Sendable () -> Void)
        case task(run: @Sendable () throws -> Void, stop: @Sendable () -> Void)
    }

    /// The name used in logs.
    public let name: String
    let body: Body

    /// A service that runs on threads of its own once started, until stopped (an HTTP server).
    ///
    /// - Parameters:
    ///   - start: returns once the service serves (e.g. its port is bound); throws when it cannot start,
    ///     and then must leave nothing running.
    ///   - stop: stops gracefully and returns once every thread the service started has ended.
    public static func background(
        _ name: String, start: @escaping @Sendable () throws -> Void, stop: @escaping @Sendable () -> Void
    ) -> Service {
        Service(name: name, body: .background(start: start, stop: stop))
    }

    /// Work the group runs on a thread it starts and joins (a worker loop, a one-off drain).
    ///
    /// - Parameters:
    ///   - run: blocks until the work ends by itself or `stop` asks it to; a throw is a failure. Either
    ///     way the whole group stops (see ``ServiceGroup``).
    ///   - stop: asks `run` to return soon; called from another thread, perhaps before `run` starts.
    public static func task(
        _ name: String, run: @escaping @Sendable () throws -> Void, stop: @escaping @Sendable () -> Void
    ) -> Service {
        Service(name: name, body: .task(run: run, stop: stop))
    }
}

/// Runs a process's services: starts them in order, waits, and stops them in reverse order.
///
/// The policy, in one place:
/// - services start in the order given; one that fails to start stops those already started;
/// - the group stops on the first of: SIGTERM or SIGINT, a task returning, a task throwing;
/// - stopping goes in reverse order, each service's `stop` returning (and a task's thread joined) before
///   the next service is stopped, so when ``run()`` returns none of the services' threads runs;
/// - ``Outcome/exitStatus`` maps the reason to the process's exit status: 0 after a signal or a task
///   that finished, 1 after a failure.
public final class ServiceGroup: Sendable {
    /// Why the group stopped.
    public enum Outcome: Sendable, CustomStringConvertible {
        /// SIGTERM or SIGINT arrived (its name).
        case signal(String)
        /// The named task returned by itself.
        case finished(service: String)
        /// The named task threw.
        case failed(service: String, error: any Error)
        /// The named service could not start.
        case startFailed(service: String, error: any Error)

        /// The exit status this outcome calls for: 0 for a signal or a finished task, 1 for a failure.
        public var exitStatus: Int32 {
            switch self {
            case .signal, .finished: 0
            case .failed, .startFailed: 1
            }
        }

        public var description: String {
            switch self {
            case .signal(let name): "signal \(name)"
            case .finished(let service): "\(service) finished"
            case .failed(let service, let error): "\(service) failed: \(error)"
            case .startFailed(let service, let error): "\(service) could not start: \(error)"
            }
        }
    }

    private let services: [Service]
    private let signals: TerminationSignals?
    private let logger: Logger
    private let outcome = Mutex<Outcome?>(nil)
    private let decided = DispatchSemaphore(value: 0)

    /// - Parameters:
    ///   - services: started in this order, stopped in the reverse order.
    ///   - signals: SIGTERM/SIGINT stop the group (create it early, before any work, so none is lost);
    ///     `nil` for a group stopped only by ``stop()`` or its tasks.
    public init(_ services: [Service], signals: TerminationSignals?, logger: Logger) {
        self.services = services
        self.signals = signals
        self.logger = logger
    }

    /// Asks a running group to stop, as SIGTERM would (an outcome already decided stands).
    public func stop() {
        decide(.signal("stop"))
    }

    /// Starts the services, blocks until the group must stop, stops every service started, and returns why.
    public func run() -> Outcome {
        signals?.onSignal { [self] name in decide(.signal(name)) }
        var started: [(Service, JoinableThread?)] = []
        for service in services {
            if outcome.withLock({ $0 != nil }) { break }  // a signal during start-up: start no more
            switch service.body {
            case .background(let start, _):
                do {
                    try start()
                    started.append((service, nil))
                } catch {
                    decide(.startFailed(service: service.name, error: error))
                }
            case .task(let run, _):
                let name = service.name
                let thread = JoinableThread(name: name) { [self] in
                    do {
                        try run()
                        decide(.finished(service: name))
                    } catch {
                        decide(.failed(service: name, error: error))
                    }
                }
                started.append((service, thread))
            }
        }
        decided.wait()
        let outcome = outcome.withLock { $0! }
        switch outcome {
        case .signal(let name): logger.info("shutting down", ["signal": .string(name)])
        case .finished(let service): logger.info("shutting down", ["finished": .string(service)])
        case .failed(let service, let error), .startFailed(let service, let error):
            logger.error(
                "shutting down after a failure",
                ["service": .string(service), "error": .string(String(describing: error))])
        }
        for (service, thread) in started.reversed() {
            switch service.body {
            case .background(_, let stop): stop()
            case .task(_, let stop): stop()
            }
            thread?.join()
        }
        return outcome
    }

    private func decide(_ candidate: Outcome) {
        let first = outcome.withLock { outcome in
            guard outcome == nil else { return false }
            outcome = candidate
            return true
        }
        if first { decided.signal() }
    }
}

/// Ends the process with `status` once its services have stopped: flushes standard output and error,
/// then calls `_exit`.
///
/// `exit` would run `atexit` handlers (OpenSSL's cleanup among them) and destructors while threads we
/// do not own — libcurl's and OpenSSL's inside FoundationNetworking, Dispatch's — may still be using
/// them; that raced into `double free or corruption` crashes after a clean shutdown. Our own threads
/// have all been joined by then, and nothing we write is left in a buffer.
public func terminateProcess(status: Int32) -> Never {
    fflush(nil)
    _exit(status)
}
