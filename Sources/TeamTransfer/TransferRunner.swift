import AppleID
public import Foundation
import ServiceSupport
import Synchronization

/// How a run calls Apple: the pace, the retries, when to stop, how often it reports progress.
public struct TransferPacing: Sendable {
    /// At most this many calls to Apple per second.
    public var rate: Double
    /// At most this many calls to Apple at once.
    public var concurrency: Int
    /// Calls per user per run on transient failures (429, 5xx, timeouts).
    public var maxAttempts: Int
    /// The first backoff after a transient failure, in seconds (doubles, jittered, at most 60).
    public var retryBaseDelay: Double
    /// Stop after this many calls to Apple (the next run resumes).
    public var stopAfter: Int?
    /// Seconds between progress lines.
    public var progressInterval: Double
    /// Ask again for users Apple refused in an earlier run.
    public var retryFailed: Bool
    /// When the app transfer completed: progress lines show the window's countdown.
    public var transferDate: Date?

    /// Pacing with siwactl's defaults.
    public init(
        rate: Double = 20, concurrency: Int = 4, maxAttempts: Int = 5, retryBaseDelay: Double = 1,
        stopAfter: Int? = nil, progressInterval: Double = 5, retryFailed: Bool = false,
        transferDate: Date? = nil
    ) {
        self.rate = rate
        self.concurrency = concurrency
        self.maxAttempts = maxAttempts
        self.retryBaseDelay = retryBaseDelay
        self.stopAfter = stopAfter
        self.progressInterval = progressInterval
        self.retryFailed = retryFailed
        self.transferDate = transferDate
    }
}

/// What one run of calls to Apple did.
public struct TransferTotals: Sendable, Equatable {
    /// Users Apple answered for.
    public var done: Int
    /// Users Apple refused for good (4xx).
    public var refused: Int
    /// Users still failing after this run's attempts (left pending for the next run).
    public var transient: Int
    /// Whether `TransferPacing.stopAfter` ended the run.
    public var stoppedEarly: Bool

    /// Totals as counted.
    public init(done: Int, refused: Int, transient: Int, stoppedEarly: Bool) {
        self.done = done
        self.refused = refused
        self.transient = transient
        self.stoppedEarly = stoppedEarly
    }
}

/// One call's outcome for one user.
enum TransferOutcome: Sendable {
    /// Apple answered: the transfer identifier (export) or the new user (import).
    case done(String, AppleIDClient.MigratedUser?)
    /// Apple refused for good (4xx): its error word and status.
    case refused(String, Int?)
    /// Still failing after this run's attempts (transient): the last error.
    case transient(String, Int?)
}

/// One user's result as recorded.
typealias TransferResult = (key: String, outcome: TransferOutcome, attempts: Int)

/// Calls Apple for many users: a shared access token (renewed on expiry or invalid_grant), a rate limit,
/// a bounded number of threads, retries with jittered backoff, results flushed to the database in
/// batches, progress lines with an estimate.
final class TransferRunner: Sendable {
    private struct State {
        var token: AppleIDClient.MigrationToken?
        var tokenAt = Date.distantPast
        var nextSlot = Date()
        var calls = 0
        var stopped = false
        var fatal: TeamTransferError?
    }

    private let client: AppleIDClient
    private let pacing: TransferPacing
    private let state = Mutex(State())
    /// Serialises token fetches (a fetch is a network call: never under `state`).
    private let tokenFetch = Mutex(())

    init(client: AppleIDClient, pacing: TransferPacing) {
        self.client = client
        self.pacing = pacing
    }

    /// A token, fetched when there is none, it is 50 minutes old, or `renew` (after invalid_grant).
    func accessToken(renew: AppleIDClient.MigrationToken? = nil) throws(AppleIDError)
        -> AppleIDClient.MigrationToken
    {
        func current() -> AppleIDClient.MigrationToken? {
            state.withLock { state in
                guard let token = state.token, Date().timeIntervalSince(state.tokenAt) < 3000,
                    renew == nil || renew!.accessToken != token.accessToken
                else { return nil }
                return token
            }
        }
        if let token = current() { return token }
        return try tokenFetch.withLock { _ throws(AppleIDError) -> AppleIDClient.MigrationToken in
            // Another thread may have fetched one while this one waited.
            if let token = current() { return token }
            let fresh = try client.migrationToken()
            state.withLock { state in
                state.token = fresh
                state.tokenAt = Date()
            }
            return fresh
        }
    }

