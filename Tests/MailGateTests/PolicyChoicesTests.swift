import Foundation
import MailGate
import RelayMail
import Testing

@Suite("The action line for each decision")
struct PolicyChoicesTests {
    func action(_ lookup: Lookup, _ choices: PolicyChoices = PolicyChoices()) -> String {
        choices.action(for: lookup)
    }

    func verdict(_ decision: RelayMailAnswer.Decision, _ reason: String) -> Lookup {
        .decided(
            RelayMailAnswer(decision: decision, reason: RelayMailAnswer.Reason(rawValue: reason)!, since: nil)
        )
    }

    @Test("block answers 550 with a text per reason, not naming the recipient (Postfix does)")
    func blocks() {
        #expect(
            action(verdict(.block, "forwarding_off"))
                == "550 5.2.1 recipient turned off Apple relay forwarding")
        #expect(
            action(verdict(.block, "account_deleted"))
                == "550 5.1.1 the Apple account behind this relay address is deleted")
        #expect(action(verdict(.block, "consent_revoked")).hasPrefix("550 5.2.1 "))
        #expect(!action(verdict(.block, "forwarding_off")).contains("@"))
    }

    @Test("allow and unknown answer DUNNO; looks_like_relay is refused only with --unknown-relay reject")
    func allowAndUnknown() {
        for reason in ["forwarding_on", "never_turned_off"] {
            #expect(action(verdict(.allow, reason)) == "DUNNO")
        }
        for reason in ["not_ours", "looks_like_relay", "malformed"] {
            #expect(action(verdict(.unknown, reason)) == "DUNNO")
        }
        let reject = PolicyChoices(unknownRelay: .reject)
        #expect(action(verdict(.unknown, "looks_like_relay"), reject).hasPrefix("550 5.1.1 "))
        #expect(action(verdict(.unknown, "not_ours"), reject) == "DUNNO")
        #expect(action(verdict(.unknown, "malformed"), reject) == "DUNNO")
    }

    @Test("no answer from the database: DUNNO, or DEFER_IF_PERMIT 4.3.0 with --on-database-error defer")
    func databaseTrouble() {
        #expect(action(.timedOut) == "DUNNO")
        #expect(action(.unavailable) == "DUNNO")
        let deferring = PolicyChoices(onDatabaseError: .defer)
        #expect(action(.timedOut, deferring).hasPrefix("DEFER_IF_PERMIT 4.3.0 "))
        #expect(action(.unavailable, deferring).hasPrefix("DEFER_IF_PERMIT 4.3.0 "))
        #expect(action(verdict(.allow, "forwarding_on"), deferring) == "DUNNO")
    }
}

@Suite("The HTTP check's timestamps")
struct TimestampTests {
    @Test("since is RFC 3339 in UTC with milliseconds, as Foundation's ISO 8601 style writes it")
    func rfc3339() {
        let style = Date.ISO8601FormatStyle(
            includingFractionalSeconds: true, timeZone: TimeZone(identifier: "UTC")!)
        for seconds in [0, 1_780_000_000.125, 951_782_400.75, 1_704_067_199.5, -1.25] {
            let date = Date(timeIntervalSince1970: seconds)
            #expect(DecisionAPI.timestamp(date) == date.formatted(style), "\(seconds)")
        }
    }
}
