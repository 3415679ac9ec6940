import AppleNotifications
import Foundation
import HTTPServer
import Postgres
import Receiver
import TestSupport
import Testing

@Suite("The notification endpoint answers each class of request correctly")
struct AnswerTests {
    @Test(
        "a genuine notification is stored and answered 200 accepted",
        arguments: [ReceiverHarness.Mode.live, .direct])
    func accepted(mode: ReceiverHarness.Mode) throws {
        let harness = try ReceiverHarness(mode: mode)
        let jti = UUID().uuidString
        let response = try harness.deliver(
            TestSigning.token(
                type: "email-disabled", subject: "001.accepted", email: "x@privaterelay.appleid.com",
                isPrivateEmail: true, jti: jti))
        #expect(response.status == 200)
        #expect(response.text == #"{"status":"accepted"}"#)
        let row = try harness.query(
            """
            SELECT event_type, sub, audience, email, is_private_email, state FROM siwa.event_history WHERE jti = $1
            """, [.text(jti)])[0]
        #expect(try row[0, as: String.self] == "email-disabled")
        #expect(try row[1, as: String.self] == "001.accepted")
        #expect(try row[2, as: String.self] == TestSigning.audience)
        #expect(try row[3, as: String?.self] == "x@privaterelay.appleid.com")
        #expect(try row[4, as: Bool?.self] == true)
        #expect(try row[5, as: String.self] == "pending")
    }

    @Test(
        "the same jti delivered twice is answered duplicate and stored once",
        arguments: [ReceiverHarness.Mode.live, .direct])
    func duplicate(mode: ReceiverHarness.Mode) throws {
        let harness = try ReceiverHarness(mode: mode)
        let token = TestSigning.token()
        let jti = try TestSigning.verifier.verify(token: token, keys: TestSigning.appleKeySet).jti
        #expect(try harness.deliver(token).text == #"{"status":"accepted"}"#)
        let second = try harness.deliver(token)
        #expect(second.status == 200)
        #expect(second.text == #"{"status":"duplicate"}"#)
        #expect(try harness.rowCount(jti: jti) == 1)
    }

    @Test("an unknown event type is verified, stored and answered 200")
    func unknownType() throws {
        let harness = try ReceiverHarness()
        let jti = UUID().uuidString
        let response = try harness.deliver(TestSigning.token(type: "account-frozen", jti: jti))
        #expect(response.status == 200)
        let rows = try harness.query("SELECT event_type FROM siwa.event_history WHERE jti = $1", [.text(jti)])
        #expect(try rows[0][0, as: String.self] == "account-frozen")
    }

    @Test(
        "malformed bodies are answered 400 and store nothing",
        arguments: [
            "not json", "[]", "{}", #"{"payload":42}"#, #"{"payload":null}"#, #"{"payload":"a.b"}"#,
            #"{"payload":"not a token at all"}"#, #"{"payload":"a.b.c.d"}"#, "",
        ])
    func malformed(body: String) throws {
        let harness = try ReceiverHarness()
        let response = try harness.post(Array(body.utf8))
        #expect(response.status == 400)
        #expect(response.text.contains(#""error":"malformed""#))
        #expect(try harness.totalRows() == 0)
    }

    @Test("a forged signature is answered 401 and stores nothing")
    func forgedSignature() throws {
        let harness = try ReceiverHarness()
        // Signed by another key but claiming Apple's kid.
        var other = TestSigning.other
        other.keyID = TestSigning.apple.keyID
        let response = try harness.deliver(TestSigning.token(signer: other))
        #expect(response.status == 401)
        #expect(response.text.contains("bad_signature"))
        #expect(try harness.totalRows() == 0)
    }

    @Test("a token for another app is answered 401")
    func foreignAudience() throws {
        let harness = try ReceiverHarness()
        let response = try harness.deliver(TestSigning.token(audience: "com.someone.else"))
        #expect(response.status == 401)
        #expect(response.text.contains("wrong_audience"))
        #expect(try harness.totalRows() == 0)
    }

    @Test("an expired token is answered 401")
    func expired() throws {
        let harness = try ReceiverHarness()
        let old = Date(timeIntervalSinceNow: -3 * 86400)
        let response = try harness.deliver(TestSigning.token(eventTime: old, issuedAt: old))
        #expect(response.status == 401)
        #expect(response.text.contains("expired"))
    }

