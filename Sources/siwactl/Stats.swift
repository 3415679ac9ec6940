import Foundation
import Postgres
import ServiceSupport

/// `siwactl stats`: the queue's health at a glance, from the view `siwa.queue_health`.
enum StatsVerb {
    static let spec = CommandSpec(
        name: "siwactl stats",
        abstract: """
            Queue depth, dead notifications, the oldest pending one's age, and over the last hour how many
            were received and applied and the apply latency (received → applied, p50 and p99); how many
            pending ones wait for their user's row (busy) and for how long; the webhook deliveries pending
            and dead, and the enabled endpoints.
            """,
        options: [.databaseURL],
        flags: [CommandFlag("json", help: "One JSON object (the view's column names) instead of text.")])

    static let verb = Verb(name: "stats", abstract: "Queue depth, dead count, throughput and latency.") {
        arguments, environment in
        switch parse(spec, arguments, environment) {
        case .failure(let exit): return exit.status
        case .success(let parsed): return await runReportingFailure(spec.name) { try run(parsed) }
        }
    }

    /// The view's columns, in order.
    struct Health {
        var pending: Int
        var due: Int
        var retrying: Int
        var dead: Int
        var oldestPendingSeconds: Double?
        var receivedLastHour: Int
        var appliedLastHour: Int
        var applyLatencyP50Seconds: Double?
        var applyLatencyP99Seconds: Double?
        var busy: Int
        var oldestBusySeconds: Double?
        /// Webhook deliveries (nil when the database has no webhooks: before schema version 4).
        var webhooks: (pending: Int, dead: Int, endpoints: Int)?
        /// Per webhook endpoint (nil before schema version 5).
        var webhookEndpoints: [WebhookEndpointStats]?

        init(_ row: PostgresRow) throws(PostgresError) {
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

        var json: [String: Any] {
            [
                "pending": pending, "due": due, "retrying": retrying, "dead": dead,
                "oldest_pending_seconds": oldestPendingSeconds ?? NSNull(),
                "received_last_hour": receivedLastHour, "applied_last_hour": appliedLastHour,
                "apply_latency_p50_seconds": applyLatencyP50Seconds ?? NSNull(),
                "apply_latency_p99_seconds": applyLatencyP99Seconds ?? NSNull(),
                "busy": busy, "oldest_busy_seconds": oldestBusySeconds ?? NSNull(),
                "webhook_deliveries_pending": webhooks.map { $0.pending as Any } ?? NSNull(),
                "webhook_deliveries_dead": webhooks.map { $0.dead as Any } ?? NSNull(),
                "webhook_endpoints_enabled": webhooks.map { $0.endpoints as Any } ?? NSNull(),
                "webhook_endpoints": webhookEndpoints.map { $0.map(\.json) as Any } ?? NSNull(),
            ]
        }

        var text: String {
            func seconds(_ value: Double?) -> String {
                guard let value else { return "-" }
                return value < 10 ? String(format: "%.3f s", value) : formatAge(value)
            }
            let rows: [[String]] = [
                ["pending", "\(pending) (due now \(due), retrying \(retrying))"],
                ["dead", "\(dead)"],
                ["oldest pending", oldestPendingSeconds.map(formatAge) ?? "-"],
                ["received, last hour", "\(receivedLastHour)"],
                ["applied, last hour", "\(appliedLastHour)"],
                ["apply latency p50", seconds(applyLatencyP50Seconds)],
                ["apply latency p99", seconds(applyLatencyP99Seconds)],
                ["busy", "\(busy)" + (oldestBusySeconds.map { " (longest \(formatAge($0)))" } ?? "")],
                [
                    "webhooks",
                    webhooks.map {
                        "\($0.pending) pending, \($0.dead) dead, \($0.endpoints) endpoint(s) enabled"
                    }
                        ?? "-",
                ],
            ]
            let width = rows.map { $0[0].count }.max() ?? 0
            return rows.map { $0[0] + String(repeating: " ", count: width - $0[0].count + 2) + $0[1] + "\n" }
                .joined() + WebhookEndpointStats.text(webhookEndpoints ?? [])
        }
    }

    static func run(_ parsed: ParsedCommand) throws {
        let connection = try connect(parsed)
        defer { connection.close() }
        let health = try database("reading siwa.queue_health") {
            guard try relationExists("siwa.queue_health", on: connection) else {
                throw ToolFailure("the database has no siwa.queue_health view; run 'siwactl migrate' first")
            }
            var health = try Health(connection.query("SELECT * FROM siwa.queue_health")[0])
            if try relationExists("siwa.webhook_endpoint_overview", on: connection) {
                let row = try connection.query(
                    """
                    SELECT coalesce(sum(pending), 0)::bigint, coalesce(sum(dead), 0)::bigint,
                           count(*) FILTER (WHERE enabled)
                      FROM siwa.webhook_endpoint_overview
                    """)[0]
                health.webhooks = (
                    try row[0, as: Int.self], try row[1, as: Int.self], try row[2, as: Int.self]
                )
            }
            health.webhookEndpoints = try WebhookEndpointStats.read(on: connection)
            return health
        }
        writeStandardOutput(parsed.flag("json") ? JSONText.line(health.json) : health.text)
    }
}
