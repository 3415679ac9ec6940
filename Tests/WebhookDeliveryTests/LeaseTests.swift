import Dispatch
import Foundation
import Postgres
import QueueConsumer
import ServiceSupport
import Synchronization
import TestSupport
import Testing
import WebhookDelivery
import Webhooks

/// An endpoint that reads a request and answers nothing until released (then 204).
private final class HangingEndpoint: Sendable {
    let server: ScriptedHTTPServer
    private let gate = DispatchSemaphore(value: 0)

    init() throws {
        let gate = gate
        server = try ScriptedHTTPServer { _, write in
            gate.wait()
            gate.signal()  // every later request goes through at once
            _ = write(Array("HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".utf8))
        }
    }

    var url: String { server.url("/hook").absoluteString }
    func release() { gate.signal() }
}

@Suite("Webhook leases: no lock held across the network, expired leases rescued once")
struct WebhookLeaseTests {
    @Test(
        "while a POST to an endpoint that never answers is in flight, the lane's connection holds no lock, other endpoints' deliveries go out and the user's later delivery waits"
    )
    func noLockAcrossTheCall() throws {
        let database = try WebhookDatabase()
        let hanging = try HangingEndpoint()
        let healthy = try WebhookReceiver()
        let stuck = try database.addEndpoint(url: hanging.url, secret: .generate())
        try database.addEndpoint(url: healthy.url, secret: .generate())
        var hungConfiguration = database.configuration
        hungConfiguration.applicationName = "siwa-test-hung-lane"
        // One lane (one connection) that will hang in the POST, and a second worker beside it.
        let first = RunningDispatcher(
            try database.dispatcher(concurrency: 1, timeout: .seconds(60), configuration: hungConfiguration))
        defer { first.stop() }
        let change = try database.insertChange(sub: "u1")
        #expect(waitUntil { hanging.server.requestHeads.count == 1 })
        let second = RunningDispatcher(try database.dispatcher(concurrency: 2))
        defer { second.stop() }
        // The other endpoint's delivery of the same change proceeds (on either worker).
        #expect(waitUntil { healthy.accepted.count == 1 })
        let pid: Int = try database.value(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'siwa-test-hung-lane'")
        // Sampled while the call is in flight: no lock of any kind, no transaction, no xid.
        for _ in 0..<10 {
            #expect(
                try database.value("SELECT count(*)::int FROM pg_locks WHERE pid = $1", [.int(Int64(pid))])
                    == 0)
            let activity = try database.connection.query(
                "SELECT state, backend_xid IS NULL FROM pg_stat_activity WHERE pid = $1", [.int(Int64(pid))])[
                    0]
            #expect(try activity[0, as: String.self] == "idle")
            #expect(try activity[1, as: Bool.self])
            Thread.sleep(forTimeInterval: 0.02)  // samples spread over the call, not a wait for an outcome
        }
        // The delivery is held by its committed lease only: another session locks its row at once.
        try database.connection.transaction { connection in
            let lease = try connection.query(
                """
                SELECT lease_owner IS NOT NULL AND lease_expires_at > now() FROM siwa.webhook_deliveries
                 WHERE change_id = $1 AND endpoint_id = $2 FOR UPDATE NOWAIT
                """, [.int(Int64(change)), .int(Int64(stuck))])[0][0, as: Bool.self]
            #expect(lease)
        }
        // The user's next change: delivered to the healthy endpoint, held back behind the leased one.
        let later = try database.insertChange(sub: "u1")
        #expect(waitUntil { healthy.accepted.count == 2 })
        #expect(hanging.server.requestHeads.count == 1)
        hanging.release()
        #expect(
            try waitUntil {
                try database.value(
                    "SELECT count(*)::int FROM siwa.webhook_deliveries WHERE endpoint_id = $1 AND state = 'delivered'",
                    [.int(Int64(stuck))]) == 2
            })
        #expect(hanging.server.requestHeads.count == 2)
        #expect(hanging.server.requestHeads[1].contains("msg_\(later)_\(stuck)"))
    }

    @Test("a claim whose process died: its lease expires and exactly one of two workers takes it over")
    func rescuedOnce() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver()
        try database.addEndpoint(url: receiver.url, secret: .generate())
        let change = try database.insertChange(sub: "dead")
        // A worker claims the delivery and dies with it (its session ends, the lease stays).
        let dying = try PostgresConnection(configuration: database.configuration)
        let claimed = try dying.query(
            "SELECT outcome, delivery_id FROM siwa.claim_webhook_delivery('dead-worker', interval '1 second')"
        )[0]
        #expect(try claimed[0, as: String.self] == "claimed")
        let delivery = try claimed[1, as: Int.self]
        dying.close()
        // While the lease lives, nobody else sends it.
        #expect(try database.dispatcher().drainOnce().isEmpty)
        #expect(
            waitUntil {
                (try? database.value(
                    "SELECT lease_expires_at <= clock_timestamp() FROM siwa.webhook_deliveries WHERE id = $1",
                    [.int(Int64(delivery))]) as Bool) == true
            })
        // Two workers drain at once: one takes it over.
        let outcomes = Mutex<[WebhookDispatcher.Outcome]>([])
        let threads = try (0..<2).map { _ in
            let dispatcher = try database.dispatcher()
            return JoinableThread(name: "rescue") {
                let mine = (try? dispatcher.drainOnce()) ?? []
                outcomes.withLock { $0 += mine }
            }
        }
        for thread in threads { thread.join() }
        #expect(outcomes.withLock { $0 }.map(\.state) == [.delivered])
        #expect(receiver.accepted.map(\.changeID) == [change])
        // The dead worker's attempt counts (from its claim) but left no row: the history numbers it out.
        #expect(try database.value("SELECT count(*)::int FROM siwa.webhook_attempts") == 1)
        #expect(try database.value("SELECT attempt FROM siwa.webhook_attempts") == 2)
        #expect(try database.value("SELECT attempts FROM siwa.webhook_deliveries") == 2)
        // The dead worker's record, had it come late, would change nothing.
        #expect(
            try database.value(
                "SELECT siwa.record_webhook_attempt($1, 'dead-worker', now(), 1, 204, 'delivered', NULL, NULL)",
                [.int(Int64(delivery))]) == false)
    }

    @Test(
        "a lane's lease covers its attempt: the timeout, the batch window and the margin, the attempt counted from the claim, so a lane that died is taken over within seconds of its deadline"
    )
    func leaseSizedToTheAttempt() throws {
        let database = try WebhookDatabase()
        let hanging = try HangingEndpoint()
        defer { hanging.release() }
        try database.addEndpoint(url: hanging.url, secret: .generate())
        _ = try database.insertChange(sub: "sized")
        let running = RunningDispatcher(try database.dispatcher(concurrency: 1, timeout: .seconds(2)))
        defer { running.stop() }
        #expect(waitUntil { hanging.server.requestHeads.count == 1 })
        let row = try database.connection.query(
            """
            SELECT attempts, extract(epoch FROM lease_expires_at - last_attempt_at)::float8
              FROM siwa.webhook_deliveries WHERE lease_owner IS NOT NULL
            """)
        #expect(row.count == 1)
        #expect(try row.first?[0, as: Int.self] == 1)  // counted while the POST is out
        let lease = try row.first?[1, as: Double?.self] ?? -1
        #expect(abs(lease - CallLease.covering(batchOf: .seconds(2)).inSeconds) < 0.5, "lease \(lease) s")
    }
}
