import AppleNotifications
import Foundation
import Postgres
import QueueConsumer
import SharedSignals
import SignalDelivery
import Synchronization
import TestSupport
import Testing

/// A stream to an RFC 8935 receiver, changes inserted as the worker inserts them, and a dispatcher
/// running as siwa_worker with a test-short retry schedule.
struct PushFixture {
    static let issuer = "https://ssf.example.test"
    let database: TestDatabase
    let key: SETSigningKey
    let audience: String
    let authorization = "Bearer test-\(UUID().uuidString)"
    let authorizationFile: String

    init() throws {
        database = try TestDatabase()
        key = try SETSigningKey.generate()
        audience = "https://receiver.example.test/\(UUID().uuidString.prefix(8))"
        authorizationFile =
            FileManager.default.temporaryDirectory.appendingPathComponent(
                "ssf-auth-\(UUID().uuidString)"
            ).path
        try (authorization + "\n").write(toFile: authorizationFile, atomically: true, encoding: .utf8)
    }

    func receiver(
        override: @escaping @Sendable (ReceivedSET, Int) -> (status: Int, err: String?)? = { _, _ in nil }
    ) throws -> SETReceiver {
        try SETReceiver(
            keys: key.keySet(), issuer: Self.issuer, audience: audience, authorization: authorization,
            override: override)
    }

    @discardableResult
    func addStream(_ url: String, authorization: Bool = true, audience: String? = nil) throws -> Int {
        try database.value(
            "SELECT siwa.add_ssf_stream('test-receiver', $1, $2, $3)",
            [
                .text(audience ?? self.audience), .text(url),
                authorization ? .text("file:" + authorizationFile) : nil,
            ])
    }

    func setStatus(_ stream: Int, _ status: String) throws {
        _ =
            try database.value(
                "SELECT siwa.set_ssf_stream_status($1, $2)", [.int(Int64(stream)), .text(status)]) as Bool
    }

    /// Inserts one change per (type, sub) in one statement, as the worker's batch does; returns the ids.
    @discardableResult
    func insertChanges(_ changes: [(String, String)]) throws -> [Int] {
        try database.connection.query(
            """
            INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti)
            SELECT t, s, now() - interval '1 minute', now(), 'apple-' || gen_random_uuid()
              FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(t, s, n) ORDER BY n
            RETURNING id
            """,
            [
                .text("{" + changes.map(\.0).joined(separator: ",") + "}"),
                .text("{" + changes.map(\.1).joined(separator: ",") + "}"),
            ]
        ).map { try $0[0, as: Int.self] }
    }

    func dispatcher(concurrency: Int = 4, timeout: Duration = .seconds(5), maxAttempts: Int = 30) throws
        -> SignalDispatcher
    {
        SignalDispatcher(
            configuration: try SignalDispatcher.Configuration(
                database: try database.configuration(asMemberOf: "siwa_worker"), issuer: Self.issuer,
                key: key,
                concurrency: concurrency, timeout: timeout, retryBaseDelay: .milliseconds(20),
                maxRetryDelay: .milliseconds(100), maxAttempts: maxAttempts, pollInterval: .milliseconds(100)),
            logger: quietLogger)
    }

    func states() throws -> [String] {
        try database.query("SELECT state FROM siwa.ssf_events ORDER BY id").map { try $0[0, as: String.self] }
    }

    /// Waits (polling the database, bounded) until no event is pending.
    func waitUntilSettled(timeout: Duration = .seconds(120)) throws {
        let deadline = ContinuousClock.now + timeout
        while try database.value("SELECT count(*)::int FROM siwa.ssf_events WHERE state = 'pending'") as Int
            > 0
        {
            guard ContinuousClock.now < deadline else { throw TestFailure("events still pending") }
            Thread.sleep(forTimeInterval: 0.05)
        }
    }
}

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

