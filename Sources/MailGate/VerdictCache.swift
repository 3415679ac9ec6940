public import RelayMail
import Synchronization

/// Recent verdicts by address, each served only while younger than the age bound, at most `capacity` of
/// them (the oldest go first).
///
/// An entry's age counts from when its lookup was sent to the database, not when the answer came back,
/// so a verdict is never older than ``ttl`` when served, however slow the database was.
public final class VerdictCache: Sendable {
    /// The age bound; zero turns the cache off.
    public let ttl: Duration
    /// The most entries held.
    public let capacity: Int
    private let now: @Sendable () -> ContinuousClock.Instant

    private struct Entry {
        let verdict: RelayMailAnswer
        let askedAt: ContinuousClock.Instant
    }

    private struct State {
        var entries: [String: Entry] = [:]
        /// Addresses in the order stored (an address stored again appears twice; the stale one is skipped).
        var order: [(address: String, askedAt: ContinuousClock.Instant)] = []
        var head = 0
    }

    private let state = Mutex(State())

    /// - Parameter now: the clock (tests move it).
    public init(
        ttl: Duration, capacity: Int = 100_000,
        now: @escaping @Sendable () -> ContinuousClock.Instant = { .now }
    ) {
        precondition(capacity > 0)
        self.ttl = ttl
        self.capacity = capacity
        self.now = now
    }

    /// The verdict for `address` if one younger than ``ttl`` is held.
    public func verdict(for address: String) -> RelayMailAnswer? {
        guard ttl > .zero else { return nil }
        let now = now()
        return state.withLock { state in
            guard let entry = state.entries[address] else { return nil }
            guard now - entry.askedAt < ttl else {
                state.entries[address] = nil
                return nil
            }
            return entry.verdict
        }
    }

    /// Stores `verdict` for `address`, asked of the database at `askedAt`.
    public func store(_ verdict: RelayMailAnswer, for address: String, askedAt: ContinuousClock.Instant) {
        guard ttl > .zero else { return }
        let now = now()
        guard now - askedAt < ttl else { return }
        state.withLock { state in
            if let held = state.entries[address], held.askedAt >= askedAt { return }
            state.entries[address] = Entry(verdict: verdict, askedAt: askedAt)
            state.order.append((address, askedAt))
            // Expired and superseded entries first, then the oldest while over capacity.
            while state.head < state.order.count {
                let (oldest, at) = state.order[state.head]
                let current = state.entries[oldest]
                let superseded = current == nil || current!.askedAt != at
                guard superseded || now - at >= ttl || state.entries.count > capacity else { break }
                if !superseded { state.entries[oldest] = nil }
                state.head += 1
            }
            if state.head > 1024, state.head * 2 > state.order.count {
                state.order.removeFirst(state.head)
                state.head = 0
            }
        }
    }

    /// How many entries are held (expired ones not yet dropped included).
    public var count: Int { state.withLock { $0.entries.count } }
}
