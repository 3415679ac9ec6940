import Foundation
import ServiceSupport

/// A fixed set of threads running submitted jobs in arrival order from one shared queue.
///
/// Jobs may block; a queued job waits only for a free thread, never behind a particular job.
// @unchecked: every mutable property is read and written only while `condition` is locked (NSCondition
// predates Sendable checking; a Mutex cannot also be waited on).
final class HandlerPool: @unchecked Sendable {
    private let condition = NSCondition()
    // Guarded by `condition`.
    private var jobs: [@Sendable () -> Void] = []
    private var head = 0
    private var running = 0
    private var threads = 0
    private var stopping = false
    private var started: [JoinableThread] = []

    /// Starts `count` threads (once).
    func start(threads count: Int) {
        condition.lock()
        defer { condition.unlock() }
        guard threads == 0, started.isEmpty else { return }
        threads = count
        stopping = false
        for index in 0..<count {
            started.append(JoinableThread(name: "siwa-http-\(index)") { [self] in work() })
        }
    }

    /// Queues `job` for the next free thread.
    func submit(_ job: @escaping @Sendable () -> Void) {
        condition.lock()
        jobs.append(job)
        condition.signal()
        condition.unlock()
    }

    /// Blocks until no job is queued or running.
    func waitUntilIdle() {
        condition.lock()
        defer { condition.unlock() }
        while head < jobs.count || running > 0 { condition.wait() }
    }

    /// Lets the threads finish what is queued, then end.
    func stop() {
        condition.lock()
        stopping = true
        condition.broadcast()
        condition.unlock()
    }

    /// Stops (see ``stop()``) and returns once every thread has ended. Must not be called from a job.
    func stopAndJoin() {
        stop()
        condition.lock()
        let threads = started
        started = []
        condition.unlock()
        for thread in threads { thread.join() }
    }

    private func work() {
        condition.lock()
        while true {
            while head == jobs.count && !stopping { condition.wait() }
            if head == jobs.count {  // stopping, and nothing left
                threads -= 1
                condition.unlock()
                return
            }
            let job = jobs[head]
            head += 1
            if head == jobs.count {  // drained: drop the consumed prefix
                jobs.removeAll(keepingCapacity: true)
                head = 0
            }
            running += 1
            condition.unlock()
            job()
            condition.lock()
            running -= 1
            if running == 0 && head == jobs.count { condition.broadcast() }
        }
    }
}
