import Bounces
import Foundation
import Testing

/// A report as Postfix's bounce(8) writes it (RFC 3464), one recipient, the returned headers last.
func postfixReport(
    recipient: String = "abc123@privaterelay.appleid.com", status: String = "5.1.1",
    diagnostic: String = "smtp; 550 5.1.1 user not found", action: String = "failed",
    sender: String? = "news@mail.sender.example", returnPath: String = "<news@mail.sender.example>",
    lineEnding: String = "\n"
) -> Data {
    let senderLine = sender.map { "X-Postfix-Sender: rfc822; \($0)\n" } ?? ""
    let text = """
        Return-Path: <>
        From: MAILER-DAEMON@mx.sender.example (Mail Delivery System)
        Subject: Undelivered Mail Returned to Sender
        To: news@mail.sender.example
        Auto-Submitted: auto-replied
        MIME-Version: 1.0
        Content-Type: multipart/report; report-type=delivery-status;
        \tboundary="4F1D2C0A.1733338800/mx.sender.example"
        Message-Id: <20261204190000.5A1B2C3D@mx.sender.example>

        This is a MIME-encapsulated message.

        --4F1D2C0A.1733338800/mx.sender.example
        Content-Description: Notification
        Content-Type: text/plain; charset=us-ascii

        I'm sorry to have to inform you that your message could not
        be delivered to one or more recipients.

        <\(recipient)>: host mx.privaterelay.appleid.com said: \(diagnostic)

        --4F1D2C0A.1733338800/mx.sender.example
        Content-Description: Delivery report
        Content-Type: message/delivery-status

        Reporting-MTA: dns; mx.sender.example
        X-Postfix-Queue-ID: 4F1D2C0A
        \(senderLine)Arrival-Date: Fri,  4 Dec 2026 19:00:00 +0000 (UTC)

        Final-Recipient: rfc822; \(recipient)
        Original-Recipient: rfc822;\(recipient)
        Action: \(action)
        Status: \(status)
        Remote-MTA: dns; mx.privaterelay.appleid.com
        Diagnostic-Code: \(diagnostic)

        --4F1D2C0A.1733338800/mx.sender.example
        Content-Description: Undelivered Message Headers
        Content-Type: text/rfc822-headers

        Return-Path: \(returnPath)
        From: News <news@mail.sender.example>
        To: \(recipient)
        Subject: hello

        --4F1D2C0A.1733338800/mx.sender.example--

        """
    return Data(text.replacingOccurrences(of: "\n", with: lineEnding).utf8)
}

@Suite("DeliveryStatusReport: RFC 3464 reports as Postfix writes them, bounded, malformed ones refused")
struct DeliveryStatusReportTests {
    @Test("the per-message and per-recipient fields of a Postfix report, LF or CRLF")
    func postfixFields() throws {
        for ending in ["\n", "\r\n"] {
            let report = try DeliveryStatusReport(parsing: postfixReport(lineEnding: ending))
            #expect(report.reportingMTA == "mx.sender.example")
            #expect(report.envelopeSender == "news@mail.sender.example")
            #expect(report.recipients.count == 1)
            let recipient = try #require(report.recipients.first)
            #expect(recipient.finalRecipient == "abc123@privaterelay.appleid.com")
            #expect(recipient.originalRecipient == "abc123@privaterelay.appleid.com")
            #expect(recipient.action == "failed")
            #expect(recipient.status == "5.1.1")
            #expect(recipient.diagnosticCode == "550 5.1.1 user not found")
            #expect(recipient.remoteMTA == "mx.privaterelay.appleid.com")
            #expect(report.messageFields.map(\.name).contains("X-Postfix-Queue-ID"))
        }
    }

    @Test("without X-Postfix-Sender the returned headers' Return-Path is the envelope sender")
    func returnPath() throws {
        let report = try DeliveryStatusReport(
            parsing: postfixReport(sender: nil, returnPath: "<bounce+x1@em.sender.example>"))
        #expect(report.envelopeSender == "bounce+x1@em.sender.example")
        let none = try DeliveryStatusReport(parsing: postfixReport(sender: nil, returnPath: "<>"))
        #expect(none.envelopeSender == nil)
    }

