import Foundation
import HTTPServer
import Postgres
import ServiceSupport
import SignIn
import TestSupport
import Testing

@Suite("The sign-in API answers what is true now, and its refusals are logged and counted")
struct SignInRefusalTests {
    /// Stores a notification for `sub` the way the receiver does and applies it as the worker does.
    func apply(_ fixture: SignInFixture, _ type: String, sub: String, eventTime: Date = Date()) throws {
        let connection = try PostgresConnection(configuration: fixture.receiver.database)
        defer { connection.close() }
        try connection.storeAsReceiver(
            SeededNotification(
                jti: "\(type)-\(sub)-\(UUID().uuidString)", type: type, sub: sub,
                audience: LocalApple.clientID,
                eventTime: eventTime))
        _ = try fixture.query("SELECT * FROM siwa.process_due_notifications(64, 20, interval '1 second')")
    }

    @Test(
        "a replayed sign-in after the user deleted the account is 410 account_deleted, without the identity")
    func replayAfterDeletion() throws {
        let fixture = try SignInFixture()
        let body = try fixture.signInBody(sub: "001.replay.deleted", email: "d@privaterelay.appleid.com")
        #expect(try fixture.post("/v1/sign-ins", body).status == 200)
        try apply(fixture, "account-delete", sub: "001.replay.deleted")
        let replay = try fixture.post("/v1/sign-ins", body)
        #expect(replay.status == 410, "\(replay.text)")
        #expect(replay.json["error"] as? String == "account_deleted")
        #expect(replay.json["sub"] == nil && !replay.text.contains("privaterelay"))
    }

    @Test("a replayed sign-in after the user revoked consent is 403 consent_revoked, without the identity")
    func replayAfterConsentRevoked() throws {
        let fixture = try SignInFixture()
        let body = try fixture.signInBody(sub: "001.replay.revoked", email: "r@privaterelay.appleid.com")
        #expect(try fixture.post("/v1/sign-ins", body).status == 200)
        try apply(fixture, "consent-revoked", sub: "001.replay.revoked")
        let replay = try fixture.post("/v1/sign-ins", body)
        #expect(replay.status == 403, "\(replay.text)")
        #expect(replay.json["error"] as? String == "consent_revoked")
        #expect(replay.json["sub"] == nil && !replay.text.contains("privaterelay"))
        // Apple was asked once: the replay is answered from the database.
        #expect(fixture.apple.log.components(separatedBy: "POST /auth/token").count - 1 == 1)
    }

    @Test("a sign-in after an earlier consent revocation stays valid, also when replayed")
    func signInAfterRevocation() throws {
        let fixture = try SignInFixture()
        try apply(fixture, "consent-revoked", sub: "001.back", eventTime: Date().addingTimeInterval(-3600))
        let body = try fixture.signInBody(sub: "001.back")
        let first = try fixture.post("/v1/sign-ins", body)
        #expect(first.status == 200, "\(first.text)")
        let replay = try fixture.post("/v1/sign-ins", body)
        #expect(replay.status == 200)
        #expect(NSDictionary(dictionary: first.json) == NSDictionary(dictionary: replay.json))
    }

