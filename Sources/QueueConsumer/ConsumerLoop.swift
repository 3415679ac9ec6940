public import ServiceSupport

/// The bookkeeping of one consumer loop, without I/O: what to do next, given what just happened.
///
/// connect → drain → wait (a NOTIFY, the next due row or the poll interval, whichever is first) →
/// drain …; any failure → backoff (``Backoff``) → connect. In `once` mode the first drain (or
/// failure) ends it. Tested without sockets; ``ConsumerLoop`` performs the actions.
public struct ConsumerLoopState: Sendable, Equatable {
    /// What the loop does next.
    public enum Action: Sendable, Equatable {
        /// Open a connection (and LISTEN).
        case connect
        /// Handle what is due now.
        case drain
        /// Wait for a NOTIFY, at most this long.
        case wait(Duration)
        /// Close the connection and sleep this long before connecting again.
        case backoff(Duration)
        /// Return.
        case stop
    }

    /// Where the loop is.
    public enum Phase: Sendable, Equatable {
        case idle, connecting, draining, waiting, backingOff, stopped
    }

    /// The longest wait between drains.
    public let pollInterval: Duration
    /// The shortest wait for a row due soon (so a due time in the past does not spin).
    public let minimumWait: Duration
    /// Whether one drain ends the loop.
    public let once: Bool
    /// The reconnect delays.
    public private(set) var backoff: Backoff
    /// Where the loop is.
    public private(set) var phase: Phase = .idle

    /// A loop's state before it starts.
    public init(
        pollInterval: Duration, backoff: Backoff = Backoff(), once: Bool = false,
        minimumWait: Duration = .milliseconds(5)
    ) {
        self.pollInterval = pollInterval
        self.backoff = backoff
        self.once = once
        self.minimumWait = minimumWait
    }

    /// The first action.
    public mutating func start() -> Action {
        phase = .connecting
        return .connect
    }

    /// A connection is open: drain; the backoff starts over.
    public mutating func connected() -> Action {
        guard phase != .stopped else { return .stop }
        backoff.reset()
        phase = .draining
        return .drain
    }

    /// A drain ended; `nextDue` is how soon the first row not yet due becomes due (nil: none known).
    public mutating func drained(nextDue: Duration?) -> Action {
        guard phase != .stopped, !once else { return stopRequested() }
        var wait = pollInterval
        if let nextDue { wait = min(wait, max(nextDue, minimumWait)) }
        phase = .waiting
        return .wait(wait)
    }

    /// A wait ended (a NOTIFY or its time): drain again.
    public mutating func woke() -> Action {
        guard phase != .stopped else { return .stop }
        phase = .draining
        return .drain
    }

    /// Connecting, draining or waiting failed; `jitter` in [0, 1) places the delay (see ``Backoff``).
    public mutating func failed(jitter: Double) -> Action {
        guard phase != .stopped, !once else { return stopRequested() }
        phase = .backingOff
        return .backoff(backoff.next(jitter: jitter))
    }

    /// The backoff's sleep ended: connect again.
    public mutating func backedOff() -> Action {
        guard phase != .stopped else { return .stop }
        phase = .connecting
        return .connect
    }

    /// The stop signal was given: stop, whatever the loop was doing.
    public mutating func stopRequested() -> Action {
        phase = .stopped
        return .stop
    }
}

/// One consumer loop: LISTEN, drain, wait for whichever comes first of a NOTIFY, the next due row or
/// the poll interval; reconnect with one ``Backoff``; stop at once on a ``StopSignal``.
///
/// The loop is generic over its connection so that this module need not know the database: the
/// consumer gives `connect` (open and LISTEN), `drain` (handle what is due now, claim by claim, never
/// retrying within one drain what it just tried; return how soon the next row is due), `wait` (block
/// on the connection until a NOTIFY, the time given or the stop signal's ``StopSignal/wakeDescriptor``)
/// and `close`. Runs on the calling thread (start it on a ``JoinableThread``).
public struct ConsumerLoop<Connection> {
    /// Bookkeeping (see ``ConsumerLoopState``).
    public var state: ConsumerLoopState
    /// The stop signal that ends ``run()``.
    public let stop: StopSignal
    /// Opens a connection (and LISTENs).
    public var connect: () throws -> Connection
    /// Handles what is due now; returns how soon the next row is due (nil: none known).
    public var drain: (Connection) throws -> Duration?
    /// Waits for a NOTIFY, at most the given time, returning early when the stop signal is given.
    public var wait: (Connection, Duration) throws -> Void
    /// Closes a connection (after a failure, and at the end).
    public var close: (Connection) -> Void
    /// Told of each failure and the delay before the next try (for the log and metrics).
    public var failed: (any Error, Duration) -> Void
    /// Where jitter comes from (tests make it fixed).
    public var jitter: () -> Double = { Double.random(in: 0..<1) }

    /// A loop; nothing runs until ``run()``.
    public init(
        state: ConsumerLoopState, stop: StopSignal, connect: @escaping () throws -> Connection,
        drain: @escaping (Connection) throws -> Duration?,
        wait: @escaping (Connection, Duration) throws -> Void,
        close: @escaping (Connection) -> Void, failed: @escaping (any Error, Duration) -> Void
    ) {
        self.state = state
        self.stop = stop
        self.connect = connect
        self.drain = drain
        self.wait = wait
        self.close = close
        self.failed = failed
    }

    /// Runs until the stop signal (or, in `once` mode, one drain). In `once` mode a failure is thrown;
    /// otherwise it is reported to `failed` and the loop reconnects after the backoff.
    public mutating func run() throws {
        var connection: Connection?
        defer { if let connection { close(connection) } }
        var action = state.start()
        while true {
            if stop.isStopped { action = state.stopRequested() }
            do {
                switch action {
                case .stop:
                    return
                case .connect:
                    connection = try connect()
                    action = state.connected()
                case .drain:
                    guard let open = connection else { action = state.backedOff(); continue }
                    action = state.drained(nextDue: try drain(open))
                case .wait(let duration):
                    guard let open = connection else { action = state.backedOff(); continue }
                    try wait(open, duration)
                    action = state.woke()
                case .backoff(let duration):
                    stop.sleep(duration)
                    action = state.backedOff()
                }
            } catch {
                if let open = connection { close(open) }
                connection = nil
                if state.once { throw error }
                action = state.failed(jitter: jitter())
                if case .backoff(let duration) = action { failed(error, duration) }
            }
        }
    }
}