    @Test("folded fields are joined; a status comment is dropped; several recipients are kept in order")
    func foldingAndRecipients() throws {
        let text = """
            Content-Type: multipart/report; report-type=delivery-status; boundary=b1

            --b1
            Content-Type: message/delivery-status

            Reporting-MTA: dns; mta.example

            Final-Recipient: rfc822; one@privaterelay.appleid.com
            Action: failed
            Status: 5.7.1 (delivery not authorized)
            Diagnostic-Code: smtp; 550 5.7.1 Your message was rejected
             due to sender.example's DMARC policy

            Final-Recipient: RFC822; two@private.icloud.com
            Action: Delayed
            Status: 4.4.1
            --b1--
            """
        let report = try DeliveryStatusReport(parsing: Data(text.utf8))
        #expect(
            report.recipients.map(\.finalRecipient) == [
                "one@privaterelay.appleid.com", "two@private.icloud.com",
            ])
        #expect(report.recipients[0].status == "5.7.1")
        #expect(
            report.recipients[0].diagnosticCode
                == "550 5.7.1 Your message was rejected due to sender.example's DMARC policy")
        #expect(report.recipients[1].action == "delayed")
        #expect(report.envelopeSender == nil)
    }

    static let malformed: [(String, String, DeliveryStatusReport.ParseError)] = [
        ("not MIME", "Subject: hi\n\nhello\n", .notMultipartReport),
        ("plain text", "Content-Type: text/plain\n\nhello\n", .notMultipartReport),
        ("no boundary", "Content-Type: multipart/report; report-type=delivery-status\n\n", .noBoundary),
        (
            "no status part",
            "Content-Type: multipart/report; boundary=x\n\n--x\nContent-Type: text/plain\n\nhi\n--x--\n",
            .noDeliveryStatus
        ),
        (
            "no recipient",
            "Content-Type: multipart/report; boundary=x\n\n--x\nContent-Type: message/delivery-status\n\n"
                + "Reporting-MTA: dns; a\n--x--\n", .noRecipient
        ),
        (
            "no Status",
            "Content-Type: multipart/report; boundary=x\n\n--x\nContent-Type: message/delivery-status\n\n"
                + "Reporting-MTA: dns; a\n\nFinal-Recipient: rfc822; a@b\nAction: failed\n--x--\n",
            .missingField("Status")
        ),
        (
            "bad Status",
            "Content-Type: multipart/report; boundary=x\n\n--x\nContent-Type: message/delivery-status\n\n"
                + "Reporting-MTA: dns; a\n\nFinal-Recipient: rfc822; a@b\nAction: failed\nStatus: 550\n--x--\n",
            .malformedField("Status")
        ),
        (
            "bad Action",
            "Content-Type: multipart/report; boundary=x\n\n--x\nContent-Type: message/delivery-status\n\n"
                + "Reporting-MTA: dns; a\n\nFinal-Recipient: rfc822; a@b\nAction: bounced\nStatus: 5.0.0\n--x--\n",
            .malformedField("Action")
        ),
    ]

    @Test("malformed input is a clear error that names no address", arguments: malformed)
    func malformedInput(_ example: (String, String, DeliveryStatusReport.ParseError)) {
        #expect(throws: example.2, "\(example.0)") { try DeliveryStatusReport(parsing: Data(example.1.utf8)) }
        #expect(!example.2.description.contains("@"))
    }

    @Test("sizes are bounded: over 4 MiB, or over 1000 recipients, is refused")
    func bounds() {
        let large = Data(repeating: UInt8(ascii: "a"), count: DeliveryStatusReport.maximumSize + 1)
        #expect(throws: DeliveryStatusReport.ParseError.tooLarge(large.count)) {
            try DeliveryStatusReport(parsing: large)
        }
        let group = "Final-Recipient: rfc822; a@privaterelay.appleid.com\nAction: failed\nStatus: 5.1.1\n\n"
        let many =
            "Content-Type: multipart/report; boundary=x\n\n--x\nContent-Type: message/delivery-status\n\n"
            + "Reporting-MTA: dns; a\n\n" + String(repeating: group, count: 1001) + "--x--\n"
        #expect(throws: DeliveryStatusReport.ParseError.tooManyRecipients) {
            try DeliveryStatusReport(parsing: Data(many.utf8))
        }
    }
}

