import Foundation
import HTTPClient
import Postgres
import QueueConsumer
import TestSupport
import Testing
import WebhookDelivery
import Webhooks

@Suite("Webhook deliveries", .serialized)
struct DeliveryTests {
    @Test("a change is POSTed signed; the standardwebhooks package verifies it; the body is the change")
    func signedDelivery() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver()
        let secret = StandardWebhooks.Secret.generate()
        let endpoint = try database.addEndpoint(url: receiver.url, secret: secret)
        let change = try database.insertChange(
            type: "siwa.email_disabled", sub: "001.alice", email: "a@privaterelay.appleid.com")

        let outcomes = try database.dispatcher().drainOnce()
        #expect(outcomes.map(\.state) == [.delivered])
        let delivery = try #require(receiver.deliveries.first)
        #expect(delivery.id == "msg_\(change)_\(endpoint)")
        let timestamp = try #require(delivery.timestamp.flatMap { Int($0) })
        #expect(abs(Double(timestamp) - Date().timeIntervalSince1970) < 60)
        #expect(try ReferenceVerifier.verify([delivery], secret: secret) == ["ok"])
        #expect(
            try ReferenceVerifier.verify([delivery], secret: .generate()).first?.hasPrefix("fail") == true)

        let json = delivery.json
        #expect(json["type"] as? String == "siwa.email_disabled")
        let data = try #require(json["data"] as? [String: Any])
        #expect(json["timestamp"] as? String == data["event_time"] as? String)
        #expect(data["change_id"] as? Int == change)
        #expect(data["sub"] as? String == "001.alice")
        #expect(data["email"] as? String == "a@privaterelay.appleid.com")
        #expect(data["is_private_email"] as? Bool == true)
        #expect(data["audience"] as? String == "com.example.app")
        #expect(data["sessions_revoked"] as? Int == 1)
        #expect(try database.value("SELECT state FROM siwa.webhook_delivery_status") as String == "delivered")
        #expect(try database.value("SELECT status FROM siwa.webhook_attempt_history") as Int == 204)
    }

    @Test("an endpoint gets only the types it asked for; a disabled one gets nothing")
    func typesAndDisabled() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver()
        let secret = StandardWebhooks.Secret.generate()
        try database.addEndpoint(url: receiver.url, secret: secret, types: ["siwa.account_deleted"])
        let disabled = try database.addEndpoint(url: receiver.url, secret: secret)
        try database.connection.execute(
            "UPDATE siwa.webhook_endpoints SET enabled = false WHERE id = $1", [.int(Int64(disabled))])
        try database.insertChange(type: "siwa.consent_revoked", sub: "s1")
        let deleted = try database.insertChange(type: "siwa.account_deleted", sub: "s1")
        _ = try database.dispatcher().drainOnce()
        #expect(receiver.deliveries.map(\.changeID) == [deleted])
    }

    @Test("per sub, changes arrive in change order, also while the first one is being retried")
    func orderPerSub() throws {
        let database = try WebhookDatabase()
        // The first change of each sub fails twice before it is accepted.
        let receiver = try WebhookReceiver { delivery, seen in
            seen < 2 && delivery.changeID <= 3
                ? (500, .zero) : (204, .milliseconds(Int64.random(in: 0...5)))
        }
        try database.addEndpoint(url: receiver.url, secret: .generate(), maxInFlight: 8)
        let ids = try database.insertChanges(subs: ["a", "b", "c"], count: 10)
        let running = RunningDispatcher(try database.dispatcher(concurrency: 6))
        defer { running.stop() }
        #expect(waitUntil(timeout: .seconds(30)) { (try? database.count("delivered")) == ids.count })
        #expect(inOrderPerSub(receiver.deliveries))
        // Each sub's first change was refused twice, and nothing of that sub arrived in between.
        for sub in ["a", "b", "c"] {
            let seen = receiver.deliveries.filter { $0.sub == sub }
            #expect(seen.prefix(3).map(\.status) == [500, 500, 204])
            #expect(Set(seen.prefix(3).map(\.changeID)).count == 1)
            #expect(seen.filter { $0.status == 204 }.count == 10)
        }
    }

    @Test("a failing, slow endpoint does not hold up another; its backoff shows in the attempt history")
    func failingEndpointDoesNotBlock() throws {
        let database = try WebhookDatabase()
        let broken = try WebhookReceiver { _, _ in (503, .milliseconds(300)) }
        let working = try WebhookReceiver()
        let brokenID = try database.addEndpoint(url: broken.url, secret: .generate(), maxInFlight: 1)
        try database.addEndpoint(url: working.url, secret: .generate())
        _ = try database.insertChanges(subs: ["u1", "u2", "u3", "u4"], count: 5)
        let running = RunningDispatcher(
            try database.dispatcher(
                concurrency: 3, retryBaseDelay: .milliseconds(100), maxRetryDelay: .seconds(2)))
        defer { running.stop() }
        #expect(waitUntil(timeout: .seconds(15)) { working.accepted.count == 20 })
        #expect(inOrderPerSub(working.accepted))
        // The broken endpoint is retried with growing delays (the first change of each sub blocks the rest).
        // From its 3rd failure in a row the endpoint as a whole waits too (up to the 2 s longest delay
        // between probes), so the first change's 4th attempt comes after some 13 probes.
        #expect(
            waitUntil(timeout: .seconds(60)) {
                ((try? database.value(
                    "SELECT max(attempt)::int FROM siwa.webhook_attempt_history WHERE endpoint_id = $1",
                    [.int(Int64(brokenID))]) as Int) ?? 0) >= 4
            })
        let rows = try database.connection.query(
            """
            SELECT attempt, extract(epoch FROM next_attempt_at - started_at)::float8 - (latency_ms / 1000.0)::float8, status,
                   outcome, error
              FROM siwa.webhook_attempt_history WHERE endpoint_id = $1 AND change_id = (
                SELECT min(change_id) FROM siwa.webhook_deliveries WHERE endpoint_id = $1)
             ORDER BY attempt
            """, [.int(Int64(brokenID))])
        let gaps = try rows.map { try $0[1, as: Double.self] }
        #expect(try rows.allSatisfy { try $0[2, as: Int.self] == 503 && $0[3, as: String.self] == "retry" })
        #expect(try rows.first?[4, as: String.self] == "HTTP 503")
        // Exponential with jitter in [0.5, 1]: after attempt n the next waits 0.1 s × 2^(n-1) × jitter.
        for (index, gap) in gaps.prefix(4).enumerated() {
            let nominal = 0.1 * pow(2, Double(index))
            #expect(
                gap >= nominal * 0.5 - 0.01 && gap <= nominal + 0.25,
                "attempt \(index + 1) waited \(gap)")
        }
        // Never more than max_in_flight (1) attempts at once to the broken endpoint.
        let times = broken.deliveries.map(\.at)
        for pair in zip(times, times.dropFirst()) { #expect(pair.1 - pair.0 >= .milliseconds(250)) }
    }

    @Test(
        "after the schedule a delivery is dead, and the sub's later changes go out; other users are not held up"
    )
    func deadAfterSchedule() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver { delivery, _ in
            delivery.changeID == 1 ? (500, .zero) : (204, .zero)
        }
        try database.addEndpoint(url: receiver.url, secret: .generate())
        let first = try database.insertChange(sub: "s")
        #expect(first == 1)
        let second = try database.insertChange(sub: "s")
        let otherUser = try database.insertChange(sub: "t")
        let running = RunningDispatcher(
            try database.dispatcher(
                retryBaseDelay: .milliseconds(50), maxRetryDelay: .milliseconds(100),
                giveUpAfter: .milliseconds(1500)))
        defer { running.stop() }
        // Another user's change goes out while the first user's is still being retried.
        #expect(waitUntil(timeout: .seconds(10)) { receiver.accepted.map(\.changeID) == [otherUser] })
        #expect(try database.count("dead") == 0)
        #expect(waitUntil(timeout: .seconds(10)) { (try? database.count("dead")) == 1 })
        #expect(
            waitUntil(timeout: .seconds(10)) { receiver.accepted.map(\.changeID) == [otherUser, second] })
        let outcomes = try database.connection.query(
            "SELECT outcome FROM siwa.webhook_attempt_history WHERE change_id = $1 ORDER BY attempt",
            [.int(Int64(first))]
        ).map { try $0[0, as: String.self] }
        #expect(
            outcomes.count >= 3 && outcomes.last == "dead" && outcomes.dropLast().allSatisfy { $0 == "retry" }
        )
        #expect(receiver.deliveries.filter { $0.changeID == first }.count == outcomes.count)
    }

    @Test("rotation: old and new secrets both sign during the overlap; after it only the new one")
    func rotationOverlap() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver()
        let old = StandardWebhooks.Secret.generate()
        let new = StandardWebhooks.Secret.generate()
        let endpoint = try database.addEndpoint(url: receiver.url, secret: old)
        try database.connection.execute(
            "SELECT siwa.rotate_webhook_secret($1, $2, interval '1.5 seconds')",
            [.int(Int64(endpoint)), .text(new.text)])
        let dispatcher = try database.dispatcher()
        try database.insertChange(sub: "r")
        _ = try dispatcher.drainOnce()
        let during = try #require(receiver.deliveries.last)
        #expect(during.signature?.split(separator: " ").count == 2)
        #expect(try ReferenceVerifier.verify([during], secret: old) == ["ok"])
        #expect(try ReferenceVerifier.verify([during], secret: new) == ["ok"])

        #expect(
            waitUntil(timeout: .seconds(5)) {
                (try? database.value(
                    "SELECT live_secrets::int FROM siwa.webhook_endpoint_overview WHERE id = $1",
                    [.int(Int64(endpoint))]) as Int) == 1
            })
        try database.insertChange(sub: "r")
        _ = try dispatcher.drainOnce()
        let after = try #require(receiver.deliveries.last)
        #expect(after.id != during.id)
        #expect(after.signature?.split(separator: " ").count == 1)
        #expect(try ReferenceVerifier.verify([after], secret: new) == ["ok"])
        #expect(try ReferenceVerifier.verify([after], secret: old).first?.hasPrefix("fail") == true)
    }

    @Test("erasure: a delivery sent after the change's email is erased carries no email")
    func erasure() throws {
        let database = try WebhookDatabase()
        let down = try WebhookReceiver { _, _ in (503, .zero) }
        let endpoint = try database.addEndpoint(url: down.url, secret: .generate())
        let change = try database.insertChange(
            type: "siwa.email_enabled", sub: "e", email: "e@privaterelay.appleid.com")
        let dispatcher = try database.dispatcher()
        _ = try dispatcher.drainOnce()
        #expect(down.deliveries.count == 1)
        #expect(
            (down.deliveries[0].json["data"] as? [String: Any])?["email"] as? String
                == "e@privaterelay.appleid.com")
        // The changefeed's erasure sets the change's email NULL; the endpoint comes back.
        try database.connection.execute(
            "UPDATE siwa.changes SET email = NULL WHERE id = $1", [.int(Int64(change))])
        let up = try WebhookReceiver()
        try database.connection.execute(
            "UPDATE siwa.webhook_endpoints SET url = $2 WHERE id = $1",
            [.int(Int64(endpoint)), .text(up.url)])
        try database.connection.execute("UPDATE siwa.webhook_deliveries SET next_attempt_at = now()")
        _ = try dispatcher.drainOnce()
        let sent = try #require(up.accepted.first)
        #expect(!String(decoding: sent.body, as: UTF8.self).contains("@"))
        #expect((sent.json["data"] as? [String: Any])?["email"] == nil)
        // Nothing stored about the deliveries holds the address either.
        let stored =
            try database.value(
                """
                SELECT string_agg(t::text, ' ') FROM (
                    SELECT d::text AS t FROM siwa.webhook_deliveries d
                    UNION ALL SELECT a::text FROM siwa.webhook_attempts a) x
                """) as String
        #expect(!stored.contains("@"))
    }

    @Test("replay: by delivery sends it again with the same webhook-id; by endpoint and time fills the gap")
    func replay() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver()
        try database.addEndpoint(url: receiver.url, secret: .generate())
        let change = try database.insertChange(sub: "p")
        let dispatcher = try database.dispatcher()
        _ = try dispatcher.drainOnce()
        let delivery = try database.value("SELECT id::int FROM siwa.webhook_deliveries") as Int
        #expect(
            try database.value(
                "SELECT siwa.replay_webhook_deliveries(p_delivery => $1)", [.int(Int64(delivery))]) as Int
                == 1)
        _ = try dispatcher.drainOnce()
        #expect(receiver.deliveries.map(\.id) == ["msg_\(change)_1", "msg_\(change)_1"])
        #expect(receiver.deliveries[0].body == receiver.deliveries[1].body)

        // An endpoint added later gets past changes only when replayed for it.
        let late = try WebhookReceiver()
        let lateID = try database.addEndpoint(url: late.url, secret: .generate())
        _ = try dispatcher.drainOnce()
        #expect(late.deliveries.isEmpty)
        #expect(
            try database.value(
                "SELECT siwa.replay_webhook_deliveries(p_endpoint => $1, p_since => now() - interval '1 hour')",
                [.int(Int64(lateID))]) as Int == 1)
        _ = try dispatcher.drainOnce()
        #expect(late.deliveries.map(\.id) == ["msg_\(change)_\(lateID)"])
    }

    @Test(
        "queue heads: a missed ready hint is swept up; a replayed delivery goes before later ones of its sub")
    func queueHeads() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver { delivery, _ in
            delivery.changeID == 2 ? (503, .zero) : (204, .zero)
        }
        try database.addEndpoint(url: receiver.url, secret: .generate())
        let dispatcher = try database.dispatcher(retryBaseDelay: .seconds(60), maxRetryDelay: .seconds(60))
        // A fan-out that raced with the end of the delivery ahead leaves a head not ready: the sweep finds it.
        let first = try database.insertChange(sub: "q")
        try database.connection.execute("UPDATE siwa.webhook_deliveries SET ready = false")
        _ = try dispatcher.drainOnce()
        #expect(receiver.accepted.map(\.changeID) == [first])
        // The second is refused (retry in a minute); the third waits behind it.
        let second = try database.insertChange(sub: "q")
        let third = try database.insertChange(sub: "q")
        _ = try dispatcher.drainOnce()
        func ready() throws -> [Int] {
            try database.connection.query(
                "SELECT change_id::int FROM siwa.webhook_deliveries WHERE state = 'pending' AND ready ORDER BY 1"
            ).map { try $0[0, as: Int.self] }
        }
        #expect(try ready() == [second])
        // Replaying the first puts it at the head: it goes out now, and the second heads the queue again.
        #expect(
            try database.value("SELECT siwa.replay_webhook_deliveries(p_change => $1)", [.int(Int64(first))])
                as Int == 1)
        #expect(try ready() == [first])
        _ = try dispatcher.drainOnce()
        #expect(receiver.deliveries.map(\.changeID) == [first, second, first])
        #expect(try ready() == [second])
        #expect(!receiver.deliveries.contains { $0.changeID == third })
    }

    @Test("the endpoint policy holds at send time: no redirects followed, answers' bodies bounded")
    func sendPolicy() throws {
        let database = try WebhookDatabase()
        let target = try WebhookReceiver()
        let redirect = try ScriptedHTTPServer { _, write in
            _ = write(
                Array(
                    "HTTP/1.1 307 Temporary Redirect\r\nLocation: \(target.url)\r\nContent-Length: 0\r\n\r\n"
                        .utf8))
        }
        defer { redirect.stop() }
        try database.addEndpoint(url: "http://127.0.0.1:\(redirect.port)/hooks", secret: .generate())
        try database.insertChange(sub: "x")
        let outcomes = try database.dispatcher().drainOnce()
        #expect(outcomes.map(\.state) == [.retry] && outcomes.first?.status == 307)
        #expect(target.deliveries.isEmpty)
        #expect(try database.value("SELECT error FROM siwa.webhook_attempt_history") as String == "HTTP 307")

        // A 200 whose body is larger than the bound is not read, and does not count as delivered.
        let huge = try ScriptedHTTPServer { _, write in
            _ = write(Array("HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n".utf8))
            _ = write([UInt8](repeating: 120, count: 1 << 20))
        }
        defer { huge.stop() }
        try database.connection.execute(
            "UPDATE siwa.webhook_endpoints SET url = $1", [.text("http://127.0.0.1:\(huge.port)/hooks")])
        try database.connection.execute("UPDATE siwa.webhook_deliveries SET next_attempt_at = now()")
        let second = try database.dispatcher().drainOnce()
        #expect(second.map(\.state) == [.retry])
        let error =
            try database.value(
                "SELECT error FROM siwa.webhook_attempt_history ORDER BY attempt DESC LIMIT 1") as String
        #expect(error.hasPrefix("tooLarge"))
        // The table refuses what the policy refuses, whoever writes it.
        for url in ["http://localhost:1/x", "http://10.1.2.3/x", "https://u:p@example.com/x"] {
            #expect(throws: PostgresError.self) {
                try database.connection.execute("UPDATE siwa.webhook_endpoints SET url = $1", [.text(url)])
            }
        }
    }
}
