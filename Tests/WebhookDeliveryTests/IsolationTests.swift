import Dispatch
import Foundation
import Postgres
import QueueConsumer
import Synchronization
import TestSupport
import Testing
import WebhookDelivery
import Webhooks

/// An endpoint that accepts each connection, reads the request and never answers until released (then
/// every request is answered 204 at once).
private final class NeverAnswering: Sendable {
    let server: ScriptedHTTPServer
    private let gate = DispatchSemaphore(value: 0)

    init() throws {
        let gate = gate
        server = try ScriptedHTTPServer { _, write in
            _ = gate.wait(timeout: .now() + 120)
            gate.signal()
            _ = write(Array("HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".utf8))
        }
    }

    var url: String { server.url("/hook").absoluteString }
    func release() { gate.signal() }
}

@Suite("Webhook isolation: an endpoint never takes more than its share of the lanes", .serialized)
struct IsolationTests {
    /// How long the healthy endpoint took to accept `count` more deliveries of changes inserted now.
    private static func timeToAccept(
        _ count: Int, subs prefix: String, receiver: WebhookReceiver, database: WebhookDatabase
    ) throws -> Duration? {
        let before = receiver.accepted.count
        let start = ContinuousClock.now
        _ = try database.insertChanges(subs: (0..<count).map { "\(prefix)\($0)" }, count: 1)
        guard waitUntil(timeout: .seconds(30), { receiver.accepted.count >= before + count }) else {
            return nil
        }
        return receiver.accepted.map(\.at).max().map { $0 - start }
    }

    @Test(
        "with 2 lanes, 8 deliveries to a healthy endpoint take about as long beside an endpoint that never answers as alone: well under one attempt timeout"
    )
    func healthyBesideHanging() throws {
        let database = try WebhookDatabase()
        let healthy = try WebhookReceiver()
        try database.addEndpoint(url: healthy.url, secret: .generate())
        let timeout = Duration.seconds(8)
        let running = RunningDispatcher(try database.dispatcher(concurrency: 2, timeout: timeout))
        defer { running.stop() }
        let alone = try #require(
            try Self.timeToAccept(8, subs: "alone-", receiver: healthy, database: database))

