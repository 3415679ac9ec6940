import Foundation
import Postgres
import TestSupport
import Testing

/// A database where Apple said forwarding off for one relay address and on for another.
private func bounceDatabase() throws -> TestDatabase {
    let database = try TestDatabase()
    let owner = try database.connect()
    defer { owner.close() }
    let now = Date()
    try owner.storeAsReceiver(
        [
            ("x1", "email-disabled", "001000.off", "off@privaterelay.appleid.com"),
            ("x2", "email-enabled", "001000.on", "on@privaterelay.appleid.com"),
        ].enumerated().map { index, event in
            SeededNotification(
                jti: event.0, type: event.1, sub: event.2, email: event.3,
                eventTime: now.addingTimeInterval(Double(index) - 600))
        })
    let worker = try database.connect(asMemberOf: "siwa_worker")
    defer { worker.close() }
    try worker.transaction { connection in
        _ = try connection.query("SELECT * FROM siwa.process_due_notifications(100, 5, interval '1 ms')")
    }
    return database
}

/// A bounce report as Postfix writes it, for one recipient.
private func report(recipient: String, diagnostic: String, status: String = "5.1.1") -> Data {
    Data(
        """
        From: MAILER-DAEMON@mx.sender.example (Mail Delivery System)
        Subject: Undelivered Mail Returned to Sender
        MIME-Version: 1.0
        Content-Type: multipart/report; report-type=delivery-status;
        \tboundary="A1B2.1/mx.sender.example"

        --A1B2.1/mx.sender.example
        Content-Type: text/plain; charset=us-ascii

        <\(recipient)>: host mx.privaterelay.appleid.com said: \(diagnostic)

        --A1B2.1/mx.sender.example
        Content-Type: message/delivery-status

        Reporting-MTA: dns; mx.sender.example
        X-Postfix-Sender: rfc822; news@Mail.Sender.Example

        Final-Recipient: rfc822; \(recipient)
        Action: failed
        Status: \(status)
        Remote-MTA: dns; mx.privaterelay.appleid.com
        Diagnostic-Code: smtp; \(diagnostic)

        --A1B2.1/mx.sender.example--

        """.utf8)
}

@Suite("siwactl mail bounce: one report classified and recorded, sysexits for Postfix's pipe transport")
struct MailBounceProcessTests {
    @Test("each class recorded for a relay address; a foreign one is not; never an address printed")
    func recordsEachReport() throws {
        let database = try bounceDatabase()
        let url = try database.url(asMemberOf: "siwa_bounce")
        let cases: [(String, String, String, String)] = [
            (
                "on@privaterelay.appleid.com", "550 5.1.1 <news@mail.sender.example>: unauthorized sender",
                "5.1.1",
                "class=sender_unauthorized recorded=true gate_reason=forwarding_on account=matched status=5.1.1"
            ),
            (
                "off@privaterelay.appleid.com", "550 5.1.1 user not found", "5.1.1",
                "class=relay_address_dead recorded=true gate_reason=forwarding_off account=matched status=5.1.1"
            ),
            (
                "new@private.icloud.com", "421 4.7.0 Try again later", "4.7.0",
                "class=transient recorded=true gate_reason=looks_like_relay account=none status=4.7.0"
            ),
            (
                "someone@example.org", "550 5.1.1 user unknown", "5.1.1",
                "class=relay_address_dead recorded=false gate_reason=not_ours account=none status=5.1.1"
            ),
        ]
        for (recipient, diagnostic, status, line) in cases {
            let result = try siwactl(
                ["mail", "bounce", "--database-url", url],
                input: report(recipient: recipient, diagnostic: diagnostic, status: status))
            #expect(result.status == 0, "\(result.standardError)")
            #expect(result.standardOutput == line + " sending_domain=mail.sender.example\n")
            #expect(!(result.standardOutput + result.standardError).contains("@"))
        }
        let owner = try database.connect()
        defer { owner.close() }
        let classes = try owner.query("SELECT class, sub FROM siwa.relay_bounce_history ORDER BY id").map {
            "\(try $0[0, as: String.self]):\(try $0[1, as: String?.self] ?? "-")"
        }
        #expect(classes == ["sender_unauthorized:001000.on", "relay_address_dead:001000.off", "transient:-"])
    }

    @Test(
        "--input from a file; a report that is not one exits 65, a missing file 66, no database 75, usage 64")
    func exitStatuses() throws {
        let database = try bounceDatabase()
        let url = try database.url(asMemberOf: "siwa_bounce")
        let file = FileManager.default.temporaryDirectory.appendingPathComponent(
            "bounce-\(UUID().uuidString).eml")
        defer { try? FileManager.default.removeItem(at: file) }
        try report(
            recipient: "off@privaterelay.appleid.com", diagnostic: "550 5.7.1 Relay not permitted for user"
        )
        .write(to: file)
        let fromFile = try siwactl(["mail", "bounce", "--database-url", url, "--input", file.path])
        #expect(fromFile.status == 0, "\(fromFile.standardError)")
        #expect(
            fromFile.standardOutput.hasPrefix("class=forwarding_off recorded=true gate_reason=forwarding_off")
        )

        // Postfix returns up to 50,000 bytes of the message, more with a raised bounce_size_limit:
        // standard input is read to its end, past a pipe's buffer.
        var large = report(recipient: "off@privaterelay.appleid.com", diagnostic: "550 5.1.1 user not found")
        let boundaryEnd = large.range(of: Data("--A1B2.1/mx.sender.example--".utf8))!.lowerBound
        large.insert(
            contentsOf: Data(
                ("--A1B2.1/mx.sender.example\nContent-Type: message/rfc822\n\nSubject: big\n\n"
                    + String(repeating: "x", count: 300_000) + "\n\n").utf8), at: boundaryEnd)
        let fromPipe = try siwactl(["mail", "bounce", "--database-url", url], input: large)
        #expect(fromPipe.status == 0, "\(fromPipe.standardError)")
        #expect(fromPipe.standardOutput.hasPrefix("class=relay_address_dead recorded=true"))

        let malformed = try siwactl(
            ["mail", "bounce", "--database-url", url],
            input: Data("Subject: hi off@privaterelay.appleid.com\n\nhello\n".utf8))
        #expect(malformed.status == 65)
        #expect(
            malformed.standardError
                == "siwactl mail bounce: not a bounce report: not a multipart/report (Content-Type)\n")

        let missing = try siwactl([
            "mail", "bounce", "--database-url", url, "--input", file.path + ".missing",
        ])
        #expect(missing.status == 66, "\(missing.standardError)")

        let unreachable = try siwactl(
            [
                "mail", "bounce", "--database-url",
                "postgresql:///siwa?host=/nonexistent-\(UUID().uuidString)",
            ],
            input: report(recipient: "off@privaterelay.appleid.com", diagnostic: "550 5.1.1 user not found"))
        #expect(unreachable.status == 75, "\(unreachable.standardError)")
        #expect(!unreachable.standardError.contains("off@"))

        let usage = try siwactl(["mail", "bounce", "--no-such-flag"], input: Data())
        #expect(usage.status == 64, "\(usage.standardError)")
    }
}
