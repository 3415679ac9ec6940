import Foundation
import Postgres
import QueueConsumer
import TestSupport
import Testing
import WebhookDelivery
import Webhooks

// ==== operations (retry, replay by state, remove, auto-disable, siwa_webhook_admin) ====
/// The SQLSTATE `body` failed with; nil when it succeeded.
private func refusal(_ body: () throws -> Void) -> String? {
    do {
        try body()
        return nil
    } catch let error as PostgresError {
        return error.sqlState ?? "(no SQLSTATE)"
    } catch {
        return "(not a PostgresError)"
    }
}

@Suite("Webhook operations", .serialized)
struct OperationsTests {
    @Test(
        "retry: a delivery in backoff is due now, backoff reset, not an attempt; delivered and dead are left")
    func retryNow() throws {
        let database = try WebhookDatabase()
        // The first attempt of every delivery is refused; the next is accepted.
        let receiver = try WebhookReceiver { _, seen in seen == 0 ? (503, .zero) : (204, .zero) }
        let endpoint = try database.addEndpoint(url: receiver.url, secret: .generate())
        try database.insertChange(sub: "a")
        try database.insertChange(sub: "b")
        let dispatcher = try database.dispatcher(retryBaseDelay: .seconds(600), maxRetryDelay: .seconds(600))
        #expect(try dispatcher.drainOnce().map(\.state) == [.retry, .retry])
        // In backoff (at least 300 s): another drain attempts nothing.
        #expect(try dispatcher.drainOnce().isEmpty)
        let first = try database.value("SELECT min(id)::int FROM siwa.webhook_deliveries") as Int

        #expect(
            try database.value("SELECT siwa.retry_webhook_deliveries(p_delivery => $1)", [.int(Int64(first))])
                as Int == 1)
        #expect(
            try database.value(
                "SELECT attempts = 0 AND next_attempt_at <= now() FROM siwa.webhook_deliveries WHERE id = $1",
                [.int(Int64(first))]) as Bool)
        // Not an attempt: the history still holds the two refusals only.
        #expect(try database.value("SELECT count(*)::int FROM siwa.webhook_attempts") as Int == 2)
        #expect(try dispatcher.drainOnce().map(\.delivery) == [first])
        #expect(try database.count("delivered") == 1)

        // The endpoint's pending ones: the other delivery; the delivered one is not touched.
        #expect(
            try database.value(
                "SELECT siwa.retry_webhook_deliveries(p_endpoint => $1)", [.int(Int64(endpoint))])
                as Int == 1)
        #expect(try dispatcher.drainOnce().map(\.state) == [.delivered])
        #expect(try database.count("delivered") == 2)
        #expect(
            try database.value("SELECT siwa.retry_webhook_deliveries(p_delivery => $1)", [.int(Int64(first))])
                as Int == 0)

        // A delivery in flight (a live lease) is its attempt's, not the retry's.
        try database.insertChange(sub: "c")
        try database.connection.execute(
            "UPDATE siwa.webhook_deliveries SET lease_owner = 'x', lease_expires_at = now() + interval '1 hour', next_attempt_at = now() + interval '1 hour' WHERE state = 'pending'"
        )
        #expect(
            try database.value(
                "SELECT siwa.retry_webhook_deliveries(p_endpoint => $1)", [.int(Int64(endpoint))])
                as Int == 0)
        #expect(throws: PostgresError.self) {
            _ = try database.connection.query("SELECT siwa.retry_webhook_deliveries()")
        }
    }

    @Test(
        "replay chooses by state: dead only, failed (dead and in backoff), all; in a window of every endpoint"
    )
    func replayByState() throws {
        let database = try WebhookDatabase()
        // Subs d and r are refused once; ok is accepted.
        let receiver = try WebhookReceiver { delivery, seen in
            delivery.sub != "ok" && seen == 0 ? (503, .zero) : (204, .zero)
        }
        try database.addEndpoint(url: receiver.url, secret: .generate())
        let dead = try database.insertChange(sub: "d")
        let giveUpAtOnce = try database.dispatcher(giveUpAfter: .nanoseconds(1))
        #expect(try giveUpAtOnce.drainOnce().map(\.state) == [.dead])
        let retrying = try database.insertChange(sub: "r")
        try database.insertChange(sub: "ok")
        let dispatcher = try database.dispatcher(retryBaseDelay: .seconds(600), maxRetryDelay: .seconds(600))
        #expect(try dispatcher.drainOnce().map(\.state.rawValue).sorted() == ["delivered", "retry"])
        func replay(_ arguments: String) throws -> Int {
            try database.value("SELECT siwa.replay_webhook_deliveries(\(arguments))")
        }
        func state(_ change: Int) throws -> String {
            try database.value(
                "SELECT state || ':' || (next_attempt_at <= now()) FROM siwa.webhook_deliveries WHERE change_id = $1",
                [.int(Int64(change))])
        }

        // dead: only the dead one; the one in backoff keeps waiting; the delivered one is not sent again.
        #expect(try replay("p_since => now() - interval '1 hour', p_state => 'dead'") == 1)
        #expect(try state(dead) == "pending:true")
        #expect(try state(retrying) == "pending:false")
        #expect(try dispatcher.drainOnce().map(\.state) == [.delivered])
        #expect(receiver.accepted.map(\.changeID).sorted() == [dead, retrying + 1].sorted())

        // failed: dead ones and those in backoff; here the one in backoff, due now with a fresh schedule.
        #expect(try replay("p_since => now() - interval '1 hour', p_state => 'failed'") == 1)
        #expect(try state(retrying) == "pending:true")
        #expect(
            try database.value(
                "SELECT attempts FROM siwa.webhook_deliveries WHERE change_id = $1", [.int(Int64(retrying))])
                as Int == 0)
        #expect(try dispatcher.drainOnce().map(\.state) == [.delivered])

        // all: delivered ones too; a window in the future chooses nothing.
        #expect(try replay("p_since => now() + interval '1 minute', p_state => 'all'") == 0)
        #expect(try replay("p_since => now() - interval '1 hour', p_state => 'all'") == 3)
        #expect(try dispatcher.drainOnce().map(\.state) == [.delivered, .delivered, .delivered])

        // By delivery (every state): a pending one in backoff is due now.
        let later = try database.insertChange(sub: "r2")
        #expect(try dispatcher.drainOnce().map(\.state) == [.retry])
        let id =
            try database.value(
                "SELECT id::int FROM siwa.webhook_deliveries WHERE change_id = $1", [.int(Int64(later))])
            as Int
        #expect(try replay("p_delivery => \(id)") == 1)
        #expect(try state(later) == "pending:true")
        #expect(throws: PostgresError.self) { _ = try replay("p_delivery => \(id), p_state => 'delivered'") }
        #expect(throws: PostgresError.self) { _ = try replay("p_delivery => \(id), p_since => now()") }
    }

    @Test(
        "remove: refused (55006) while pending unless forced; its secrets, deliveries and attempts go with it"
    )
    func remove() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver()
        let done = try database.addEndpoint(url: receiver.url, secret: .generate())
        try database.insertChange(sub: "a")
        _ = try database.dispatcher().drainOnce()
        let waiting = try database.addEndpoint(url: receiver.url, secret: .generate())
        try database.insertChange(sub: "b")
        _ = try database.connection.query(
            "SELECT siwa.set_webhook_endpoint_enabled($1, false)", [.int(Int64(waiting))])
        _ = try database.dispatcher().drainOnce()
        func remove(_ id: Int, force: Bool) throws -> Int? {
            try database.connection.query(
                "SELECT siwa.remove_webhook_endpoint($1, $2)", [.int(Int64(id)), .bool(force)])[0][
                    0, as: Int?.self]
        }
        func rows(_ id: Int) throws -> Int {
            try database.value(
                """
                SELECT ((SELECT count(*) FROM siwa.webhook_endpoints WHERE id = $1)
                      + (SELECT count(*) FROM siwa.webhook_secrets WHERE endpoint_id = $1)
                      + (SELECT count(*) FROM siwa.webhook_deliveries WHERE endpoint_id = $1)
                      + (SELECT count(*) FROM siwa.webhook_attempts a JOIN siwa.webhook_deliveries d
                                ON d.id = a.delivery_id WHERE d.endpoint_id = $1))::int
                """, [.int(Int64(id))])
        }
        do {
            _ = try remove(waiting, force: false)
            Issue.record("removing an endpoint with a pending delivery was not refused")
        } catch let error as PostgresError {
            #expect(error.sqlState == "55006")
        }
        #expect(try rows(waiting) > 0)
        #expect(try remove(waiting, force: true) == 1)
        #expect(try rows(waiting) == 0)
        // Delivered history only: removed without force; the change itself stays.
        #expect(try rows(done) == 1 + 1 + 2 + 2)  // the endpoint, its secret, 2 deliveries, 2 attempts
        #expect(try remove(done, force: false) == 0)
        #expect(try rows(done) == 0)
        #expect(try database.value("SELECT count(*)::int FROM siwa.changes") as Int == 2)
        #expect(try remove(99, force: true) == nil)
    }

    @Test(
        "auto-disable: a 410 Gone disables the endpoint at once, recorded and visible to siwa_admin; enabling clears it"
    )
    func goneDisables() throws {
        let database = try WebhookDatabase()
        let gone = try WebhookReceiver { _, _ in (410, .zero) }
        let endpoint = try database.addEndpoint(url: gone.url, secret: .generate())
        try database.insertChange(sub: "a")
        try database.insertChange(sub: "b")
        let dispatcher = try database.dispatcher(retryBaseDelay: .seconds(600), maxRetryDelay: .seconds(600))
        #expect(try dispatcher.drainOnce().count >= 1)
        let admin = try PostgresConnection(configuration: database.configuration(asMemberOf: "siwa_admin"))
        defer { admin.close() }
        let row = try #require(
            try admin.query(
                "SELECT enabled, disabled_reason, disabled_at > now() - interval '1 minute', pending::int FROM siwa.webhook_endpoint_overview"
            ).first)
        #expect(try row[0, as: Bool.self] == false)
        #expect(try row[1, as: String.self] == "auto: the endpoint answered 410 Gone")
        #expect(try row[2, as: Bool.self])
        #expect(try row[3, as: Int.self] == 2)
        // Disabled: nothing more is attempted, and new changes do not fan out to it.
        let attempts = gone.deliveries.count
        try database.insertChange(sub: "c")
        #expect(
            try database.value(
                "SELECT siwa.retry_webhook_deliveries(p_endpoint => $1)", [.int(Int64(endpoint))]) as Int >= 1
        )
        #expect(try dispatcher.drainOnce().isEmpty)
        #expect(gone.deliveries.count == attempts)
        #expect(try database.count("pending") == 2)
        // Enabling clears the record.
        _ = try database.connection.query(
            "SELECT siwa.set_webhook_endpoint_enabled($1, true)", [.int(Int64(endpoint))])
        #expect(
            try admin.query(
                "SELECT enabled AND disabled_reason IS NULL AND failing_since IS NULL FROM siwa.webhook_endpoint_overview"
            )[0][0, as: Bool.self])
        _ = try database.connection.query(
            "SELECT siwa.set_webhook_endpoint_enabled($1, false)", [.int(Int64(endpoint))])
        #expect(
            try database.value("SELECT disabled_reason FROM siwa.webhook_endpoints") as String == "manual")
    }

    @Test(
        "auto-disable: failing continuously for siwa.settings.webhook_auto_disable_after disables; a 2xx ends the run"
    )
    func failingDisables() throws {
        let database = try WebhookDatabase()
        let flaky = try WebhookReceiver { delivery, seen in
            delivery.sub == "heals" && seen >= 1 ? (204, .zero) : (503, .zero)
        }
        try database.addEndpoint(url: flaky.url, secret: .generate())
        let dispatcher = try database.dispatcher(
            retryBaseDelay: .milliseconds(50), maxRetryDelay: .milliseconds(100))
        // A run of failures that ends with a 2xx: failing_since set, then cleared; still enabled.
        try database.insertChange(sub: "heals")
        #expect(try dispatcher.drainOnce().map(\.state) == [.retry])
        #expect(try database.value("SELECT failing_since IS NOT NULL FROM siwa.webhook_endpoints") as Bool)
        #expect(
            waitUntil(timeout: .seconds(10)) { (try? dispatcher.drainOnce().map(\.state)) == [.delivered] })
        #expect(
            try database.value("SELECT enabled AND failing_since IS NULL FROM siwa.webhook_endpoints") as Bool
        )

        try database.connection.execute(
            "UPDATE siwa.settings SET webhook_auto_disable_after = interval '300 milliseconds'")
        try database.insertChange(sub: "broken")
        let running = RunningDispatcher(dispatcher)
        defer { running.stop() }
        #expect(
            waitUntil(timeout: .seconds(15)) {
                (try? database.value("SELECT NOT enabled FROM siwa.webhook_endpoints") as Bool) == true
            })
        let reason =
            try database.value("SELECT disabled_reason FROM siwa.webhook_endpoint_overview") as String
        #expect(reason.hasPrefix("auto: failing continuously since "), "\(reason)")
        #expect(reason.hasSuffix("(siwa.settings.webhook_auto_disable_after: 00:00:00.3)"), "\(reason)")
        #expect(
            try database.value(
                "SELECT disabled_at - failing_since >= interval '300 milliseconds' FROM siwa.webhook_endpoints"
            )
                as Bool)
    }

    @Test(
        "siwa_webhook_admin adds, rotates, disables, retries, replays and removes; never reads a secret (42501)"
    )
    func webhookAdminRole() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver { _, seen in seen == 0 ? (503, .zero) : (204, .zero) }
        let admin = try PostgresConnection(
            configuration: database.configuration(asMemberOf: "siwa_webhook_admin"))
        defer { admin.close() }
        let secret = StandardWebhooks.Secret.generate()
        let endpoint = try admin.query(
            "SELECT siwa.add_webhook_endpoint($1, $2)", [.text(receiver.url), .text(secret.text)])[0][
                0, as: Int.self]
        #expect(
            try admin.query(
                "SELECT siwa.rotate_webhook_secret($1, $2, interval '1 hour')",
                [.int(Int64(endpoint)), .text(StandardWebhooks.Secret.generate().text)])[0][0, as: Bool.self])
        try database.insertChange(sub: "a", email: "a@privaterelay.appleid.com")
        let dispatcher = try database.dispatcher(retryBaseDelay: .seconds(600), maxRetryDelay: .seconds(600))
        #expect(try dispatcher.drainOnce().map(\.state) == [.retry])
        #expect(
            try admin.query(
                "SELECT siwa.retry_webhook_deliveries(p_endpoint => $1)", [.int(Int64(endpoint))])[0][
                    0, as: Int.self] == 1)
        #expect(try dispatcher.drainOnce().map(\.state) == [.delivered])
        #expect(
            try admin.query(
                "SELECT siwa.replay_webhook_deliveries(p_endpoint => $1, p_since => now() - interval '1 hour')",
                [.int(Int64(endpoint))])[0][0, as: Int.self] == 1)
        #expect(
            try admin.query("SELECT siwa.set_webhook_endpoint_enabled($1, false)", [.int(Int64(endpoint))])[
                0][
                    0, as: Bool.self])
        #expect(try admin.query("SELECT id, expires_at FROM siwa.webhook_secrets").count == 2)
        for sql in [
            "SELECT secret FROM siwa.webhook_secrets", "SELECT * FROM siwa.webhook_secrets",
            "SELECT email FROM siwa.changes",
            "UPDATE siwa.webhook_endpoints SET url = 'https://evil.example/'",
        ] {
            #expect(refusal { _ = try admin.query(sql) } == "42501", "\(sql)")
        }
        let text = try admin.query("SELECT o::text FROM siwa.webhook_endpoint_overview o")[0][
            0, as: String.self]
        #expect(!text.contains("whsec_"))
        #expect(
            try admin.query("SELECT siwa.remove_webhook_endpoint($1, true)", [.int(Int64(endpoint))])[0][
                0, as: Int.self] == 1)
        #expect(try database.value("SELECT count(*)::int FROM siwa.webhook_secrets") as Int == 0)
    }
}
// ==== end operations ====
