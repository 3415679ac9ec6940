public import Postgres
public import ServiceSupport

/// Why the worker could not start or finish.
public struct WorkerError: Error, Sendable, CustomStringConvertible {
    /// What kind of failure this is. New codes may be added.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// A short snake_case label, fit for logs and metrics.
        public let rawValue: String
        private init(_ rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }

        /// The database could not be reached, or a statement failed in a way the worker cannot handle.
        public static let database = Code("database")
    }

    /// The kind of failure.
    public var code: Code
    /// A human-readable message (never contains tokens or email addresses).
    public var message: String

    /// Creates an error.
    public init(code: Code, message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "WorkerError(\(code)): \(message)" }
}

extension Worker {
    /// Everything the worker needs to know, built once by the executable (from flags and environment).
    public struct Configuration: Sendable {
        /// The largest batch. A batch is applied with one statement per effect in one subtransaction,
        /// but when that fails, each notification of it is applied in a subtransaction that writes, and
        /// PostgreSQL caches the XIDs of only 64 subtransactions per transaction; one more overflows the
        /// cache and slows down every snapshot on the server while the batch runs. The database function
        /// claims no more than this, whatever it is asked for.
        public static let maxBatchSize = 64
        /// The batch size when none is configured.
        public static let defaultBatchSize = 64
        /// The defaults of the other settings (the executable's flags show and use these).
        public static let defaultConcurrency = 1
        public static let defaultMaxAttempts = 20
        public static let defaultRetryBaseDelay: Duration = .seconds(1)
        public static let defaultPollInterval: Duration = .seconds(1)
        public static let defaultStatementTimeout: Duration = .seconds(30)
        public static let defaultLockTimeout: Duration = .seconds(5)

        /// Where the notifications live.
        public var database: PostgresConfiguration
        /// How each claimed notification's stored token is checked before anything of it is applied
        /// (there is no way to turn it off).
        public var verification: StoredTokenVerification
        /// How many lanes (threads, each with its own connection) process notifications in parallel.
        public var concurrency: Int
        /// How many notifications one lane claims per transaction: at most ``maxBatchSize``.
        public var batchSize: Int
        /// After this many failed attempts a notification becomes `dead`.
        public var maxAttempts: Int
        /// The first retry waits about this long (with jitter); each further one twice as long, at most 1 h.
        public var retryBaseDelay: Duration
        /// How long an idle lane waits for a notification before looking for due work anyway.
        public var pollInterval: Duration
        /// The server-side limit for any one statement (a batch); `nil` for none. A batch that exceeds
        /// it is retried one notification at a time, and the one that still exceeds it is a failure.
        public var statementTimeout: Duration?
        /// The server-side limit for any one lock wait (`lock_timeout`); `nil` for none. A notification
        /// whose application waits longer for a row another transaction holds (an app transaction on one
        /// of the user's sessions, say) fails with SQLSTATE 55P03 in its own subtransaction and is
        /// retried with backoff, while the rest of its batch applies. Must be shorter than
        /// `statementTimeout`, or the wait ends the whole batch instead.
        public var lockTimeout: Duration?
        /// Raw tokens of finished notifications are cleared after this long; `nil` keeps them.
        public var retainTokens: Duration?
        /// Finished notifications are deleted after this long; `nil` keeps them.
        public var retainEvents: Duration?
        /// How often the maintenance pass (retention and due erasure of personal data) runs.
        public var maintenanceInterval: Duration
        /// The first wait before reconnecting after the database went away; doubles up to `maxReconnectDelay`.
        public var reconnectDelay: Duration
        /// The longest wait between reconnection attempts.
        public var maxReconnectDelay: Duration

        /// Creates and validates a configuration; every value but the database has a production default.
        /// - Throws: ``ConfigurationError`` naming the out-of-range value.
        public init(
            database: PostgresConfiguration,
            verification: StoredTokenVerification,
            concurrency: Int = Configuration.defaultConcurrency,
            batchSize: Int = Configuration.defaultBatchSize,
            maxAttempts: Int = Configuration.defaultMaxAttempts,
            retryBaseDelay: Duration = Configuration.defaultRetryBaseDelay,
            pollInterval: Duration = Configuration.defaultPollInterval,
            statementTimeout: Duration? = Configuration.defaultStatementTimeout,
            lockTimeout: Duration? = Configuration.defaultLockTimeout,
            retainTokens: Duration? = nil,
            retainEvents: Duration? = nil,
            maintenanceInterval: Duration = .seconds(60),
            reconnectDelay: Duration = .milliseconds(100),
            maxReconnectDelay: Duration = .seconds(5)
        ) throws(ConfigurationError) {
            func invalid(_ message: String) -> ConfigurationError { ConfigurationError(message) }
            guard (1...256).contains(concurrency) else {
                throw invalid("concurrency must be between 1 and 256")
            }
            guard (1...Self.maxBatchSize).contains(batchSize) else {
                throw invalid(
                    "batch size must be between 1 and \(Self.maxBatchSize): when a batch falls back to one "
                        + "subtransaction per notification, PostgreSQL caches only 64 per transaction")
            }
            guard (1...1_000_000).contains(maxAttempts) else {
                throw invalid("max attempts must be at least 1")
            }
            guard retryBaseDelay >= .zero else { throw invalid("retry base delay must not be negative") }
            guard pollInterval > .zero else { throw invalid("poll interval must be positive") }
            if let statementTimeout, statementTimeout <= .zero {
                throw invalid("statement timeout must be positive (or absent)")
            }
            if let lockTimeout {
                guard lockTimeout > .zero else { throw invalid("lock timeout must be positive (or absent)") }
                if let statementTimeout, lockTimeout >= statementTimeout {
                    throw invalid("lock timeout must be shorter than the statement timeout")
                }
            }
            if let retainTokens, retainTokens <= .zero { throw invalid("token retention must be positive") }
            if let retainEvents, retainEvents <= .zero { throw invalid("event retention must be positive") }
            guard maintenanceInterval > .zero else { throw invalid("maintenance interval must be positive") }
            guard reconnectDelay > .zero, maxReconnectDelay >= reconnectDelay else {
                throw invalid("reconnect delays must be positive and ordered")
            }
            self.database = database
            self.verification = verification
            self.concurrency = concurrency
            self.batchSize = batchSize
            self.maxAttempts = maxAttempts
            self.retryBaseDelay = retryBaseDelay
            self.pollInterval = pollInterval
            self.statementTimeout = statementTimeout
            self.lockTimeout = lockTimeout
            self.retainTokens = retainTokens
            self.retainEvents = retainEvents
            self.maintenanceInterval = maintenanceInterval
            self.reconnectDelay = reconnectDelay
            self.maxReconnectDelay = maxReconnectDelay
        }
    }
}
