import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// One stop signal for a consumer's threads: ``stop()`` wakes every sleeper at once, whether it sleeps
/// in ``sleep(_:)`` or in a `poll()` of its own on ``wakeDescriptor`` (a LISTEN connection's wait).
///
/// The state (stopped or not) lives behind a `Mutex`; the wake-up is a pipe whose read end becomes
/// readable, for good, when the signal is given, so a thread blocked in `poll()` on its database
/// socket and on this descriptor returns at once instead of noticing a flag at its next 50 ms tick. A
/// signal is given once and never taken back: a consumer started again gets a new one.
public final class StopSignal: Sendable {
    private let stopped = Mutex<Bool>(false)
    private let readEnd: Int32
    private let writeEnd: Int32

    /// A signal not given yet.
    public init() {
        var descriptors: [Int32] = [-1, -1]
        guard pipe(&descriptors) == 0 else {
            fatalError("pipe() failed: \(String(cString: strerror(errno)))")
        }
        for descriptor in descriptors { _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC) }
        readEnd = descriptors[0]
        writeEnd = descriptors[1]
    }

    deinit {
        close(readEnd)
        close(writeEnd)
    }

    /// Gives the signal: every sleeper wakes now, later sleeps return at once. Safe from any thread.
    public func stop() {
        let first = stopped.withLock { stopped in
            defer { stopped = true }
            return !stopped
        }
        if first {
            var byte: UInt8 = 1
            _ = write(writeEnd, &byte, 1)
        }
    }

    /// Whether ``stop()`` was called.
    public var isStopped: Bool { stopped.withLock { $0 } }

    /// Readable once the signal is given (never read from: it stays readable). For a `poll()` that also
    /// waits on something else.
    public var wakeDescriptor: Int32 { readEnd }

    /// Sleeps for `duration` or until the signal is given, whichever comes first; returns whether the
    /// signal is still not given.
    @discardableResult
    public func sleep(_ duration: Duration) -> Bool {
        let deadline = ContinuousClock.now + duration
        while !isStopped {
            let remaining = deadline - ContinuousClock.now
            if remaining <= .zero { return true }
            var descriptor = pollfd(fd: readEnd, events: Int16(POLLIN), revents: 0)
            _ = poll(&descriptor, 1, Int32(clamping: max(remaining.wholeMilliseconds, 1)))
        }
        return false
    }
}

/// The reconnect delay of every consumer: 100 ms doubling to 5 s, each delay drawn from
/// [½ × d, d] so that consumers that lost the database together do not come back in step.
public struct Backoff: Sendable, Equatable {
    /// The first delay's upper bound.
    public var initial: Duration
    /// The largest delay.
    public var maximum: Duration
    /// Failures in a row since the last ``reset()``.
    public private(set) var failures = 0

    /// A backoff, 100 ms → 5 s unless told otherwise.
    public init(initial: Duration = .milliseconds(100), maximum: Duration = .seconds(5)) {
        self.initial = initial
        self.maximum = max(maximum, initial)
    }

    /// The delay before the next try after one more failure; `jitter` in [0, 1) picks where in
    /// [½ × d, d] it falls (d = initial × 2^(failures − 1), at most the maximum).
    public mutating func next(jitter: Double) -> Duration {
        failures += 1
        var ceiling = initial
        for _ in 1..<min(failures, 32) where ceiling < maximum { ceiling = ceiling * 2 }
        ceiling = min(ceiling, maximum)
        return ceiling * (0.5 + 0.5 * min(max(jitter, 0), 1))
    }

    /// After a success: the next failure starts at ``initial`` again.
    public mutating func reset() { failures = 0 }
}

/// A deadline that comes back every `interval` (a sweep, a heartbeat, a prune): due at once, then
/// `interval` after each time it was taken.
public struct Every: Sendable, Equatable {
    /// How often.
    public var interval: Duration
    /// When it was last taken (nil: never, so due now).
    public private(set) var last: ContinuousClock.Instant?

    /// Due at once, then every `interval`.
    public init(_ interval: Duration) { self.interval = interval }

    /// Whether it is due at `now`; if so, it is taken (the next one is `interval` later).
    public mutating func take(now: ContinuousClock.Instant) -> Bool {
        guard remaining(now: now) <= .zero else { return false }
        last = now
        return true
    }

    /// How long until it is due (zero or less: due).
    public func remaining(now: ContinuousClock.Instant) -> Duration {
        guard let last else { return .zero }
        return last + interval - now
    }
}
