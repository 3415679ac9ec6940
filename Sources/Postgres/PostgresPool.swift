import Dispatch
import Synchronization

/// A bounded, thread-safe pool of `PostgresConnection`s for synchronous callers.
///
/// Connections are opened lazily, at most `maxConnections` at a time. A connection that failed at the
/// connection level is closed instead of being returned, and idle connections are checked before
/// reuse, so after a server restart the next call simply reconnects.
public final class PostgresPool: Sendable {
    /// How many connections are idle and how many are lent out.
    public struct Statistics: Sendable, Hashable {
        /// Open connections waiting in the pool.
        public var idle: Int
        /// Connections currently lent to callers.
        public var inUse: Int

        /// Creates statistics (for comparisons in tests and metrics).
        public init(idle: Int, inUse: Int) {
            self.idle = idle
            self.inUse = inUse
        }
    }

    private struct State: Sendable {
        var idle: [PostgresConnection] = []
        var inUse = 0
        var closed = false
    }

    /// The configuration used for every connection.
    public let configuration: PostgresConfiguration
    /// The most connections open at once.
    public let maxConnections: Int
    /// How long `withConnection` waits for a free connection by default.
    public let acquireTimeout: Duration
    /// One permit per connection that may be lent out.
    private let permits: DispatchSemaphore
    private let state = Mutex(State())

    /// Creates a pool; no connection is opened until first use.
    public init(
        configuration: PostgresConfiguration, maxConnections: Int = 10, acquireTimeout: Duration = .seconds(5)
    ) {
        precondition(maxConnections > 0, "maxConnections must be positive")
        self.configuration = configuration
        self.maxConnections = maxConnections
        self.acquireTimeout = acquireTimeout
        self.permits = DispatchSemaphore(value: maxConnections)
    }

    /// Lends a connection to `body` and takes it back afterwards (rolling back a transaction that
    /// `body` left open, and discarding the connection if it broke).
    ///
    /// - Parameter timeout: how long to wait for a free connection (default `acquireTimeout`).
    /// - Throws: `.poolExhausted` after waiting `timeout`, `.poolClosed`, `.connectionFailed` when a
    ///   new connection cannot be opened, or whatever `body` throws.
    @discardableResult
    public func withConnection<T>(timeout: Duration? = nil, _ body: (PostgresConnection) throws -> T) throws
        -> T
    {
        let connection = try acquire(timeout: timeout ?? acquireTimeout)
        defer { release(connection) }
        return try body(connection)
    }

    /// Checks that the database answers (`SELECT 1`), for readiness probes.
    public func ping(timeout: Duration? = nil) throws(PostgresError) {
        do {
            _ = try withConnection(timeout: timeout) { connection in try connection.query("SELECT 1") }
        } catch let error as PostgresError {
            throw error
        } catch {
            throw PostgresError(code: .queryFailed, message: "ping failed: \(error)")
        }
    }

    /// Checks that the database answers and accepts writes, for the readiness probes of services that
    /// write: a hot standby (or a server with `default_transaction_read_only`) fails with
    /// ``PostgresError/Code/readOnly``, and the connection that found it is closed rather than pooled,
    /// so that the next one may reach the read-write primary (with `target_session_attrs=read-write`).
    public func checkWritable(timeout: Duration? = nil) throws(PostgresError) {
        do {
            let readOnly = try withConnection(timeout: timeout) { connection in
                let readOnly = try connection.query(
                    "SELECT pg_catalog.current_setting('transaction_read_only') = 'on'"
                )
                .first?[0, as: Bool.self]
                if readOnly != false { connection.discard() }
                return readOnly
            }
            guard readOnly == false else {
                throw PostgresError(
                    code: .readOnly, message: "the server accepts no writes (a hot standby, or read-only)",
                    sqlState: "25006")
            }
        } catch let error as PostgresError {
            throw error
        } catch {
            throw PostgresError(code: .queryFailed, message: "the writability check failed: \(error)")
        }
    }

    /// Closes idle connections and refuses new work; connections in use are closed when returned.
    public func close() {
        let idle = state.withLock { state in
            state.closed = true
            defer { state.idle.removeAll() }
            return state.idle
        }
        for connection in idle { connection.close() }
    }

    /// Current counts of idle and lent-out connections.
    public var statistics: Statistics {
        state.withLock { Statistics(idle: $0.idle.count, inUse: $0.inUse) }
    }

    private func acquire(timeout: Duration) throws(PostgresError) -> PostgresConnection {
        if state.withLock({ $0.closed }) { throw Self.closedError }
        let (seconds, attoseconds) = timeout.components
        let nanoseconds =
            Int(clamping: max(0, seconds).multipliedReportingOverflow(by: 1_000_000_000).partialValue)
            + Int(max(0, attoseconds) / 1_000_000_000)
        guard permits.wait(timeout: .now() + .nanoseconds(nanoseconds)) == .success else {
            throw PostgresError(
                code: .poolExhausted,
                message: "no connection became free within \(timeout) (maxConnections \(maxConnections))")
        }
        while true {
            let next: PostgresConnection?? = state.withLock { state in
                if state.closed { return .none }
                state.inUse += 1
                return .some(state.idle.popLast())
            }
            guard let candidate = next else {
                permits.signal()
                throw Self.closedError
            }
            if let connection = candidate {
                if connection.isAliveWhenIdle() { return connection }
                connection.close()
                state.withLock { $0.inUse -= 1 }
                continue
            }
            do {
                return try PostgresConnection(configuration: configuration)
            } catch {
                state.withLock { $0.inUse -= 1 }
                permits.signal()
                throw error
            }
        }
    }

    private func release(_ connection: PostgresConnection) {
        if connection.isHealthy && connection.isInTransaction {
            _ = try? connection.simpleQuery("ROLLBACK")
        }
        let reusable = connection.isHealthy && !connection.isInTransaction
        let keep = state.withLock { state in
            state.inUse -= 1
            guard reusable && !state.closed else { return false }
            state.idle.append(connection)
            return true
        }
        if !keep { connection.close() }
        permits.signal()
    }

    private static let closedError = PostgresError(code: .poolClosed, message: "the pool has been closed")
}
