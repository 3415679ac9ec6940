import Postgres
import ServiceHealth
import TestSupport
import Testing
import WebhookAdministration
import Webhooks

/// Webhook administration as a library, in process: the calls `siwactl webhooks` and `stats` make.
@Suite("WebhookAdministration in process: endpoints, keys, deliveries and stats as typed rows")
struct WebhookAdministrationTests {
    @Test("an endpoint added is listed with its settings, disabled, rotated and removed; then it is gone")
    func endpointLifecycle() throws {
        let database = try TestDatabase()
        let webhooks = WebhookAdministration(database.connection)
        let id = try webhooks.addEndpoint(
            url: "https://app.example/hooks", secret: StandardWebhooks.Secret.generate().text,
            types: [WebhookChange.types[0]], maxInFlight: 3, publicKey: nil)
        let listed = try webhooks.endpoints()
        #expect(listed.map(\.id) == [id])
        #expect(listed.first?.url == "https://app.example/hooks")
        #expect(listed.first?.types == WebhookChange.types[0])
        #expect(listed.first?.maxInFlight == 3)
        #expect(listed.first?.enabled == true)
        #expect(listed.first?.liveSecrets == 1)
        #expect(try webhooks.currentScheme(endpoint: Int64(id)) == .v1)

        #expect(try webhooks.setEnabled(endpoint: Int64(id), false))
        #expect(try webhooks.endpoints().first?.enabled == false)
        #expect(try !webhooks.setEnabled(endpoint: Int64(id) + 1000, true))

        let key = StandardWebhooks.SigningKey.ed25519(.generate())
        #expect(
            try webhooks.rotateSecret(
                endpoint: Int64(id), secret: key.text, overlap: 60, publicKey: key.publicKey?.text))
        #expect(try webhooks.currentScheme(endpoint: Int64(id)) == .v1a)

        #expect(try webhooks.pendingDeliveries(endpoint: Int64(id)) == 0)
        #expect(try webhooks.endpointExists(Int64(id)))
        #expect(try webhooks.remove(endpoint: Int64(id), force: false) == .removed(deletedPending: 0))
        #expect(try webhooks.remove(endpoint: Int64(id), force: false) == .notFound)
        #expect(try !webhooks.endpointExists(Int64(id)))
        #expect(try webhooks.pendingDeliveries(endpoint: Int64(id)) == nil)
    }

    @Test("an unknown delivery reads as nil, retries and replays of nothing count zero")
    func unknownDelivery() throws {
        let database = try TestDatabase()
        let webhooks = WebhookAdministration(database.connection)
        #expect(try webhooks.delivery(424_242) == nil)
        #expect(try webhooks.retry(delivery: 424_242, endpoint: nil) == 0)
        #expect(
            try webhooks.replay(
                delivery: 424_242, change: nil, endpoint: nil, since: nil, until: nil, choosing: .all) == 0)
    }

    @Test("stats: the totals, one row per endpoint and the queue's health decode from a fresh schema")
    func stats() throws {
        let database = try TestDatabase()
        let webhooks = WebhookAdministration(database.connection)
        let id = try webhooks.addEndpoint(
            url: "https://app.example:8443/hooks?token=t", secret: StandardWebhooks.Secret.generate().text,
            types: nil, maxInFlight: 4, publicKey: nil)
        let totals = try #require(try webhooks.deliveryTotals())
        #expect(totals.pending == 0 && totals.dead == 0 && totals.enabledEndpoints == 1)
        let endpoints = try #require(try webhooks.endpointStats())
        #expect(endpoints.map(\.id) == [id])
        #expect(endpoints.first?.host == "app.example:8443")
        #expect(endpoints.first?.failingSince == nil)
        let queue = try #require(try QueueHealth.read(on: database.connection))
        #expect(queue.pending == 0 && queue.dead == 0)
    }
}
