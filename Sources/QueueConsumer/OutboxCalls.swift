public import Postgres
public import ServiceSupport

/// The settings of an outbox whose lanes call out over HTTP (webhooks, Shared Signals push,
/// suppressions): where its queue is, its lanes and batches, one call's deadline, its retries' delays,
/// how often it looks without a NOTIFY, and the environment its HTTP client reads.
public struct OutboxCalls: Sendable {
    /// The database (the role needs `siwa_worker`).
    public var database: PostgresConfiguration
    /// Lanes: calls in flight at once from this process.
    public var concurrency: Int
    /// Rows a lane claims at once and calls one after another (one while their peer is failing).
    public var batchSize: Int
    /// The deadline of one call, from name resolution to the last byte of the answer.
    public var timeout: Duration
    /// The retries' delays: the first retry delay doubling per attempt to the longest, with jitter.
    public var retrySchedule: RetrySchedule
    /// Look for due rows at least this often (NOTIFY wakes the lanes sooner).
    public var pollInterval: Duration
    /// Where `SSL_CERT_FILE` and `https_proxy`/`no_proxy` are read (the executable's environment).
    public var environment: [String: String]

    /// Settings; every duration positive, the longest retry delay at least the first, at least one
    /// lane, a batch of 1 to 1,000; otherwise a ``ConfigurationError`` naming `settings` ("the webhook
    /// settings").
    public init(
        _ settings: String, database: PostgresConfiguration, concurrency: Int, batchSize: Int,
        timeout: Duration,
        retryBaseDelay: Duration, maxRetryDelay: Duration, pollInterval: Duration,
        environment: [String: String]
    ) throws {
        guard concurrency >= 1, (1...1000).contains(batchSize), timeout > .zero, retryBaseDelay > .zero,
            maxRetryDelay >= retryBaseDelay, pollInterval > .zero
        else {
            throw ConfigurationError(
                "\(settings) must be positive (max delay ≥ base delay, a batch of 1 to 1,000)")
        }
        self.database = database
        self.concurrency = concurrency
        self.batchSize = batchSize
        self.timeout = timeout
        retrySchedule = RetrySchedule(base: retryBaseDelay, maximum: maxRetryDelay)
        self.pollInterval = pollInterval
        self.environment = environment
    }

    /// How long a claimed row stays leased to its lane when it takes `callsPerRow` calls: their
    /// deadlines plus ``CallLease/margin``, and ``CallLease/batchWindow`` when a lane claims batches. A
    /// lease still held after that is taken over by another lane.
    public func lease(callsPerRow: Int = 1) -> Duration {
        let deadline = timeout * callsPerRow
        return batchSize > 1 ? CallLease.covering(batchOf: deadline) : CallLease.covering(deadline)
    }
}