    /// Waits for the next slot under the rate limit; false when the run is stopping.
    private func takeSlot() -> Bool {
        let slot: Date? = state.withLock { state in
            if state.stopped || state.fatal != nil { return nil }
            if let stopAfter = pacing.stopAfter, state.calls >= stopAfter {
                state.stopped = true
                return nil
            }
            state.calls += 1
            let slot = max(state.nextSlot, Date())
            state.nextSlot = slot.addingTimeInterval(1 / pacing.rate)
            return slot
        }
        guard let slot else { return false }
        let wait = slot.timeIntervalSinceNow
        if wait > 0 { Thread.sleep(forTimeInterval: wait) }
        return true
    }

    /// Whether `stopAfter` ended the run.
    var stoppedEarly: Bool { state.withLock { $0.stopped } }

    private func fail(_ failure: TeamTransferError) {
        state.withLock { state in
            if state.fatal == nil { state.fatal = failure }
        }
    }

    /// One user: calls `call` with retries; nil when the run stopped before an answer.
    private func attempt(
        _ call: (AppleIDClient.MigrationToken) throws(AppleIDError) -> TransferOutcome
    ) -> (TransferOutcome, Int)? {
        var attempts = 0
        var renewed = false
        var delay = pacing.retryBaseDelay
        var last: AppleIDError?
        while attempts < pacing.maxAttempts {
            guard takeSlot() else { return attempts == 0 ? nil : last.map { (Self.transient($0), attempts) } }
            attempts += 1
            do {
                let token = try accessToken()
                do {
                    return (try call(token), attempts)
                } catch  where error.code == .invalidGrant && !renewed {
                    // The access token expired (one hour) or was refused: a new one, once per user.
                    renewed = true
                    attempts -= 1
                    _ = try accessToken(renew: token)
                    continue
                }
            } catch {
                if error.code == .invalidClient || error.code == .configuration
                    || error.code == .unauthorizedClient
                    || error.code == .invalidScope
                {
                    // The credentials are wrong: every user would fail the same way.
                    fail(
                        TeamTransferError(
                            "Apple refused our credentials: \(error.appleError ?? error.code.rawValue)"))
                    return nil
                }
                guard error.isRetryable else {
                    return (.refused(error.appleError ?? error.code.rawValue, error.status), attempts)
                }
                last = error
                if attempts < pacing.maxAttempts {
                    Thread.sleep(forTimeInterval: delay * Double.random(in: 0.5...1.5))
                    delay = min(delay * 2, 60)
                }
            }
        }
        return last.map { (Self.transient($0), attempts) }
    }

    private static func transient(_ error: AppleIDError) -> TransferOutcome {
        .transient(error.appleError ?? error.code.rawValue, error.status)
    }

    /// Runs `call` for every key, `pacing.concurrency` at a time, handing results to `record` in
    /// batches (one batch at a time: `record` may use one database connection). Reports progress.
    func run(
        keys: [String], total: Int, alreadyDone: Int,
        progress: @escaping @Sendable (String) -> Void,
        call:
            @escaping @Sendable (String, AppleIDClient.MigrationToken) throws(AppleIDError) -> TransferOutcome,
        record: @escaping @Sendable ([TransferResult]) throws -> Void
    ) throws -> TransferTotals {
        let counts = RunState(keys: keys)
        let started = Date()
        let recording = Mutex(())
        let threads = (0..<min(pacing.concurrency, max(keys.count, 1))).map { _ in
            JoinableThread(name: "siwa-transfer") { [self] in
                var pending: [TransferResult] = []
                func flush() {
                    guard !pending.isEmpty else { return }
                    let batch = pending
                    pending = []
                    recording.withLock { _ in
                        do {
                            try record(batch)
                            counts.count(batch.map(\.outcome))
                        } catch {
                            fail(
                                error as? TeamTransferError
                                    ?? TeamTransferError("recording progress failed: \(error)"))
                        }
                    }
                }
                while let key = counts.next() {
                    guard
                        let (outcome, attempts) = attempt({ (token) throws(AppleIDError) in
                            try call(key, token)
                        })
                    else { break }
                    pending.append((key, outcome, attempts))
                    if pending.count >= 100 { flush() }
                }
                flush()
                counts.finishThread()
            }
        }
        var lastProgress = Date()
        while counts.waitForThreads(threads.count, timeout: 0.05) == false {
            if Date().timeIntervalSince(lastProgress) >= pacing.progressInterval {
                lastProgress = Date()
                progress(line(counts, total: total, alreadyDone: alreadyDone, started: started))
            }
        }
        for thread in threads { thread.join() }
        progress(line(counts, total: total, alreadyDone: alreadyDone, started: started))
        if let fatal = state.withLock({ $0.fatal }) { throw fatal }
        let (done, refused, transient) = counts.totals
        return TransferTotals(done: done, refused: refused, transient: transient, stoppedEarly: stoppedEarly)
    }

