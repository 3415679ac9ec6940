import Foundation
import Postgres
import ServiceHealth
import ServiceSupport
import WebhookAdministration

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

    /// What `siwactl stats` shows: the queue's health, and the webhook deliveries when the database has them.
    struct Health {
        var queue: QueueHealth
        /// Webhook deliveries (nil when the database has no webhooks: before schema version 4).
        var webhooks: WebhookAdministration.DeliveryTotals?
        /// Per webhook endpoint (nil before schema version 5).
        var webhookEndpoints: [WebhookAdministration.EndpointStats]?

        var json: [String: Any] {
            [
                "pending": queue.pending, "due": queue.due, "retrying": queue.retrying, "dead": queue.dead,
                "oldest_pending_seconds": queue.oldestPendingSeconds ?? NSNull(),
                "received_last_hour": queue.receivedLastHour, "applied_last_hour": queue.appliedLastHour,
                "apply_latency_p50_seconds": queue.applyLatencyP50Seconds ?? NSNull(),
                "apply_latency_p99_seconds": queue.applyLatencyP99Seconds ?? NSNull(),
                "busy": queue.busy, "oldest_busy_seconds": queue.oldestBusySeconds ?? NSNull(),
                "webhook_deliveries_pending": webhooks.map { $0.pending as Any } ?? NSNull(),
                "webhook_deliveries_dead": webhooks.map { $0.dead as Any } ?? NSNull(),
                "webhook_endpoints_enabled": webhooks.map { $0.enabledEndpoints as Any } ?? NSNull(),
                "webhook_endpoints": webhookEndpoints.map { $0.map(\.json) as Any } ?? NSNull(),
            ]
        }

        var text: String {
            func seconds(_ value: Double?) -> String {
                guard let value else { return "-" }
                return value < 10 ? String(format: "%.3f s", value) : formatAge(value)
            }
            let rows: [[String]] = [
                ["pending", "\(queue.pending) (due now \(queue.due), retrying \(queue.retrying))"],
                ["dead", "\(queue.dead)"],
                ["oldest pending", queue.oldestPendingSeconds.map(formatAge) ?? "-"],
                ["received, last hour", "\(queue.receivedLastHour)"],
                ["applied, last hour", "\(queue.appliedLastHour)"],
                ["apply latency p50", seconds(queue.applyLatencyP50Seconds)],
                ["apply latency p99", seconds(queue.applyLatencyP99Seconds)],
                [
                    "busy",
                    "\(queue.busy)" + (queue.oldestBusySeconds.map { " (longest \(formatAge($0)))" } ?? ""),
                ],
                [
                    "webhooks",
                    webhooks.map {
                        "\($0.pending) pending, \($0.dead) dead, \($0.enabledEndpoints) endpoint(s) enabled"
                    }
                        ?? "-",
                ],
            ]
            let width = rows.map { $0[0].count }.max() ?? 0
            return rows.map { $0[0] + String(repeating: " ", count: width - $0[0].count + 2) + $0[1] + "\n" }
                .joined() + WebhookAdministration.EndpointStats.text(webhookEndpoints ?? [])
        }
    }

    static func run(_ parsed: ParsedCommand) throws {
        let connection = try connect(parsed)
        defer { connection.close() }
        let health = try database("reading siwa.queue_health") {
            guard let queue = try QueueHealth.read(on: connection) else {
                throw ToolFailure("the database has no siwa.queue_health view; run 'siwactl migrate' first")
            }
            let webhooks = WebhookAdministration(connection)
            return Health(
                queue: queue, webhooks: try webhooks.deliveryTotals(),
                webhookEndpoints: try webhooks.endpointStats())
        }
        writeStandardOutput(parsed.flag("json") ? JSONText.line(health.json) : health.text)
    }
}
