import Foundation
import HTTPServer
import SharedSignals
import TestSupport
import Testing

/// What a receiver written from SSF 1.0 § 8.1.1 and RFC 9110 § 11.1 does that the lifecycle test does not.
@Suite("Shared Signals transmitter: receiver interoperability")
struct ReceiverInteropTests {
    static let poll = "urn:ietf:rfc:8936"
    typealias EventType = SecurityEventToken.EventType

    @Test("SSF 1.0 § 8.1.1.1: a create without delivery is a poll stream, its delivery answered")
    func createWithoutDelivery() throws {
        let fixture = try TransmitterFixture()
        let token = try fixture.token(try fixture.addReceiver("keycloak"))
        let answer = try fixture.call(
            "POST", "/ssf/streams", token: token, json: ["events_requested": [EventType.sessionRevoked]])
        #expect(answer.status == 201, "\(answer.response.text)")
        let created = try #require(answer.body as? [String: Any])
        let id = try #require(created["stream_id"] as? String)
        let delivery = try #require(created["delivery"] as? [String: Any])
        #expect(delivery["method"] as? String == Self.poll)
        #expect(delivery["endpoint_url"] as? String == TransmitterFixture.issuer + "/ssf/poll/" + id)
        #expect(try fixture.poll(created, token: token, body: ["returnImmediately": true]).sets.isEmpty)
    }

    @Test(
        "SSF 1.0 § 8.1.1.3: PATCH and PUT refuse Transmitter-Supplied members that differ (400, nothing changed), accept an echo"
    )
    func transmitterSuppliedMembers() throws {
        let fixture = try TransmitterFixture()
        let token = try fixture.token(try fixture.addReceiver("okta"))
        let created = try fixture.createStream(token: token, events: [EventType.sessionRevoked])
        let id = try #require(created["stream_id"] as? String)
        let wrong: [(String, Any)] = [
            ("iss", "https://other.example.test"), ("aud", "https://other.example.test"),
            ("events_supported", [EventType.sessionRevoked]), ("events_delivered", EventType.all),
        ]
        for (member, value) in wrong {
            for method in ["PATCH", "PUT"] {
                let answer = try fixture.call(
                    method, "/ssf/streams", token: token,
                    json: [
                        "stream_id": id, "delivery": ["method": Self.poll], "description": "changed",
                        "events_requested": [EventType.accountPurged], member: value,
                    ])
                #expect(answer.status == 400, "\(method) \(member)")
                #expect((answer.body as? [String: Any])?["error"] as? String == "invalid_request")
            }
        }
        let unchanged = try #require(
            try fixture.call("GET", "/ssf/streams?stream_id=\(id)", token: token).body as? [String: Any])
        #expect(unchanged["description"] == nil)
        #expect(unchanged["events_delivered"] as? [String] == [EventType.sessionRevoked])

        // The whole configuration echoed back, one member changed, is accepted by both.
        var echo = unchanged
        echo["description"] = "patched"
        let patched = try fixture.call("PATCH", "/ssf/streams", token: token, json: echo)
        #expect(patched.status == 200, "\(patched.response.text)")
        #expect((patched.body as? [String: Any])?["description"] as? String == "patched")
        echo["description"] = "replaced"
        echo["aud"] = [unchanged["aud"] as? String ?? ""]
        echo["events_supported"] = Array(EventType.all.reversed())
        let replaced = try fixture.call("PUT", "/ssf/streams", token: token, json: echo)
        #expect(replaced.status == 200, "\(replaced.response.text)")
        #expect((replaced.body as? [String: Any])?["description"] as? String == "replaced")
    }
}
