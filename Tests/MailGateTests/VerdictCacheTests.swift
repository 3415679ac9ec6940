import MailGate
import RelayMail
import Synchronization
import Testing

/// A clock the test moves by hand.
final class ManualClock: Sendable {
    private let origin = ContinuousClock.now
    private let offset = Mutex<Duration>(.zero)
    var now: ContinuousClock.Instant { origin + offset.withLock { $0 } }
    func advance(_ duration: Duration) { offset.withLock { $0 += duration } }
}

@Suite("VerdictCache: the age bound holds exactly, and the size bound")
struct VerdictCacheTests {
    let block = RelayMailAnswer(decision: .block, reason: .forwardingOff, since: nil)
    let allow = RelayMailAnswer(decision: .allow, reason: .forwardingOn, since: nil)

    @Test("a verdict is served until its age, counted from its query, reaches the ttl, and never after")
    func ageBound() {
        let clock = ManualClock()
        let cache = VerdictCache(ttl: .seconds(5)) { clock.now }
        let askedAt = clock.now
        clock.advance(.seconds(1))  // the database took a second to answer
        cache.store(block, for: "a@x", askedAt: askedAt)
        #expect(cache.verdict(for: "a@x") == block)
        clock.advance(.milliseconds(3999))
        #expect(cache.verdict(for: "a@x") == block)  // 4.999 s after the query
        clock.advance(.milliseconds(1))
        #expect(cache.verdict(for: "a@x") == nil)  // 5 s: never served at or past the ttl
        #expect(cache.verdict(for: "b@x") == nil)
    }

    @Test(
        "an answer older than the ttl when it arrives is not stored; an older answer never replaces a newer")
    func lateAnswers() {
        let clock = ManualClock()
        let cache = VerdictCache(ttl: .seconds(5)) { clock.now }
        let early = clock.now
        clock.advance(.seconds(6))
        cache.store(block, for: "a@x", askedAt: early)
        #expect(cache.verdict(for: "a@x") == nil)
        let second = clock.now
        clock.advance(.seconds(1))
        cache.store(allow, for: "a@x", askedAt: clock.now)
        cache.store(block, for: "a@x", askedAt: second)  // asked earlier, answered later
        #expect(cache.verdict(for: "a@x") == allow)
    }

    @Test("past the capacity the oldest entries go first; ttl zero holds nothing")
    func capacity() {
        let clock = ManualClock()
        let cache = VerdictCache(ttl: .seconds(60), capacity: 3) { clock.now }
        for index in 0..<5 {
            cache.store(allow, for: "\(index)@x", askedAt: clock.now)
            clock.advance(.milliseconds(1))
        }
        #expect(cache.count == 3)
        #expect(cache.verdict(for: "0@x") == nil && cache.verdict(for: "1@x") == nil)
        #expect(cache.verdict(for: "4@x") == allow)
        let off = VerdictCache(ttl: .zero)
        off.store(block, for: "a@x", askedAt: .now)
        #expect(off.verdict(for: "a@x") == nil)
    }
}
