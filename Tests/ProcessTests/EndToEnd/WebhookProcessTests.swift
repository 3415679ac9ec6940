import Foundation
import HTTPClient
import Postgres
import QueueConsumer
import Synchronization
import TestSupport
import Testing
import WebhookDelivery
import Webhooks

/// Reads a file that a child process appends to.
private func contents(_ path: String) -> String {
    (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
}

private func temporaryPath(_ name: String) -> String {
    FileManager.default.temporaryDirectory.appendingPathComponent(
        "siwa-webhooks-\(UUID().uuidString)-\(name)"
    ).path
}

@Suite("Webhooks through the executables", .serialized)
struct WebhookProcessTests {
    @Test("siwactl webhooks add prints a secret once; list shows no secret; disable and rotate-secret work")
    func siwactlManagement() throws {
        let database = try WebhookDatabase()
        let siwactl = ExecutableLocator.url(named: "siwactl")
        let added = try ExecutableLocator.run(
            siwactl,
            arguments: [
                "webhooks", "add", "--database-url", database.url, "--url", "https://hooks.example.com/siwa",
                "--types", "siwa.account_deleted,siwa.consent_revoked",
            ])
        #expect(added.status == 0, "\(added.standardError)")
        let secretLine = try #require(
            added.standardOutput.split(separator: "\n").first { $0.hasPrefix("secret: ") })
        let secret = String(secretLine.dropFirst("secret: ".count))
        #expect(try StandardWebhooks.Secret(secret).key.count == 32)
        #expect(try database.value("SELECT secret FROM siwa.webhook_secrets") as String == secret)

        let listed = try ExecutableLocator.run(
            siwactl, arguments: ["webhooks", "list", "--database-url", database.url])
        #expect(listed.status == 0)
        #expect(listed.standardOutput.contains("https://hooks.example.com/siwa"))
        #expect(!listed.standardOutput.contains("whsec_"))

        let refused = try ExecutableLocator.run(
            siwactl,
            arguments: ["webhooks", "add", "--database-url", database.url, "--url", "http://localhost:9/x"])
        #expect(refused.status == 2)
        #expect(refused.standardError.contains("loopback IP literal"))

        let rotated = try ExecutableLocator.run(
            siwactl,
            arguments: [
                "webhooks", "rotate-secret", "--database-url", database.url, "--endpoint", "1", "--overlap",
                "1h",
            ])
        #expect(rotated.status == 0, "\(rotated.standardError)")
        #expect(
            try database.value("SELECT count(*)::int FROM siwa.webhook_secrets WHERE expires_at IS NULL")
                as Int == 1)
        #expect(
            try database.value(
                "SELECT count(*)::int FROM siwa.webhook_secrets WHERE expires_at BETWEEN now() + interval '59 minutes' AND now() + interval '61 minutes'"
            ) as Int == 1)

        let disabled = try ExecutableLocator.run(
            siwactl, arguments: ["webhooks", "disable", "--database-url", database.url, "--endpoint", "1"])
        #expect(disabled.status == 0)
        #expect(try database.value("SELECT enabled FROM siwa.webhook_endpoints") as Bool == false)
        #expect(try database.value("SELECT disabled_at IS NOT NULL FROM siwa.webhook_endpoints") as Bool)

        let enabled = try ExecutableLocator.run(
            siwactl, arguments: ["webhooks", "enable", "--database-url", database.url, "--endpoint", "1"])
        #expect(enabled.status == 0)
        #expect(
            try database.value("SELECT enabled AND disabled_at IS NULL FROM siwa.webhook_endpoints") as Bool)

        let unknown = try ExecutableLocator.run(
            siwactl, arguments: ["webhooks", "disable", "--database-url", database.url, "--endpoint", "99"])
        #expect(unknown.status != 0)
        #expect(unknown.standardError.contains("no endpoint 99"))
        #expect(try database.value("SELECT enabled FROM siwa.webhook_endpoints") as Bool)
    }

    @Test("siwactl webhooks listen prints deliveries the worker signed and refuses forged or stale ones")
    func listen() throws {
        let database = try WebhookDatabase()
        let secret = StandardWebhooks.Secret.generate()
        let addresses = ListenAddresses()
        defer { addresses.remove() }
        let output = temporaryPath("listen.out")
        let errors = temporaryPath("listen.err")
        let listener = try Subprocess(
            ExecutableLocator.url(named: "siwactl").path,
            ["webhooks", "listen", "--port", "0", "--secret", secret.text] + addresses.arguments,
            standardOutput: output, standardError: errors)
        defer {
            listener.send(SIGTERM)
            listener.wait()
        }
        let port = try ListenAddresses.port(
            of: addresses.address("webhooks", of: listener) { contents(errors) })
        try database.addEndpoint(url: "http://127.0.0.1:\(port)/", secret: secret)
        let change = try database.insertChange(type: "siwa.account_deleted", sub: "001.dev")
        let outcomes = try database.dispatcher().drainOnce()
        #expect(outcomes.map(\.state) == [.delivered])
        #expect(outcomes.first?.status == 204)
        let line = try #require(contents(output).split(separator: "\n").first)
        let printed = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(printed["webhook_id"] as? String == "msg_\(change)_1")
        #expect(printed["type"] as? String == "siwa.account_deleted")
        #expect(printed["verified"] as? Bool == true)

        // Forged and stale requests, from a client of our own.
        let client = OutboundHTTP.Client()
        let body = Array(#"{"type":"siwa.account_deleted"}"#.utf8)
        let now = Int(Date().timeIntervalSince1970)
        func post(_ timestamp: Int, _ signingSecret: StandardWebhooks.Secret) throws -> Int {
            try client.perform(
                OutboundHTTP.Request(
                    method: "POST", url: "http://127.0.0.1:\(port)/",
                    headers: [
                        .init("webhook-id", "msg_forged"), .init("webhook-timestamp", String(timestamp)),
                        .init(
                            "webhook-signature",
                            StandardWebhooks.signature(
                                id: "msg_forged", timestamp: timestamp, body: body, secret: signingSecret)),
                    ], body: body)
            ).status
        }
        #expect(try post(now, .generate()) == 401)
        #expect(try post(now - 600, secret) == 400)
        #expect(try post(now, secret) == 204)
        #expect(contents(output).split(separator: "\n").count == 2)
    }

    @Test(
        "kill -9 of siwa-worker during deliveries, repeatedly: every change arrives, duplicates share their webhook-id, order per sub holds"
    )
    func killNine() throws {
        let database = try WebhookDatabase()
        let secret = StandardWebhooks.Secret.generate()
        let receiver = try WebhookReceiver(threads: 16) { _, _ in
            (200, .milliseconds(Int64.random(in: 5...40)))
        }
        try database.addEndpoint(url: receiver.url, secret: secret, maxInFlight: 8)
        let subs = (1...12).map { "k\($0)" }
        let ids = try database.insertChanges(subs: subs, count: 15)
        let log = temporaryPath("worker.log")
        func start() throws -> Subprocess {
            try Subprocess(
                ExecutableLocator.url(named: "siwa-worker").path,
                [
                    "--database-url", database.url, "--webhook-concurrency", "8", "--webhook-poll-interval",
                    "0.1",
                    "--webhook-retry-base-delay", "0.05", "--webhook-max-retry-delay", "0.2", "--log-level",
                    "warning",
                ], standardError: log)
        }
        var kills = 0
        while kills < 6, (try database.count("delivered")) < ids.count {
            let worker = try start()
            let before = receiver.deliveries.count
            _ = waitUntil(timeout: .seconds(10)) { receiver.deliveries.count >= before + 15 }
            worker.send(SIGKILL)
            worker.wait()
            kills += 1
        }
        let worker = try start()
        defer {
            worker.send(SIGTERM)
            worker.wait()
        }
        #expect(waitUntil(timeout: .seconds(60)) { (try? database.count("delivered")) == ids.count })
        #expect(kills >= 3)
        let accepted = receiver.accepted
        #expect(Set(accepted.map(\.changeID)) == Set(ids))
        // Every copy of a message has the message's id, the same body and a valid signature.
        var bodies: [String: [UInt8]] = [:]
        for delivery in accepted {
            #expect(delivery.id == "msg_\(delivery.changeID)_1")
            if let id = delivery.id {
                if let earlier = bodies[id] {
                    #expect(earlier == delivery.body)
                } else {
                    bodies[id] = delivery.body
                }
            }
        }
        #expect(inOrderPerSub(receiver.deliveries))
        let verdicts = try ReferenceVerifier.verify(accepted, secret: secret)
        #expect(verdicts.count == accepted.count && verdicts.allSatisfy { $0 == "ok" })
        #expect(!contents(log).contains("whsec_"))
    }

    @Test(
        "an endpoint down, then back: everything arrives, in order per sub, with the backoff in the history")
    func downThenBack() throws {
        let database = try WebhookDatabase()
        let down = Atomic<Bool>(true)
        let receiver = try WebhookReceiver { _, _ in
            down.load(ordering: .sequentiallyConsistent) ? (503, .zero) : (204, .zero)
        }
        try database.addEndpoint(url: receiver.url, secret: .generate())
        let ids = try database.insertChanges(subs: ["d1", "d2", "d3"], count: 4)
        let running = RunningDispatcher(
            try database.dispatcher(retryBaseDelay: .milliseconds(100), maxRetryDelay: .milliseconds(800)))
        defer { running.stop() }
        #expect(
            waitUntil(timeout: .seconds(20)) {
                ((try? database.value("SELECT coalesce(max(attempt), 0)::int FROM siwa.webhook_attempts")
                    as Int) ?? 0) >= 4
            })
        #expect(receiver.accepted.isEmpty)
        down.store(false, ordering: .sequentiallyConsistent)
        #expect(waitUntil(timeout: .seconds(20)) { (try? database.count("delivered")) == ids.count })
        #expect(inOrderPerSub(receiver.deliveries))
        #expect(Set(receiver.accepted.map(\.changeID)) == Set(ids))
        // Only each sub's first change was tried while the endpoint was down.
        let retried = try database.connection.query(
            "SELECT DISTINCT change_id::int FROM siwa.webhook_attempt_history WHERE outcome = 'retry' ORDER BY 1"
        ).map { try $0[0, as: Int.self] }
        #expect(retried == Array(ids.prefix(3)))
        let gaps = try database.connection.query(
            """
            SELECT extract(epoch FROM next_attempt_at - started_at)::float8 - (latency_ms / 1000.0)::float8
              FROM siwa.webhook_attempt_history
             WHERE change_id = $1 AND outcome = 'retry' ORDER BY attempt
            """, [.int(Int64(ids[0]))]
        ).map { try $0[0, as: Double.self] }
        #expect(gaps.count >= 3)
        #expect(gaps.last! > gaps.first!)
    }
}

