import Foundation
import HTTPServer
import Postgres
import SharedSignals
import SignalTransmitter
import TestSupport
import Testing

/// The stream configuration, status, subjects and verification endpoints (SSF 1.0 § 8.1).
@Suite("Shared Signals transmitter: streams")
struct StreamTests {
    static let push = "urn:ietf:rfc:8935"
    static let poll = "urn:ietf:rfc:8936"
    typealias EventType = SecurityEventToken.EventType

    // Conformance plan: OIDSSFStreamControlHappyPathTest, OIDSSFStreamControlNegativeTestReadUnknownStream,
    // …UpdateUnknownStream, …ReplaceUnknownStream, …DeleteUnknownStream, …UpdateStreamWithInvalidBody,
    // …ReplaceStreamWithInvalidBody, …CreateStreamWithBrokenInput.
    @Test(
        "create 201 (events_delivered = supported ∩ requested), read one and all, update, replace, delete 204"
    )
    func lifecycle() throws {
        let fixture = try TransmitterFixture()
        let client = try fixture.addReceiver("okta", audience: "https://okta.example.test")
        let token = try fixture.token(client)
        let created = try fixture.createStream(
            token: token, method: Self.push, endpoint: "https://okta.example.test/ssf/push",
            events: [EventType.sessionRevoked, "https://example.test/unknown-type"],
            authorization: "Bearer okta-push-secret")
        let id = try #require(created["stream_id"] as? String)
        #expect(created["iss"] as? String == TransmitterFixture.issuer)
        #expect(created["aud"] as? String == "https://okta.example.test")
        #expect(created["events_supported"] as? [String] == EventType.all)
        #expect(
            created["events_requested"] as? [String] == [
                EventType.sessionRevoked, "https://example.test/unknown-type",
            ])
        #expect(created["events_delivered"] as? [String] == [EventType.sessionRevoked])
        #expect(created["min_verification_interval"] as? Int == 30)
        let delivery = try #require(created["delivery"] as? [String: Any])
        #expect(delivery["method"] as? String == Self.push)
        #expect(delivery["endpoint_url"] as? String == "https://okta.example.test/ssf/push")
        // The authorization header is never answered; the database holds a file reference only.
        #expect(delivery["authorization_header"] == nil)
        let reference = try fixture.database.value(
            "SELECT authorization_ref FROM siwa.ssf_streams WHERE stream_uid = $1", [.text(id)],
            as: String.self)
        #expect(reference.hasPrefix("file:" + fixture.authorizationDirectory + "/"))
        let file = String(reference.dropFirst(5))
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "Bearer okta-push-secret\n")
        let mode = try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int
        #expect(mode == 0o600)

        let one = try fixture.call("GET", "/ssf/streams?stream_id=\(id)", token: token)
        #expect(one.status == 200)
        #expect((one.body as? [String: Any])?["events_delivered"] as? [String] == [EventType.sessionRevoked])
        #expect(!one.response.text.contains("okta-push-secret"))
        let second = try fixture.createStream(token: token)
        let all = try #require(try fixture.call("GET", "/ssf/streams", token: token).body as? [[String: Any]])
        #expect(all.compactMap { $0["stream_id"] as? String } == [id, second["stream_id"] as? String])

        let updated = try fixture.call(
            "PATCH", "/ssf/streams", token: token,
            json: [
                "stream_id": id, "events_requested": [EventType.accountPurged], "description": "okta prod",
            ])
        #expect(updated.status == 200)
        let patched = try #require(updated.body as? [String: Any])
        #expect(patched["events_delivered"] as? [String] == [EventType.accountPurged])
        #expect(patched["description"] as? String == "okta prod")
        #expect(
            (patched["delivery"] as? [String: Any])?["endpoint_url"] as? String
                == "https://okta.example.test/ssf/push")

        let replaced = try fixture.call(
            "PUT", "/ssf/streams", token: token,
            json: [
                "stream_id": id,
                "delivery": ["method": Self.push, "endpoint_url": "https://okta.example.test/ssf/push2"],
            ])
        #expect(replaced.status == 200)
        let put = try #require(replaced.body as? [String: Any])
        #expect(put["events_delivered"] as? [String] == EventType.all)
        #expect(put["description"] == nil)
        #expect(
            (put["delivery"] as? [String: Any])?["endpoint_url"] as? String
                == "https://okta.example.test/ssf/push2")
        // Replaced without an authorization header: none is sent any more, and its file is gone.
        #expect(
            try fixture.database.value(
                "SELECT authorization_ref IS NULL FROM siwa.ssf_streams WHERE stream_uid = $1", [.text(id)],
                as: Bool.self))
        #expect(!FileManager.default.fileExists(atPath: file))

        // Invalid bodies and unknown streams.
        #expect(
            try fixture.call("POST", "/ssf/streams", token: token, json: ["delivery": ["method": "urn:x"]])
                .status == 400)
        #expect(
            try fixture.call(
                "POST", "/ssf/streams", token: token,
                json: ["delivery": ["method": Self.push, "endpoint_url": "http://okta.example.test/"]]
            ).status == 400)
        #expect(
            try fixture.call(
                "PATCH", "/ssf/streams", token: token, json: ["stream_id": id, "events_requested": "all"]
            ).status == 400)
        #expect(try fixture.call("PUT", "/ssf/streams", token: token, json: ["stream_id": id]).status == 400)
        #expect(
            try fixture.call("PATCH", "/ssf/streams", token: token, json: ["stream_id": "nope"]).status == 404
        )
        #expect(
            try fixture.call(
                "PUT", "/ssf/streams", token: token,
                json: ["stream_id": "nope", "delivery": ["method": Self.poll]]
            ).status == 404)
        #expect(try fixture.call("GET", "/ssf/streams?stream_id=nope", token: token).status == 404)
        #expect(try fixture.call("DELETE", "/ssf/streams?stream_id=nope", token: token).status == 404)

        #expect(try fixture.call("DELETE", "/ssf/streams?stream_id=\(id)", token: token).status == 204)
        #expect(try fixture.call("GET", "/ssf/streams?stream_id=\(id)", token: token).status == 404)
    }

    @Test("two receivers never see, change or delete each other's streams (404)")
    func isolation() throws {
        let fixture = try TransmitterFixture()
        let alice = try fixture.token(try fixture.addReceiver("alice"))
        let bob = try fixture.token(try fixture.addReceiver("bob"))
        let stream = try fixture.createStream(token: alice)
        let id = try #require(stream["stream_id"] as? String)
        #expect(try fixture.call("GET", "/ssf/streams?stream_id=\(id)", token: bob).status == 404)
        #expect((try fixture.call("GET", "/ssf/streams", token: bob).body as? [Any])?.isEmpty == true)
        #expect(try fixture.call("PATCH", "/ssf/streams", token: bob, json: ["stream_id": id]).status == 404)
        #expect(try fixture.call("DELETE", "/ssf/streams?stream_id=\(id)", token: bob).status == 404)
        #expect(try fixture.call("GET", "/ssf/status?stream_id=\(id)", token: bob).status == 404)
        #expect(
            try fixture.call("POST", "/ssf/status", token: bob, json: ["stream_id": id, "status": "paused"])
                .status == 404)
        #expect(try fixture.call("POST", "/ssf/verify", token: bob, json: ["stream_id": id]).status == 404)
        let subject: [String: Any] = [
            "format": "iss_sub", "iss": SecurityEventToken.subjectIssuer, "sub": "001.x",
        ]
        #expect(
            try fixture.call(
                "POST", "/ssf/subjects:add", token: bob, json: ["stream_id": id, "subject": subject]
            ).status == 404)
        #expect(try fixture.poll(stream, token: alice, body: ["returnImmediately": true]).sets.isEmpty)
        let polled = try fixture.call(
            "POST", "/ssf/poll/\(id)", token: bob, json: ["returnImmediately": true])
        #expect(polled.status == 404)
        #expect(try fixture.call("GET", "/ssf/status?stream_id=\(id)", token: alice).status == 200)
    }

    /// Polls with acks until nothing is left; returns every SET served, in the order served.
    static func drain(_ fixture: TransmitterFixture, _ stream: [String: Any], token: String) throws
        -> [String]
    {
        var all: [String] = []
        var acks: [String] = []
        for _ in 0..<100 {
            let (sets, more) = try fixture.poll(
                stream, token: token, body: ["ack": acks, "returnImmediately": true, "maxEvents": 10])
            acks = Array(sets.keys)
            all += sets.keys.sorted().compactMap { sets[$0] }
            if sets.isEmpty && !more { break }
        }
        return all
    }

    // Conformance plan: the status part of OIDSSFStreamControlHappyPathTest.
    @Test(
        "status: paused keeps events in order, each change enqueues a stream-updated SET; disabled drops events"
    )
    func statusChanges() throws {
        let fixture = try TransmitterFixture()
        let client = try fixture.addReceiver("okta")
        let token = try fixture.token(client)
        let stream = try fixture.createStream(token: token)
        let id = try #require(stream["stream_id"] as? String)
        let audience = try #require(stream["aud"] as? String)
        let status = try fixture.call("GET", "/ssf/status?stream_id=\(id)", token: token)
        #expect((status.body as? [String: Any])?["status"] as? String == "enabled")
        let paused = try fixture.call(
            "POST", "/ssf/status", token: token,
            json: ["stream_id": id, "status": "paused", "reason": "maintenance"])
        #expect(paused.status == 200)
        #expect((paused.body as? [String: Any])?["status"] as? String == "paused")
        try fixture.insertChanges([
            ("siwa.email_disabled", "001.p"), ("siwa.email_enabled", "001.p"),
            ("siwa.consent_revoked", "001.p"),
        ])
        #expect(try fixture.poll(stream, token: token, body: ["returnImmediately": true]).sets.isEmpty)
        #expect(
            try fixture.call(
                "POST", "/ssf/status", token: token, json: ["stream_id": id, "status": "enabled"]
            ).status == 200)
        let outcomes = try fixture.verified(try Self.drain(fixture, stream, token: token), audience: audience)
        #expect(outcomes.allSatisfy { $0.failure == nil })
        let account = outcomes.filter { subject($0) == "001.p" }
        #expect(
            account.map(eventType) == [
                EventType.emailForwardingDisabled, EventType.emailForwardingEnabled, EventType.sessionRevoked,
            ])
        let updates = outcomes.filter { eventType($0) == EventType.streamUpdated }
        #expect(updates.map { eventMembers($0)["status"] as? String } == ["paused", "enabled"])
        #expect(updates.first.map { eventMembers($0)["reason"] as? String } == "maintenance")
        #expect(
            updates.allSatisfy {
                ($0.claims["sub_id"] as? [String: String]) == ["format": "opaque", "id": id]
            })
        // Disabled: new changes are dropped; enabled again, only the stream-updated SETs come.
        #expect(
            try fixture.call(
                "POST", "/ssf/status", token: token, json: ["stream_id": id, "status": "disabled"]
            ).status == 200)
        try fixture.insertChanges([("siwa.account_deleted", "001.p")])
        #expect(
            try fixture.call(
                "POST", "/ssf/status", token: token, json: ["stream_id": id, "status": "enabled"]
            ).status == 200)
        let after = try fixture.verified(try Self.drain(fixture, stream, token: token), audience: audience)
        #expect(after.map(eventType) == [EventType.streamUpdated, EventType.streamUpdated])
        #expect(after.map { eventMembers($0)["status"] as? String } == ["disabled", "enabled"])
        #expect(
            try fixture.call("POST", "/ssf/status", token: token, json: ["stream_id": id, "status": "off"])
                .status == 400)
    }

    // Conformance plan: OIDSSFTransmitterStreamVerificationEventsTest.
    @Test(
        "verification: a SET echoing state (opaque sub_id); again sooner than min_verification_interval is 429"
    )
    func verification() throws {
        let fixture = try TransmitterFixture(minVerificationInterval: 30)
        let client = try fixture.addReceiver("okta")
        let token = try fixture.token(client)
        let stream = try fixture.createStream(token: token)
        let id = try #require(stream["stream_id"] as? String)
        let first = try fixture.call(
            "POST", "/ssf/verify", token: token, json: ["stream_id": id, "state": "s-4711"])
        #expect(first.status == 204)
        let again = try fixture.call(
            "POST", "/ssf/verify", token: token, json: ["stream_id": id, "state": "s-4712"])
        #expect(again.status == 429)
        let retry = Int(again.response.headers["Retry-After"] ?? "") ?? 0
        #expect((1...30).contains(retry))
        let (sets, _) = try fixture.poll(stream, token: token, body: ["returnImmediately": true])
        let outcomes = try fixture.verified(Array(sets.values), audience: stream["aud"] as? String ?? "")
        #expect(outcomes.count == 1)
        #expect(outcomes.first?.failure == nil)
        #expect(outcomes.first.map(eventType) == EventType.verification)
        #expect(outcomes.first.map { eventMembers($0)["state"] as? String } == "s-4711")
        #expect(outcomes.first?.claims["sub_id"] as? [String: String] == ["format": "opaque", "id": id])
        #expect(outcomes.first?.header["typ"] as? String == "secevent+jwt")
        #expect(outcomes.first?.claims["txn"] == nil)
    }

    // Conformance plan: OIDSSFStreamSubjectControlHappyPathTest.
    @Test("subjects with default_subjects NONE: only added subjects' events; removed again, none")
    func subjects() throws {
        let fixture = try TransmitterFixture(defaultSubjects: .none)
        let client = try fixture.addReceiver("okta")
        let token = try fixture.token(client)
        let metadata = try fixture.call("GET", "/.well-known/ssf-configuration", token: nil)
        #expect((metadata.body as? [String: Any])?["default_subjects"] as? String == "NONE")
        let stream = try fixture.createStream(token: token)
        let id = try #require(stream["stream_id"] as? String)
        let alice: [String: Any] = [
            "format": "iss_sub", "iss": SecurityEventToken.subjectIssuer, "sub": "001.alice",
        ]
        #expect(
            try fixture.call(
                "POST", "/ssf/subjects:add", token: token,
                json: ["stream_id": id, "subject": alice, "verified": true]
            ).status == 200)
        #expect(
            try fixture.call(
                "POST", "/ssf/subjects:add", token: token,
                json: ["stream_id": id, "subject": ["format": "email", "email": "a@example.test"]]
            ).status == 400)
        try fixture.insertChanges([
            ("siwa.consent_revoked", "001.alice"), ("siwa.consent_revoked", "001.bob"),
        ])
        let served = try fixture.verified(
            try Self.drain(fixture, stream, token: token), audience: stream["aud"] as? String ?? "")
        #expect(served.map(subject) == ["001.alice"])
        // A team transfer of an added subject reaches the stream under the new sub, naming the old one.
        try fixture.database.connection.execute(
            """
            INSERT INTO siwa.changes (type, sub, old_sub, event_time, applied_at, jti)
            VALUES ('siwa.sub_transferred', '001.alice2', '001.alice', now(), now(), '')
            """)
        let moved = try fixture.verified(
            try Self.drain(fixture, stream, token: token), audience: stream["aud"] as? String ?? "")
        #expect(moved.map(subject) == ["001.alice2"])
        #expect(moved.map(eventType) == [EventType.subjectTransferred])
        #expect(
            try fixture.call(
                "POST", "/ssf/subjects:remove", token: token, json: ["stream_id": id, "subject": alice]
            ).status == 204)
        try fixture.insertChanges([("siwa.account_deleted", "001.alice")])
        #expect(try Self.drain(fixture, stream, token: token).isEmpty)
    }
}
