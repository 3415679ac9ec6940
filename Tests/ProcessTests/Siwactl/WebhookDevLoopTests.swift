import Foundation
import Postgres
import Synchronization
import TestSupport
import Testing
import Webhooks

// MARK: - The developer loop: siwactl webhooks send

/// The executables' environment: this process's, without any SIWA_* setting of the caller.
private let cleanEnvironment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }

private func temporaryPath(_ name: String) -> String {
    FileManager.default.temporaryDirectory.appendingPathComponent("siwa-devloop-\(UUID().uuidString)-\(name)")
        .path
}

private func contents(_ path: String) -> String {
    (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
}

@Suite("The webhook developer loop through siwactl", .serialized)
struct WebhookDevLoopTests {
    @Test(
        "webhooks send --type all, with no database: one signed delivery of each type, each verified by the standardwebhooks package"
    )
    func sendEveryType() throws {
        let secret = StandardWebhooks.Secret.generate()
        let app = try WebhookReceiver()
        let sent = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwactl"),
            arguments: ["webhooks", "send", "--url", app.url, "--type", "all", "--secret-file", "-"],
            environment: cleanEnvironment, input: Data((secret.text + "\n").utf8))
        #expect(sent.status == 0, "\(sent.standardError)")
        let lines = sent.standardOutput.split(separator: "\n")
        #expect(lines.count == WebhookChange.types.count)
        #expect(lines.allSatisfy { $0.hasSuffix(" 204") })
        let received = app.deliveries
        #expect(received.map { $0.json["type"] as? String ?? "" } == WebhookChange.types)
        // Distinct webhook-ids of endpoint 0 (no real endpoint has it), each naming its change id.
        #expect(Set(received.compactMap(\.id)).count == received.count)
        #expect(received.allSatisfy { $0.id == "msg_\($0.changeID)_0" })
        let verdicts = try ReferenceVerifier.verify(received, secret: secret)
        #expect(verdicts == Array(repeating: "ok", count: WebhookChange.types.count), "\(verdicts)")
        // Email events carry an email; the team transfer its old sub; no secret is printed.
        for delivery in received {
            let data = delivery.json["data"] as? [String: Any] ?? [:]
            let type = delivery.json["type"] as? String ?? ""
            #expect((data["email"] != nil) == type.hasPrefix("siwa.email_"), "\(type)")
            #expect((data["old_sub"] != nil) == (type == "siwa.sub_transferred"), "\(type)")
        }
        #expect(!sent.standardOutput.contains("whsec_") && !sent.standardError.contains("whsec_"))
    }

    @Test("webhooks send exits 1 when the app refuses a delivery, and prints the status it answered")
    func sendRefused() throws {
        let secret = StandardWebhooks.Secret.generate()
        let app = try WebhookReceiver { delivery, _ in
            (delivery.json["type"] as? String == "siwa.account_deleted" ? 401 : 204, .zero)
        }
        let sent = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwactl"),
            arguments: ["webhooks", "send", "--url", app.url, "--type", "all"],
            environment: cleanEnvironment.merging(["SIWA_WEBHOOK_SECRET": secret.text]) { $1 })
        #expect(sent.status == 1)
        #expect(sent.standardOutput.split(separator: "\n").filter { $0.hasSuffix(" 401") }.count == 1)
        #expect(sent.standardOutput.contains("siwa.account_deleted 401"))
        #expect(sent.standardError.contains("1 of 6 deliveries were not accepted"))

        let one = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwactl"),
            arguments: [
                "webhooks", "send", "--url", app.url, "--type", "siwa.consent_revoked", "--change-id", "42",
            ],
            environment: cleanEnvironment.merging(["SIWA_WEBHOOK_SECRET": secret.text]) { $1 })
        #expect(one.status == 0, "\(one.standardError)")
        #expect(one.standardOutput == "msg_42_0 siwa.consent_revoked 204\n")

        let unknown = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwactl"),
            arguments: ["webhooks", "send", "--url", app.url, "--type", "siwa.nonsense"],
            environment: cleanEnvironment.merging(["SIWA_WEBHOOK_SECRET": secret.text]) { $1 })
        #expect(unknown.status == 2)
        let missingSecret = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwactl"),
            arguments: ["webhooks", "send", "--url", app.url, "--type", "all"], environment: cleanEnvironment)
        #expect(missingSecret.status == 2)
        #expect(app.deliveries.count == 7)
    }

    @Test(
        "webhooks listen --forward-to as siwa_admin: a temporary endpoint, a delivery from siwa-worker forwarded and verified at the app, the endpoint gone after SIGTERM, one left by kill -9 removed by the next listener"
    )
    func forward() throws {
        let database = try WebhookDatabase()
        let app = try WebhookReceiver()
        let admin = try database.url(asMemberOf: "siwa_admin")
        func startListener(_ name: String) throws -> (Subprocess, output: String, errors: String) {
            let output = temporaryPath("\(name).out")
            let errors = temporaryPath("\(name).err")
            let listener = try Subprocess(
                ExecutableLocator.url(named: "siwactl").path,
                ["webhooks", "listen", "--forward-to", app.url, "--database-url", admin],
                environment: cleanEnvironment, standardOutput: output, standardError: errors)
            return (listener, output, errors)
        }
        let (listener, output, errors) = try startListener("listen")
        try #require(
            waitUntil(timeout: .seconds(20)) { contents(output).contains("secret: ") }, "\(contents(errors))")
        let lines = contents(output).split(separator: "\n")
        let secretLine = try #require(lines.first { $0.hasPrefix("secret: ") })
        let secret = try StandardWebhooks.Secret(String(secretLine.dropFirst("secret: ".count)))
        let endpointLine = try #require(lines.first { $0.hasPrefix("endpoint ") })
        let endpoint = try #require(Int(endpointLine.dropFirst("endpoint ".count).prefix { $0.isNumber }))
        // Temporary, expiring, to the listener on loopback; its own secret is not the one printed.
        #expect(
            try database.value(
                "SELECT expires_at BETWEEN now() AND now() + interval '6 minutes' FROM siwa.webhook_endpoints WHERE id = $1",
                [.int(Int64(endpoint))]) as Bool)
        #expect(
            try database.value(
                "SELECT count(*)::int FROM siwa.webhook_secrets WHERE endpoint_id = $1 AND secret = $2",
                [.int(Int64(endpoint)), .text(secret.text)]) as Int == 0)

        let worker = try Subprocess(
            ExecutableLocator.url(named: "siwa-worker").path,
            [
                "--database-url", try database.url(asMemberOf: "siwa_worker"), "--log-level", "warning",
                "--webhook-poll-interval", "0.1",
            ], environment: cleanEnvironment)
        defer {
            worker.send(SIGTERM)
            worker.wait()
        }
        let change = try database.insertChange(type: "siwa.account_deleted", sub: "001.forwarded")
        #expect(waitUntil(timeout: .seconds(30)) { app.accepted.count == 1 })
        let delivered = try #require(app.accepted.first)
        #expect(delivered.id == "msg_\(change)_\(endpoint)")
        #expect(delivered.changeID == change)
        #expect(try ReferenceVerifier.verify([delivered], secret: secret) == ["ok"])
        #expect(
            waitUntil(timeout: .seconds(20)) {
                (try? database.value("SELECT state FROM siwa.webhook_delivery_status") as String)
                    == "delivered"
            })
        #expect(
            waitUntil(timeout: .seconds(10)) {
                contents(output).contains("msg_\(change)_\(endpoint) siwa.account_deleted → 204")
            })

        listener.send(SIGTERM)
        #expect(listener.wait(timeout: .seconds(20)) == .exited(0))
        #expect(try database.value("SELECT count(*)::int FROM siwa.webhook_endpoints") as Int == 0)

        // A listener killed with -9 leaves its endpoint; once it has expired, the next listener removes it.
        let (crashed, crashedOutput, _) = try startListener("crashed")
        #expect(waitUntil(timeout: .seconds(20)) { contents(crashedOutput).contains("secret: ") })
        crashed.send(SIGKILL)
        crashed.wait()
        #expect(
            try database.value(
                "SELECT count(*)::int FROM siwa.webhook_endpoints WHERE expires_at IS NOT NULL")
                as Int == 1)
        try database.query("UPDATE siwa.webhook_endpoints SET expires_at = now() - interval '1 second'")
        let (next, nextOutput, _) = try startListener("next")
        #expect(waitUntil(timeout: .seconds(20)) { contents(nextOutput).contains("secret: ") })
        #expect(try database.value("SELECT count(*)::int FROM siwa.webhook_endpoints") as Int == 1)
        next.send(SIGINT)
        #expect(next.wait(timeout: .seconds(20)) == .exited(0))
        #expect(try database.value("SELECT count(*)::int FROM siwa.webhook_endpoints") as Int == 0)
    }

    @Test("siwa_admin's temporary-endpoint functions: loopback http only, and never a permanent endpoint")
    func temporaryEndpointsAsAdmin() throws {
        let database = try WebhookDatabase()
        let permanent = try database.addEndpoint(url: "https://hooks.example.com/siwa", secret: .generate())
        let admin = try database.connect(asMemberOf: "siwa_admin")
        defer { admin.close() }
        let secret = StandardWebhooks.Secret.generate().text
        #expect(throws: (any Error).self) {
            try admin.query(
                "SELECT siwa.add_temporary_webhook_endpoint('https://evil.example.com/', $1, NULL, interval '5 minutes')",
                [.text(secret)])
        }
        #expect(throws: (any Error).self) {
            try admin.query(
                "SELECT siwa.add_temporary_webhook_endpoint('http://127.0.0.1:9/', $1, NULL, interval '2 hours')",
                [.text(secret)])
        }
        #expect(
            try admin.query(
                "SELECT siwa.remove_temporary_webhook_endpoint($1::bigint)", [.int(Int64(permanent))]
            )[0][0, as: Bool.self] == false)
        #expect(
            try admin.query(
                "SELECT siwa.renew_temporary_webhook_endpoint($1::bigint, interval '5 minutes')",
                [.int(Int64(permanent))]
            )[0][0, as: Bool.self] == false)
        #expect(
            try database.value("SELECT count(*)::int FROM siwa.webhook_endpoints WHERE expires_at IS NULL")
                as Int == 1)
        // Neither an admin nor the app may add an endpoint of any other kind, nor read a secret.
        #expect(throws: (any Error).self) {
            try admin.query("SELECT siwa.add_webhook_endpoint('http://127.0.0.1:9/', $1)", [.text(secret)])
        }
        let app = try database.connect(asMemberOf: "siwa_app")
        defer { app.close() }
        #expect(throws: (any Error).self) {
            try app.query(
                "SELECT siwa.add_temporary_webhook_endpoint('http://127.0.0.1:9/', $1, NULL, interval '5 minutes')",
                [.text(secret)])
        }
    }
}
