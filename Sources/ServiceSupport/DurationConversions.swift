public import Dispatch

extension Duration {
    /// The duration in (fractional) seconds, e.g. for metrics and `TimeInterval`s.
    public var inSeconds: Double {
        let (whole, attoseconds) = components
        return Double(whole) + Double(attoseconds) / 1e18
    }

    /// The duration as a number of seconds for a command line: `93600`, or `0.5` when fractional.
    public var secondsText: String {
        let seconds = inSeconds
        return seconds == seconds.rounded() && abs(seconds) < 1e15 ? String(Int64(seconds)) : String(seconds)
    }

    /// The duration in whole milliseconds, rounded up (e.g. for PostgreSQL's `statement_timeout`).
    public var wholeMilliseconds: Int64 {
        let (whole, attoseconds) = components
        return whole * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
    }

    /// The duration for Dispatch's timed waits (nanosecond resolution, never negative).
    public var dispatchInterval: DispatchTimeInterval {
        let (whole, attoseconds) = components
        return .nanoseconds(max(0, Int(whole) * 1_000_000_000 + Int(attoseconds / 1_000_000_000)))
    }
}
