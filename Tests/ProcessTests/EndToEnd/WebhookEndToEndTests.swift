import AppleNotifications
import Foundation
import Postgres
import Synchronization
import TestSupport
import Testing
import Webhooks

/// A URL of `database` for a login role that is a member of `group`.
private func loginURL(_ database: WebhookDatabase, memberOf group: String) throws -> String {
    try database.url(asMemberOf: group)
}

private func temporaryPath(_ name: String) -> String {
    FileManager.default.temporaryDirectory.appendingPathComponent("siwa-e2e-\(UUID().uuidString)-\(name)")
        .path
}

private func contents(_ path: String) -> String {
    (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
}

/// The executables' environment: this process's, without any SIWA_* setting of the caller.
private let cleanEnvironment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }

extension ReceivedDelivery {
    /// The body's `type`.
    fileprivate var type: String { json["type"] as? String ?? "" }
    /// The body's `data`.
    fileprivate var data: [String: Any] { json["data"] as? [String: Any] ?? [:] }
    /// Whether the raw body holds `text` anywhere.
    fileprivate func holds(_ text: String) -> Bool { String(decoding: body, as: UTF8.self).contains(text) }
}

/// Milliseconds since 1970 of an ISO 8601 time with fractional seconds, as the bodies carry.
private func milliseconds(_ iso: Any?) -> Int64? {
    let formatter = ISO8601DateFormatter()
    formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
    guard let text = iso as? String, let date = formatter.date(from: text) else { return nil }
    return Int64((date.timeIntervalSince1970 * 1000).rounded())
}

/// One notification the test posts, and what its change should say.
private struct Posted {
    var type: String
    var sub: String
    var jti = UUID().uuidString.lowercased()
    /// Apple's event_time, in milliseconds (as real traffic sends it).
    var eventTime: Int64
    var email: String?
    var isPrivateEmail: Bool?

    var token: String {
        TestSigning.token(
            type: type, subject: sub, email: email, isPrivateEmail: isPrivateEmail,
            eventTime: Date(timeIntervalSince1970: Double(eventTime) / 1000), jti: jti)
    }
}

