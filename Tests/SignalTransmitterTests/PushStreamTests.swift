import Foundation
import HTTPServer
import Postgres
import QueueConsumer
import SharedSignals
import SignalDelivery
import SignalTransmitter
import TestSupport
import Testing

/// A push stream made through the API, delivered by siwa-worker's lanes (SignalDispatcher as siwa_worker)
/// to an RFC 8935 receiver with the authorization header the receiver gave at create.
@Suite("Shared Signals transmitter: push streams made through the API")
struct PushStreamTests {
    // Conformance plan: OIDSSFTransmitterStreamVerificationEventsTest (push variant).
    @Test(
        "verification and stream-updated SETs and the account events are pushed with the stream's Authorization"
    )
    func pushed() throws {
        let fixture = try TransmitterFixture()
        let token = try fixture.token(try fixture.addReceiver("okta", audience: "https://okta.example.test"))
        let authorization = "Bearer push-\(UUID().uuidString)"
        let receiver = try SETReceiver(
            keys: fixture.key.keySet(), issuer: TransmitterFixture.issuer,
            audience: "https://okta.example.test",
            authorization: authorization)
        let stream = try fixture.createStream(
            token: token, method: "urn:ietf:rfc:8935", endpoint: receiver.url, authorization: authorization)
        let id = try #require(stream["stream_id"] as? String)
        #expect(
            try fixture.call("POST", "/ssf/verify", token: token, json: ["stream_id": id, "state": "v1"])
                .status == 204)
        try fixture.insertChanges([("siwa.consent_revoked", "001.push")])
        #expect(
            try fixture.call(
                "POST", "/ssf/status", token: token, json: ["stream_id": id, "status": "paused"]
            ).status
                == 200)
        let dispatcher = SignalDispatcher(
            configuration: try SignalDispatcher.Configuration(
                database: try fixture.database.configuration(asMemberOf: "siwa_worker"),
                issuer: TransmitterFixture.issuer, key: fixture.key),
            logger: quietLogger)
        // Paused: nothing is pushed; enabled again, everything in order per subject.
        #expect(try dispatcher.drainOnce().isEmpty)
        #expect(
            try fixture.call(
                "POST", "/ssf/status", token: token, json: ["stream_id": id, "status": "enabled"]
            ).status
                == 200)
        var outcomes: [SignalDispatcher.Outcome] = []
        for _ in 0..<10 {
            let round = try dispatcher.drainOnce()
            outcomes += round
            if round.isEmpty { break }
        }
        #expect(outcomes.allSatisfy { $0.state == .delivered })
        #expect(receiver.received.allSatisfy { $0.status == 202 })
        let streamEvents = receiver.received.filter { $0.sub == id }.map(\.eventType)
        #expect(
            streamEvents == [
                SecurityEventToken.EventType.verification, SecurityEventToken.EventType.streamUpdated,
                SecurityEventToken.EventType.streamUpdated,
            ])
        #expect(
            receiver.received.filter { $0.sub == "001.push" }.map(\.eventType) == [
                SecurityEventToken.EventType.sessionRevoked
            ])
        let verified = try fixture.verified(
            receiver.received.map(\.token), audience: "https://okta.example.test")
        #expect(verified.allSatisfy { $0.failure == nil })
        #expect(verified.contains { eventMembers($0)["state"] as? String == "v1" })
    }
}
