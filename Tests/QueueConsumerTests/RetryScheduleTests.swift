import QueueConsumer
import Testing

@Suite("RetrySchedule: base × 2^(n−1), capped, times a jitter in [½, 1)")
struct RetryScheduleTests {
    let schedule = RetrySchedule(base: .seconds(5), maximum: .seconds(3600))

    @Test("the ceiling doubles per attempt from the base")
    func doubles() {
        #expect(schedule.ceiling(afterAttempt: 1) == .seconds(5))
        #expect(schedule.ceiling(afterAttempt: 2) == .seconds(10))
        #expect(schedule.ceiling(afterAttempt: 5) == .seconds(80))
    }

    @Test("the ceiling stops at the maximum, however many attempts")
    func capped() {
        #expect(schedule.ceiling(afterAttempt: 11) == .seconds(3600))
        #expect(schedule.ceiling(afterAttempt: 1_000_000) == .seconds(3600))
        #expect(
            RetrySchedule(base: .seconds(5), maximum: .seconds(1)).ceiling(afterAttempt: 1) == .seconds(5))
    }

    @Test("an attempt count below 1 is the first attempt")
    func belowOne() {
        #expect(schedule.ceiling(afterAttempt: 0) == .seconds(5))
        #expect(schedule.ceiling(afterAttempt: -3) == .seconds(5))
    }

    @Test("jitter 0 gives half the ceiling, jitter near 1 nearly all of it")
    func jitterBounds() {
        #expect(schedule.delay(afterAttempt: 3, jitter: 0) == .seconds(10))
        #expect(schedule.delay(afterAttempt: 3, jitter: 0.5) == .seconds(15))
        let top = schedule.delay(afterAttempt: 3, jitter: 0.999_999)
        #expect(top < .seconds(20) && top > .milliseconds(19_999))
        #expect(schedule.delay(afterAttempt: 3, jitter: -1) == .seconds(10))
    }

    @Test("random delays fall in [½ × ceiling, ceiling)")
    func randomInRange() {
        for attempt in 1...20 {
            let ceiling = schedule.ceiling(afterAttempt: attempt)
            let delay = schedule.delay(afterAttempt: attempt)
            #expect(delay >= ceiling * 0.5 && delay < ceiling, "attempt \(attempt): \(delay)")
        }
    }
}
