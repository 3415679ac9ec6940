import Foundation
import Postgres
import TestSupport
import Testing

@Suite("siwa-mailgate --esp-events-listen as a process: secrets from files, its own siwa_bounce login")
struct MailGateESPEventsProcessTests {
    static let relay = "dead.p@privaterelay.appleid.com"
    static let signingKey = "mailgun-process-key-0123456789abcdef"

    var environment: [String: String] {
        ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }
    }

    func run(_ arguments: [String], _ extra: [String: String]) throws -> ExecutableLocator.Result {
        try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwa-mailgate"), arguments: arguments,
            environment: environment.merging(extra) { $1 })
    }

    /// A file holding `text` with `mode`.
    func file(_ text: String, mode: Int) throws -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("esp-\(UUID().uuidString)")
        try Data(text.utf8).write(to: url)
        try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: url.path)
        return url
    }

    @Test("unusable bounce-listener settings exit 2 naming the setting, never a secret")
    func refusals() throws {
        let base = ["SIWA_MAILGATE_DATABASE_URL": "postgresql://mail@127.0.0.1:1/siwa"]
        let bounceURL = "postgresql://bounce:s3cret-password@127.0.0.1:1/siwa"
        let listen = ["--esp-events-listen", "127.0.0.1:0"]
        let cases: [([String], [String: String], String)] = [
            (listen, ["SIWA_MAILGATE_MAILGUN_SIGNING_KEY": Self.signingKey], "siwa_bounce"),
            (listen, ["SIWA_MAILGATE_ESP_EVENTS_DATABASE_URL": bounceURL], "at least one provider"),
            (
                ["--esp-events-listen", "192.0.2.1:0"],
                [
                    "SIWA_MAILGATE_ESP_EVENTS_DATABASE_URL": bounceURL,
                    "SIWA_MAILGATE_MAILGUN_SIGNING_KEY": Self.signingKey,
                ],
                "loopback"
            ),
            ([], ["SIWA_MAILGATE_MAILGUN_SIGNING_KEY": Self.signingKey], "needs --esp-events-listen"),
            (
                listen,
                [
                    "SIWA_MAILGATE_ESP_EVENTS_DATABASE_URL": bounceURL,
                    "SIWA_MAILGATE_POSTMARK_CREDENTIALS": "u:short",
                ],
                "at least 16"
            ),
            (
                listen,
                [
                    "SIWA_MAILGATE_ESP_EVENTS_DATABASE_URL": bounceURL,
                    "SIWA_MAILGATE_SENDGRID_VERIFICATION_KEY": "bm90IGEga2V5",
                ],
                "--sendgrid-verification-key"
            ),
            (
                listen,
                [
                    "SIWA_MAILGATE_ESP_EVENTS_DATABASE_URL": bounceURL,
                    "SIWA_MAILGATE_MAILGUN_SIGNING_KEY": Self.signingKey,
                    "SIWA_MAILGATE_ESP_EVENTS_MAX_AGE": "0",
                ],
                "esp-events-max-age"
            ),
        ]
        for (arguments, extra, word) in cases {
            let result = try run(arguments, base.merging(extra) { $1 })
            #expect(result.status == 2, "\(arguments): \(result.standardError)")
            #expect(result.standardError.contains(word), "\(arguments): \(result.standardError)")
            #expect(
                !result.standardError.contains("s3cret") && !result.standardError.contains(Self.signingKey))
        }
        // A signing key file that others may read: refused before anything starts.
        let open = try file(Self.signingKey + "\n", mode: 0o644)
        defer { try? FileManager.default.removeItem(at: open) }
        let result = try run(
            listen + ["--mailgun-signing-key-file", open.path],
            base.merging(["SIWA_MAILGATE_ESP_EVENTS_DATABASE_URL": bounceURL]) { $1 })
        #expect(result.status == 2 && result.standardError.contains("chmod 600"), "\(result.standardError)")
        #expect(!result.standardError.contains(Self.signingKey))
    }

    @Test(
        "a Mailgun event signed with the key from a file is recorded as siwa_bounce and counted on /metrics")
    func mailgunEndToEnd() throws {
        let database = try TestDatabase()
        let connection = try database.connect()
        defer { connection.close() }
        try connection.storeAsReceiver(
            SeededNotification(
                jti: "esp-\(UUID().uuidString)", type: "email-disabled", sub: "001.esp", email: Self.relay))
        _ = try connection.query("SELECT * FROM siwa.process_due_notifications(64, 20, interval '1 second')")
        let keyFile = try file(Self.signingKey + "\n", mode: 0o600)
        defer { try? FileManager.default.removeItem(at: keyFile) }
        let log = FileManager.default.temporaryDirectory.appendingPathComponent(
            "esp-\(UUID().uuidString).log")
        defer { try? FileManager.default.removeItem(at: log) }
        let addresses = ListenAddresses()
        defer { addresses.remove() }
        var environment = self.environment
        environment["SIWA_MAILGATE_DATABASE_URL"] = try database.url(asMemberOf: "siwa_mail")
        environment["SIWA_MAILGATE_ESP_EVENTS_DATABASE_URL"] = try database.url(asMemberOf: "siwa_bounce")
        environment["SIWA_MAILGATE_MAILGUN_SIGNING_KEY_FILE"] = keyFile.path
        let process = try Subprocess(
            ExecutableLocator.url(named: "siwa-mailgate").path,
            [
                "--policy-listen", "127.0.0.1:0", "--esp-events-listen", "127.0.0.1:0", "--metrics-listen",
                "127.0.0.1:0",
            ]
                + addresses.arguments, environment: environment, standardError: log.path)
        let listeners = try addresses.wait(for: process) {
            (try? String(contentsOf: log, encoding: .utf8)) ?? ""
        }
        let events = try ListenAddresses.address("esp_events", in: listeners)
        let metrics = try ListenAddresses.address("metrics", in: listeners)

        let timestamp = "\(Int(Date().timeIntervalSince1970))"
        let token = UUID().uuidString
        let hmac = try Subprocess.run(
            "/usr/bin/openssl", ["dgst", "-sha256", "-hmac", Self.signingKey, "-r"],
            input: Data((timestamp + token).utf8))
        let body: [String: Any] = [
            "signature": [
                "timestamp": timestamp, "token": token, "signature": String(hmac.standardOutput.prefix(64)),
            ],
            "event-data": [
                "event": "failed", "severity": "permanent", "recipient": Self.relay,
                "delivery-status": ["code": 550, "message": "5.1.1 user not found", "description": ""],
            ],
        ]
        let answer = try TestHTTPClient.post(
            "http://\(events)/v1/esp/mailgun", body: try JSONSerialization.data(withJSONObject: body),
            headers: [("Content-Type", "application/json")])
        #expect(answer.status == 200, "\(answer.text)")
        #expect(
            try TestHTTPClient.post("http://\(events)/v1/esp/sendgrid", body: Data("[]".utf8)).status == 404)
        let row = try connection.query("SELECT class, source, sub FROM siwa.relay_bounces")
        #expect(row.count == 1)
        #expect(
            try row.first.map {
                try [$0[0, as: String.self], $0[1, as: String.self], $0[2, as: String.self]]
            } == [
                "relay_address_dead", "mailgun", "001.esp",
            ])
        let scraped = try TestHTTPClient.get("http://\(metrics)/metrics").text
        #expect(
            scraped.contains(
                #"siwa_mailgate_esp_bounces_total{provider="mailgun",class="relay_address_dead"} 1"#))
        process.send(SIGTERM)
        #expect(process.wait(timeout: .seconds(20)) == .exited(0))
        let text = (try? String(contentsOf: log, encoding: .utf8)) ?? ""
        #expect(!text.contains("dead.p@") && !text.contains(Self.signingKey))
    }
}