        let hanging = try NeverAnswering()
        defer { hanging.release() }
        let stuck = try database.addEndpoint(url: hanging.url, secret: .generate())
        let beside = try #require(
            try Self.timeToAccept(8, subs: "beside-", receiver: healthy, database: database))
        // The hanging endpoint holds one lane (its share of 2): one attempt in flight, not both lanes.
        #expect(waitUntil { hanging.server.requestHeads.count >= 1 })
        #expect(hanging.server.requestHeads.count == 1)
        #expect(
            beside < timeout / 2,
            "8 deliveries took \(alone) alone and \(beside) beside an endpoint that never answers")
        #expect(
            try database.value(
                "SELECT count(*)::int FROM siwa.webhook_deliveries WHERE endpoint_id = $1 AND state = 'pending'",
                [.int(Int64(stuck))]) == 8)
    }

    @Test(
        "an endpoint failing 3 times in a row is backed off as a whole: its other users' deliveries are not each attempted; a retry probes it, and a 2xx resumes all"
    )
    func backedOffAsAWhole() throws {
        let database = try WebhookDatabase()
        let status = AnsweredStatus(503)
        let receiver = try WebhookReceiver { _, _ in (status.value, .zero) }
        let endpoint = try database.addEndpoint(url: receiver.url, secret: .generate())
        _ = try database.insertChanges(subs: (1...8).map { "user\($0)" }, count: 1)
        let dispatcher = try database.dispatcher(retryBaseDelay: .seconds(600), maxRetryDelay: .seconds(3600))
        // Three users' deliveries are refused; the endpoint is then backed off and nobody else is tried.
        #expect(try dispatcher.drainOnce().map(\.state) == [.retry, .retry, .retry])
        #expect(receiver.deliveries.count == 3)
        let row = try database.connection.query(
            """
            SELECT consecutive_failures, failing_since IS NOT NULL,
                   backoff_until > now() + interval '250 seconds'
              FROM siwa.webhook_endpoint_overview WHERE id = $1
            """, [.int(Int64(endpoint))])[0]
        #expect(try row[0, as: Int.self] == 3)
        #expect(try row[1, as: Bool.self])
        #expect(try row[2, as: Bool.self])
        // Deliveries never tried are due, yet not attempted while the endpoint is backed off.
        try database.connection.execute("UPDATE siwa.webhook_deliveries SET next_attempt_at = now()")
        #expect(try dispatcher.drainOnce().isEmpty)
        #expect(try database.value("SELECT count(*)::int FROM siwa.webhook_attempts") == 3)
        #expect(
            try database.value("SELECT count(*)::int FROM siwa.webhook_deliveries WHERE attempts = 0") == 5)

        // The endpoint answers again; retrying its deliveries ends the backoff: the first probes it, and
        // its 2xx lets every other user's delivery go out.
        status.value = 204
        #expect(
            try database.value(
                "SELECT siwa.retry_webhook_deliveries(p_endpoint => $1)", [.int(Int64(endpoint))]) == 8)
        #expect(try database.value("SELECT backoff_until IS NULL FROM siwa.webhook_endpoints") as Bool)
        #expect(try dispatcher.drainOnce().map(\.state) == Array(repeating: .delivered, count: 8))
        #expect(
            try database.value(
                "SELECT consecutive_failures = 0 AND failing_since IS NULL AND backoff_until IS NULL FROM siwa.webhook_endpoints"
            ) as Bool)
    }

    @Test(
        "an endpoint refusing every user is backed off after at most its share of the lanes' attempts, never one per user"
    )
    func failingEndpointBackedOffWithLanes() throws {
        let database = try WebhookDatabase()
        let broken = try WebhookReceiver { _, _ in (503, .milliseconds(100)) }
        try database.addEndpoint(url: broken.url, secret: .generate(), maxInFlight: 8)
        _ = try database.insertChanges(subs: (1...12).map { "u\($0)" }, count: 1)
        let running = RunningDispatcher(
            try database.dispatcher(
                concurrency: 6, retryBaseDelay: .seconds(600), maxRetryDelay: .seconds(600)))
        defer { running.stop() }
        #expect(
            waitUntil {
                (try? database.value(
                    """
                    SELECT backoff_until IS NOT NULL AND NOT EXISTS (
                        SELECT 1 FROM siwa.webhook_deliveries WHERE lease_owner IS NOT NULL)
                      FROM siwa.webhook_endpoints
                    """) as Bool) == true
            })
        // At most 5 of the 6 lanes were in flight before the first failure was recorded; from then on
        // it is tried one attempt at a time, and backed off at the 3rd failure in a row.
        let attempts = broken.deliveries.count
        #expect(attempts >= 3 && attempts <= 5, "\(attempts) attempts")
        #expect(
            try database.value("SELECT count(*)::int FROM siwa.webhook_deliveries WHERE attempts = 0")
                == 12 - attempts)
        #expect(try database.dispatcher().drainOnce().isEmpty)
        #expect(broken.deliveries.count == attempts)
    }

    @Test(
        "rotation: an endpoint with an older backlog does not starve another's; both progress together, a batch each in turn",
        arguments: [1, 4])
    func rotation(batchSize: Int) throws {
        let database = try WebhookDatabase()
        let first = try WebhookReceiver()
        let second = try WebhookReceiver()
        try database.addEndpoint(url: first.url, secret: .generate(), types: ["siwa.consent_revoked"])
        try database.addEndpoint(url: second.url, secret: .generate(), types: ["siwa.account_deleted"])
        // The first endpoint's 10 deliveries are all older than the second's.
        for index in 0..<10 { try database.insertChange(type: "siwa.consent_revoked", sub: "a\(index)") }
        for index in 0..<10 { try database.insertChange(type: "siwa.account_deleted", sub: "b\(index)") }
        let outcomes = try database.dispatcher(batchSize: batchSize).drainOnce()
        #expect(outcomes.count == 20 && outcomes.allSatisfy { $0.state == .delivered })
        // In arrival order the two endpoints alternate, a batch (the last one shorter) at a time.
        let arrivals = (first.deliveries.map { ($0.at, 1) } + second.deliveries.map { ($0.at, 2) })
            .sorted { $0.0 < $1.0 }.map(\.1)
        let batches = stride(from: 0, to: 10, by: batchSize).flatMap { start in
            [1, 2].flatMap { Array(repeating: $0, count: min(batchSize, 10 - start)) }
        }
        #expect(arrivals == batches, "\(arrivals)")
    }

    @Test(
        "a lane's batch stops at its first failed attempt: the rest are released unattempted (their attempt uncounted) and go out after it"
    )
    func batchStopsAtFirstFailure() throws {
        let database = try WebhookDatabase()
        // The third user's delivery fails; every other one is accepted.
        let receiver = try WebhookReceiver { delivery, _ in (delivery.sub == "u2" ? 503 : 204, .zero) }
        try database.addEndpoint(url: receiver.url, secret: .generate())
        for index in 0..<8 { try database.insertChange(type: "siwa.consent_revoked", sub: "u\(index)") }
        let outcomes = try database.dispatcher(
            concurrency: 1, batchSize: 8, retryBaseDelay: .seconds(600), maxRetryDelay: .seconds(600)
        )
        .drainOnce()
        #expect(
            outcomes.map(\.state) == [.delivered, .delivered, .retry] + Array(repeating: .delivered, count: 5)
        )
        #expect(receiver.deliveries.map(\.sub) == (0..<8).map { "u\($0)" })
        // Each delivery was attempted once, and counted once: none of the released ones kept its claim's count.
        #expect(
            try database.value(
                """
                SELECT count(*) FILTER (WHERE d.attempts = 1 AND (SELECT count(*) FROM siwa.webhook_attempts a
                                                                    WHERE a.delivery_id = d.id) = 1)::int
                  FROM siwa.webhook_deliveries d
                """) == 8)
    }

    @Test("the worker removes temporary endpoints past their expiry (a listener that crashed left them)")
    func expiredTemporaryEndpointsRemoved() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver()
        let temporary =
            try database.value(
                "SELECT siwa.add_temporary_webhook_endpoint($1, $2, NULL, interval '1 minute')::int",
                [.text(receiver.url), .text(StandardWebhooks.Secret.generate().text)]) as Int
        let live =
            try database.value(
                "SELECT siwa.add_temporary_webhook_endpoint($1, $2, NULL, interval '1 minute')::int",
                [.text(receiver.url), .text(StandardWebhooks.Secret.generate().text)]) as Int
        let permanent = try database.addEndpoint(url: receiver.url, secret: .generate())
        // Its listener crashed an hour ago: it was never renewed.
        try database.connection.execute(
            "UPDATE siwa.webhook_endpoints SET expires_at = now() - interval '1 hour' WHERE id = $1",
            [.int(Int64(temporary))])
        let running = RunningDispatcher(try database.dispatcher(concurrency: 2))
        defer { running.stop() }
        #expect(
            waitUntil {
                (try? database.value(
                    "SELECT count(*)::int FROM siwa.webhook_endpoints WHERE id = $1", [.int(Int64(temporary))]
                )
                    as Int) == 0
            })
        let left = try database.connection.query("SELECT id::int FROM siwa.webhook_endpoints ORDER BY id")
            .map { try $0[0, as: Int.self] }
        #expect(left == [live, permanent])
    }
}

/// The status a test endpoint answers, changed by the test.
private final class AnsweredStatus: Sendable {
    private let status: Mutex<Int>
    init(_ initial: Int) { status = Mutex(initial) }
    var value: Int {
        get { status.withLock { $0 } }
        set { status.withLock { $0 = newValue } }
    }
}

extension Array {
    fileprivate func repeated(_ times: Int) -> [Element] { (0..<times).flatMap { _ in self } }
}
