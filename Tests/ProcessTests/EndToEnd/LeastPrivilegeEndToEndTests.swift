import AppleNotifications
import Foundation
import Postgres
import SharedSignals
import TestSupport
import Testing

/// Every process under the login its docs give it (docs/security.md's roles) and every consumer on: a
/// trigger runs with the rights of the role whose write fired it, so a grant missing for one consumer
/// stops every notification once that consumer has something to do (PrivilegeAuditTests reads the same
/// rule statically).
@Suite("Least privilege end to end: every process under its own login, every consumer on", .serialized)
struct LeastPrivilegeEndToEndTests {
    /// The executables' environment: this process's, without any SIWA_* setting of the caller.
    static let clean = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }

    static func write(_ text: String, to url: URL) throws {
        try Data(text.utf8).write(to: url)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: url.path)
    }

    static func contents(_ url: URL) -> String { (try? String(contentsOf: url, encoding: .utf8)) ?? "" }

    @Test(
        "notifications are applied and reach webhooks, Shared Signals push and poll, the suppression list, the revoker, auth adapters (Supabase Auth, a hosted Keycloak) and the mail gate"
    )
    func everyConsumer() throws {
        let database = try TestDatabase()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("least-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let siwactl = ExecutableLocator.url(named: "siwactl")
        let alice = "001026.least0a11ce000000000000000000000.1801"
        let bob = "001026.least0b0b0000000000000000000000.1802"
        let aliceRelay = "least.alice.q8x@privaterelay.appleid.com"
        let bobReal = "least.bob@example.com"

        // A webhook endpoint, added by the webhook administrators' login.
        let endpoint = try WebhookReceiver { _, _ in (204, .zero) }
        let added = try ExecutableLocator.run(
            siwactl,
            arguments: [
                "webhooks", "add", "--database-url", try database.url(asMemberOf: "siwa_webhook_admin"),
                "--url", endpoint.url,
            ], environment: Self.clean)
        try #require(added.status == 0, "\(added.standardError)")
        // A Shared Signals push stream (the owner, as siwactl ssf streams add) and a receiver that will
        // create a poll stream through the transmitter API.
        let setKey = try SETSigningKey.generate()
        let setKeyFile = directory.appendingPathComponent("ssf-key.pem")
        try Self.write(setKey.privateKeyPEM, to: setKeyFile)
        let issuer = "https://ssf.example.test"
        let pushAudience = "https://receiver.example.test/push"
        let pushReceiver = try SETReceiver(
            keys: setKey.keySet(), issuer: issuer, audience: pushAudience, authorization: nil)
        _ =
            try database.value(
                "SELECT siwa.add_ssf_stream('push', $1, $2, NULL)",
                [.text(pushAudience), .text(pushReceiver.url)]) as Int
        let receiverAdded = try ExecutableLocator.run(
            siwactl, arguments: ["ssf", "receivers", "add", "poller", "--database-url", database.url],
            environment: Self.clean)
        try #require(receiverAdded.status == 0, "\(receiverAdded.standardError)")
        func printed(_ prefix: String) throws -> String {
            String(
                try #require(
                    receiverAdded.standardOutput.split(separator: "\n").first { $0.hasPrefix(prefix) }
                )
                .dropFirst(prefix.count))
        }
        let clientID = try printed("client_id: ")
        let clientSecret = try printed("client_secret: ")
        // A suppression list (SendGrid's fake) and the revoker's Apple.
        let sendgrid = try FakeSuppressionProvider(.sendgrid)
        try database.query(
            "INSERT INTO siwa.suppression_providers (name, kind) VALUES ('sendgrid', 'sendgrid')")
        let sendgridKey = directory.appendingPathComponent("sendgrid-key")
        try Self.write(sendgrid.credential, to: sendgridKey)
        // A Supabase Auth adapter, added by the administrators' login; Alice and Bob are its users.
        let auth = try SupabaseAuthFixture.database()
        try auth.query(
            "UPDATE auth.identities SET provider_id = $1 WHERE provider_id = '001.a'", [.text(alice)])
        try auth.query(
            "UPDATE auth.identities SET provider_id = $1 WHERE provider_id = '001.b'", [.text(bob)])
        let authURLFile = directory.appendingPathComponent("auth-url")
        try Self.write(auth.url, to: authURLFile)
        let adapterAdded = try ExecutableLocator.run(
            siwactl,
            arguments: [
                "adapters", "add", "supabase", "--platform", "supabase", "--connection-file",
                authURLFile.path,
                "--database-url", try database.url(asMemberOf: "siwa_admin"),
            ], environment: Self.clean)
        try #require(adapterAdded.status == 0, "\(adapterAdded.standardError)")
        // And a hosted one, the fake Keycloak: Alice signs in with Apple only, Bob also with a password.
        let keycloak = try HostedPlatformFake("keycloak")
        try keycloak.seed(email: "alice@example.com", appleSub: alice, sessions: 1)
        try keycloak.seed(email: "bob@example.com", appleSub: bob, password: true, sessions: 1)
        let keycloakFile = directory.appendingPathComponent("keycloak-credentials")
        try Self.write(String(decoding: try keycloak.adapterCredentials(), as: UTF8.self), to: keycloakFile)
        let hostedAdded = try ExecutableLocator.run(
            siwactl,
            arguments: [
                "adapters", "add", "keycloak", "--platform", "keycloak", "--connection-file",
                keycloakFile.path,
                "--database-url", try database.url(asMemberOf: "siwa_admin"),
            ], environment: Self.clean)
        try #require(hostedAdded.status == 0, "\(hostedAdded.standardError)")
        let apple = try LocalApple()
        let tokenKeys = try writeKeyFile([("k1", randomKey())], in: directory)
        let keys = try StaticHTTPServer(body: TestSigning.apple.jwksJSON())

        // siwa-receiver (siwa_receiver) with the transmitter API (siwa_ssf).
        let receiverLog = directory.appendingPathComponent("receiver.log")
        let receiverAddresses = ListenAddresses()
        defer { receiverAddresses.remove() }
        let receiver = try Subprocess(
            ExecutableLocator.url(named: "siwa-receiver").path,
            ["--listen", "127.0.0.1:0", "--audience", TestSigning.audience] + receiverAddresses.arguments,
            environment: Self.clean.merging(
                [
                    "SIWA_DATABASE_URL": try database.url(asMemberOf: "siwa_receiver"),
                    "SIWA_JWKS_URL": keys.url.absoluteString, "SIWA_SSF_LISTEN": "127.0.0.1:0",
                    "SIWA_SSF_DATABASE_URL": try database.url(asMemberOf: "siwa_ssf"),
                    "SIWA_SSF_KEY_FILE": setKeyFile.path, "SIWA_SSF_ISSUER": issuer,
                ], uniquingKeysWith: { $1 }), standardError: receiverLog.path)
        defer {
            receiver.send(SIGTERM)
            _ = receiver.wait(timeout: .seconds(20))
        }
        let listeners = try receiverAddresses.wait(for: receiver) { Self.contents(receiverLog) }
        let notifications = try "http://" + ListenAddresses.address("notifications", in: listeners)
        let ssf = try "http://" + ListenAddresses.address("ssf", in: listeners)

        // siwa-worker (siwa_worker) with webhooks, Shared Signals push, suppressions and the revoker on.
        let worker = try WorkerProcess(
            [
                "--poll-interval", "0.2", "--webhook-poll-interval", "0.1", "--ssf-key-file", setKeyFile.path,
                "--ssf-issuer", issuer, "--suppressions", "sendgrid", "--sendgrid-key-file", sendgridKey.path,
                "--sendgrid-api-url", sendgrid.baseURL, "--apple-key-file", apple.teamKeyFile.path,
                "--apple-team-id", LocalApple.teamID, "--apple-key-id", LocalApple.keyID, "--apple-url",
                apple.baseURL, "--audience", TestSigning.audience, "--token-key-file", tokenKeys,
                "--revocation-poll-interval", "0.2", "--auth-adapters", "on", "--log-level", "info",
            ], databaseURL: try database.url(asMemberOf: "siwa_worker"),
            environment: ["SIWA_JWKS_URL": keys.url.absoluteString])
        defer {
            worker.send(SIGTERM)
            _ = worker.waitForExit(timeout: .seconds(20))
        }

        // siwa-mailgate (siwa_mail).
        let gateToken = "least-privilege-gate-token-0123456789abcdef"
        let gateLog = directory.appendingPathComponent("gate.log")
        let gateAddresses = ListenAddresses()
        defer { gateAddresses.remove() }
        let gate = try Subprocess(
            ExecutableLocator.url(named: "siwa-mailgate").path,
            [
                "--policy-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
            ] + gateAddresses.arguments,
            environment: Self.clean.merging(
                [
                    "SIWA_MAILGATE_DATABASE_URL": try database.url(asMemberOf: "siwa_mail"),
                    "SIWA_MAILGATE_CACHE_TTL": "0",
                    // The token from the environment, as the Kubernetes manifest passes it.
                    "SIWA_MAILGATE_HTTP_TOKEN": gateToken,
                ], uniquingKeysWith: { $1 }), standardError: gateLog.path)
        defer {
            gate.send(SIGTERM)
            _ = gate.wait(timeout: .seconds(20))
        }
        let gateHTTP = try ListenAddresses.address(
            "http", in: gateAddresses.wait(for: gate) { Self.contents(gateLog) })

        // The poll stream, created by its receiver with a token of its own.
        let basic = Data("\(clientID):\(clientSecret)".utf8).base64EncodedString()
        let tokenAnswer = try TestHTTPClient.post(
            ssf + "/ssf/token", body: Array("grant_type=client_credentials".utf8),
            headers: [
                ("Authorization", "Basic " + basic), ("Content-Type", "application/x-www-form-urlencoded"),
            ])
        try #require(tokenAnswer.status == 200, "\(tokenAnswer.text)")
        let access = try #require(
            (try JSONSerialization.jsonObject(with: tokenAnswer.data) as? [String: Any])?["access_token"]
                as? String)
        let bearer = [("Authorization", "Bearer " + access), ("Content-Type", "application/json")]
        let created = try TestHTTPClient.post(
            ssf + "/ssf/streams", body: Data(#"{"delivery":{"method":"urn:ietf:rfc:8936"}}"#.utf8),
            headers: bearer)
        try #require(created.status == 201, "\(created.text)")
        let delivery = try #require(
            (try JSONSerialization.jsonObject(with: created.data) as? [String: Any])?["delivery"]
                as? [String: Any])
        let pollURL = try #require(delivery["endpoint_url"] as? String)
        let pollPath = try #require(URL(string: pollURL)?.path)

        // The app's revocation request, as siwa_app.
        let app = try database.connect(asMemberOf: "siwa_app")
        defer { app.close() }
        try app.query("SELECT siwa.request_revocation($1, 'least privilege')", [.text(alice)])

        // Apple's notifications, as real traffic spells them.
        let start = Date().addingTimeInterval(-600)
        let posted = [
            TestSigning.token(
                type: "email-disabled", subject: alice, email: aliceRelay, isPrivateEmail: true,
                eventTime: start),
            TestSigning.token(
                type: "email-disabled", subject: bob, email: bobReal, isPrivateEmail: false,
                eventTime: start.addingTimeInterval(1)),
            TestSigning.token(
                type: "consent-revoked", subject: alice, eventTime: start.addingTimeInterval(2)),
            TestSigning.token(type: "account-delete", subject: bob, eventTime: start.addingTimeInterval(3)),
        ]
        for token in posted {
            let answer = try TestHTTPClient.post(
                notifications + "/apple/notifications", body: Array(#"{"payload":"\#(token)"}"#.utf8),
                headers: [("Content-Type", "application/json")])
            try #require(answer.status == 200, "\(answer.status) \(Self.contents(receiverLog).suffix(2000))")
        }
        func count(_ sql: String) -> Int { (try? database.value(sql) as Int) ?? -1 }
        #expect(
            waitUntil(timeout: .seconds(30)) {
                count("SELECT count(*)::int FROM siwa.notification_log WHERE state = 'applied'") == 4
            },
            "not applied: \(worker.log.suffix(3000))")

        #expect(
            waitUntil(timeout: .seconds(30)) {
                count("SELECT count(*)::int FROM siwa.revocation_requests WHERE state <> 'pending'") == 1
            }, "revoker: \(worker.log.suffix(2000))")
        // Each consumer finishes its rows: webhooks one per change (Bob's erasure may be one), Shared
        // Signals one per change it sends.
        let signals = count(
            "SELECT count(*)::int FROM siwa.changes WHERE siwa.ssf_event_type(type) IS NOT NULL")
        #expect(signals == 4)
        #expect(
            waitUntil(timeout: .seconds(30)) {
                count("SELECT count(*)::int FROM siwa.webhook_deliveries WHERE state = 'delivered'")
                    == count("SELECT count(*)::int FROM siwa.changes")
            }, "webhooks: \(worker.log.suffix(2000))")
        #expect(
            waitUntil(timeout: .seconds(30)) { pushReceiver.accepted.count == signals },
            "push: \(worker.log.suffix(2000))")
        #expect(
            waitUntil(timeout: .seconds(30)) {
                count("SELECT count(*)::int FROM siwa.suppression_outbox WHERE state = 'done'") == 1
            }, "suppressions: \(worker.log.suffix(2000))")
        // The adapter applied every change in Supabase Auth: both users' sessions ended, Bob's Apple identity
        // unlinked (he keeps his password, so he is not banned), Alice's kept; Bob's erasure, after the
        // unlink, finds no user there.
        func adapterRows(_ adapter: String) -> [String] {
            (try? database.query(
                """
                SELECT e.state || ' ' || e.type FROM siwa.auth_adapter_events e
                  JOIN siwa.auth_adapters a ON a.id = e.adapter_id WHERE a.name = $1 ORDER BY e.id
                """, [.text(adapter)]
            ).map { try $0[0, as: String.self] }) ?? []
        }
        for adapter in ["supabase", "keycloak"] {
            #expect(
                waitUntil(timeout: .seconds(30)) {
                    !adapterRows(adapter).contains { $0.hasPrefix("pending") }
                },
                "\(adapter): \(adapterRows(adapter)) \(worker.log.suffix(2000))")
            #expect(
                adapterRows(adapter) == [
                    "done siwa.email_disabled", "done siwa.email_disabled", "done siwa.consent_revoked",
                    "done siwa.account_deleted", "no_user siwa.personal_data_erased",
                ], "\(adapter)")
        }
        // In Keycloak too: no session left, Bob's Apple link gone (his password keeps him enabled), Alice's kept.
        #expect(
            try keycloak.users().allSatisfy {
                $0["sessions"] as? Int == 0 && $0["disabled"] as? Bool == false
            })
        #expect(try keycloak.user(withIdentity: "apple", alice) != nil)
        #expect(try keycloak.user(withIdentity: "apple", bob) == nil)
        #expect(try auth.value("SELECT count(*)::int FROM auth.sessions", as: Int.self) == 0)
        #expect(
            try auth.query("SELECT provider_id FROM auth.identities WHERE provider = 'apple'").map {
                try $0[0, as: String.self]
            } == [alice])
        // Only Alice's relay address went to the list; Bob's real address never did.
        #expect(Set(sendgrid.calls.map(\.address)) == [aliceRelay])
        // Polled in order per user: each round acknowledges what the previous one returned.
        var polled: Set<String> = []
        var acknowledge: [String] = []
        for _ in 0..<signals where polled.count < signals {
            let body = try JSONSerialization.data(withJSONObject: [
                "maxEvents": 10, "returnImmediately": true, "ack": acknowledge,
            ])
            let answer = try TestHTTPClient.post(ssf + pollPath, body: body, headers: bearer)
            try #require(answer.status == 200, "\(answer.text)")
            let sets =
                (try JSONSerialization.jsonObject(with: answer.data) as? [String: Any])?["sets"]
                as? [String: Any]
            acknowledge = Array((sets ?? [:]).keys)
            polled.formUnion(acknowledge)
        }
        #expect(polled.count == signals)
        let decision = try TestHTTPClient.get(
            "http://\(gateHTTP)/v1/relay-mail/decision?address=\(aliceRelay)",
            headers: [("Authorization", "Bearer \(gateToken)")])
        #expect(
            decision.status == 200 && decision.text.contains(#""reason":"forwarding_off""#),
            "\(decision.text)")

        // Nothing was refused for want of a grant, in any process.
        for (name, log) in [
            ("worker", worker.log), ("receiver", Self.contents(receiverLog)),
            ("mailgate", Self.contents(gateLog)),
        ] {
            #expect(
                !log.contains("42501") && !log.contains("permission denied"), "\(name): \(log.suffix(2000))")
        }
    }
}