    private func line(_ counts: RunState, total: Int, alreadyDone: Int, started: Date) -> String {
        let (done, refused, transient) = counts.totals
        let handled = done + refused + transient
        let elapsed = Date().timeIntervalSince(started)
        let perSecond = elapsed > 0 ? Double(handled) / elapsed : 0
        let left = counts.keyCount - handled
        var line =
            "\(alreadyDone + done) of \(total) done, \(refused) refused by Apple, \(transient) to retry, \(left) left in this run"
        line += String(format: "; %.0f/s", perSecond)
        if left > 0, perSecond > 0 { line += ", about \(formatAge(Double(left) / perSecond)) to go" }
        if let date = pacing.transferDate { line += "; " + TransferWindow.describe(transferDate: date) }
        return line
    }

    /// The keys still to hand out, the counts so far, and the threads that have finished.
    private final class RunState: Sendable {
        private struct Counts {
            var position = 0
            var done = 0
            var refused = 0
            var transient = 0
            var finished = 0
        }

        private let keys: [String]
        private let counts = Mutex(Counts())
        private let finished = NSCondition()

        init(keys: [String]) { self.keys = keys }

        func finishThread() {
            finished.lock()
            counts.withLock { $0.finished += 1 }
            finished.broadcast()
            finished.unlock()
        }

        /// Whether `threads` threads have finished, waiting at most `timeout` seconds for it.
        func waitForThreads(_ threads: Int, timeout: Double) -> Bool {
            finished.lock()
            defer { finished.unlock() }
            if counts.withLock({ $0.finished }) >= threads { return true }
            _ = finished.wait(until: Date().addingTimeInterval(timeout))
            return counts.withLock { $0.finished } >= threads
        }

        var keyCount: Int { keys.count }

        func next() -> String? {
            counts.withLock { counts in
                guard counts.position < keys.count else { return nil }
                defer { counts.position += 1 }
                return keys[counts.position]
            }
        }

        func count(_ outcomes: [TransferOutcome]) {
            counts.withLock { counts in
                for outcome in outcomes {
                    switch outcome {
                    case .done: counts.done += 1
                    case .refused: counts.refused += 1
                    case .transient: counts.transient += 1
                    }
                }
            }
        }

        var totals: (Int, Int, Int) { counts.withLock { ($0.done, $0.refused, $0.transient) } }
    }
}

/// The outcomes of a batch as JSON for the record functions (`jsonb_to_recordset`, one call per batch).
func outcomesJSON(_ batch: [TransferResult]) -> String {
    let rows: [[String: Any]] = batch.map { entry in
        var row: [String: Any] = ["k": entry.key, "a": entry.attempts]
        switch entry.outcome {
        case .done(let value, let user):
            row["s"] = "done"
            row["v"] = value
            if let user {
                row["v"] = user.sub
                if let email = user.email { row["e"] = email }
                if let flag = user.isPrivateEmail { row["p"] = flag }
            }
        case .refused(let error, let status):
            row["s"] = "failed"
            row["err"] = error
            if let status { row["st"] = status }
        case .transient(let error, let status):
            row["s"] = "pending"
            row["err"] = error
            if let status { row["st"] = status }
        }
        return row
    }
    let data = (try? JSONSerialization.data(withJSONObject: rows)) ?? Data("[]".utf8)
    return String(decoding: data, as: UTF8.self)
}
