import Foundation
import Postgres
import QueueConsumer
import TestSupport
import Testing
import WebhookDelivery
import Webhooks

/// `database` as a login role that is a member of the group role `role`.
private func configuration(_ database: WebhookDatabase, as role: String) throws -> PostgresConfiguration {
    try database.configuration(asMemberOf: role)
}

private func sqlState(_ body: () throws -> Void) -> String? {
    do {
        try body()
        return nil
    } catch let error as PostgresError {
        return error.sqlState ?? "(no SQLSTATE)"
    } catch {
        return "(not a PostgresError)"
    }
}

@Suite("Webhook privileges")
struct PrivilegeTests {
    @Test("secrets are refused to siwa_admin and siwa_app (42501); admins read the views, which hold none")
    func secretsRefused() throws {
        let database = try WebhookDatabase()
        let secret = StandardWebhooks.Secret.generate()
        try database.addEndpoint(url: "https://hooks.example.com/x", secret: secret)
        try database.insertChange(sub: "p")
        for role in ["siwa_admin", "siwa_app"] {
            let connection = try PostgresConnection(configuration: configuration(database, as: role))
            defer { connection.close() }
            for sql in [
                "SELECT secret FROM siwa.webhook_secrets", "SELECT * FROM siwa.webhook_endpoints",
                "SELECT * FROM siwa.webhook_deliveries", "SELECT * FROM siwa.webhook_attempts",
                "UPDATE siwa.webhook_endpoints SET url = 'https://evil.example/'",
                "INSERT INTO siwa.webhook_secrets (endpoint_id, secret) VALUES (1, '\(StandardWebhooks.Secret.generate().text)')",
                "SELECT siwa.add_webhook_endpoint('https://evil.example/', '\(secret.text)')",
                "SELECT siwa.replay_webhook_deliveries(p_change => 1)",
            ] {
                #expect(sqlState { _ = try connection.query(sql) } == "42501", "\(role): \(sql)")
            }
            let views = "SELECT * FROM siwa.webhook_endpoint_overview"
            if role == "siwa_admin" {
                let rows = try connection.query(views)
                #expect(rows.count == 1)
                #expect(try connection.query("SELECT * FROM siwa.webhook_delivery_status").count == 1)
                #expect(try connection.query("SELECT * FROM siwa.webhook_attempt_history").count == 0)
                let text = try connection.query("SELECT o::text FROM siwa.webhook_endpoint_overview o")[0][
                    0, as: String.self]
                #expect(!text.contains("whsec_"))
            } else {
                #expect(sqlState { _ = try connection.query(views) } == "42501")
            }
        }
    }

    @Test("siwa_worker can deliver: fan-out on its own insert, claim, sign, record")
    func workerDelivers() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver()
        try database.addEndpoint(url: receiver.url, secret: .generate())
        // The changefeed's worker inserts changes as siwa_worker: the fan-out runs with its rights.
        try database.connection.execute("GRANT INSERT ON siwa.changes TO siwa_worker")
        let worker = try PostgresConnection(configuration: configuration(database, as: "siwa_worker"))
        defer { worker.close() }
        try worker.execute(
            "INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti) VALUES ('siwa.consent_revoked', 'w', now(), now(), 'j')"
        )
        let outcomes = try database.dispatcher(configuration: configuration(database, as: "siwa_worker"))
            .drainOnce()
        #expect(outcomes.map(\.state) == [.delivered])
        #expect(receiver.accepted.count == 1)
        #expect(
            sqlState {
                _ = try worker.query("SELECT siwa.add_webhook_endpoint('https://x.example/', 'whsec_x')")
            } == "42501")
    }
}
