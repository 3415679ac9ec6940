import AppleNotifications
import Foundation
import Postgres
import TestSupport
import Testing

/// The health series on the /metrics of a real siwa-receiver and siwa-worker, each
/// connected as a member of its own group role.
@Suite("The receiver's and worker's /metrics carry the health series")
struct HealthMetricsTests {
    /// Series from the database, on both.
    static let databaseSeries = [
        "siwa_health_gauges_up", "siwa_last_verified_notification_timestamp_seconds",
        "siwa_last_application_timestamp_seconds", "siwa_dead_notifications",
        "siwa_oldest_pending_notification_age_seconds",
    ]

    @Test("they move as a notification is stored and applied, a notification dies and one waits")
    func liveSeries() throws {
        let database = try TestDatabase()
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let started = Date().timeIntervalSince1970
        let receiver = try ServiceProcess.receiver(database, audiences: [TestSigning.audience], jwks: jwks)
        // The worker verifies each stored token against the same key set.
        let worker = try ServiceProcess.worker(database, ["--jwks-url", jwks.url.absoluteString])

        // Every series has its HELP and TYPE; nothing stored yet.
        let own = [
            (receiver, "siwa_receiver_last_verified_notification_timestamp_seconds"),
            (worker, "siwa_worker_last_application_timestamp_seconds"),
        ]
        for (process, ownSeries) in own {
            let text = try process.scrape()
            for name in Self.databaseSeries + [ownSeries] {
                #expect(text.contains("# HELP \(name) "), "\(name) lacks HELP")
                #expect(text.contains("# TYPE \(name) gauge\n"), "\(name) lacks TYPE")
            }
            #expect(ServiceProcess.value(of: "siwa_health_gauges_up", in: text) == 1, "\(process.log)")
            #expect(ServiceProcess.value(of: "siwa_dead_notifications", in: text) == 0)
            #expect(ServiceProcess.value(of: "siwa_oldest_pending_notification_age_seconds", in: text) == 0)
            #expect(ServiceProcess.value(of: "siwa_last_application_timestamp_seconds", in: text) == 0)
            #expect(ServiceProcess.value(of: ownSeries, in: text) == 0)
            // Nothing ever received: the schema's installation time, so that a silence alert counts from it.
            let silentSince = ServiceProcess.value(
                of: "siwa_last_verified_notification_timestamp_seconds", in: text)
            #expect(silentSince.map { $0 > started - 600 && $0 <= Date().timeIntervalSince1970 } == true)
        }

        // One notification, stored and applied: the times move, on both processes, from the database.
        let posted = Date().timeIntervalSince1970
        let body = Array(#"{"payload":"\#(TestSigning.token())"}"#.utf8)
        #expect(try TestHTTPClient.post(receiver.notificationURL!, body: body).status == 200)
        #expect(
            try receiver.metric("siwa_receiver_last_verified_notification_timestamp_seconds") ?? 0 >= posted
                - 1)
        for process in [receiver, worker] {
            #expect(
                waitUntil(timeout: .seconds(30)) {
                    let text = (try? process.scrape()) ?? ""
                    return
                        (ServiceProcess.value(
                            of: "siwa_last_verified_notification_timestamp_seconds", in: text)
                        ?? 0) >= posted - 1
                        && (ServiceProcess.value(of: "siwa_last_application_timestamp_seconds", in: text) ?? 0)
                            >= posted - 1
                }, "\(process.log)")
        }
        #expect(try worker.metric("siwa_worker_last_application_timestamp_seconds") ?? 0 >= posted - 1)

        // A dead notification, and one waiting (received 15 minutes ago, next attempt in an hour).
        try database.insert(jti: "health-dead", state: "dead", receivedAgo: 60)
        try database.insert(jti: "health-waiting", sub: "001.waiting", receivedAgo: 900, dueIn: 3600)
        for process in [receiver, worker] {
            #expect(
                waitUntil(timeout: .seconds(30)) {
                    let text = (try? process.scrape()) ?? ""
                    return ServiceProcess.value(of: "siwa_dead_notifications", in: text) == 1
                        && (ServiceProcess.value(of: "siwa_oldest_pending_notification_age_seconds", in: text)
                            ?? 0) >= 900
                }, "\(process.log)")
        }

        // Both recorded their heartbeat with their role's grant: the receiver with its audiences.
        let rows = try database.query(
            "SELECT kind, array_to_string(audiences, ','), version FROM siwa.service_heartbeats ORDER BY kind"
        )
        #expect(rows.count == 2)
        #expect(try rows.map { try $0[0, as: String.self] } == ["receiver", "worker"])
        #expect(try rows[0][1, as: String.self] == TestSigning.audience)
        #expect(try rows[1][1, as: String.self] == "")
        #expect(try rows[0][2, as: String.self].hasPrefix("schema "))

        // The database refusing the reading: siwa_health_gauges_up 0 and the gauges NaN, not stale values.
        try database.query("REVOKE EXECUTE ON FUNCTION siwa.health_gauges(timestamptz) FROM siwa_worker")
        #expect(
            waitUntil(timeout: .seconds(30)) {
                let text = (try? worker.scrape()) ?? ""
                return ServiceProcess.value(of: "siwa_health_gauges_up", in: text) == 0
                    && ServiceProcess.value(of: "siwa_dead_notifications", in: text)?.isNaN == true
            }, "\(worker.log)")

        // Stopped with SIGTERM, a process deletes its heartbeat: it no longer looks alive.
        worker.process.send(SIGTERM)
        #expect(worker.process.wait(timeout: .seconds(15)) == .exited(0))
        #expect(
            try database.query("SELECT count(*) FROM siwa.service_heartbeats WHERE kind = 'worker'")[0][
                0, as: Int.self] == 0)
    }
}
