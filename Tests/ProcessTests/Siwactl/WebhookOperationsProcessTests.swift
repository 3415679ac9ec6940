import Foundation
import Postgres
import QueueConsumer
import TestSupport
import Testing
import WebhookDelivery
import Webhooks

// ==== operations through siwactl (retry, replay by state, remove) ====
@Suite("siwactl webhooks operations", .serialized)
struct WebhookOperationsProcessTests {
    let siwactl = ExecutableLocator.url(named: "siwactl")

    func run(_ arguments: [String]) throws -> ExecutableLocator.Result {
        try ExecutableLocator.run(siwactl, arguments: ["webhooks"] + arguments)
    }

    @Test(
        "siwactl webhooks retry: --delivery and --endpoint make backoffs due now; wrong states answer clearly"
    )
    func retry() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver { _, seen in seen == 0 ? (503, .zero) : (204, .zero) }
        let endpoint = try database.addEndpoint(url: receiver.url, secret: .generate())
        try database.insertChange(sub: "a")
        try database.insertChange(sub: "b")
        let dispatcher = try database.dispatcher(retryBaseDelay: .seconds(600), maxRetryDelay: .seconds(600))
        #expect(try dispatcher.drainOnce().map(\.state) == [.retry, .retry])
        let first = try database.value("SELECT min(id)::int FROM siwa.webhook_deliveries") as Int

        let one = try run(["retry", "--database-url", database.url, "--delivery", String(first)])
        #expect(one.status == 0, "\(one.standardError)")
        #expect(one.standardOutput == "due now: 1 delivery\n")
        #expect(try dispatcher.drainOnce().map(\.delivery) == [first])

        let delivered = try run(["retry", "--database-url", database.url, "--delivery", String(first)])
        #expect(delivered.status == 1)
        #expect(
            delivered.standardError.contains("is delivered, not pending: siwactl webhooks replay --delivery"))

        let all = try run(["retry", "--database-url", database.url, "--endpoint", String(endpoint)])
        #expect(all.status == 0, "\(all.standardError)")
        #expect(all.standardOutput == "due now: 1 delivery\n")
        #expect(try dispatcher.drainOnce().map(\.state) == [.delivered])

        let unknown = try run(["retry", "--database-url", database.url, "--endpoint", "99"])
        #expect(unknown.status == 1)
        #expect(unknown.standardError.contains("no endpoint 99"))
        let both = try run(["retry", "--database-url", database.url, "--endpoint", "1", "--delivery", "1"])
        #expect(both.status == 2)
    }

    @Test(
        "siwactl webhooks replay --since: dead only by default, --state failed|all; --delivery says why not")
    func replayByState() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver { delivery, seen in
            delivery.sub != "ok" && seen == 0 ? (503, .zero) : (204, .zero)
        }
        try database.addEndpoint(url: receiver.url, secret: .generate())
        try database.insertChange(sub: "d")
        #expect(try database.dispatcher(giveUpAfter: .nanoseconds(1)).drainOnce().map(\.state) == [.dead])
        let retrying = try database.insertChange(sub: "r")
        try database.insertChange(sub: "ok")
        let dispatcher = try database.dispatcher(retryBaseDelay: .seconds(600), maxRetryDelay: .seconds(600))
        _ = try dispatcher.drainOnce()
        let url = database.url

        let dead = try run(["replay", "--database-url", url, "--since", "1h"])
        #expect(dead.status == 0, "\(dead.standardError)")
        #expect(dead.standardOutput == "queued 1 delivery\n")
        #expect(try dispatcher.drainOnce().map(\.state) == [.delivered])

        let backoff =
            try database.value(
                "SELECT id::int FROM siwa.webhook_deliveries WHERE change_id = $1", [.int(Int64(retrying))])
            as Int
        let refused = try run([
            "replay", "--database-url", url, "--delivery", String(backoff), "--state", "dead",
        ])
        #expect(refused.status == 0)
        #expect(refused.standardOutput == "queued 0 deliveries\n")
        #expect(refused.standardError.contains("pending in backoff"))
        #expect(refused.standardError.contains("siwactl webhooks retry --delivery"))

        let failed = try run(["replay", "--database-url", url, "--since", "1h", "--state", "failed"])
        #expect(failed.standardOutput == "queued 1 delivery\n", "\(failed.standardError)")
        #expect(try dispatcher.drainOnce().map(\.state) == [.delivered])
        let all = try run(["replay", "--database-url", url, "--since", "1h", "--state", "all"])
        #expect(all.standardOutput == "queued 3 deliveries\n", "\(all.standardError)")

        let bad = try run(["replay", "--database-url", url, "--since", "1h", "--state", "delivered"])
        #expect(bad.status == 2)
        let unknown = try run(["replay", "--database-url", url, "--delivery", "999"])
        #expect(unknown.status == 1)
        #expect(unknown.standardError.contains("no delivery 999"))
    }

    @Test("siwactl webhooks remove --endpoint ID: refused while pending, --force deletes them; unknown fails")
    func remove() throws {
        let database = try WebhookDatabase()
        let endpoint = try database.addEndpoint(url: "https://hooks.example.com/x", secret: .generate())
        try database.insertChange(sub: "a")
        let url = database.url
        let refused = try run(["remove", "--database-url", url, "--endpoint", String(endpoint)])
        #expect(refused.status == 1)
        #expect(refused.standardError.contains("1 pending delivery: kept; remove it with --force"))
        #expect(try database.value("SELECT enabled FROM siwa.webhook_endpoints") as Bool)
        let forced = try run(["remove", "--database-url", url, "--force", "--endpoint", String(endpoint)])
        #expect(forced.status == 0, "\(forced.standardError)")
        #expect(forced.standardOutput == "endpoint \(endpoint) removed with 1 pending delivery deleted\n")
        #expect(forced.standardError == "")
        #expect(try database.value("SELECT count(*)::int FROM siwa.webhook_secrets") as Int == 0)
        #expect(try database.value("SELECT count(*)::int FROM siwa.webhook_deliveries") as Int == 0)
        let again = try run(["remove", "--database-url", url, "--endpoint", String(endpoint)])
        #expect(again.status == 1)
        #expect(again.standardError.contains("no endpoint \(endpoint)"))
        let missing = try run(["remove", "--database-url", url])
        #expect(missing.status == 2)
        #expect(missing.standardError.contains("missing --endpoint ID"))
        let twice = try run(["remove", "--database-url", url, "--endpoint", "1", "1"])
        #expect(twice.status == 2)
    }

    @Test("siwactl webhooks remove ID, the deprecated form, still removes, with a warning")
    func removeDeprecatedArgument() throws {
        let database = try WebhookDatabase()
        let endpoint = try database.addEndpoint(url: "https://hooks.example.com/x", secret: .generate())
        let removed = try run(["remove", "--database-url", database.url, String(endpoint)])
        #expect(removed.status == 0, "\(removed.standardError)")
        #expect(removed.standardError.contains("'remove ID' is deprecated, use 'remove --endpoint ID'"))
        #expect(try database.value("SELECT count(*)::int FROM siwa.webhook_endpoints") as Int == 0)
    }
}
// ==== end operations through siwactl ====
