import Foundation
import Postgres
import ServiceSupport
import Synchronization

/// Wakes long polls when `siwa_ssf` is notified (a SET was enqueued or a stream enabled): one thread
/// with its own LISTEN connection bumps a generation that waiting polls compare with theirs.
// @unchecked: the condition guards `count` and `stopped`; the thread handle is set once in start().
final class PollWaker: @unchecked Sendable {
    private let database: PostgresConfiguration
    private let logger: Logger
    private let condition = NSCondition()
    private var count: UInt64 = 0
    private var stopped = false
    private var waitingCount = 0
    private var thread: JoinableThread?

    init(database: PostgresConfiguration, logger: Logger) {
        self.database = database
        self.logger = logger
    }

    /// The number of wake-ups so far.
    var generation: UInt64 {
        condition.lock()
        defer { condition.unlock() }
        return count
    }

    /// Long polls waiting now.
    var waiting: Int {
        condition.lock()
        defer { condition.unlock() }
        return waitingCount
    }

    var isStopped: Bool {
        condition.lock()
        defer { condition.unlock() }
        return stopped
    }

    /// Waits until the generation passes `seen` (true) or `deadline` passes or the waker stops (false).
    func wait(after seen: UInt64, until deadline: ContinuousClock.Instant) -> Bool {
        condition.lock()
        waitingCount += 1
        defer {
            waitingCount -= 1
            condition.unlock()
        }
        while count == seen && !stopped {
            let left = deadline - ContinuousClock.now
            guard left > .zero else { return false }
            _ = condition.wait(until: Date(timeIntervalSinceNow: min(left.inSeconds, 1)))
        }
        return count != seen
    }

    func start() {
        thread = JoinableThread(name: "siwa-ssf-poll-waker") { [self] in run() }
    }

    func stop() {
        condition.lock()
        stopped = true
        condition.broadcast()
        condition.unlock()
        thread?.join()
    }

    private func bump() {
        condition.lock()
        count &+= 1
        condition.broadcast()
        condition.unlock()
    }

    private func run() {
        var connection: PostgresConnection?
        while !isStopped {
            do {
                if connection == nil {
                    connection = try PostgresConnection.listening(on: "siwa_ssf", configuration: database)
                    bump()  // anything enqueued while not listening is looked for again
                }
                if try !(connection?.waitForNotifications(timeout: .milliseconds(500)) ?? []).isEmpty {
                    bump()
                }
            } catch {
                logger.warning("shared signals poll waker: database failure; connecting again")
                connection?.close()
                connection = nil
                bump()
                condition.lock()
                _ = condition.wait(until: Date(timeIntervalSinceNow: 1))
                condition.unlock()
            }
        }
        connection?.close()
    }
}