/// The whole loop through public interfaces: Apple's signed notification → a real
/// siwa-receiver (as a member of siwa_receiver) → a real siwa-worker (siwa_worker) applying it and
/// writing the changefeed → a Standard Webhooks delivery to an endpoint registered with `siwactl
/// webhooks add`, verified by the independent Python implementation; the app's side read as siwa_app.
@Suite("Webhooks end to end: Apple's notification to a verified delivery", .serialized)
struct EndToEndTests {
    @Test(
        "signed notifications through siwa-receiver and siwa-worker arrive as verified webhooks, in order per sub, with no email left after erasure"
    )
    func endToEnd() throws {
        let database = try WebhookDatabase()
        let appConnection = try PostgresConnection(
            configuration: PostgresConfiguration(loginURL(database, memberOf: "siwa_app")))
        defer { appConnection.close() }
        let alice = "001026.e2e0a11ce0000000000000000000000.1744"
        let bob = "001026.e2e0b0b00000000000000000000000000.1745"
        let aliceEmail = "e2e.alice.x7q@privaterelay.appleid.com"
        let bobEmail = "e2e.bob.k3z@example.com"

        // The endpoint: answers 503 to Alice's email_enabled until the test has seen her erasure, so that
        // a delivery is still pending when the email is erased.
        let holdAlicesEmailEnabled = Atomic<Bool>(true)
        let endpoint = try WebhookReceiver { delivery, _ in
            if holdAlicesEmailEnabled.load(ordering: .sequentiallyConsistent), delivery.sub == alice,
                delivery.type == "siwa.email_enabled"
            {
                return (503, .zero)
            }
            return (204, .zero)
        }
        let siwactl = ExecutableLocator.url(named: "siwactl")
        let added = try ExecutableLocator.run(
            siwactl, arguments: ["webhooks", "add", "--database-url", database.url, "--url", endpoint.url],
            environment: cleanEnvironment)
        try #require(added.status == 0, "\(added.standardError)")
        let lines = added.standardOutput.split(separator: "\n")
        let secret = try StandardWebhooks.Secret(
            String(try #require(lines.first { $0.hasPrefix("secret: ") }).dropFirst("secret: ".count)))
        let endpointLine = try #require(lines.first { $0.hasPrefix("endpoint ") })
        let endpointID = try #require(
            Int(endpointLine.dropFirst("endpoint ".count).prefix { $0.isNumber }))

        // Apple's keys, the receiver and the worker, each as a member of its own role.
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let receiverLog = temporaryPath("receiver.log")
        let addresses = ListenAddresses()
        defer { addresses.remove() }
        let receiver = try Subprocess(
            ExecutableLocator.url(named: "siwa-receiver").path,
            [
                "--listen", "127.0.0.1:0", "--database-url",
                loginURL(database, memberOf: "siwa_receiver"),
                "--audience", TestSigning.audience, "--jwks-url", jwks.url.absoluteString, "--log-level",
                "debug",
            ] + addresses.arguments, environment: cleanEnvironment, standardError: receiverLog)
        defer {
            receiver.send(SIGTERM)
            receiver.wait()
        }
        let base = try "http://" + addresses.address("notifications", of: receiver) { contents(receiverLog) }
        try #require(
            waitUntil(timeout: .seconds(20)) { (try? TestHTTPClient.get(base + "/readyz").status) == 200 },
            "\(contents(receiverLog))")
        let workerLog = temporaryPath("worker.log")
        defer {
            try? FileManager.default.removeItem(atPath: receiverLog)
            try? FileManager.default.removeItem(atPath: workerLog)
        }
        let worker = try Subprocess(
            ExecutableLocator.url(named: "siwa-worker").path,
            [
                "--database-url", loginURL(database, memberOf: "siwa_worker"), "--poll-interval", "0.2",
                "--jwks-url", jwks.url.absoluteString, "--webhook-poll-interval", "0.1",
                "--webhook-retry-base-delay", "0.05",
                "--webhook-max-retry-delay", "0.2", "--log-level", "debug",
            ], environment: cleanEnvironment, standardError: workerLog)
        defer {
            worker.send(SIGTERM)
            worker.wait()
        }

        // The app's sessions and refresh tokens, recorded as siwa_app: two sessions and a token of Alice's
        // and a session of Bob's, from before the consent revocations.
        try appConnection.query(
            """
            INSERT INTO siwa.sessions (sub, created_at)
            VALUES ($1, now() - interval '2 days'), ($1, now() - interval '1 day'), ($2, now() - interval '1 day')
            """, [.text(alice), .text(bob)])
        try appConnection.query(
            """
            INSERT INTO siwa.refresh_tokens (sub, client_id, token_sha256, token_ciphertext, created_at)
            VALUES ($1, $2, sha256(convert_to(gen_random_uuid()::text, 'UTF8')), '\\x01', now() - interval '1 day')
            """, [.text(alice), .text(TestSigning.audience)])

        // Event times in milliseconds with a fraction of a second, ten minutes ago and on, as real traffic.
        let start = Int64(Date().timeIntervalSince1970 * 1000) / 1000 * 1000 - 600_000 + 123
        let a1 = Posted(
            type: "email-disabled", sub: alice, eventTime: start, email: aliceEmail, isPrivateEmail: true)
        let b1 = Posted(
            type: "email-enabled", sub: bob, eventTime: start + 10_000, email: bobEmail, isPrivateEmail: false
        )
        let a2 = Posted(
            type: "email-enabled", sub: alice, eventTime: start + 60_000, email: aliceEmail,
            isPrivateEmail: true)
        let b2 = Posted(type: "consent-revoked", sub: bob, eventTime: start + 70_000)
        let a3 = Posted(type: "consent-revoked", sub: alice, eventTime: start + 120_000)
        let a4 = Posted(type: "account-delete", sub: alice, eventTime: start + 180_000)
        let b3 = Posted(
            type: "email-disabled", sub: bob, eventTime: start + 190_000, email: bobEmail,
            isPrivateEmail: false)

        func changefeedCount() -> Int {
            (try? appConnection.query("SELECT count(*)::int FROM siwa.changefeed")[0][0, as: Int.self]) ?? -1
        }
        /// Posts `notification` to the receiver as Apple would; waits until the changefeed has `changes`.
        func post(_ notification: Posted, thenChanges changes: Int) throws {
            let response = try TestHTTPClient.post(
                base + "/apple/notifications", body: Array(#"{"payload":"\#(notification.token)"}"#.utf8),
                headers: [("Content-Type", "application/json")])
            try #require(response.status == 200, "\(notification.type): \(response.status)")
            try #require(
                waitUntil(timeout: .seconds(20)) { changefeedCount() >= changes },
                "\(notification.type) was not applied: \(contents(workerLog).suffix(2000))")
            #expect(changefeedCount() == changes)
        }

        try post(a1, thenChanges: 1)
        try post(b1, thenChanges: 2)
        try post(a2, thenChanges: 3)
        // Alice's email_enabled is refused (by then her email_disabled went out, being ahead of it).
        try #require(
            waitUntil(timeout: .seconds(20)) {
                endpoint.deliveries.contains {
                    $0.sub == alice && $0.type == "siwa.email_enabled" && $0.status == 503
                }
            })
        try post(b2, thenChanges: 4)
        try post(a3, thenChanges: 5)
        // Sessions the app records after the revocation are valid; the deletion revokes them.
        try appConnection.query(
            "INSERT INTO siwa.sessions (sub, created_at) VALUES ($1, now())", [.text(alice)])
        try appConnection.query(
            """
            INSERT INTO siwa.refresh_tokens (sub, client_id, token_sha256, token_ciphertext, created_at)
            SELECT $1, $2, sha256(convert_to(gen_random_uuid()::text, 'UTF8')), '\\x02', now() FROM generate_series(1, 2)
            """, [.text(alice), .text(TestSigning.audience)])
        try post(a4, thenChanges: 7)
        try post(b3, thenChanges: 8)

