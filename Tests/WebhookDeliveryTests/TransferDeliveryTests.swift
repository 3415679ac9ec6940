import Foundation
import Postgres
import QueueConsumer
import Synchronization
import TestSupport
import Testing
import WebhookDelivery
import Webhooks

@Suite("Webhooks across a team transfer")
struct TransferDeliveryTests {
    @Test(
        "after a team transfer, a user's pending deliveries go out under the new sub, in order, ahead of a later change"
    )
    func pendingDeliveriesFollowTheTransfer() throws {
        let database = try WebhookDatabase()
        let secret = StandardWebhooks.Secret.generate()
        // The user's first change fails once: the rest of the user's queue waits for its retry.
        let firstChange = Mutex<Int>(-1)
        let receiver = try WebhookReceiver { delivery, seen in
            (seen == 0 && delivery.changeID == firstChange.withLock { $0 }) ? (503, .zero) : (204, .zero)
        }
        try database.addEndpoint(url: receiver.url, secret: secret)
        try database.connection.execute("INSERT INTO siwa.accounts (sub) VALUES ('old.t'), ('other.t')")
        var ids: [Int] = []
        for (sub, type) in [
            ("old.t", "siwa.email_disabled"), ("other.t", "siwa.consent_revoked"),
            ("old.t", "siwa.consent_revoked"), ("old.t", "siwa.account_deleted"),
        ] {
            ids.append(try database.insertChange(type: type, sub: sub))
        }
        firstChange.withLock { $0 = ids[0] }
        // Its retry is due in 1.5 to 3 s.
        let first = try database.dispatcher(retryBaseDelay: .seconds(3), maxRetryDelay: .seconds(3))
            .drainOnce()
        #expect(first.map(\.state) == [.retry, .delivered])

        let outcome: String = try database.connection.query(
            "SELECT outcome FROM siwa.apply_sub_transfer('t1', '{old.t}', '{new.t}', NULL, NULL)")[0][0]
        #expect(outcome == "applied")
        // The transfer's own change, siwa.sub_transferred, queues behind the user's rewritten ones.
        let transferred: Int = try database.value(
            "SELECT id::int FROM siwa.changes WHERE type = 'siwa.sub_transferred' AND sub = 'new.t'")
        // A change of the user after the transfer (the worker writes it under the new sub).
        let late = try database.insertChange(type: "siwa.consent_revoked", sub: "new.t")
        // While the retry is not due, nothing of the user goes out, the later change neither.
        #expect(try database.dispatcher().drainOnce().isEmpty)
        #expect(
            waitUntil(timeout: .seconds(20)) {
                _ = try? database.dispatcher().drainOnce()
                return (try? database.count("delivered")) == ids.count + 2
            })

        let user = receiver.accepted.filter { $0.sub != "other.t" }
        #expect(user.map(\.changeID) == [ids[0], ids[2], ids[3], transferred, late])
        #expect(user.allSatisfy { $0.sub == "new.t" })
        let told = user.first { $0.changeID == transferred }?.json
        #expect(told?["type"] as? String == "siwa.sub_transferred")
        #expect((told?["data"] as? [String: Any])?["old_sub"] as? String == "old.t")
        #expect(inOrderPerSub(receiver.deliveries))
        #expect(
            try database.value("SELECT count(*)::int FROM siwa.webhook_deliveries WHERE sub = 'old.t'") == 0)
        let verdicts = try ReferenceVerifier.verify(receiver.deliveries, secret: secret)
        #expect(verdicts.allSatisfy { $0 == "ok" })
    }
}
