import Foundation
import HTTPServer
import Postgres
import SharedSignals
import SignalTransmitter
import Synchronization
import TestSupport
import Testing

/// Poll delivery (RFC 8936) from the stream's endpoint, against the live listener.
@Suite("Shared Signals transmitter: poll (RFC 8936)")
struct PollTests {
    typealias EventType = SecurityEventToken.EventType

    func pollStream(_ fixture: TransmitterFixture) throws -> (token: String, stream: [String: Any]) {
        let token = try fixture.token(try fixture.addReceiver("poller"))
        return (token, try fixture.createStream(token: token))
    }

    @Test(
        "SETs verified by PyJWT, then acknowledged (delivered) and setErrs (failed, the err kept), in one call"
    )
    func acksAndErrors() throws {
        let fixture = try TransmitterFixture()
        let (token, stream) = try pollStream(fixture)
        try fixture.insertChanges([
            ("siwa.consent_revoked", "001.a"), ("siwa.account_deleted", "001.b"),
            ("siwa.email_disabled", "001.c"),
        ])
        let (sets, more) = try fixture.poll(
            stream, token: token, body: ["returnImmediately": true, "maxEvents": 2])
        #expect(sets.count == 2)
        #expect(more)
        let outcomes = try fixture.verified(Array(sets.values), audience: stream["aud"] as? String ?? "")
        #expect(outcomes.allSatisfy { $0.failure == nil && $0.header["typ"] as? String == "secevent+jwt" })
        #expect(outcomes.allSatisfy { $0.claims["exp"] == nil && $0.claims["sub"] == nil })
        #expect(Set(outcomes.compactMap { $0.claims["jti"] as? String }) == Set(sets.keys))
        let keys = Array(sets.keys).sorted()
        let next = try fixture.poll(
            stream, token: token,
            body: [
                "ack": [keys[0]], "setErrs": [keys[1]: ["err": "invalid_audience", "description": "no"]],
                "returnImmediately": true,
            ])
        #expect(next.sets.count == 1)
        #expect(!next.more)
        let rows = try fixture.database.query(
            "SELECT jti, state, coalesce(last_error, '') FROM siwa.ssf_events ORDER BY id"
        ).map { (try $0[0, as: String.self], try $0[1, as: String.self], try $0[2, as: String.self]) }
        let byJTI = Dictionary(uniqueKeysWithValues: rows.map { ($0.0, ($0.1, $0.2)) })
        #expect(byJTI[keys[0]]?.0 == "delivered")
        #expect(byJTI[keys[1]]?.0 == "failed")
        #expect(byJTI[keys[1]]?.1 == "setErr err=invalid_audience")
        #expect(
            try fixture.poll(
                stream, token: token, body: ["ack": Array(next.sets.keys), "returnImmediately": true]
            ).sets.isEmpty)
        #expect(
            try fixture.database.value(
                "SELECT count(*)::int FROM siwa.ssf_events WHERE state = 'delivered'", as: Int.self) == 2)
    }

    @Test(
        "an unacknowledged SET is served again, same jti, once its lease expires; the sub's next waits for it"
    )
    func redelivery() throws {
        let fixture = try TransmitterFixture()
        let (token, stream) = try pollStream(fixture)
        try fixture.insertChanges([("siwa.email_disabled", "001.r"), ("siwa.email_enabled", "001.r")])
        let first = try fixture.poll(stream, token: token, body: ["returnImmediately": true])
        #expect(first.sets.count == 1)
        // Leased: neither it nor the same sub's next SET is served meanwhile.
        #expect(try fixture.poll(stream, token: token, body: ["returnImmediately": true]).sets.isEmpty)
        try fixture.database.connection.execute(
            "UPDATE siwa.ssf_events SET lease_expires_at = now() - interval '1 second' WHERE lease_owner IS NOT NULL"
        )
        let again = try fixture.poll(stream, token: token, body: ["returnImmediately": true])
        #expect(Array(again.sets.keys) == Array(first.sets.keys))
        #expect(again.sets == first.sets)
        let last = try fixture.poll(
            stream, token: token, body: ["ack": Array(again.sets.keys), "returnImmediately": true])
        let outcomes = try fixture.verified(Array(last.sets.values), audience: stream["aud"] as? String ?? "")
        #expect(outcomes.map(eventType) == [EventType.emailForwardingEnabled])
    }

    @Test("a long poll returns as soon as an event is enqueued (NOTIFY), and empty at its bound")
    func longPoll() throws {
        let fixture = try TransmitterFixture(longPollLimit: .seconds(20))
        let (token, stream) = try pollStream(fixture)
        let started = ContinuousClock.now
        let answer = Mutex<Result<[String: String], any Error>?>(nil)
        let path = String(
            ((stream["delivery"] as? [String: Any])?["endpoint_url"] as? String ?? "").dropFirst(
                TransmitterFixture.issuer.count))
        let poller = Thread {
            let result = Result { () throws -> [String: String] in
                let reply = try fixture.call("POST", path, token: token, json: ["maxEvents": 10])
                return (reply.body as? [String: Any])?["sets"] as? [String: String] ?? [:]
            }
            answer.withLock { $0 = result }
        }
        poller.start()
        // Once the poll waits (it holds no connection then), a change wakes it.
        let waiting = ContinuousClock.now + .seconds(10)
        while fixture.transmitter.longPollsWaiting == 0, ContinuousClock.now < waiting {
            Thread.sleep(forTimeInterval: 0.01)
        }
        #expect(fixture.transmitter.longPollsWaiting == 1)
        #expect(
            try fixture.database.value(
                "SELECT count(*)::int FROM pg_stat_activity WHERE usename = $1 AND state <> 'idle'",
                [.text(try fixture.database.loginRole(memberOf: "siwa_ssf"))], as: Int.self) == 0)
        try fixture.insertChanges([("siwa.consent_revoked", "001.long")])
        let deadline = ContinuousClock.now + .seconds(15)
        while answer.withLock({ $0 }) == nil, ContinuousClock.now < deadline {
            Thread.sleep(forTimeInterval: 0.02)
        }
        let got = try #require(answer.withLock { $0 }).get()
        #expect(got.count == 1)
        #expect(ContinuousClock.now - started < .seconds(10))
        let short = try TransmitterFixture(longPollLimit: .seconds(1))
        let (shortToken, shortStream) = try pollStream(short)
        let empty = try short.poll(shortStream, token: shortToken, body: ["ack": Array(got.keys)])
        #expect(empty.sets.isEmpty)
        #expect(!empty.more)
    }

    @Test("10,000 SETs polled with maxEvents 100 and acks: each once, the rate reported")
    func rate() throws {
        let fixture = try TransmitterFixture()
        let (token, stream) = try pollStream(fixture)
        let total = 10_000
        for chunk in stride(from: 0, to: total, by: 1000) {
            try fixture.insertChanges(
                (chunk..<chunk + 1000).map { ("siwa.consent_revoked", "001.rate.\($0)") })
        }
        let started = ContinuousClock.now
        var seen = Set<String>()
        var acks: [String] = []
        var polls = 0
        while polls < 500 {
            let (sets, more) = try fixture.poll(
                stream, token: token, body: ["ack": acks, "maxEvents": 100, "returnImmediately": true])
            polls += 1
            acks = Array(sets.keys)
            seen.formUnion(sets.keys)
            if sets.isEmpty && !more { break }
        }
        let elapsed = (ContinuousClock.now - started).inSecondsForTest
        #expect(seen.count == total)
        #expect(
            try fixture.database.value(
                "SELECT count(*)::int FROM siwa.ssf_events WHERE state = 'delivered'", as: Int.self) == total)
        print(
            "ssf poll rate: \(total) SETs in \(polls) polls, \(String(format: "%.1f", elapsed)) s, \(Int(Double(total) / elapsed)) SETs/s"
        )
    }
}

extension Duration {
    var inSecondsForTest: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}
