import Foundation
import HTTPServer
import MailGate
import ServiceSupport
import TestSupport
import Testing

@Suite("siwa-mailgate's HTTP check", .serialized)
struct GateHTTPTests {
    func json(_ object: Any) throws -> [UInt8] { [UInt8](try JSONSerialization.data(withJSONObject: object)) }

    @Test(
        "GET answers one address's decision as JSON, no-store; refusals are error words, counted, logged without the address"
    )
    func single() throws {
        let fixture = try GateFixture()
        let off = try fixture.call("GET", "/v1/relay-mail/decision?address=off.1%40privaterelay.appleid.com")
        #expect(off.status == 200)
        #expect(off.headers["Cache-Control"] == "no-store")
        #expect(off.object["address"] as? String == Mailbox.off)
        #expect(off.object["decision"] as? String == "block")
        #expect(off.object["reason"] as? String == "forwarding_off")
        #expect(off.object["since"] is String)
        let on = try fixture.call("GET", "/v1/relay-mail/decision?address=\(Mailbox.on)")
        #expect(on.object["decision"] as? String == "allow")
        let stranger = try fixture.call("GET", "/v1/relay-mail/decision?address=\(Mailbox.stranger)")
        #expect(
            stranger.object["reason"] as? String == "looks_like_relay" && stranger.object["since"] is NSNull)

        let refusals: [(TestHTTPResponse, Int, String)] = [
            (
                try fixture.call("GET", "/v1/relay-mail/decision?address=\(Mailbox.off)", authorization: nil),
                401, "unauthorized"
            ),
            (
                try fixture.call(
                    "GET", "/v1/relay-mail/decision?address=\(Mailbox.off)", authorization: "Bearer wrong"),
                401, "unauthorized"
            ),
            (
                try fixture.call(
                    "GET", "/v1/relay-mail/decision?address=\(Mailbox.off)",
                    authorization: "Bearer \(GateFixture.token)x"), 401, "unauthorized"
            ),
            (try fixture.call("GET", "/v1/relay-mail/decision"), 400, "address_missing"),
            (
                try fixture.call("POST", "/v1/relay-mail/decision?address=\(Mailbox.off)", body: []), 405,
                "method_not_allowed"
            ),
            (try fixture.call("GET", "/v1/relay-mail/other"), 404, "not_found"),
        ]
        for (response, status, word) in refusals {
            #expect(response.status == status)
            #expect(response.object["error"] as? String == word)
            #expect(response.headers["Cache-Control"] == "no-store")
        }
        #expect(refusals[0].0.headers["WWW-Authenticate"] == "Bearer")
        #expect(
            fixture.metrics.contains(
                #"siwa_mailgate_http_responses_total{endpoint="decision",status="401",error="unauthorized"} 3"#
            ))
        #expect(fixture.log.contains(#""error":"address_missing""#))
        #expect(!fixture.log.contains("off.1") && !fixture.log.contains("stranger"))
    }

    @Test("RFC 9110 § 11.1: the bearer scheme is taken in any case", arguments: ["bearer", "BEARER"])
    func bearerSchemeIgnoresCase(scheme: String) throws {
        let fixture = try GateFixture()
        let answer = try fixture.call(
            "GET", "/v1/relay-mail/decision?address=\(Mailbox.off)",
            authorization: "\(scheme) \(GateFixture.token)")
        #expect(answer.status == 200)
    }

    @Test(
        "POST answers a list in its order, duplicates and nulls kept; more than 10,000 addresses are refused")
    func list() throws {
        let fixture = try GateFixture()
        let addresses: [Any] = [
            Mailbox.gone, Mailbox.on, NSNull(), Mailbox.off, Mailbox.on, "not an address", Mailbox.elsewhere,
        ]
        let response = try fixture.call(
            "POST", "/v1/relay-mail/decisions", body: try json(["addresses": addresses]))
        #expect(response.status == 200)
        #expect(response.headers["Cache-Control"] == "no-store")
        let rows = try #require(response.object["decisions"] as? [[String: Any]])
        #expect(
            rows.map { $0["decision"] as? String } == [
                "block", "allow", "unknown", "block", "allow", "unknown", "unknown",
            ])
        #expect(
            rows.map { $0["reason"] as? String } == [
                "account_deleted", "forwarding_on", "malformed", "forwarding_off", "forwarding_on",
                "malformed", "not_ours",
            ])
        #expect(rows[2]["address"] is NSNull && rows[3]["address"] as? String == Mailbox.off)

        let tooMany = try fixture.call(
            "POST", "/v1/relay-mail/decisions",
            body: try json(["addresses": Array(repeating: Mailbox.on, count: 10_001)]))
        #expect(tooMany.status == 400 && tooMany.object["error"] as? String == "too_many_addresses")
        for (body, word) in [
            (Array("[1]".utf8), "body_is_not_a_json_object"), (Array("{".utf8), "body_is_not_a_json_object"),
            (try json(["address": [Mailbox.on]]), "addresses_missing"),
            (try json(["addresses": [1]]), "address_is_not_a_string"),
        ] {
            let refused = try fixture.call("POST", "/v1/relay-mail/decisions", body: body)
            #expect(refused.status == 400 && refused.object["error"] as? String == word)
        }
        let unauthorized = try fixture.call(
            "POST", "/v1/relay-mail/decisions", body: try json(["addresses": [Mailbox.on]]),
            authorization: nil)
        #expect(unauthorized.status == 401)
        #expect(try fixture.call("GET", "/v1/relay-mail/decisions").status == 405)
    }

    @Test("10,000 addresses in one call, in order; the rate is reported")
    func bulkRate() throws {
        let fixture = try GateFixture()
        let pattern = [Mailbox.on, Mailbox.off, Mailbox.gone, Mailbox.stranger, Mailbox.elsewhere]
        let addresses = (0..<10_000).map { pattern[$0 % pattern.count] }
        let body = try json(["addresses": addresses])
        _ = try fixture.call("POST", "/v1/relay-mail/decisions", body: body)  // warm
        let rounds = 5
        let started = ContinuousClock.now
        for _ in 0..<rounds {
            let response = try fixture.call("POST", "/v1/relay-mail/decisions", body: body)
            let rows = try #require(response.object["decisions"] as? [[String: Any]])
            #expect(rows.count == 10_000)
            #expect(
                rows[9_999]["address"] as? String == Mailbox.elsewhere
                    && rows[1]["decision"] as? String == "block")
        }
        let seconds = (ContinuousClock.now - started).inSeconds
        print("mailgate HTTP bulk: \(Int(Double(rounds * 10_000) / seconds)) addresses/s (10,000 per call)")
    }
}
