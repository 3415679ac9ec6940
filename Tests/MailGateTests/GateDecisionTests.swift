import Foundation
import MailGate
import Postgres
import TestSupport
import Testing

@Suite("siwa-mailgate's policy service decides at RCPT from the database", .serialized)
struct GateDecisionTests {
    @Test("each decision's action line at RCPT; other states and a missing recipient answer DUNNO")
    func decisions() throws {
        let fixture = try GateFixture()
        let client = try PolicyClient(fixture.policyAddress)
        #expect(try client.ask(recipient: Mailbox.on) == "DUNNO")
        #expect(
            try client.ask(recipient: Mailbox.off)
                == "550 5.2.1 recipient turned off Apple relay forwarding")
        #expect(
            try client.ask(recipient: Mailbox.gone)
                == "550 5.1.1 the Apple account behind this relay address is deleted")
        #expect(try client.ask(recipient: Mailbox.stranger) == "DUNNO")
        #expect(try client.ask(recipient: Mailbox.elsewhere) == "DUNNO")
        // The domain matches case-insensitively.
        #expect(try client.ask(recipient: "off.1@PrivateRelay.AppleID.com")?.hasPrefix("550 5.2.1 ") == true)
        for state in ["CONNECT", "EHLO", "MAIL", "DATA", "END-OF-MESSAGE", "VRFY", "ETRN"] {
            #expect(try client.ask(state: state, recipient: Mailbox.off) == "DUNNO", "\(state)")
        }
        try client.send("request=smtpd_access_policy\nprotocol_state=RCPT\n\n")
        #expect(try client.answer() == "DUNNO")
        let metrics = fixture.metrics
        #expect(
            metrics.contains(
                #"siwa_mailgate_decisions_total{source="policy",decision="block",reason="forwarding_off"} 2"#)
        )
        #expect(
            metrics.contains(
                #"siwa_mailgate_decisions_total{source="policy",decision="unknown",reason="looks_like_relay"} 1"#
            ))
        #expect(metrics.contains(#"siwa_mailgate_policy_requests_total{state="other",action="dunno"} 7"#))
        #expect(metrics.contains(#"siwa_mailgate_policy_requests_total{state="rcpt",action="dunno"} 4"#))
        #expect(!fixture.log.contains("off.1@"))
    }

    @Test("--unknown-relay reject refuses an address on a relay domain that Apple did not give this app")
    func unknownRelayReject() throws {
        let fixture = try GateFixture(choices: PolicyChoices(unknownRelay: .reject))
        let client = try PolicyClient(fixture.policyAddress)
        #expect(
            try client.ask(recipient: Mailbox.stranger)?.hasPrefix("550 5.1.1 ")
                == true)
        #expect(try client.ask(recipient: Mailbox.elsewhere) == "DUNNO")
        #expect(try client.ask(recipient: Mailbox.on) == "DUNNO")
    }

    @Test(
        "with the database unreachable: DUNNO at once (or DEFER_IF_PERMIT 4.3.0), counted as database errors",
        arguments: [PolicyChoices.OnDatabaseError.dunno, .defer])
    func databaseDown(onError: PolicyChoices.OnDatabaseError) throws {
        let closed = try RefusingPort()
        let fixture = try GateFixture(
            choices: PolicyChoices(onDatabaseError: onError), decisionTimeout: .seconds(1),
            database: try PostgresConfiguration(
                "host=127.0.0.1 port=\(closed.port) dbname=siwa user=nobody", connectTimeout: .seconds(1)),
            seed: false)
        let client = try PolicyClient(fixture.policyAddress)
        for _ in 0..<3 {
            let started = ContinuousClock.now
            let action = try #require(try client.ask(recipient: Mailbox.off))
            // The 1 s deadline, with a loaded machine's slack.
            #expect(ContinuousClock.now - started < .seconds(2))
            #expect(onError == .dunno ? action == "DUNNO" : action.hasPrefix("DEFER_IF_PERMIT 4.3.0 "))
        }
        #expect(fixture.metrics.contains(#"reason="database_error"} 3"#))
        #expect(!fixture.metrics.contains("siwa_mailgate_database_errors_total 0"))
    }

    @Test("connections the server ends are replaced: the next lookups reconnect")
    func reconnects() throws {
        let fixture = try GateFixture()
        let client = try PolicyClient(fixture.policyAddress)
        #expect(try client.ask(recipient: Mailbox.off)?.hasPrefix("550 5.2.1 ") == true)
        let login = try fixture.database.loginRole(memberOf: "siwa_mail")
        let ended = try fixture.database.value(
            "SELECT count(pg_terminate_backend(pid))::int FROM pg_stat_activity WHERE usename = $1 AND datname = $2",
            [.text(login), .text(fixture.database.name)], as: Int.self)
        #expect(ended >= 1)
        // A lookup on a connection found dead may answer without the database once; then it reconnects.
        #expect(try waitUntil { try client.ask(recipient: Mailbox.off)?.hasPrefix("550 5.2.1 ") == true })
        #expect(try client.ask(recipient: Mailbox.gone)?.hasPrefix("550 5.1.1 ") == true)
    }

    @Test("a database slower than --decision-timeout: DUNNO within the deadline; its late answer then serves")
    func slowDatabase() throws {
        let fixture = try GateFixture(decisionTimeout: .milliseconds(300), cacheTTL: .seconds(30))
        // The owner holds the accounts table: every lookup waits on the lock.
        let holder = try fixture.database.connect()
        defer { holder.close() }
        _ = try holder.simpleQuery("BEGIN; LOCK TABLE siwa.accounts IN ACCESS EXCLUSIVE MODE")
        let client = try PolicyClient(fixture.policyAddress)
        let started = ContinuousClock.now
        #expect(try client.ask(recipient: Mailbox.off) == "DUNNO")
        let waited = ContinuousClock.now - started
        // The lock is held until the test ends: an answer at all is within the deadline (slack for load).
        #expect(waited >= .milliseconds(300) && waited < .milliseconds(1300), "\(waited)")
        #expect(
            fixture.metrics.contains(
                #"siwa_mailgate_decisions_total{source="policy",decision="none",reason="timeout"} 1"#))
        _ = try holder.simpleQuery("COMMIT")
        // The lookup that outlived its request fills the cache: the next request is answered from it.
        #expect(try waitUntil { fixture.gate.resolver.cache.count == 1 })
        #expect(try client.ask(recipient: Mailbox.off)?.hasPrefix("550 5.2.1 ") == true)
        #expect(fixture.metrics.contains("siwa_mailgate_cache_hits_total 1"))
    }

    @Test(
        "an email-enabled after a block is honoured once the cached block is older than --cache-ttl, not later"
    )
    func cacheAgeEndToEnd() throws {
        let ttl = Duration.milliseconds(400)
        let fixture = try GateFixture(cacheTTL: ttl)
        let client = try PolicyClient(fixture.policyAddress)
        #expect(try client.ask(recipient: Mailbox.off)?.hasPrefix("550 5.2.1 ") == true)
        try GateFixture.apply(fixture.database, "email-enabled", sub: "001.off", email: Mailbox.off)
        let applied = ContinuousClock.now
        var answer: String?
        #expect(
            try waitUntil {
                answer = try client.ask(recipient: Mailbox.off)
                return answer == "DUNNO"
            })
        // The cached block outlived the change by at most its ttl (plus a poll of the wait).
        #expect(ContinuousClock.now - applied < ttl + .milliseconds(300))
    }
}
