public import Postgres

/// The notification queue's health at a glance: one row of the view `siwa.queue_health`.
public struct QueueHealth: PostgresRowDecodable, Equatable {
    public static let statement = """
        SELECT pending, due, retrying, dead, oldest_pending_seconds, received_last_hour, applied_last_hour,
               apply_latency_p50_seconds, apply_latency_p99_seconds, busy, oldest_busy_seconds
          FROM siwa.queue_health
        """
    public static let columns: PostgresColumns = """
        pending bigint, due bigint, retrying bigint, dead bigint, oldest_pending_seconds double precision, \
        received_last_hour bigint, applied_last_hour bigint, apply_latency_p50_seconds double precision, \
        apply_latency_p99_seconds double precision, busy bigint, oldest_busy_seconds double precision
        """
    public var pending: Int
    public var due: Int
    public var retrying: Int
    public var dead: Int
    public var oldestPendingSeconds: Double?
    public var receivedLastHour: Int
    public var appliedLastHour: Int
    public var applyLatencyP50Seconds: Double?
    public var applyLatencyP99Seconds: Double?
    /// Pending ones waiting for their user's row.
    public var busy: Int
    public var oldestBusySeconds: Double?

    public init(row: PostgresRow) throws(PostgresError) {
        pending = try row["pending"]
        due = try row["due"]
        retrying = try row["retrying"]
        dead = try row["dead"]
        oldestPendingSeconds = try row["oldest_pending_seconds"]
        receivedLastHour = try row["received_last_hour"]
        appliedLastHour = try row["applied_last_hour"]
        applyLatencyP50Seconds = try row["apply_latency_p50_seconds"]
        applyLatencyP99Seconds = try row["apply_latency_p99_seconds"]
        busy = try row["busy"]
        oldestBusySeconds = try row["oldest_busy_seconds"]
    }

    /// The view's row, or nil when the database has no `siwa.queue_health` (no schema yet).
    public static func read(on connection: PostgresConnection) throws(PostgresError) -> QueueHealth? {
        guard
            try connection.value("SELECT to_regclass('siwa.queue_health') IS NOT NULL", as: Bool.self)
        else { return nil }
        return try connection.rows(QueueHealth.self).first
    }
}
