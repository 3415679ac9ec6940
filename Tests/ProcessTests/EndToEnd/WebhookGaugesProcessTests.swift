import Foundation
import Postgres
import Synchronization
import TestSupport
import Testing
import WebhookDelivery
import Webhooks

/// The value of `name{endpoint="id",…}` in a scrape (nil when absent).
private func endpointValue(_ name: String, _ endpoint: Int, in text: String) -> Double? {
    let prefix = "\(name){endpoint=\"\(endpoint)\","
    for line in text.split(separator: "\n") where line.hasPrefix(prefix) {
        guard let value = line.split(separator: " ").last else { return nil }
        return value == "NaN" ? .nan : Double(value)
    }
    return nil
}

/// The webhook endpoints' gauges on a real siwa-worker's /metrics (as a member of siwa_worker) over real
/// deliveries to local endpoints, and `siwactl stats` (as a member of siwa_admin) showing the same.
@Suite("Webhook gauges and siwactl stats per endpoint", .serialized)
struct WebhookGaugesProcessTests {
    @Test(
        "pending, dead, oldest pending, consecutive failures, failing since and disabled per endpoint; only the URL's host; a 2xx ends the run"
    )
    func perEndpointGauges() throws {
        let database = try WebhookDatabase()
        let healthy = try WebhookReceiver()
        let failingStatus = Mutex(503)
        let failing = try WebhookReceiver { _, _ in (failingStatus.withLock { $0 }, .zero) }
        let idle = try WebhookReceiver()
        let ok = try database.addEndpoint(url: healthy.url, secret: .generate())
        // A token in the query string: never in a label, never printed by siwactl stats.
        let bad = try database.addEndpoint(url: failing.url + "?token=hush-hush-0042", secret: .generate())
        let off = try database.addEndpoint(url: idle.url, secret: .generate())
        try database.insertChange(sub: "001.a")
        try database.insertChange(sub: "001.b")
        try database.query("SELECT siwa.set_webhook_endpoint_enabled($1, false)", [.int(Int64(off))])

        let started = Date().timeIntervalSince1970
        let worker = try ServiceProcess.worker(
            database,
            [
                "--webhook-poll-interval", "0.1", "--webhook-retry-base-delay", "0.05",
                "--webhook-max-retry-delay", "0.2", "--webhook-give-up-after", "2",
            ])
        let series = [
            "siwa_webhook_endpoint_pending", "siwa_webhook_endpoint_dead",
            "siwa_webhook_endpoint_oldest_pending_age_seconds", "siwa_webhook_endpoint_consecutive_failures",
            "siwa_webhook_endpoint_failing_since_timestamp_seconds", "siwa_webhook_endpoint_disabled",
            "siwa_webhook_endpoint_backoff_until_timestamp_seconds",
            "siwa_webhook_gauges_up", "siwa_webhook_endpoints", "siwa_webhook_pending_deliveries",
            "siwa_webhook_dead_deliveries", "siwa_webhook_endpoints_without_series",
        ]
        var text = ""
        // The failing endpoint's two deliveries die (give-up after 2 s); the healthy one got both; the
        // disabled one's two wait.
        let settled = waitUntil(timeout: .seconds(60)) {
            text = (try? worker.scrape()) ?? ""
            return endpointValue("siwa_webhook_endpoint_dead", bad, in: text) == 2
                && endpointValue("siwa_webhook_endpoint_pending", ok, in: text) == 0
                && endpointValue("siwa_webhook_endpoint_pending", bad, in: text) == 0
        }
        #expect(settled, "\(worker.log)\n\(text)")
        for name in series {
            #expect(text.contains("# HELP \(name) "), "\(name) lacks HELP")
            #expect(text.contains("# TYPE \(name) gauge\n"), "\(name) lacks TYPE")
        }
        #expect(ServiceProcess.value(of: "siwa_webhook_gauges_up", in: text) == 1)
        #expect(ServiceProcess.value(of: "siwa_webhook_endpoints", in: text) == 3)
        #expect(ServiceProcess.value(of: "siwa_webhook_endpoints_without_series", in: text) == 0)
        #expect(ServiceProcess.value(of: "siwa_webhook_pending_deliveries", in: text) == 2)
        #expect(ServiceProcess.value(of: "siwa_webhook_dead_deliveries", in: text) == 2)
        // The healthy endpoint: nothing pending, dead or failing.
        #expect(endpointValue("siwa_webhook_endpoint_dead", ok, in: text) == 0)
        #expect(endpointValue("siwa_webhook_endpoint_consecutive_failures", ok, in: text) == 0)
        #expect(endpointValue("siwa_webhook_endpoint_failing_since_timestamp_seconds", ok, in: text) == 0)
        #expect(endpointValue("siwa_webhook_endpoint_backoff_until_timestamp_seconds", ok, in: text) == 0)
        #expect(endpointValue("siwa_webhook_endpoint_disabled", ok, in: text) == 0)
        #expect(endpointValue("siwa_webhook_endpoint_oldest_pending_age_seconds", ok, in: text) == 0)
        // The failing one: every attempt counted, failing since its first attempt.
        let attempts =
            try database.value(
                "SELECT count(*)::int FROM siwa.webhook_attempt_history WHERE endpoint_id = $1",
                [.int(Int64(bad))])
            as Int
        #expect(attempts >= 4)
        #expect(
            endpointValue("siwa_webhook_endpoint_consecutive_failures", bad, in: text) == Double(attempts))
        let failingSince = try #require(
            endpointValue("siwa_webhook_endpoint_failing_since_timestamp_seconds", bad, in: text))
        #expect(failingSince >= started - 1 && failingSince <= Date().timeIntervalSince1970)
        #expect(endpointValue("siwa_webhook_endpoint_disabled", bad, in: text) == 0)
        // The disabled one: its deliveries wait, and age.
        #expect(endpointValue("siwa_webhook_endpoint_disabled", off, in: text) == 1)
        #expect(endpointValue("siwa_webhook_endpoint_pending", off, in: text) == 2)
        #expect((endpointValue("siwa_webhook_endpoint_oldest_pending_age_seconds", off, in: text) ?? 0) > 0)
        // Labels: the endpoint's id and its URL's host and port, never the path or query.
        let port = failing.port
        #expect(text.contains("siwa_webhook_endpoint_dead{endpoint=\"\(bad)\",host=\"127.0.0.1:\(port)\"} 2"))
        #expect(!text.contains("hush-hush"))
        #expect(!text.contains("/hooks"))

        // siwactl stats, as a member of siwa_admin: the same per endpoint, in both forms.
        let admin = try database.url(asMemberOf: "siwa_admin")
        let json = try siwactl(["stats", "--database-url", admin, "--json"])
        #expect(json.status == 0, "\(json.standardError)")
        #expect(!json.standardOutput.contains("hush-hush"))
        let object = try #require(
            try JSONSerialization.jsonObject(with: Data(json.standardOutput.utf8)) as? [String: Any])
        let endpoints = try #require(object["webhook_endpoints"] as? [[String: Any]])
        // Those in trouble first (disabled, failing, with dead deliveries), then by id.
        #expect(endpoints.map { $0["id"] as? Int } == [bad, off, ok])
        let failed = endpoints[0]
        #expect(failed["host"] as? String == "127.0.0.1:\(port)")
        #expect(failed["dead"] as? Int == 2)
        #expect(failed["pending"] as? Int == 0)
        #expect(failed["oldest_pending_seconds"] is NSNull)
        #expect(failed["consecutive_failures"] as? Int == attempts)
        #expect((failed["failing_since"] as? String)?.hasPrefix("20") == true)
        #expect((failed["failing_for_seconds"] as? Double ?? -1) >= 0)
        #expect(failed["disabled"] as? Bool == false)
        let disabled = endpoints[1]
        #expect(disabled["disabled"] as? Bool == true)
        #expect(disabled["pending"] as? Int == 2)
        #expect((disabled["oldest_pending_seconds"] as? Double ?? 0) > 0)
        #expect(disabled["failing_since"] is NSNull)
        #expect(endpoints[2]["consecutive_failures"] as? Int == 0)
        #expect(endpoints[2]["failing_since"] is NSNull)
        let plain = try siwactl(["stats", "--database-url", admin])
        #expect(plain.status == 0, "\(plain.standardError)")
        #expect(!plain.standardOutput.contains("hush-hush"))
        let table = plain.standardOutput.components(separatedBy: "webhook endpoints\n").last ?? ""
        let lines = table.split(separator: "\n").map {
            $0.split(separator: " ", omittingEmptySubsequences: true)
        }
        #expect(lines.count == 4, "\(plain.standardOutput)")
        #expect(lines.first?.first == "endpoint")
        #expect(lines.dropFirst().first?.prefix(4) == ["\(bad)", "127.0.0.1:\(port)", "0", "2"])
        #expect(table.contains("(\(attempts) failures"))
        #expect(lines.dropFirst(2).first?.last == "yes")

        // The endpoint answers again; the dead ones are replayed and delivered: the run of failures ends.
        failingStatus.withLock { $0 = 204 }
        try database.query("SELECT siwa.replay_webhook_deliveries(p_endpoint => $1)", [.int(Int64(bad))])
        #expect(
            waitUntil(timeout: .seconds(30)) {
                text = (try? worker.scrape()) ?? ""
                return endpointValue("siwa_webhook_endpoint_consecutive_failures", bad, in: text) == 0
                    && endpointValue("siwa_webhook_endpoint_failing_since_timestamp_seconds", bad, in: text)
                        == 0
                    && endpointValue("siwa_webhook_endpoint_dead", bad, in: text) == 0
            }, "\(worker.log)\n\(text)")
    }

    @Test("a scrape while another session holds an exclusive lock on the webhook tables answers at once")
    func scrapeUnderLock() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver()
        let endpoint = try database.addEndpoint(url: receiver.url, secret: .generate())
        let worker = try ServiceProcess.worker(database, ["--webhook-poll-interval", "0.1"])
        #expect(
            waitUntil(timeout: .seconds(30)) {
                let text = (try? worker.scrape()) ?? ""
                return endpointValue("siwa_webhook_endpoint_pending", endpoint, in: text) == 0
            }, "\(worker.log)")

        let locker = try PostgresConnection(configuration: database.configuration)
        defer { locker.close() }
        try locker.query("BEGIN")
        try locker.query(
            "LOCK TABLE siwa.webhook_deliveries, siwa.webhook_endpoints IN ACCESS EXCLUSIVE MODE")
        // The reading waits for the lock (at most its lock_timeout); every scrape meanwhile answers at
        // once, and once the reading gave up the gauges say so instead of showing stale values.
        var slowest: Duration = .zero
        var text = ""
        let blind = waitUntil(timeout: .seconds(30)) {
            let start = ContinuousClock.now
            text = (try? worker.scrape()) ?? ""
            slowest = max(slowest, ContinuousClock.now - start)
            return ServiceProcess.value(of: "siwa_webhook_gauges_up", in: text) == 0
        }
        #expect(blind, "\(worker.log)")
        #expect(slowest < .seconds(1), "a scrape took \(slowest)")
        #expect(ServiceProcess.value(of: "siwa_webhook_dead_deliveries", in: text)?.isNaN == true)
        #expect(endpointValue("siwa_webhook_endpoint_pending", endpoint, in: text) == nil)
        try locker.query("ROLLBACK")
        #expect(
            waitUntil(timeout: .seconds(30)) {
                (try? worker.metric("siwa_webhook_gauges_up")) == 1
            }, "\(worker.log)")
    }
}