@Suite("Shared Signals push delivery (RFC 8935)", .serialized)
struct PushTests {
    @Test(
        "each carried change is pushed once as a verified SET with the stream's Authorization; 202 is delivered"
    )
    func delivery() throws {
        let fixture = try PushFixture()
        let receiver = try fixture.receiver()
        try fixture.addStream(receiver.url)
        try fixture.insertChanges([
            ("siwa.consent_revoked", "001.a"), ("siwa.account_deleted", "001.b"),
            ("siwa.email_disabled", "001.c"),
            ("siwa.email_enabled", "001.c"), ("siwa.personal_data_erased", "001.b"),
        ])
        let outcomes = try fixture.dispatcher().drainOnce()
        #expect(outcomes.map(\.state) == [.delivered, .delivered, .delivered, .delivered])
        #expect(receiver.received.map(\.status) == [202, 202, 202, 202])
        #expect(
            receiver.received.map(\.eventType) == [
                SecurityEventToken.EventType.sessionRevoked, SecurityEventToken.EventType.accountPurged,
                SecurityEventToken.EventType.emailForwardingDisabled,
                SecurityEventToken.EventType.emailForwardingEnabled,
            ])
        let jtis = try fixture.database.query("SELECT jti FROM siwa.ssf_events ORDER BY id").map {
            try $0[0, as: String.self]
        }
        #expect(receiver.received.map(\.jti) == jtis)
        #expect(try fixture.states() == ["delivered", "delivered", "delivered", "delivered"])
    }

    @Test(
        "a 400 with each of RFC 8935's error codes fails the SET for good; the stream's other subjects go on",
        arguments: SignalDispatcher.permanentErrors.sorted())
    func permanentErrors(code: String) throws {
        let fixture = try PushFixture()
        let receiver = try fixture.receiver { set, _ in set.sub == "001.bad" ? (400, code) : nil }
        try fixture.addStream(receiver.url)
        try fixture.insertChanges([("siwa.consent_revoked", "001.bad"), ("siwa.consent_revoked", "001.good")])
        let outcomes = try fixture.dispatcher().drainOnce()
        #expect(outcomes.map(\.state.rawValue).sorted() == ["delivered", "failed"])
        #expect(try fixture.states() == ["failed", "delivered"])
        #expect(
            try fixture.database.value("SELECT last_error FROM siwa.ssf_events WHERE sub = '001.bad'")
                as String
                == "HTTP 400 err=\(code)")
        #expect(receiver.received.count == 2)
    }

    @Test("the receiver's own checks: a wrong audience or a missing Authorization is a permanent 400")
    func receiverRefusals() throws {
        let fixture = try PushFixture()
        let receiver = try fixture.receiver()
        try fixture.addStream(receiver.url, audience: "https://someone.else")
        try fixture.addStream(receiver.url, authorization: false)
        try fixture.insertChanges([("siwa.account_deleted", "001.a")])
        _ = try fixture.dispatcher().drainOnce()
        #expect(Set(receiver.received.compactMap(\.error)) == ["invalid_audience", "authentication_failed"])
        #expect(try fixture.states() == ["failed", "failed"])
    }

    @Test("a 5xx, a 400 without an RFC code, a 401 and no answer are retried; the same SET comes again")
    func retried() throws {
        let fixture = try PushFixture()
        let answers: [(Int, String?)] = [(503, nil), (400, "something_else"), (401, nil), (500, nil)]
        let receiver = try fixture.receiver { _, seen in seen < answers.count ? answers[seen] : nil }
        try fixture.addStream(receiver.url)
        try fixture.insertChanges([("siwa.consent_revoked", "001.a")])
        let running = RunningSignals(try fixture.dispatcher())
        defer { running.stop() }
        try fixture.waitUntilSettled()
        #expect(receiver.received.map(\.status) == [503, 400, 401, 500, 202])
        #expect(Set(receiver.received.map(\.token)).count == 1)
        #expect(try fixture.states() == ["delivered"])
        #expect(try fixture.database.value("SELECT attempts FROM siwa.ssf_events") as Int == 5)
    }

    @Test(
        "a lane's batch stops at its first failed push: the rest are released unsent, their attempt uncounted, and sent after it"
    )
    func batchStopsAtFirstFailure() throws {
        let fixture = try PushFixture()
        // The third subject's SET fails once; every other push is accepted.
        let receiver = try fixture.receiver { set, seen in set.sub == "001.c" && seen == 0 ? (503, nil) : nil
        }
        try fixture.addStream(receiver.url)
        try fixture.insertChanges(
            ["001.a", "001.b", "001.c", "001.d", "001.e"].map { ("siwa.consent_revoked", $0) })
        let outcomes = try fixture.dispatcher().drainOnce()
        // The batch up to its failure; then d and e, released unsent, and c's retry (due after 10–20 ms,
        // possibly in the same drain and before them: order is per subject, not across subjects).
        #expect(Array(outcomes.map(\.state).prefix(3)) == [.delivered, .delivered, .retry])
        #expect(Array(receiver.received.map(\.sub).prefix(3)) == ["001.a", "001.b", "001.c"])
        #expect(
            receiver.received.filter { ["001.d", "001.e"].contains($0.sub) }.map(\.status) == [202, 202])
        // Each SET's attempts are its pushes: none kept the count of a batch it was released from.
        let pushes = Dictionary(grouping: receiver.received, by: \.sub).mapValues(\.count)
        for row in try fixture.database.query("SELECT sub, attempts FROM siwa.ssf_events ORDER BY id") {
            let sub = try row[0, as: String.self]
            #expect(try row[1, as: Int.self] == pushes[sub], "\(sub)")
        }
    }

    @Test("a paused stream keeps its events; resumed, they arrive in change order per subject")
    func pauseThenResume() throws {
        let fixture = try PushFixture()
        let receiver = try fixture.receiver()
        let stream = try fixture.addStream(receiver.url)
        try fixture.setStatus(stream, "paused")
        var changes: [(String, String)] = []
        for round in 0..<20 {
            for sub in ["001.a", "001.b", "001.c"] {
                changes.append((round % 2 == 0 ? "siwa.email_disabled" : "siwa.email_enabled", sub))
            }
        }
        let ids = try fixture.insertChanges(changes)
        #expect(try fixture.dispatcher().drainOnce().isEmpty)
        #expect(
            try fixture.database.value("SELECT count(*)::int FROM siwa.ssf_events WHERE state = 'pending'")
                == 60)
        let running = RunningSignals(try fixture.dispatcher(concurrency: 4))
        defer { running.stop() }
        try fixture.setStatus(stream, "enabled")
        try fixture.waitUntilSettled()
        let jtiOrder = try fixture.database.query(
            "SELECT jti, sub, change_id FROM siwa.ssf_events ORDER BY change_id"
        )
        .map { (try $0[0, as: String.self], try $0[1, as: String.self]) }
        #expect(receiver.accepted.count == ids.count)
        for sub in ["001.a", "001.b", "001.c"] {
            #expect(
                receiver.accepted.filter { $0.sub == sub }.map(\.jti)
                    == jtiOrder.filter { $0.1 == sub }.map(\.0))
        }
    }

    @Test("erasure: SETs hold no email, and a pending SET of an erased account is delivered unchanged")
    func erasure() throws {
        let fixture = try PushFixture()
        let receiver = try fixture.receiver()
        let stream = try fixture.addStream(receiver.url)
        try fixture.setStatus(stream, "paused")
        try fixture.database.connection.execute(
            """
            INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti, email, is_private_email)
            VALUES ('siwa.email_disabled', '001.e', now(), now(), 'apple-1', 'x@privaterelay.appleid.com', true),
                   ('siwa.account_deleted', '001.e', now(), now(), 'apple-2', NULL, NULL)
            """)
        try fixture.database.connection.execute(
            "UPDATE siwa.changes SET email = NULL, is_private_email = NULL WHERE sub = '001.e'")
        try fixture.setStatus(stream, "enabled")
        _ = try fixture.dispatcher().drainOnce()
        #expect(receiver.accepted.count == 2)
        for set in receiver.accepted {
            let payload = try CompactJWS(set.token).payload
            #expect(!String(decoding: payload, as: UTF8.self).contains("@"))
        }
    }
}

/// A dispatcher's `run()` on its own thread, stopped and joined by ``stop()``.
final class RunningSignals: Sendable {
    let dispatcher: SignalDispatcher
    private let done = DispatchSemaphore(value: 0)

    init(_ dispatcher: SignalDispatcher) {
        self.dispatcher = dispatcher
        let thread = Thread { [dispatcher, done] in
            dispatcher.run()
            done.signal()
        }
        thread.start()
    }

    func stop() {
        dispatcher.stop()
        done.wait()
    }
}
