import Foundation
import Postgres
import TestSupport
import Testing

/// A signed notification whose `event_time` lies after its `iat`: the event cannot have happened after
/// Apple signed the token about it. It is stored (never lost), but applied with `iat` + 60 s (the
/// leeway) as its time; the signed value is kept in `claimed_event_time` and counted.
@Suite("An event dated after its token was signed")
struct FutureEventTimeTests {
    private static let thirtyDays: TimeInterval = 30 * 86400

    /// The worker's pass over everything due (the worker's own function).
    private func applyAll(_ harness: ReceiverHarness) throws {
        _ = try harness.query(
            "SELECT outcome FROM siwa.process_due_notifications(100, 1, interval '1 second')")
    }

    private func futureCount(_ harness: ReceiverHarness) throws -> String? {
        try harness.get("/metrics").text.split(separator: "\n")
            .first { $0.hasPrefix("siwa_future_event_times_total ") }
            .map { String($0.split(separator: " ")[1]) }
    }

    @Test(
        "a consent-revoked dated 30 days after iat revokes what existed by iat + 60 s, not the sign-ins after it; the signed time is kept and counted"
    )
    func futureConsentRevoked() throws {
        let harness = try ReceiverHarness()
        let sub = "001.future-consent"
        let issuedAt = Date().addingTimeInterval(-600).rounded()
        let claimed = Date().addingTimeInterval(Self.thirtyDays)
        // Signed in before the event, and (as the app would record it) after it.
        _ = try harness.query(
            "INSERT INTO siwa.sessions (sub, created_at) VALUES ($1, now() - interval '20 minutes')",
            [.text(sub)])
        let jti = "future-\(UUID().uuidString)"
        let response = try harness.deliver(
            TestSigning.token(
                type: "consent-revoked", subject: sub, eventTime: claimed, issuedAt: issuedAt, jti: jti))
        #expect(response.status == 200)
        #expect(response.text == #"{"status":"accepted"}"#)
        try applyAll(harness)

        // Applied; the session from before the event is revoked.
        let state = try harness.query("SELECT state FROM siwa.event_history WHERE jti = $1", [.text(jti)])
        #expect(try state[0][0, as: String.self] == "applied")
        #expect(
            try harness.query(
                "SELECT count(*) FROM siwa.sessions WHERE sub = $1 AND revoked_at IS NULL", [.text(sub)])[0][
                    0, as: Int.self] == 0)
        // A sign-in now (after iat + 60 s) is valid, and stays valid when the app records it.
        #expect(
            try harness.query("SELECT siwa.session_is_valid($1, now())", [.text(sub)])[0][0, as: Bool.self])
        _ = try harness.query("INSERT INTO siwa.sessions (sub, created_at) VALUES ($1, now())", [.text(sub)])
        #expect(
            try harness.query(
                "SELECT count(*) FROM siwa.sessions WHERE sub = $1 AND revoked_at IS NULL", [.text(sub)])[0][
                    0, as: Int.self] == 1)
        // The account's consent_revoked_at and the change say iat + 60 s.
        let times = try harness.query(
            """
            SELECT a.consent_revoked_at = $2::timestamptz + interval '60 seconds',
                   (SELECT c.event_time = a.consent_revoked_at FROM siwa.changefeed c WHERE c.jti = $3)
              FROM siwa.accounts a WHERE a.sub = $1
            """, [.text(sub), .date(issuedAt), .text(jti)])[0]
        #expect(try times[0, as: Bool.self])
        #expect(try times[1, as: Bool?.self] == true)

        // Admins see the anomaly: event_time iat + 60 s, the signed time beside it.
        let history = try harness.query(
            """
            SELECT event_time = issued_at + interval '60 seconds', extract(epoch FROM claimed_event_time)::float8
              FROM siwa.event_history WHERE jti = $1
            """, [.text(jti)])[0]
        #expect(try history[0, as: Bool.self])
        #expect(abs(try history[1, as: Double.self] - claimed.timeIntervalSince1970) < 0.01)
        #expect(try futureCount(harness) == "1")
        #expect(harness.logs.all.contains("claimed_event_time"))
    }

    @Test("an email event dated 30 days ahead does not freeze the relay status: the next real one still wins")
    func futureEmailEventDoesNotFreezeStatus() throws {
        let harness = try ReceiverHarness()
        let sub = "001.future-email"
        let email = "f@privaterelay.appleid.com"
        let issuedAt = Date().addingTimeInterval(-600).rounded()
        #expect(
            try harness.deliver(
                TestSigning.token(
                    type: "email-disabled", subject: sub, email: email, isPrivateEmail: true,
                    eventTime: Date().addingTimeInterval(Self.thirtyDays), issuedAt: issuedAt)
            ).status == 200)
        try applyAll(harness)
        // The user turns forwarding back on five minutes ago.
        let later = Date().addingTimeInterval(-300).rounded()
        #expect(
            try harness.deliver(
                TestSigning.token(
                    type: "email-enabled", subject: sub, email: email, isPrivateEmail: true, eventTime: later,
                    issuedAt: later)
            ).status == 200)
        try applyAll(harness)
        let status = try harness.query("SELECT email_status FROM siwa.accounts WHERE sub = $1", [.text(sub)])
        #expect(try status[0][0, as: String?.self] == "enabled")
        #expect(
            try harness.query(
                "SELECT count(*) FROM siwa.event_history WHERE sub = $1 AND claimed_event_time IS NOT NULL",
                [.text(sub)])[0][0, as: Int.self] == 1)
        #expect(try futureCount(harness) == "1")
    }

    @Test("an event_time within the leeway after iat is kept as signed, with no anomaly")
    func withinLeewayKept() throws {
        let harness = try ReceiverHarness()
        let issuedAt = Date().addingTimeInterval(-600).rounded()
        let jti = "near-\(UUID().uuidString)"
        #expect(
            try harness.deliver(
                TestSigning.token(
                    type: "consent-revoked", subject: "001.near", eventTime: issuedAt.addingTimeInterval(30),
                    issuedAt: issuedAt, jti: jti)
            ).status == 200)
        let row = try harness.query(
            """
            SELECT event_time = issued_at + interval '30 seconds', claimed_event_time IS NULL
              FROM siwa.event_history WHERE jti = $1
            """, [.text(jti)])[0]
        #expect(try row[0, as: Bool.self])
        #expect(try row[1, as: Bool.self])
        #expect(try futureCount(harness) == "0")
    }
}

extension Date {
    /// Whole seconds (a token's `iat` is an integer).
    fileprivate func rounded() -> Date { Date(timeIntervalSince1970: timeIntervalSince1970.rounded(.down)) }
}
