import Foundation
import Postgres
import ServiceSupport

// ---- webhook visibility: siwactl stats per webhook endpoint ----

/// One row of `siwa.webhook_endpoint_gauges()` for `siwactl stats`: the endpoint's id and URL host
/// (never its path, query or a secret), its deliveries pending and dead, the oldest pending one's age,
/// and its current run of failures.
struct WebhookEndpointStats {
    var id: Int
    var host: String
    var enabled: Bool
    var pending: Int
    var dead: Int
    var oldestPendingSeconds: Double
    var consecutiveFailures: Int
    var failingSince: Date?
    var failingForSeconds: Double?

    /// Every endpoint (those in trouble first), or nil when the database has no such function (before
    /// schema version 5).
    static func read(on connection: PostgresConnection) throws -> [WebhookEndpointStats]? {
        guard
            try connection.query(
                "SELECT to_regprocedure('siwa.webhook_endpoint_gauges()') IS NOT NULL")[0][0, as: Bool.self]
        else { return nil }
        return try connection.query(
            """
            SELECT endpoint_id, coalesce(host, ''), enabled, pending, dead, oldest_pending_seconds,
                   consecutive_failures, extract(epoch FROM failing_since)::float8,
                   extract(epoch FROM now() - failing_since)::float8
              FROM siwa.webhook_endpoint_gauges()
            """
        ).map { row in
            WebhookEndpointStats(
                id: try row[0, as: Int.self], host: try row[1, as: String.self],
                enabled: try row[2, as: Bool.self],
                pending: try row[3, as: Int.self], dead: try row[4, as: Int.self],
                oldestPendingSeconds: try row[5, as: Double.self],
                consecutiveFailures: try row[6, as: Int.self],
                failingSince: try row[7, as: Double?.self].map { Date(timeIntervalSince1970: $0) },
                failingForSeconds: try row[8, as: Double?.self])
        }
    }

    var json: [String: Any] {
        [
            "id": id, "host": host, "disabled": !enabled, "pending": pending, "dead": dead,
            "oldest_pending_seconds": pending > 0 ? oldestPendingSeconds as Any : NSNull(),
            "consecutive_failures": consecutiveFailures,
            "failing_since": failingSince.map { VerifyVerb.formatISO8601($0) as Any } ?? NSNull(),
            "failing_for_seconds": failingForSeconds.map { $0 as Any } ?? NSNull(),
        ]
    }

    /// The endpoints as a table under a `webhook endpoints` heading (nothing when there is none).
    static func text(_ endpoints: [WebhookEndpointStats]) -> String {
        guard !endpoints.isEmpty else { return "" }
        let header = ["endpoint", "host", "pending", "dead", "oldest pending", "failing since", "disabled"]
        let rows: [[String]] = endpoints.map { endpoint in
            [
                "\(endpoint.id)", TerminalText.escaped(endpoint.host), "\(endpoint.pending)",
                "\(endpoint.dead)",
                endpoint.pending > 0 ? formatAge(endpoint.oldestPendingSeconds) : "-",
                endpoint.failingSince.map {
                    "\(VerifyVerb.formatISO8601($0)) (\(endpoint.consecutiveFailures) failures"
                        + (endpoint.failingForSeconds.map { ", \(formatAge($0))" } ?? "") + ")"
                } ?? "-",
                endpoint.enabled ? "no" : "yes",
            ]
        }
        let all = [header] + rows
        let widths = header.indices.map { column in all.map { $0[column].count }.max() ?? 0 }
        let lines = all.map { row in
            row.indices.map { column in
                column == row.count - 1
                    ? row[column]
                    : row[column].padding(toLength: widths[column] + 2, withPad: " ", startingAt: 0)
            }.joined()
        }
        return "\nwebhook endpoints\n" + lines.map { "  " + $0 + "\n" }.joined()
    }
}

// ---- end of webhook visibility ----