@Suite("Webhooks and shutdown", .serialized)
struct WebhookShutdownTests {
    @Test("SIGTERM during an attempt: the attempt finishes and is recorded before siwa-worker exits 0")
    func sigtermDuringAttempt() throws {
        let database = try WebhookDatabase()
        let arrived = Arrival()
        let receiver = try WebhookReceiver { _, _ in
            arrived.mark()
            return (204, .seconds(2))
        }
        try database.addEndpoint(url: receiver.url, secret: .generate())
        let change = try database.insertChange(sub: "t")
        let worker = try Subprocess(
            ExecutableLocator.url(named: "siwa-worker").path,
            ["--database-url", database.url, "--log-level", "error", "--webhook-poll-interval", "0.1"])
        // The attempt is in flight: the POST reached the endpoint (a lease alone may precede the POST, and a
        // stop before it releases the delivery unsent), and its delivery is leased with no transaction open.
        #expect(waitUntil(timeout: .seconds(20)) { arrived.happened })
        #expect(
            try database.value(
                "SELECT count(*)::int FROM siwa.webhook_deliveries WHERE lease_owner IS NOT NULL") as Int == 1
        )
        #expect(
            try database.value(
                """
                SELECT count(*)::int FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'siwa-worker-webhooks'
                   AND state = 'idle in transaction'
                """) as Int == 0)
        worker.send(SIGTERM)
        #expect(worker.wait(timeout: .seconds(20)) == .exited(0))
        #expect(try database.value("SELECT state FROM siwa.webhook_delivery_status") as String == "delivered")
        #expect(receiver.accepted.map(\.changeID) == [change])
    }
}

/// Whether a request reached the endpoint, from any of its threads.
private final class Arrival: Sendable {
    private let value = Atomic<Bool>(false)
    func mark() { value.store(true, ordering: .sequentiallyConsistent) }
    var happened: Bool { value.load(ordering: .sequentiallyConsistent) }
}
