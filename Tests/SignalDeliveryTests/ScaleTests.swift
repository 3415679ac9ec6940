import Foundation
import Postgres
import SignalDelivery
import TestSupport
import Testing

@Suite("Shared Signals push: isolation and volume", .serialized)
struct ScaleTests {
    @Test("a stream whose receiver hangs holds at most its max_in_flight lanes; the other stream is served")
    func isolation() throws {
        let fixture = try PushFixture()
        let hanging = try fixture.receiver { _, _ in
            Thread.sleep(forTimeInterval: 3)
            return nil
        }
        let healthy = try fixture.receiver()
        let slow = try fixture.addStream(hanging.url)
        try fixture.database.connection.execute(
            "UPDATE siwa.ssf_streams SET max_in_flight = 1 WHERE id = $1", [.int(Int64(slow))])
        try fixture.addStream(healthy.url)
        try fixture.insertChanges((0..<20).map { ("siwa.consent_revoked", "001.u\($0)") })
        let running = RunningSignals(try fixture.dispatcher(concurrency: 3))
        defer { running.stop() }
        let deadline = ContinuousClock.now + .seconds(60)
        while healthy.accepted.count < 20, ContinuousClock.now < deadline {
            Thread.sleep(forTimeInterval: 0.05)
        }
        #expect(healthy.accepted.count == 20)
        #expect(hanging.received.count <= 1)
    }

    @Test("10,000 events to one stream: each delivered once, in order per subject (rate in the log)")
    func tenThousand() throws {
        let fixture = try PushFixture()
        let receiver = try fixture.receiver()
        try fixture.addStream(receiver.url)
        for chunk in 0..<10 {
            try fixture.insertChanges(
                (0..<1000).map { ("siwa.email_disabled", "001.u\((chunk * 1000 + $0) % 500)") })
        }
        let started = ContinuousClock.now
        let running = RunningSignals(try fixture.dispatcher(concurrency: 4))
        defer { running.stop() }
        try fixture.waitUntilSettled(timeout: .seconds(600))
        let elapsed = ContinuousClock.now - started
        let accepted = receiver.accepted
        #expect(accepted.count == 10_000)
        #expect(Set(accepted.map(\.jti)).count == 10_000)
        let order = try fixture.database.query("SELECT jti, sub FROM siwa.ssf_events ORDER BY change_id").map
        {
            (try $0[0, as: String.self], try $0[1, as: String.self])
        }
        var expected: [String: [String]] = [:]
        for (jti, sub) in order { expected[sub, default: []].append(jti) }
        var got: [String: [String]] = [:]
        for set in accepted { got[set.sub, default: []].append(set.jti) }
        #expect(got == expected)
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        let rate = 10_000 / max(seconds, 0.001)
        print("ssf push rate: 10000 SETs in \(elapsed), \(Int(rate)) per second (4 lanes, one stream)")
    }

    @Test(
        "a claim does not walk the delivered events ahead of the due ones when the statistics predate them"
    )
    func claimProbesTheDueIndex() throws {
        let fixture = try PushFixture()
        try fixture.addStream("https://receiver.example.test/events")
        try fixture.insertChanges((0..<2000).map { ("siwa.consent_revoked", "001.u\($0)") })
        let owner = fixture.database.connection
        try owner.execute("ANALYZE siwa.ssf_events")
        // Delivered since the statistics were taken, as a burst is: the planner still counts them pending.
        try owner.execute(
            "UPDATE siwa.ssf_events SET state = 'delivered', delivered_at = now() WHERE id <= (SELECT min(id) + 1499 FROM siwa.ssf_events)"
        )
        try owner.execute("VACUUM siwa.ssf_events")
        // The primary-key entries the claim's scans read (this backend's count, before and after).
        let keysRead = "SELECT pg_stat_get_xact_tuples_returned('siwa.ssf_events_pkey'::regclass)"
        let (claimed, read) = try owner.transaction { connection in
            let before = try connection.value(keysRead, as: Int.self)
            let claimed = try connection.query(
                "SELECT id FROM siwa.claim_ssf_events('host:1:test:0', interval '1 minute', 8)"
            ).count
            return (claimed, try connection.value(keysRead, as: Int.self) - before)
        }
        #expect(claimed == 8)
        // Walking the 1,500 delivered events by primary key reads each one's entry.
        #expect(read < 100, "\(read) primary-key entries read")
    }
}