    @Test("a fresh sign-in of a deleted account is 410 account_deleted; its token is stored revoked")
    func freshSignInOfDeletedAccount() throws {
        let fixture = try SignInFixture()
        try apply(fixture, "account-delete", sub: "001.fresh.deleted")
        let answer = try fixture.post("/v1/sign-ins", try fixture.signInBody(sub: "001.fresh.deleted"))
        #expect(answer.status == 410, "\(answer.text)")
        #expect(answer.json["error"] as? String == "account_deleted")
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.refresh_tokens WHERE sub = '001.fresh.deleted' AND revoked_at IS NOT NULL"
            )
                == 1)
    }

    @Test(
        "a claim that aged past ten minutes while Apple was slow is 409 sign_in_claim_expired, nothing stored"
    )
    func claimExpired() throws {
        let fixture = try SignInFixture()
        let body = try fixture.signInBody(sub: "001.slow")
        try fixture.apple.fault(["--delay-ms", "1500", "--times", "1", "--endpoint", "token"])
        let data = try JSONSerialization.data(withJSONObject: body)
        let url = fixture.url + "/v1/sign-ins"
        let slow = Thread.detachNewThreadWithResult { () -> String in
            (try? TestHTTPClient.post(
                url, body: data, headers: [("Authorization", "Bearer \(SignInFixture.bearer)")]))?.text ?? ""
        }
        #expect(
            waitUntil {
                (try? fixture.count("SELECT count(*) FROM siwa.sign_in_codes WHERE state = 'exchanging'"))
                    == 1
            })
        _ = try fixture.query("UPDATE siwa.sign_in_codes SET created_at = now() - interval '11 minutes'")
        #expect(slow.wait()?.contains("sign_in_claim_expired") == true)
        #expect(try fixture.count("SELECT count(*) FROM siwa.refresh_tokens") == 0)
        #expect(try fixture.count("SELECT count(*) FROM siwa.sign_ins") == 0)
    }

    @Test("RFC 9110 § 11.1: the bearer scheme is taken in any case", arguments: ["bearer", "BEARER"])
    func bearerSchemeIgnoresCase(scheme: String) throws {
        let fixture = try SignInFixture()
        let answer = try fixture.post(
            "/v1/sign-ins", ["x": 1], authorization: "\(scheme) \(SignInFixture.bearer)")
        #expect(answer.status == 400, "\(answer.text)")
    }

    @Test("missing or wrong bearer tokens and unparseable bodies are logged and counted, never their secrets")
    func refusalsLoggedAndCounted() throws {
        let fixture = try SignInFixture()
        let wrong = "Bearer wrong-secret-0123456789abcdefghijklmnopqrstuv"
        #expect(try fixture.post("/v1/sign-ins", ["x": 1], authorization: nil).status == 401)
        #expect(try fixture.post("/v1/revocations", ["x": 1], authorization: wrong).status == 401)
        let notJSON = try TestHTTPClient.post(
            fixture.url + "/v1/sign-ins", body: Array("{\"authorization_code\": \"secret-code-xyz".utf8),
            headers: [("Authorization", "Bearer \(SignInFixture.bearer)")])
        #expect(notJSON.status == 400)
        let log = fixture.logs.all
        let refusals = log.split(separator: "\n").filter { $0.contains("sign-in API refused a call") }
        #expect(refusals.count == 3, "\(log)")
        #expect(refusals.filter { $0.contains("\"error\":\"unauthorized\"") }.count == 2)
        #expect(refusals.contains { $0.contains("\"error\":\"body_is_not_a_json_object\"") })
        #expect(
            !log.contains("wrong-secret") && !log.contains(SignInFixture.bearer)
                && !log.contains("secret-code"))
        let metrics = fixture.service.metrics.render()
        #expect(
            metrics.contains(
                #"siwa_signin_responses_total{endpoint="sign-ins",status="401",error="unauthorized"} 1"#),
            "\(metrics)")
        #expect(
            metrics.contains(
                #"siwa_signin_responses_total{endpoint="revocations",status="401",error="unauthorized"} 1"#))
        #expect(
            metrics.contains(
                #"siwa_signin_responses_total{endpoint="sign-ins",status="400",error="body_is_not_a_json_object"} 1"#
            ))
    }

    @Test(
        "control characters in a revocation's sub or reason get 400 with a clear error, not 503",
        arguments: [("reason", "deleted\u{0}in app"), ("reason", "line\nbreak"), ("sub", "001.\u{1b}[2J")])
    func controlCharacters(field: String, value: String) throws {
        let fixture = try SignInFixture()
        var body = ["sub": "001.control", "reason": "account deleted"]
        body[field] = value
        let answer = try fixture.post("/v1/revocations", body)
        #expect(answer.status == 400, "\(answer.text)")
        #expect(answer.json["error"] as? String == "\(field)_has_control_characters")
        #expect(try fixture.count("SELECT count(*) FROM siwa.revocation_requests") == 0)
        #expect(!fixture.logs.all.contains("database unavailable"))
        #expect(
            fixture.service.metrics.render().contains(
                #"siwa_signin_responses_total{endpoint="revocations",status="400",error="\#(field)_has_control_characters"} 1"#
            ))
    }

    @Test("the plain-HTTP API listens on loopback only, unless TLS terminates in front of it")
    func loopbackOnly() throws {
        let fixture = try SignInFixture()
        func configuration(_ host: String, tlsInFront: Bool) throws -> SignInConfiguration {
            try SignInConfiguration(
                http: HTTPServer.Configuration(host: host, port: 0), bearerToken: SignInFixture.bearer,
                clients: fixture.service.configuration.clients, cipher: fixture.cipher,
                database: fixture.login("signin_test_login"), tlsTerminatedInFront: tlsInFront)
        }
        for host in ["127.0.0.1", "127.1.2.3", "::1", "localhost"] {
            #expect(throws: Never.self) { try configuration(host, tlsInFront: false) }
        }
        for host in ["0.0.0.0", "::", "10.0.0.5", "::ffff:127.0.0.1", "example.com", ""] {
            #expect(throws: ConfigurationError.self, "\(host)") { try configuration(host, tlsInFront: false) }
            #expect(throws: Never.self) { try configuration(host, tlsInFront: true) }
        }
    }
}
