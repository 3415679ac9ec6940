import Foundation
import Postgres
import QueueConsumer
import Synchronization
import TestSupport
import Testing
import Webhooks

/// How many deliveries an endpoint was sent, from any of its threads.
private final class CallCount: Sendable {
    private let value = Atomic<Int>(0)
    /// Counts a call; returns how many came before it.
    func next() -> Int { value.add(1, ordering: .sequentiallyConsistent).oldValue }
    /// The calls so far.
    var count: Int { value.load(ordering: .sequentiallyConsistent) }
}

@Suite("Webhook leases sized to the attempt: a worker killed mid-delivery is taken over within seconds")
struct WebhookCrashTests {
    @Test(
        "kill -9 of siwa-worker while an endpoint holds the POST: after the restart the delivery is sent again within seconds of the attempt's deadline"
    )
    func killedDuringTheDelivery() throws {
        let database = try WebhookDatabase()
        let calls = CallCount()
        // The first POST is held past the worker's 5 s deadline (until the worker is killed); the next is
        // answered at once.
        let receiver = try WebhookReceiver { _, _ in calls.next() == 0 ? (204, .seconds(12)) : (204, .zero) }
        try database.addEndpoint(url: receiver.url, secret: .generate())
        let change = try database.insertChange(sub: "killed")
        let arguments = ["--webhook-timeout", "5", "--webhook-poll-interval", "0.1", "--log-level", "info"]
        let first = try WorkerProcess(arguments, databaseURL: database.url)
        // Killed once the endpoint holds the POST: a kill between the claim's commit and the POST would
        // let the second worker's attempt be the one held.
        #expect(
            waitUntil(timeout: .seconds(20)) {
                calls.count == 1
                    && (try? database.value(
                        "SELECT count(*)::int FROM siwa.webhook_deliveries WHERE lease_owner IS NOT NULL AND attempts = 1"
                    ) as Int) == 1
            }, "\(first.log)")
        first.send(SIGKILL)
        #expect(first.waitForExit(timeout: .seconds(10)) == 128 + SIGKILL)
        let killed = ContinuousClock.now
        let second = try WorkerProcess(arguments, databaseURL: database.url)
        defer {
            second.send(SIGTERM)
            _ = second.waitForExit(timeout: .seconds(20))
        }
        // The lease was the deadline (5 s) plus the margin from the claim: retried well within 15 s.
        let delivered = waitUntil(timeout: .seconds(20)) { (try? database.count("delivered")) == 1 }
        let elapsed = ContinuousClock.now - killed
        #expect(delivered, "\(second.log)")
        #expect(elapsed < CallLease.covering(.seconds(5)) + .seconds(5), "\(elapsed)")
        #expect(receiver.accepted.map(\.changeID).contains(change))
        // Two attempts counted; the killed one left no row in the history.
        #expect(try database.value("SELECT attempts FROM siwa.webhook_deliveries") == 2)
        #expect(try database.value("SELECT count(*)::int FROM siwa.webhook_attempts") == 1)
        print("webhook crash: delivered \(elapsed) after the kill")
    }
}