    @Test("a token without exp older than the maximum token age is answered 401 too_old and stores nothing")
    func tooOldWithoutExp() throws {
        let harness = try ReceiverHarness(maxTokenAge: .seconds(3600))
        func tokenWithoutExp(issuedAgo seconds: TimeInterval, jti: String) throws -> String {
            let issued = Date(timeIntervalSinceNow: -seconds)
            var claims = TestSigning.apple.claims(
                type: "consent-revoked", subject: "001.noexp", audience: TestSigning.audience, email: nil,
                isPrivateEmail: nil, eventTime: issued, issuedAt: issued, jti: jti)
            claims["exp"] = nil
            return try TestSigning.apple.sign(claims: claims)
        }
        let oldJTI = UUID().uuidString
        let old = try harness.deliver(try tokenWithoutExp(issuedAgo: 7200, jti: oldJTI))
        #expect(old.status == 401)
        #expect(old.text == #"{"error":"verification failed","reason":"too_old"}"#)
        #expect(try harness.rowCount(jti: oldJTI) == 0)
        #expect(
            try harness.get("/metrics").text.contains(
                #"siwa_verification_failures_total{reason="too_old"} 1"#))

        let freshJTI = UUID().uuidString
        #expect(try harness.deliver(try tokenWithoutExp(issuedAgo: 600, jti: freshJTI)).status == 200)
        #expect(try harness.rowCount(jti: freshJTI) == 1)
    }

    @Test("a genuine token sent with two Content-Length fields is answered 400 and stores nothing")
    func repeatedContentLength() throws {
        let harness = try ReceiverHarness()
        let jti = UUID().uuidString
        let body = Array(#"{"payload":"\#(TestSigning.token(jti: jti))"}"#.utf8)
        let connection = try RawHTTPConnection(host: "127.0.0.1", port: harness.port)
        try connection.send(
            "POST \(NotificationEndpoint.notificationPath) HTTP/1.1\r\nHost: x\r\n"
                + "Content-Type: application/json\r\nContent-Length: \(body.count)\r\nContent-Length: 0\r\n\r\n"
        )
        _ = connection.sendUnlessClosed(body)
        #expect(try connection.readOutcome() == .answered(status: 400))
        #expect(try harness.rowCount(jti: jti) == 0)
    }

    @Test("a request smuggled in a body framed by 'Content-Length : N' is never served")
    func smuggledBehindSpaceBeforeColon() throws {
        let harness = try ReceiverHarness()
        let jti = UUID().uuidString
        let body = #"{"payload":"\#(TestSigning.token(jti: jti))"}"#
        // A proxy that reads "Content-Length : N" as the length sees one request to /healthz whose
        // body is the inner request; a server that ignores the field would serve the inner one.
        let inner =
            "POST \(NotificationEndpoint.notificationPath) HTTP/1.1\r\nHost: x\r\n"
            + "Content-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n" + body
        let connection = try RawHTTPConnection(host: "127.0.0.1", port: harness.port)
        try connection.send(
            "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length : \(inner.utf8.count)\r\n\r\n")
        _ = connection.sendUnlessClosed(Array(inner.utf8))
        #expect(try connection.readOutcome() == .answered(status: 400))
        #expect(connection.waitForClose(timeout: .seconds(5)))
        #expect(try harness.rowCount(jti: jti) == 0)
    }

    @Test("a token issued in the future is answered 401")
    func issuedInFuture() throws {
        let harness = try ReceiverHarness()
        let response = try harness.deliver(TestSigning.token(issuedAt: Date(timeIntervalSinceNow: 600)))
        #expect(response.status == 401)
        #expect(response.text.contains("issued_in_future"))
    }

    @Test("an unsigned token (alg none) is answered 401")
    func algorithmNone() throws {
        let harness = try ReceiverHarness()
        let valid = TestSigning.token()
        let parts = valid.split(separator: ".")
        let header = Base64URL.encode(Array(#"{"kid":"\#(TestSigning.apple.keyID)","alg":"none"}"#.utf8))
        let response = try harness.deliver("\(header).\(parts[1]).")
        #expect(response.status == 400 || response.status == 401)
        #expect(try harness.totalRows() == 0)
        let resigned = "\(header).\(parts[1]).\(parts[2])"
        #expect(try harness.deliver(resigned).status == 401)
    }

    @Test("other methods on the endpoint are answered 405")
    func methodNotAllowed() throws {
        let harness = try ReceiverHarness()
        let response = try harness.get(NotificationEndpoint.notificationPath)
        #expect(response.status == 405)
        #expect(response.headers["Allow"] == "POST")
    }

    @Test("a body over the limit is answered 413")
    func tooLarge() throws {
        let harness = try ReceiverHarness(maxBodyBytes: 1024)
        let response = try harness.post(Array(repeating: UInt8(ascii: "a"), count: 4096))
        #expect(response.status == 413)
    }

    @Test("health, readiness and metrics are served")
    func operationalEndpoints() throws {
        let harness = try ReceiverHarness()
        #expect(try harness.get("/healthz").status == 200)
        #expect(try waitUntil { try harness.get("/readyz").status == 200 })
        _ = try harness.deliver(TestSigning.token())
        _ = try harness.deliver(TestSigning.token(audience: "com.someone.else"))
        let metrics = try harness.get("/metrics").text
        #expect(metrics.contains(#"siwa_deliveries_total{outcome="accepted"} 1"#))
        #expect(metrics.contains(#"siwa_deliveries_total{outcome="unauthorized"} 1"#))
        #expect(metrics.contains(#"siwa_verification_failures_total{reason="wrong_audience"} 1"#))
        #expect(metrics.contains(#"siwa_jwks_fetches_total{result="success"}"#))
        #expect(metrics.contains("siwa_storage_duration_seconds_count 1"))
        #expect(metrics.contains("siwa_requests_in_flight"))
        #expect(try harness.get("/nowhere").status == 404)
    }

    @Test("logs carry the outcome but never the token or the email address")
    func logsKeepSecrets() throws {
        let harness = try ReceiverHarness()
        let email = "secret-person@privaterelay.appleid.com"
        let token = TestSigning.token(type: "email-enabled", email: email, isPrivateEmail: true)
        #expect(try harness.deliver(token).status == 200)
        var forged = Array(token)
        forged[forged.count - 5] = forged[forged.count - 5] == "A" ? "B" : "A"
        #expect(try harness.deliver(String(forged)).status == 401)
        let logs = harness.logs.all
        #expect(logs.contains(#""outcome":"accepted""#))
        #expect(logs.contains(#""outcome":"unauthorized""#))
        #expect(!logs.contains(email))
        #expect(!logs.contains(String(token.split(separator: ".")[1])))
        #expect(!logs.contains(String(token.split(separator: ".")[2])))
    }
}
