public import Foundation
public import Postgres

extension WebhookAdministration {
    /// The deliveries pending and dead over every endpoint, and the endpoints enabled.
    public struct DeliveryTotals: PostgresRowDecodable, Equatable {
        public static let statement = """
            SELECT coalesce(sum(pending), 0)::bigint AS pending, coalesce(sum(dead), 0)::bigint AS dead,
                   count(*) FILTER (WHERE enabled) AS enabled_endpoints
              FROM siwa.webhook_endpoint_overview
            """
        public static let columns: PostgresColumns = "pending bigint, dead bigint, enabled_endpoints bigint"
        public var pending: Int
        public var dead: Int
        public var enabledEndpoints: Int

        public init(row: PostgresRow) throws(PostgresError) {
            pending = try row["pending"]
            dead = try row["dead"]
            enabledEndpoints = try row["enabled_endpoints"]
        }
    }

    /// The totals from `siwa.webhook_endpoint_overview`, or nil when the database has no such view
    /// (before schema version 4).
    public func deliveryTotals() throws(PostgresError) -> DeliveryTotals? {
        guard
            try connection.value(
                "SELECT to_regclass('siwa.webhook_endpoint_overview') IS NOT NULL", as: Bool.self)
        else { return nil }
        return try connection.rows(DeliveryTotals.self).first
    }

    /// One row of `siwa.webhook_endpoint_gauges()`, for `siwactl stats` and siwa-worker's `/metrics`: the
    /// endpoint's id and URL host (never its path, query or a secret), its deliveries pending and dead,
    /// the oldest pending one's age, its current run of failures and its backoff.
    public struct EndpointStats: PostgresRowDecodable, Equatable {
        public static let statement = """
            SELECT endpoint_id, coalesce(host, '') AS host, enabled, pending, dead, oldest_pending_seconds,
                   consecutive_failures, extract(epoch FROM failing_since)::float8 AS failing_since,
                   extract(epoch FROM now() - failing_since)::float8 AS failing_for_seconds,
                   extract(epoch FROM backoff_until)::float8 AS backoff_until
              FROM siwa.webhook_endpoint_gauges()
            """
        public static let columns: PostgresColumns = """
            endpoint_id bigint, host text, enabled boolean, pending bigint, dead bigint, \
            oldest_pending_seconds double precision, consecutive_failures integer, \
            failing_since double precision, failing_for_seconds double precision, \
            backoff_until double precision
            """
        public var id: Int
        public var host: String
        public var enabled: Bool
        public var pending: Int
        public var dead: Int
        public var oldestPendingSeconds: Double
        public var consecutiveFailures: Int
        public var failingSince: Date?
        public var failingForSeconds: Double?
        /// Until when it is backed off as a whole (`nil`: not backed off).
        public var backoffUntil: Date?

        public init(row: PostgresRow) throws(PostgresError) {
            id = try row["endpoint_id"]
            host = try row["host"]
            enabled = try row["enabled"]
            pending = try row["pending"]
            dead = try row["dead"]
            oldestPendingSeconds = try row["oldest_pending_seconds"]
            consecutiveFailures = try row["consecutive_failures"]
            failingSince = try row["failing_since", as: Double?.self].map { Date(timeIntervalSince1970: $0) }
            failingForSeconds = try row["failing_for_seconds"]
            backoffUntil = try row["backoff_until", as: Double?.self].map { Date(timeIntervalSince1970: $0) }
        }
    }

    /// Every endpoint's stats (those in trouble first), or nil when the database has no such function
    /// (before schema version 5).
    public func endpointStats() throws(PostgresError) -> [EndpointStats]? {
        guard
            try connection.value(
                "SELECT to_regprocedure('siwa.webhook_endpoint_gauges()') IS NOT NULL", as: Bool.self)
        else { return nil }
        return try connection.rows(EndpointStats.self)
    }
}
