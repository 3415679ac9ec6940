import Dispatch
public import RelayMail
public import ServiceSupport
import Synchronization

/// Answers "the verdict for this address, within this deadline" from the cache or the database.
///
/// Callers wait on a ticket with their own deadline; a few lookup threads take every address waiting
/// (up to ``Configuration/maximumBatch``) and ask for all of them in one call of `fetch` (the bulk
/// function), so many requests arriving together cost one round trip. An address already waiting or in
/// flight is not asked twice. A lookup that outlives its caller's deadline still fills the cache.
public final class VerdictResolver: Sendable {
    /// The resolver's limits.
    public struct Configuration: Sendable {
        /// Lookup threads, each with its own database connection.
        public var lookupThreads: Int
        /// The most addresses asked in one call.
        public var maximumBatch: Int
        /// The most addresses waiting; past it a lookup fails at once (the database is not keeping up).
        public var maximumWaiting: Int

        public init(lookupThreads: Int = 4, maximumBatch: Int = 500, maximumWaiting: Int = 10_000) {
            self.lookupThreads = lookupThreads
            self.maximumBatch = maximumBatch
            self.maximumWaiting = maximumWaiting
        }
    }

    /// Asks the database for the verdicts of `addresses`, one per address in order; throws when it cannot.
    public typealias Fetch = @Sendable (_ addresses: [String]) throws -> [RelayMailAnswer]

    public let configuration: Configuration
    public let cache: VerdictCache
    private let fetch: Fetch
    private let metrics: MailGateMetrics
    private let logger: Logger

    private struct State {
        /// Addresses not yet taken by a lookup thread, in arrival order.
        var queue: [String] = []
        /// Tickets per address waiting or in flight.
        var tickets: [String: [Ticket]] = [:]
        var stopping = false
    }

    private let state = Mutex(State())
    private let work = DispatchSemaphore(value: 0)
    private let threads = Mutex<[JoinableThread]>([])

    public init(
        configuration: Configuration = Configuration(), cache: VerdictCache, metrics: MailGateMetrics,
        logger: Logger, fetch: @escaping Fetch
    ) {
        self.configuration = configuration
        self.cache = cache
        self.fetch = fetch
        self.metrics = metrics
        self.logger = logger
    }

    /// Starts the lookup threads.
    public func start() {
        threads.withLock { threads in
            for index in 0..<max(1, configuration.lookupThreads) {
                threads.append(JoinableThread(name: "mailgate-db-\(index)") { [self] in lookupLoop() })
            }
        }
    }

    /// Fails every waiting lookup and ends the lookup threads once their calls in flight return.
    public func shutdown() {
        let waiting = state.withLock { state -> [Ticket] in
            state.stopping = true
            defer {
                state.tickets = [:]
                state.queue = []
            }
            return state.tickets.values.flatMap { $0 }
        }
        for ticket in waiting { ticket.fulfil(.unavailable) }
        let all = threads.withLock { $0 }
        for _ in all { work.signal() }
        for thread in all { thread.join() }
    }

    /// The verdict for `address`, from the cache or the database, or why there is none by `deadline`.
    public func lookup(_ address: String, deadline: ContinuousClock.Instant) -> Lookup {
        if let verdict = cache.verdict(for: address) {
            metrics.cacheHits.increment()
            return .decided(verdict)
        }
        metrics.cacheMisses.increment()
        let ticket = Ticket()
        let queued = state.withLock { state -> Bool? in
            guard !state.stopping, state.tickets.count < configuration.maximumWaiting else { return nil }
            if state.tickets[address] != nil {
                state.tickets[address]!.append(ticket)
                return false
            }
            state.tickets[address] = [ticket]
            state.queue.append(address)
            return true
        }
        guard let queued else {
            metrics.lookupsRefused.increment()
            return .unavailable
        }
        if queued { work.signal() }
        return ticket.wait(until: deadline)
    }

    private func lookupLoop() {
        while true {
            work.wait()
            let batch = state.withLock { state -> [String]? in
                if state.stopping { return nil }
                let taken = Array(state.queue.prefix(configuration.maximumBatch))
                state.queue.removeFirst(taken.count)
                if !state.queue.isEmpty { work.signal() }  // another thread takes the rest
                return taken
            }
            guard let batch else { return }
            guard !batch.isEmpty else { continue }
            let askedAt = ContinuousClock.now
            let outcome: [Lookup]
            do {
                let verdicts = try fetch(batch)
                guard verdicts.count == batch.count else {
                    throw MailGateError(.databaseAnswer, "the bulk function answered a different count")
                }
                outcome = verdicts.map(Lookup.decided)
                metrics.batchSize.observe(Double(batch.count))
                metrics.databaseSeconds.observe((ContinuousClock.now - askedAt).inSeconds)
                for (address, verdict) in zip(batch, verdicts) {
                    cache.store(verdict, for: address, askedAt: askedAt)
                }
            } catch {
                metrics.databaseErrors.increment()
                logger.warning(
                    "relay-mail lookup failed",
                    ["error": .string("\(error)"), "addresses": .int(batch.count)])
                outcome = Array(repeating: .unavailable, count: batch.count)
            }
            let answered = state.withLock { state in
                zip(batch, outcome).map { address, lookup in
                    (state.tickets.removeValue(forKey: address) ?? [], lookup)
                }
            }
            for (tickets, lookup) in answered {
                for ticket in tickets { ticket.fulfil(lookup) }
            }
        }
    }
}

/// One caller's wait for a lookup: fulfilled once, waited on with a deadline.
private final class Ticket: Sendable {
    private let result = Mutex<Lookup?>(nil)
    private let ready = DispatchSemaphore(value: 0)

    func fulfil(_ lookup: Lookup) {
        let first = result.withLock { result in
            guard result == nil else { return false }
            result = lookup
            return true
        }
        if first { ready.signal() }
    }

    func wait(until deadline: ContinuousClock.Instant) -> Lookup {
        let remaining = deadline - ContinuousClock.now
        let nanoseconds = max(0, Int(remaining.inSeconds * 1e9))
        guard ready.wait(timeout: .now() + .nanoseconds(nanoseconds)) == .success else { return .timedOut }
        return result.withLock { $0 } ?? .unavailable
    }
}
