import Foundation
import HTTPClient
import Postgres
import QueueConsumer
import ServiceSupport
import Suppressions
import TestSupport
import Testing

/// A database with providers and their fakes, events applied through the worker's SQL entry point.
final class Fixture {
    let database: TestDatabase
    let fakes: [String: FakeSuppressionProvider]

    init(_ kinds: [FakeSuppressionProvider.Kind], preset: Set<String> = []) throws {
        database = try TestDatabase()
        var fakes: [String: FakeSuppressionProvider] = [:]
        for kind in kinds {
            fakes[kind.rawValue] = try FakeSuppressionProvider(kind, preset: preset)
            try database.connection.execute(
                "INSERT INTO siwa.suppression_providers (name, kind) VALUES ($1, $1)", [.text(kind.rawValue)])
        }
        self.fakes = fakes
    }

    func provider(_ name: String) -> any SuppressionProvider {
        let fake = fakes[name]!
        switch fake.kind {
        case .sendgrid: return SendGridProvider(apiKey: fake.credential, baseURL: fake.baseURL)
        case .postmark: return PostmarkProvider(serverToken: fake.credential, baseURL: fake.baseURL)
        case .mailgun:
            return MailgunProvider(apiKey: fake.credential, domain: "mg.example.com", baseURL: fake.baseURL)
        case .ses:
            return SESProvider(
                credentials: .init(
                    accessKeyID: FakeSuppressionProvider.sesAccessKeyID, secretAccessKey: fake.credential),
                region: FakeSuppressionProvider.sesRegion, endpoint: fake.baseURL)
        }
    }

    /// A dispatcher for every fake (or those named), as siwa_worker.
    func dispatcher(_ names: [String]? = nil, timeout: Duration = .seconds(5), maxAttempts: Int = 30) throws
        -> SuppressionDispatcher
    {
        var providers: [String: any SuppressionProvider] = [:]
        for name in names ?? Array(fakes.keys) { providers[name] = provider(name) }
        return SuppressionDispatcher(
            configuration: try SuppressionDispatcher.Configuration(
                database: try database.configuration(asMemberOf: "siwa_worker"), providers: providers,
                timeout: timeout, retryBaseDelay: .seconds(1), maxRetryDelay: .seconds(2),
                maxAttempts: maxAttempts),
            logger: quietLogger)
    }

    /// Stores the events as the receiver does and applies them as the worker, in one transaction.
    func apply(_ events: [(type: String, sub: String, email: String?)]) throws {
        var seeded: [SeededNotification] = []
        let start = Date().addingTimeInterval(-60)
        for (index, event) in events.enumerated() {
            seeded.append(
                SeededNotification(
                    jti: UUID().uuidString, type: event.type, sub: event.sub, email: event.email,
                    eventTime: start.addingTimeInterval(Double(index)),
                    issuedAt: start.addingTimeInterval(Double(index))))
        }
        try database.connection.storeAsReceiver(seeded)
        let worker = try database.connect(asMemberOf: "siwa_worker")
        defer { worker.close() }
        let outcomes = try worker.transaction { connection in
            try connection.query(
                "SELECT outcome FROM siwa.process_due_notifications(100, 5, interval '1 ms')"
            )
            .map { try $0[0, as: String.self] }
        }
        #expect(outcomes.allSatisfy { $0 == "applied" }, "\(outcomes)")
    }

    /// Makes every pending row due now (the retries' delays are real time otherwise).
    func makeDue() throws {
        try database.connection.execute(
            "UPDATE siwa.suppression_outbox SET next_attempt_at = now() - interval '1 s' WHERE state = 'pending'"
        )
    }

    /// (provider, action, state, outcome) of every row, in id order.
    func rows() throws -> [String] {
        try database.query(
            "SELECT provider, action, state, coalesce(outcome, '-') FROM siwa.suppression_outbox ORDER BY id"
        ).map {
            "\(try $0[0, as: String.self]) \(try $0[1, as: String.self]) \(try $0[2, as: String.self]) \(try $0[3, as: String.self])"
        }
    }
}

let alice = "alice@privaterelay.appleid.com"
let bob = "bob@privaterelay.appleid.com"

