import Foundation
import ServiceSupport

/// The delay before a consumer's next attempt after a failure: base × 2^(n−1) after attempt n, at most
/// ``maximum``, times a jitter in [½, 1) so that failures that came together do not retry in step.
///
/// The one retry formula of the consumers that call out (each ``Outbox``); the
/// notification lanes' retries are computed by `siwa.record_failure`.
public struct RetrySchedule: Sendable, Equatable {
    /// The delay after the first attempt, before jitter.
    public var base: Duration
    /// The longest delay, before jitter.
    public var maximum: Duration

    /// A schedule; `maximum` below `base` is raised to it.
    public init(base: Duration, maximum: Duration) {
        self.base = base
        self.maximum = max(maximum, base)
    }

    /// The delay after attempt `attempt` (1 for the first) before jitter: base × 2^(attempt−1), at
    /// most ``maximum``.
    public func ceiling(afterAttempt attempt: Int) -> Duration {
        // 2^62 seconds is past any maximum: a larger exponent changes nothing but could overflow.
        let doublings = Double(min(max(attempt - 1, 0), 62))
        return .seconds(min(base.inSeconds * pow(2, doublings), maximum.inSeconds))
    }

    /// The delay after attempt `attempt`; `jitter` in [0, 1) places it in [½ × ceiling, ceiling).
    public func delay(afterAttempt attempt: Int, jitter: Double) -> Duration {
        ceiling(afterAttempt: attempt) * (0.5 + 0.5 * min(max(jitter, 0), 1))
    }

    /// The delay after attempt `attempt`, with a random jitter.
    public func delay(afterAttempt attempt: Int) -> Duration {
        delay(afterAttempt: attempt, jitter: Double.random(in: 0..<1))
    }
}
