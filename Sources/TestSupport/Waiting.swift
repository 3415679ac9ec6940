import Foundation

/// Polls `condition` every 10 ms until it holds (true) or `timeout` passes (false, after one last look).
///
/// The way tests wait for something to happen: on a condition, with a deadline, never a fixed sleep.
public func waitUntil(timeout: Duration = .seconds(10), _ condition: () throws -> Bool) rethrows -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try condition() { return true }
        Thread.sleep(forTimeInterval: 0.01)  // the poll interval of a bounded wait
    }
    return try condition()
}