@Suite("BounceClassifier: each relay bounce's class, from the texts Apple's relay and Postfix write")
struct BounceClassifierTests {
    /// (diagnostic, status, action, class): Apple's forum posts, bounce decoders and Postfix's own texts.
    static let table: [(String, String, String, BounceClass)] = [
        // Apple's forum (Mailgun's event for a relay address): the bracketed address is the sender's.
        (
            "smtp; 550 5.1.1 <bounce+b53c9e.27949-6qj4xaisn4k=privaterelay.appleid.com@test.x.domain.com>: unauthorized sender",
            "5.1.1", "failed", .senderUnauthorized
        ),
        ("550 5.1.1 <news@mail.sender.example>: unauthorized sender", "5.1.1", "failed", .senderUnauthorized),
        ("550 5.1.1 user not found", "5.1.1", "failed", .relayAddressDead),
        ("550 5.1.1 <abc@privaterelay.appleid.com>: user unknown", "5.1.1", "failed", .relayAddressDead),
        ("550 5.1.1 Recipient address rejected", "5.1.1", "failed", .relayAddressDead),
        ("550 5.1.10 RESOLVER.ADR.RecipientNotFound", "5.1.10", "failed", .relayAddressDead),
        // Hide My Email and relay forwarding turned off.
        ("550 5.7.1 Relay not permitted for user", "5.7.1", "failed", .forwardingOff),
        (
            "550 5.1.1 <abc@privaterelay.appleid.com>: forwarding is disabled", "5.1.1", "failed",
            .forwardingOff
        ),
        // Authentication.
        (
            "550 5.7.1 Your message was rejected due to sender.example's DMARC policy", "5.7.1", "failed",
            .authFailure
        ),
        ("550 5.7.26 This message does not pass SPF", "5.7.26", "failed", .authFailure),
        ("554 5.7.1 DKIM signature missing", "5.7.1", "failed", .authFailure),
        ("550 5.7.1 Email rejected due to transformation error", "5.7.1", "failed", .authFailure),
        ("554 5.7.1 [HM08] Message rejected due to local policy", "5.7.1", "failed", .authFailure),
        // Transient: a 4.x.x status or a delay report (Postfix's delay_warning_time).
        ("421 4.7.0 Try again later", "4.7.0", "failed", .transient),
        ("450 4.2.1 user not found, try later", "4.2.1", "failed", .transient),
        (
            "connect to mx.privaterelay.appleid.com[17.57.155.1]:25: Connection timed out", "4.4.1",
            "delayed", .transient
        ),
        ("", "5.0.0", "delayed", .transient),
        // Anything else.
        ("552 5.2.2 mailbox full", "5.2.2", "failed", .other),
        ("554 5.3.4 Message too big for system", "5.3.4", "failed", .other),
        ("", "5.0.0", "failed", .other),
    ]

    @Test("the table", arguments: table)
    func classes(_ example: (String, String, String, BounceClass)) throws {
        let diagnostic = example.0.hasPrefix("smtp;") ? String(example.0.dropFirst(6)) : example.0
        #expect(
            BounceClassifier.classify(diagnostic: diagnostic, status: example.1, action: example.2)
                == example.3,
            "\(example.0)")
    }

    @Test("a parsed report's recipient is classified from its fields")
    func fromReport() throws {
        let cases: [(String, String, BounceClass)] = [
            ("smtp; 550 5.1.1 <news@mail.sender.example>: unauthorized sender", "5.1.1", .senderUnauthorized),
            ("smtp; 550 5.1.1 user not found", "5.1.1", .relayAddressDead),
        ]
        for (diagnostic, status, expected) in cases {
            let report = try DeliveryStatusReport(
                parsing: postfixReport(status: status, diagnostic: diagnostic))
            #expect(BounceClassifier.classify(try #require(report.recipients.first)) == expected)
        }
    }

    @Test("relay domains: Apple's three, case-insensitively; a relay domain in a local part is not one")
    func relayDomains() {
        #expect(BounceClassifier.isRelayDomain("a@privaterelay.appleid.com"))
        #expect(BounceClassifier.isRelayDomain("a@PrivateRelay.AppleID.com"))
        #expect(BounceClassifier.isRelayDomain("a@private.icloud.com"))
        #expect(BounceClassifier.isRelayDomain("a@icloud.com"))
        #expect(!BounceClassifier.isRelayDomain("bounce+x=privaterelay.appleid.com@sender.example"))
        #expect(!BounceClassifier.isRelayDomain("no-at-sign"))
        #expect(BounceClassifier.domain(of: "News@Mail.Sender.Example") == "mail.sender.example")
    }
}

@Suite("Postmark's Basic credentials")
struct PostmarkCredentialsTests {
    static let bounce = Data(
        #"{"RecordType":"Bounce","Type":"HardBounce","Email":"a@privaterelay.appleid.com"}"#.utf8)

    @Test(
        "RFC 9110 § 11.1: the Basic scheme in any case; a wrong password is refused",
        arguments: ["Basic", "basic", "BASIC"])
    func schemeIgnoresCase(scheme: String) throws {
        let webhook = PostmarkWebhook(username: "postmark", password: "secret-0123")
        let right = Data("postmark:secret-0123".utf8).base64EncodedString()
        let batch = try webhook.events(body: [UInt8](Self.bounce), authorization: "\(scheme) \(right)")
        #expect(batch.bounces.count == 1)
        let wrong = Data("postmark:secret-0124".utf8).base64EncodedString()
        #expect(throws: ESPEventError.self) {
            try webhook.events(body: [UInt8](Self.bounce), authorization: "\(scheme) \(wrong)")
        }
    }
}