@Suite("Suppression lists in step with the relay events", .serialized)
struct SuppressionTests {
    @Test("no provider: applying events writes no outbox row")
    func noProvider() throws {
        let fixture = try Fixture([])
        try fixture.apply([("email-disabled", "s1", alice), ("account-delete", "s2", nil)])
        #expect(try fixture.database.value("SELECT count(*) FROM siwa.suppression_outbox") as Int == 0)
    }

    @Test(
        "calls per event: disabled reads then adds, enabled removes what we added, delete adds; per provider")
    func callsPerEvent() throws {
        let fixture = try Fixture([.sendgrid, .postmark, .mailgun])
        try fixture.database.connection.execute(
            "INSERT INTO siwa.accounts (sub, email, is_private_email) VALUES ('s2', $1, true)", [.text(bob)])
        try fixture.apply([("email-disabled", "s1", alice)])
        let first = try fixture.dispatcher().drainOnce()
        #expect(first.map(\.outcome.recordedName) == ["done", "done", "done"])
        try fixture.apply([("email-enabled", "s1", alice), ("account-delete", "s2", nil)])
        let second = try fixture.dispatcher().drainOnce()
        #expect(
            second.map(\.outcome.recordedName).sorted() == ["done", "done", "done", "done", "done", "done"])
        let sendgrid = fixture.fakes["sendgrid"]!.calls.map { "\($0.method) \($0.path) \($0.status)" }
        #expect(
            sendgrid == [
                "GET /v3/asm/suppressions/global/\(alice) 200", "POST /v3/asm/suppressions/global 201",
                "DELETE /v3/asm/suppressions/global/\(alice) 204",
                "GET /v3/asm/suppressions/global/\(bob) 200", "POST /v3/asm/suppressions/global 201",
            ])
        let postmark = fixture.fakes["postmark"]!.calls.map { "\($0.method) \($0.path) \($0.address)" }
        #expect(
            postmark == [
                "GET /message-streams/outbound/suppressions/dump \(alice)",
                "POST /message-streams/outbound/suppressions \(alice)",
                "POST /message-streams/outbound/suppressions/delete \(alice)",
                "GET /message-streams/outbound/suppressions/dump \(bob)",
                "POST /message-streams/outbound/suppressions \(bob)",
            ])
        let mailgun = fixture.fakes["mailgun"]!.calls.map { "\($0.method) \($0.path) \($0.status)" }
        #expect(
            mailgun == [
                "GET /v3/mg.example.com/unsubscribes/\(alice) 404",
                "POST /v3/mg.example.com/unsubscribes 200",
                "DELETE /v3/mg.example.com/unsubscribes/\(alice) 200",
                "GET /v3/mg.example.com/unsubscribes/\(bob) 404", "POST /v3/mg.example.com/unsubscribes 200",
            ])
        for fake in fixture.fakes.values { #expect(fake.suppressed == [bob]) }
        // bob's account is erased with its deletion (the default): his finished rows keep no address.
        #expect(
            try fixture.database.value(
                "SELECT count(*) FROM siwa.suppression_outbox WHERE sub = 's2' AND address IS NOT NULL")
                as Int == 0)
        #expect(try fixture.database.value("SELECT count(*) FROM siwa.suppressions_we_added") as Int == 0)
    }

    @Test("a real address (is_private_email false) goes to no list: not when disabled, not when deleted")
    func realAddressesStayOff() throws {
        let fixture = try Fixture([.sendgrid, .postmark])
        try fixture.database.connection.execute(
            "INSERT INTO siwa.accounts (sub, email, is_private_email) VALUES ('s4', 'dave@example.com', false)"
        )
        try fixture.apply([
            ("email-disabled", "s3", "carol@example.com"), ("account-delete", "s4", nil),
            ("email-disabled", "s1", alice),
        ])
        #expect(
            try fixture.database.value("SELECT count(*) FROM siwa.suppression_outbox WHERE sub <> 's1'")
                as Int
                == 0)
        _ = try fixture.dispatcher().drainOnce()
        for fake in fixture.fakes.values { #expect(fake.suppressed == [alice]) }
    }

    @Test("what an earlier version added for a real address is listed by sub and removed from the list")
    func realAddressesAddedEarlier() throws {
        let real = "erin@example.com"
        let fixture = try Fixture([.sendgrid], preset: [real])
        try fixture.database.connection.execute(
            "INSERT INTO siwa.accounts (sub, email, is_private_email) VALUES ('s5', $1, false), ('s1', $2, true)",
            [.text(real), .text(alice)])
        try fixture.database.connection.execute(
            """
            INSERT INTO siwa.suppressions_we_added (provider, address_key, sub)
            VALUES ('sendgrid', siwa.mail_address_key($1), 's5'), ('sendgrid', siwa.mail_address_key($2), 's1')
            """, [.text(real), .text(alice)])
        let administration = SuppressionAdministration(fixture.database.connection)
        #expect(try administration.realAddressSuppressions().map(\.sub) == ["s5"])
        #expect(try administration.removeRealAddressSuppressions(provider: "sendgrid") == 1)
        #expect(try fixture.dispatcher().drainOnce().map(\.outcome.recordedName) == ["done"])
        #expect(fixture.fakes["sendgrid"]!.suppressed.isEmpty)
        #expect(try administration.realAddressSuppressions().isEmpty)
        #expect(try fixture.rows() == ["sendgrid remove done done"])
    }

    @Test("replaying a row that a later row of its address supersedes is refused; the latest replays")
    func replayKeepsTheOrder() throws {
        let fixture = try Fixture([.sendgrid])
        try fixture.apply([("email-disabled", "s1", alice)])
        _ = try fixture.dispatcher().drainOnce()
        try fixture.apply([("email-enabled", "s1", alice)])
        _ = try fixture.dispatcher().drainOnce()
        let ids = try fixture.database.query("SELECT id FROM siwa.suppression_outbox ORDER BY id").map {
            try $0[0, as: Int.self]
        }
        try #require(ids.count == 2)
        #expect(throws: PostgresError.self) {
            try fixture.database.query("SELECT siwa.replay_suppression($1)", [.int(Int64(ids[0]))])
        }
        let replayed: Int = try fixture.database.value(
            "SELECT siwa.replay_suppression($1)", [.int(Int64(ids[1]))])
        #expect(replayed > ids[1])
    }

    @Test("ownership: an address the ESP suppressed itself is not added, and not removed on email-enabled")
    func ownership() throws {
        let fixture = try Fixture([.sendgrid, .postmark], preset: [alice])
        try fixture.apply([("email-disabled", "s1", alice)])
        #expect(
            try fixture.dispatcher().drainOnce().map(\.outcome.recordedName) == [
                "already_there", "already_there",
            ])
        try fixture.apply([("email-enabled", "s1", alice)])
        #expect(try fixture.dispatcher().drainOnce().isEmpty)
        for fake in fixture.fakes.values {
            #expect(fake.suppressed == [alice])
            #expect(fake.calls.map(\.method) == ["GET"])
        }
        #expect(
            try fixture.rows() == [
                "postmark add done already_there", "sendgrid add done already_there",
                "postmark remove done not_ours", "sendgrid remove done not_ours",
            ])
    }

    @Test("429 with Retry-After, X-RateLimit-Reset and ratelimit-reset: retried no sooner than asked")
    func rateLimits() throws {
        let fixture = try Fixture([.sendgrid])
        let fake = fixture.fakes["sendgrid"]!
        let reset = String(Int(Date().timeIntervalSince1970) + 300)
        fake.script([
            .init(status: 429, headers: [("Retry-After", "120")]),
            .init(status: 429, headers: [("X-RateLimit-Reset", reset)]),
            .init(status: 429, headers: [("ratelimit-reset", "200")]),
        ])
        try fixture.apply([("email-disabled", "s1", alice)])
        for expected in [120.0, 300.0, 200.0] {
            let outcome = try #require(try fixture.dispatcher().drainOnce().first)
            #expect(outcome.outcome.recordedName == "retry" && outcome.status == 429)
            let wait = try fixture.database.value(
                "SELECT extract(epoch FROM next_attempt_at - now())::float8 FROM siwa.suppression_outbox",
                as: Double.self)
            #expect(wait > expected - 5 && wait <= expected + 1, "\(wait) for \(expected)")
            #expect(try fixture.dispatcher().drainOnce().isEmpty)
            try fixture.makeDue()
        }
        #expect(try fixture.dispatcher().drainOnce().map(\.outcome.recordedName) == ["done"])
        #expect(fake.suppressed == [alice])
    }

    @Test("5xx and a timeout are retried, then the call succeeds; a 4xx is permanent")
    func retriesAndPermanent() throws {
        let fixture = try Fixture([.postmark])
        let fake = fixture.fakes["postmark"]!
        fake.script([.init(status: 503), .init(status: 200, delay: .seconds(3))])
        try fixture.apply([("email-disabled", "s1", alice)])
        let dispatcher = try fixture.dispatcher(timeout: .seconds(1))
        #expect(try dispatcher.drainOnce().map(\.outcome.recordedName) == ["retry"])
        try fixture.makeDue()
        #expect(try dispatcher.drainOnce().map(\.outcome.recordedName) == ["retry"])
        try fixture.makeDue()
        #expect(try dispatcher.drainOnce().map(\.outcome.recordedName) == ["done"])
        #expect(fake.suppressed == [alice])
        fake.script([.init(status: 422)])
        try fixture.apply([("email-disabled", "s2", bob)])
        #expect(try dispatcher.drainOnce().map(\.outcome.recordedName) == ["permanent"])
        #expect(try fixture.rows().last == "postmark add dead permanent")
    }

    @Test("isolation: a provider down leaves the others working; its rows wait and arrive in order later")
    func providerDown() throws {
        let fixture = try Fixture([.sendgrid, .mailgun])
        let down = fixture.fakes["mailgun"]!
        down.setDown(.init(status: 503))
        try fixture.apply([("email-disabled", "s1", alice)])
        try fixture.apply([("email-enabled", "s1", alice)])
        try fixture.apply([("email-disabled", "s1", alice)])
        for _ in 0..<3 {
            _ = try fixture.dispatcher().drainOnce()
            try fixture.makeDue()
        }
        #expect(fixture.fakes["sendgrid"]!.suppressed == [alice])
        #expect(fixture.fakes["sendgrid"]!.calls.map(\.method) == ["GET", "POST", "DELETE", "GET", "POST"])
        #expect(down.suppressed.isEmpty)
        #expect(down.calls.allSatisfy { $0.method == "GET" })  // only ever its queue's head
        down.setDown(nil)
        for _ in 0..<3 {
            _ = try fixture.dispatcher().drainOnce()
            try fixture.makeDue()
        }
        #expect(down.suppressed == [alice])
        #expect(
            down.calls.filter { $0.status < 300 || $0.status == 404 }.map(\.method) == [
                "GET", "POST", "DELETE", "GET", "POST",
            ])
        #expect(
            try fixture.database.value("SELECT count(*) FROM siwa.suppression_outbox WHERE state <> 'done'")
                as Int == 0)
    }

    @Test("a team transfer while rows are pending: they follow the new sub and are delivered")
    func transferWhilePending() throws {
        let fixture = try Fixture([.sendgrid])
        try fixture.apply([("email-disabled", "old.sub", alice)])
        _ = try fixture.database.query(
            "SELECT * FROM siwa.apply_sub_transfer('t1', ARRAY['old.sub'], ARRAY['new.sub'], ARRAY[NULL::text], ARRAY[NULL::boolean])"
        )
        #expect(try fixture.database.value("SELECT sub FROM siwa.suppression_outbox") as String == "new.sub")
        #expect(try fixture.dispatcher().drainOnce().map(\.outcome.recordedName) == ["done"])
        #expect(
            try fixture.database.value("SELECT sub FROM siwa.suppressions_we_added") as String == "new.sub")
        try fixture.apply([("email-enabled", "new.sub", alice)])
        #expect(try fixture.dispatcher().drainOnce().map(\.outcome.recordedName) == ["done"])
        #expect(fixture.fakes["sendgrid"]!.suppressed.isEmpty)
    }

    @Test("an erasure while rows are pending: delivered within the wait, then erased and dead, saying so")
    func erasureWhilePending() throws {
        let fixture = try Fixture([.sendgrid, .postmark])
        fixture.fakes["postmark"]!.setDown(.init(status: 503))
        try fixture.database.connection.execute(
            "INSERT INTO siwa.accounts (sub, email, is_private_email) VALUES ('s1', $1, true)", [.text(alice)]
        )
        try fixture.apply([("account-delete", "s1", nil)])
        #expect(
            try fixture.database.value(
                "SELECT count(*) FROM siwa.accounts WHERE email IS NULL AND sub = 's1'") as Int == 1)
        // Within the wait the pending rows keep the address, and the working provider gets it.
        #expect(
            try fixture.dispatcher().drainOnce().map(\.outcome.recordedName).sorted() == ["done", "retry"])
        #expect(fixture.fakes["sendgrid"]!.suppressed == [alice])
        #expect(
            try fixture.database.value(
                "SELECT string_agg(provider || ':' || (address IS NOT NULL)::text, ',' ORDER BY provider) FROM siwa.suppression_outbox"
            )
                as String == "postmark:true,sendgrid:false")
        // The wait passes: the row is dead, erased, without its address.
        try fixture.database.connection.execute(
            "UPDATE siwa.suppression_outbox SET erase_by = now() - interval '1 s' WHERE state = 'pending'")
        #expect(try fixture.dispatcher().drainOnce().isEmpty)
        #expect(try fixture.rows() == ["postmark add dead erased", "sendgrid add done done"])
        #expect(
            try fixture.database.value(
                "SELECT count(*) FROM siwa.suppression_outbox WHERE address IS NOT NULL") as Int == 0)
        #expect(try fixture.database.value("SELECT count(*) FROM siwa.suppressions_we_added") as Int == 0)
        #expect(
            try fixture.database.value(
                "SELECT last_error FROM siwa.suppression_outbox WHERE provider = 'postmark'")
                as String == "the account's personal data was erased and the provider's erasure_wait passed")
    }

    @Test("an add the ESP made but whose answer never came: the retry finds it listed and counts it as ours")
    func addMadeAnswerLost() throws {
        let fixture = try Fixture([.sendgrid])
        let fake = fixture.fakes["sendgrid"]!
        fake.script([.late(.zero), .late(.seconds(3))])  // the lookup, then the add answered too late
        try fixture.apply([("email-disabled", "s1", alice)])
        let dispatcher = try fixture.dispatcher(timeout: .seconds(1))
        #expect(try dispatcher.drainOnce().map(\.outcome.recordedName) == ["retry"])
        #expect(fake.suppressed == [alice])
        try fixture.makeDue()
        #expect(try dispatcher.drainOnce().map(\.outcome.recordedName) == ["done"])
        try fixture.apply([("email-enabled", "s1", alice)])
        #expect(try dispatcher.drainOnce().map(\.outcome.recordedName) == ["done"])
        #expect(fake.suppressed.isEmpty)
        #expect(fake.calls.map(\.method) == ["GET", "POST", "GET", "DELETE"])
    }

    @Test("attempts run out: the row is dead (gave_up) and the next one of its address goes")
    func givesUp() throws {
        let fixture = try Fixture([.sendgrid])
        fixture.fakes["sendgrid"]!.script([.init(status: 500), .init(status: 500)])
        try fixture.apply([("email-disabled", "s1", alice)])
        let dispatcher = try fixture.dispatcher(maxAttempts: 2)
        #expect(try dispatcher.drainOnce().map(\.outcome.recordedName) == ["retry"])
        try fixture.makeDue()
        #expect(try dispatcher.drainOnce().map(\.outcome.recordedName) == ["retry"])
        #expect(try fixture.rows() == ["sendgrid add dead gave_up"])
    }

    @Test(
        "a lane that died mid-call: its lease runs out, another takes the row over; the late record is refused"
    )
    func leaseTakenOver() throws {
        let fixture = try Fixture([.sendgrid])
        try fixture.apply([("email-disabled", "s1", alice)])
        let worker = try fixture.database.connect(asMemberOf: "siwa_worker")
        defer { worker.close() }
        let id = try worker.value(
            "SELECT id FROM siwa.claim_suppressions('dead-lane', interval '1 hour', 1, 'sendgrid')",
            as: Int.self)
        // Leased: nothing to claim while the lease lives.
        #expect(try fixture.dispatcher().drainOnce().isEmpty)
        try fixture.database.connection.execute(
            "UPDATE siwa.suppression_outbox SET lease_expires_at = now() - interval '1 s' WHERE id = $1",
            [.int(Int64(id))])
        #expect(try fixture.dispatcher().drainOnce().map(\.outcome.recordedName) == ["done"])
        #expect(
            try worker.value(
                "SELECT siwa.record_suppression_attempt($1, 'dead-lane', 'done', 201, NULL)",
                [.int(Int64(id))],
                as: Bool.self) == false)
        #expect(try fixture.rows() == ["sendgrid add done done"])
        #expect(try fixture.database.value("SELECT attempts FROM siwa.suppression_outbox") as Int == 2)
    }

    @Test("pruning: finished rows past the retention go, each address's latest stays unless erased")
    func pruning() throws {
        let fixture = try Fixture([.sendgrid])
        try fixture.database.connection.execute(
            "INSERT INTO siwa.accounts (sub, email, is_private_email) VALUES ('s3', $1, true)",
            [.text("carol@privaterelay.appleid.com")])
        try fixture.apply([("email-disabled", "s1", alice), ("email-disabled", "s2", bob)])
        #expect(try fixture.dispatcher().drainOnce().count == 2)
        try fixture.apply([("email-enabled", "s1", alice), ("account-delete", "s3", nil)])
        #expect(try fixture.dispatcher().drainOnce().count == 2)
        try fixture.apply([("email-disabled", "s1", alice)])  // pending: never pruned
        // Everything finished long ago; carol's account is erased (her row has no address).
        try fixture.database.connection.execute(
            "UPDATE siwa.suppression_outbox SET finished_at = now() - interval '40 days' WHERE state <> 'pending'"
        )
        let dispatcher = SuppressionDispatcher(
            configuration: try .init(
                database: try fixture.database.configuration(asMemberOf: "siwa_worker"),
                providers: ["sendgrid": fixture.provider("sendgrid")], retention: .seconds(30 * 86_400)),
            logger: quietLogger)
        let pruned = try dispatcher.prune()
        let left = try fixture.database.query(
            "SELECT sub || ' ' || action || ' ' || state FROM siwa.suppression_outbox ORDER BY id"
        ).map { try $0[0, as: String.self] }
        // alice's add and remove (her pending add is her latest), carol's erased add; bob's only row stays.
        #expect(pruned == 3, "\(left)")
        #expect(left == ["s2 add done", "s1 add pending"])
        #expect(try dispatcher.prune() == 0)
        // Within the retention nothing goes.
        try fixture.database.connection.execute(
            "UPDATE siwa.suppression_outbox SET finished_at = now() - interval '1 day' WHERE state <> 'pending'"
        )
        try fixture.makeDue()
        _ = try dispatcher.drainOnce()
        #expect(try dispatcher.prune() == 0)
    }

    @Test("Retry-After as an HTTP date, and the bounds")
    func retryAfterForms() {
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        func after(_ headers: [OutboundHTTP.Header]) -> Duration? {
            OutboundHTTP.Response(status: 429, headers: headers, body: []).retryAfter(now: now)
        }
        let format = DateFormatter()
        format.locale = Locale(identifier: "en_US_POSIX")
        format.timeZone = TimeZone(identifier: "GMT")
        format.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        #expect(
            after([.init("Retry-After", format.string(from: now.addingTimeInterval(90)))]) == .seconds(90))
        #expect(after([.init("Retry-After", "7")]) == .seconds(7))
        #expect(after([.init("X-RateLimit-Reset", "30")]) == .seconds(30))
        #expect(after([.init("X-RateLimit-Reset", "1800000045")]) == .seconds(45))
        #expect(after([.init("ratelimit-reset", "999999")]) == .seconds(86_400))
        #expect(after([]) == nil)
    }
}
