import Foundation
import ServiceSupport
import WebhookAdministration

// ---- webhook visibility: siwactl stats per webhook endpoint ----

/// An endpoint's stats as `siwactl stats` prints them: a JSON object, and a table.
extension WebhookAdministration.EndpointStats {
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
    static func text(_ endpoints: [Self]) -> String {
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