        // Erased: a retry of the held delivery now carries no email; from then on nothing sent holds it.
        try #require(
            waitUntil(timeout: .seconds(20)) {
                endpoint.deliveries.contains {
                    $0.sub == alice && $0.type == "siwa.email_enabled" && $0.status == 503
                        && !$0.holds(aliceEmail)
                }
            },
            "no attempt after the erasure came without the email")
        let afterErasure = try #require(
            endpoint.deliveries.firstIndex {
                $0.sub == alice && $0.type == "siwa.email_enabled" && !$0.holds(aliceEmail)
            })
        holdAlicesEmailEnabled.store(false, ordering: .sequentiallyConsistent)
        #expect(waitUntil(timeout: .seconds(30)) { (try? database.count("delivered")) == 8 })

        let beforeReplay = endpoint.deliveries
        // A replay after the erasure: the same webhook-id, and no email.
        let a1Change = try #require(
            endpoint.accepted.first { $0.sub == alice && $0.type == "siwa.email_disabled" }?.changeID)
        let replayed = try ExecutableLocator.run(
            siwactl,
            arguments: ["webhooks", "replay", "--database-url", database.url, "--change", String(a1Change)],
            environment: cleanEnvironment)
        #expect(replayed.status == 0, "\(replayed.standardError)")
        #expect(
            waitUntil(timeout: .seconds(20)) {
                endpoint.accepted.filter { $0.changeID == a1Change }.count == 2
                    && (try? database.count("delivered")) == 8
            })

        let received = endpoint.deliveries
        let accepted = endpoint.accepted

        // Every request verifies with the reference implementation; none with another secret or altered.
        let verdicts = try ReferenceVerifier.verify(received, secret: secret)
        #expect(verdicts.count == received.count && verdicts.allSatisfy { $0 == "ok" }, "\(verdicts)")
        let forgedVerdicts = try ReferenceVerifier.verify(accepted, secret: .generate())
        #expect(forgedVerdicts.count == accepted.count && forgedVerdicts.allSatisfy { $0.hasPrefix("fail") })
        var altered = try #require(accepted.first)
        altered.body[altered.body.count - 2] ^= 0x01
        #expect(try ReferenceVerifier.verify([altered], secret: secret).allSatisfy { $0.hasPrefix("fail") })

        // The first accepted copy of each message, in arrival order: per sub, the changes in applied order.
        var seen: Set<String> = []
        let messages = accepted.filter { seen.insert($0.id ?? "").inserted }
        #expect(messages.count == 8)
        #expect(
            messages.filter { $0.sub == alice }.map(\.type) == [
                "siwa.email_disabled", "siwa.email_enabled", "siwa.consent_revoked", "siwa.account_deleted",
                "siwa.personal_data_erased",
            ])
        #expect(
            messages.filter { $0.sub == bob }.map(\.type) == [
                "siwa.email_enabled", "siwa.consent_revoked", "siwa.email_disabled",
            ])
        #expect(inOrderPerSub(beforeReplay))

        // data: sub, jti, event_time (Apple's milliseconds), counts; timestamp is the event time.
        let expected: [(Posted, String, sessions: Int, tokens: Int)] = [
            (a1, "siwa.email_disabled", 0, 0), (b1, "siwa.email_enabled", 0, 0),
            (a2, "siwa.email_enabled", 0, 0),
            (b2, "siwa.consent_revoked", 1, 0), (a3, "siwa.consent_revoked", 2, 1),
            (a4, "siwa.account_deleted", 1, 2), (a4, "siwa.personal_data_erased", 0, 0),
            (b3, "siwa.email_disabled", 0, 0),
        ]
        for (posted, type, sessions, tokens) in expected {
            let message = try #require(messages.first { $0.sub == posted.sub && $0.type == type }, "\(type)")
            let data = message.data
            #expect(data["sub"] as? String == posted.sub)
            #expect(data["jti"] as? String == posted.jti, "\(type)")
            #expect(milliseconds(data["event_time"]) == posted.eventTime, "\(type): \(data)")
            #expect(milliseconds(message.json["timestamp"]) == posted.eventTime)
            #expect(data["sessions_revoked"] as? Int == sessions, "\(type)")
            #expect(data["refresh_tokens_revoked"] as? Int == tokens, "\(type)")
            #expect(data["audience"] as? String == TestSigning.audience)
            #expect(milliseconds(data["applied_at"]) != nil)
        }
        // Email only on email events, and Alice's only before her erasure.
        let a1Message = try #require(messages.first { $0.changeID == a1Change })
        #expect(a1Message.data["email"] as? String == aliceEmail)
        #expect(a1Message.data["is_private_email"] as? Bool == true)
        let b1Message = try #require(messages.first { $0.sub == bob && $0.type == "siwa.email_enabled" })
        #expect(b1Message.data["email"] as? String == bobEmail)
        #expect(b1Message.data["is_private_email"] as? Bool == false)
        #expect(
            received.contains { $0.sub == alice && $0.type == "siwa.email_enabled" && $0.holds(aliceEmail) },
            "the held delivery's first attempts, before the erasure, carried the email")
        for delivery in received[afterErasure...] {
            #expect(!delivery.holds(aliceEmail), "delivered after the erasure: \(delivery.type)")
        }
        #expect(
            messages.filter {
                ["siwa.consent_revoked", "siwa.account_deleted", "siwa.personal_data_erased"].contains(
                    $0.type)
            }.allSatisfy { $0.data["email"] == nil && $0.data["is_private_email"] == nil })

        // webhook-id: msg_<change>_<endpoint>, the same on every attempt and on the replay.
        for delivery in received {
            #expect(delivery.id == "msg_\(delivery.changeID)_\(endpointID)")
        }
        let replay = try #require(accepted.last { $0.changeID == a1Change })
        #expect(replay.id == a1Message.id)
        #expect(replay.data["email"] == nil && replay.data["is_private_email"] == nil)
        #expect(replay.data["jti"] as? String == a1.jti)
        let heldAttempts = received.filter {
            $0.id == messages.first { $0.sub == alice && $0.type == "siwa.email_enabled" }?.id
        }
        #expect(heldAttempts.count >= 3)
        #expect(heldAttempts.dropLast().allSatisfy { $0.status == 503 } && heldAttempts.last?.status == 204)

        // The changefeed, read as siwa_app: the same changes; per sub, in the order they were delivered.
        let feed = try appConnection.query(
            "SELECT id::int, sub, type, email FROM siwa.changefeed ORDER BY position"
        ).map {
            (
                id: try $0[0, as: Int.self], sub: try $0[1, as: String.self],
                type: try $0[2, as: String.self],
                email: try $0[3, as: String?.self]
            )
        }
        #expect(Set(feed.map(\.id)) == Set(messages.map(\.changeID)))
        for sub in [alice, bob] {
            #expect(
                feed.filter { $0.sub == sub }.map(\.id) == messages.filter { $0.sub == sub }.map(\.changeID))
            #expect(
                feed.filter { $0.sub == sub }.map(\.type) == messages.filter { $0.sub == sub }.map(\.type))
        }
        #expect(feed.filter { $0.sub == alice }.allSatisfy { $0.email == nil })
        #expect(
            feed.filter { $0.sub == bob && $0.type != "siwa.consent_revoked" }.allSatisfy {
                $0.email == bobEmail
            })

        // Nothing stored holds Alice's email: the changes, every webhook table, the attempts' errors, the
        // notifications and the account. (Bob's, not erased, is found the same way.)
        func stored(_ text: String) throws -> Int {
            try database.value(
                """
                SELECT ((SELECT count(*) FROM siwa.changes t WHERE strpos(t::text, $1) > 0)
                      + (SELECT count(*) FROM siwa.webhook_deliveries t WHERE strpos(t::text, $1) > 0)
                      + (SELECT count(*) FROM siwa.webhook_attempts t WHERE strpos(t::text, $1) > 0)
                      + (SELECT count(*) FROM siwa.webhook_endpoints t WHERE strpos(t::text, $1) > 0)
                      + (SELECT count(*) FROM siwa.notification_log t WHERE strpos(t::text, $1) > 0)
                      + (SELECT count(*) FROM siwa.accounts t WHERE strpos(t::text, $1) > 0))::int
                """, [.text(text)])
        }
        #expect(try stored(aliceEmail) == 0)
        #expect(try stored(bobEmail) > 0)
        let errors = try database.connection.query(
            "SELECT DISTINCT coalesce(error, '-') FROM siwa.webhook_attempt_history WHERE sub = $1 ORDER BY 1",
            [.text(alice)]
        ).map { try $0[0, as: String.self] }
        #expect(errors == ["-", "HTTP 503"])

        // The app's view: Alice's sessions and tokens are revoked, and the rule says so.
        #expect(
            try appConnection.query(
                """
                SELECT (SELECT count(*) FROM siwa.sessions WHERE sub = $1 AND revoked_at IS NULL)
                     + (SELECT count(*) FROM siwa.refresh_tokens WHERE sub = $1 AND revoked_at IS NULL)
                """, [.text(alice)])[0][0, as: Int.self] == 0)
        #expect(
            try appConnection.query("SELECT siwa.session_is_valid($1, now())", [.text(alice)])[0][
                0, as: Bool.self]
                == false)

        // The services logged neither the email nor the secret, and stop cleanly.
        worker.send(SIGTERM)
        #expect(worker.wait(timeout: .seconds(20)) == .exited(0))
        receiver.send(SIGTERM)
        #expect(receiver.wait(timeout: .seconds(20)) == .exited(0))
        for log in [contents(workerLog), contents(receiverLog)] {
            #expect(!log.isEmpty)
            #expect(!log.contains(aliceEmail) && !log.contains(bobEmail) && !log.contains("whsec_"))
        }
    }
}
