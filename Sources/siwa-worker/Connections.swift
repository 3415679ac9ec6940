import AuthAdapters
import Postgres
import QueueConsumer
import Revoker
import SignalDelivery
import Suppressions
import WebhookDelivery
import Worker

/// The PostgreSQL connections this process opens for the configuration it parsed, one row per user of
/// connections: the one place they are counted. `siwa-worker --print-connections` prints it, and
/// docs/operations.md (*Connections*) quotes that output instead of numbers of its own. Each row follows
/// what ``runWorker(arguments:environment:)`` starts: a service added there that opens a connection adds
/// a row here (WorkerConnectionsProcessTests checks a running worker's `pg_stat_activity` against the
/// total). Each connection is opened when its thread starts and held until it stops; after a failure
/// it is closed before the next is opened, so the total is also the most held at once.
struct ConnectionPlan {
    struct Row {
        /// Who holds the connections.
        let user: String
        let count: Int
        /// Why that many, and the `application_name` they show in `pg_stat_activity`.
        let note: String
    }

    let rows: [Row]

    var total: Int { rows.reduce(0) { $0 + $1.count } }

    init(
        worker: Worker.Configuration, once: Bool, webhooks: WebhookDispatcher?,
        sharedSignals: SignalDispatcher?,
        suppressions: SuppressionDispatcher?, authAdapters: [String]?, revoker: Revoker?
    ) {
        let lanes = worker.concurrency
        // A URL that sets application_name itself wins over these names (libpq), in pg_stat_activity too.
        let name = worker.database.applicationName ?? "siwa-worker"
        if once {
            // --once runs the notification lanes only (Run.swift): rounds of lanes, then the busy check
            // and the maintenance pass, each on a connection of its own opened after the lanes closed
            // theirs.
            let notRun = "not run with --once"
            rows = [
                Row(
                    user: "notification lanes", count: lanes,
                    note: "--concurrency \(lanes): one each per drain round (\(name))"),
                Row(
                    user: "maintenance", count: 0,
                    note: "--once: one pass after the lanes closed theirs, then closed (\(name))"),
                Row(user: "heartbeat and gauges", count: 0, note: notRun),
                Row(user: "webhook gauges", count: 0, note: notRun),
                Row(user: "webhook lanes", count: 0, note: notRun),
                Row(user: "Shared Signals lanes", count: 0, note: notRun),
                Row(user: "suppression lanes", count: 0, note: notRun),
                Row(user: "revoker", count: 0, note: notRun),
            ]
            return
        }
        var rows = [
            Row(
                user: "notification lanes", count: lanes,
                note: "--concurrency \(lanes): one each, LISTEN siwa_notifications (\(name))"),
            Row(
                user: "maintenance", count: 1,
                note: "partitions, erasure, retention, whatever the lanes do (\(name))"),
            Row(
                user: "heartbeat and gauges", count: 1,
                note: "siwa.service_heartbeats and the database's gauges on /metrics (\(name)-health)"),
            Row(
                user: "webhook gauges", count: 1,
                note:
                    "the endpoints' gauges on /metrics, also with --webhook-concurrency 0 (\(name)-webhook-gauges)"
            ),
        ]
        if let webhooks {
            let count = webhooks.configuration.calls.concurrency
            rows.append(
                Row(
                    user: "webhook lanes", count: count,
                    note:
                        "--webhook-concurrency \(count): one each, LISTEN siwa_webhooks, also while no endpoint exists (\(name)-webhooks)"
                ))
        } else {
            rows.append(Row(user: "webhook lanes", count: 0, note: "off: --webhook-concurrency 0"))
        }
        if let sharedSignals {
            let count = sharedSignals.configuration.calls.concurrency
            rows.append(
                Row(
                    user: "Shared Signals lanes", count: count,
                    note: "--ssf-concurrency \(count): one each, LISTEN siwa_ssf (\(name)-ssf)"))
        } else {
            rows.append(Row(user: "Shared Signals lanes", count: 0, note: "off: no --ssf-key-file"))
        }
        if let suppressions {
            let names = suppressions.configuration.providers.keys.sorted()
            rows.append(
                Row(
                    user: "suppression lanes", count: names.count,
                    note:
                        "--suppressions \(names.joined(separator: ",")): one per provider, LISTEN siwa_suppressions (\(name)-suppressions)"
                ))
        } else {
            rows.append(Row(user: "suppression lanes", count: 0, note: "off: no --suppressions"))
        }
        if let names = authAdapters {
            rows.append(
                Row(
                    user: "auth adapter lanes", count: names.count + 1,
                    note:
                        "--auth-adapters on, \(names.isEmpty ? "none enabled" : names.joined(separator: ",")) now: one per enabled adapter, LISTEN siwa_auth_adapters, and one reading siwa.auth_adapters every 5 s (\(name)-auth-adapters); each lane also opens one to its auth database, not counted here"
                ))
        } else {
            rows.append(Row(user: "auth adapter lanes", count: 0, note: "off: --auth-adapters off"))
        }
        if revoker != nil {
            rows.append(
                Row(
                    user: "revoker", count: 1,
                    note:
                        "revocations, refresh checks, sign-in code pruning, LISTEN siwa_revocations (\(name)-revoker)"
                ))
        } else {
            rows.append(Row(user: "revoker", count: 0, note: "off: no --apple-key-file"))
        }
        self.rows = rows
    }

    /// The table `--print-connections` prints: a row per user (name, count, note), then the total.
    var text: String {
        let width = max(rows.map(\.user.count).max() ?? 0, "total".count)
        func padded(_ text: String) -> String { text + String(repeating: " ", count: width - text.count) }
        func count(_ value: Int) -> String {
            let digits = String(value)
            return String(repeating: " ", count: max(0, 3 - digits.count)) + digits
        }
        var lines = rows.map { "\(padded($0.user)) \(count($0.count))  \($0.note)" }
        lines.append("\(padded("total")) \(count(total))  PostgreSQL connections this process opens")
        return lines.joined(separator: "\n") + "\n"
    }
}
