import BounceEvents
import Bounces
import Foundation
import HTTPClient
import Postgres
import TestSupport
import Testing

/// The keys and certificates, made once by openssl for every test.
let signers = Result { try Signers() }

@Suite("ESP bounce events: each provider authenticated as it documents, relay bounces recorded by class")
struct ESPEventsTests {
    @Test(
        "Mailgun: a signed failed event is recorded; unauthorized sender names the sender, not the recipient")
    func mailgun() throws {
        let listener = try Listener(signers: signers.get())
        let response = try listener.post(
            "mailgun",
            listener.mailgunBody(
                recipient: Relay.on, message: "5.1.1 <bounce+x@mail.sender.example>: unauthorized sender"))
        #expect(response.status == 200, "\(String(decoding: response.body, as: UTF8.self))")
        let temporary = try listener.post(
            "mailgun",
            listener.mailgunBody(recipient: Relay.off, severity: "temporary", message: "4.2.1 try later"))
        #expect(temporary.status == 200)
        #expect(
            try listener.recorded() == [
                [
                    "sender_unauthorized", "001000.on", "forwarding_on", "5.1.1", "failed",
                    "mail.sender.example", "mailgun",
                ],
                [
                    "transient", "001000.off", "forwarding_off", "4.2.1", "delayed", "mail.sender.example",
                    "mailgun",
                ],
            ])
        #expect(
            listener.metric(
                "siwa_mailgate_esp_bounces_total", #"provider="mailgun",class="sender_unauthorized""#) == 1)
        // The recipient's account is not touched: forwarding stays on, nothing suppressed.
        let owner = try listener.database.connect()
        defer { owner.close() }
        #expect(
            try owner.query("SELECT email_status FROM siwa.accounts WHERE sub = '001000.on'")[0][
                0, as: String?.self]
                == "enabled")
    }

    @Test("Mailgun: a bad signature, an old timestamp and a replayed token are refused; nothing recorded")
    func mailgunRefusals() throws {
        let listener = try Listener(signers: signers.get())
        let forged = try listener.post(
            "mailgun",
            listener.mailgunBody(
                recipient: Relay.on, message: "5.1.1 user not found",
                signature: String(repeating: "0", count: 64)))
        #expect(forged.status == 401)
        let body = String(decoding: forged.body, as: UTF8.self)
        #expect(body == #"{"error":"unauthorized"}"#)
        #expect(!body.contains(Secrets.mailgunKey))
        let old = try listener.post(
            "mailgun",
            listener.mailgunBody(
                recipient: Relay.on, message: "5.1.1 user not found",
                timestamp: Int(Date().timeIntervalSince1970) - 3600))
        #expect(old.status == 401)
        let once = try listener.mailgunBody(
            recipient: Relay.on, message: "5.1.1 user not found", token: "t-once")
        #expect(try listener.post("mailgun", once).status == 200)
        #expect(try listener.post("mailgun", once).status == 401)
        let again = try listener.mailgunBody(
            recipient: Relay.on, message: "5.1.1 user not found", token: "t-once")
        #expect(try listener.post("mailgun", again).status == 401)
        #expect(try listener.recorded().count == 1)
        #expect(
            listener.metric("siwa_mailgate_esp_requests_total", #"provider="mailgun",result="unauthorized""#)
                == 4)
    }

    @Test(
        "SendGrid: a signed batch records its relay bounces; other events and foreign addresses are counted")
    func sendGrid() throws {
        let listener = try Listener(signers: signers.get())
        let response = try listener.sendGrid([
            [
                "event": "bounce", "type": "bounce", "email": Relay.on, "status": "5.1.1",
                "reason": "550 5.1.1 user not found",
            ],
            ["event": "delivered", "email": Relay.on],
            ["event": "deferred", "email": Relay.off, "response": "451 4.7.1 try again later"],
            [
                "event": "bounce", "type": "blocked", "email": Relay.foreign, "status": "5.0.0",
                "reason": "550 no",
            ],
        ])
        #expect(response.status == 200)
        let answer = try JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Int]
        #expect(answer == ["recorded": 2, "ignored": 1, "duplicates": 0, "other_events": 1])
        #expect(
            try listener.recorded().map { [$0[0], $0[1]] } == [
                ["relay_address_dead", "001000.on"], ["transient", "001000.off"],
            ])
        #expect(listener.metric("siwa_mailgate_esp_bounces_ignored_total", #"provider="sendgrid""#) == 1)
        #expect(
            try listener.sendGrid([["event": "bounce", "email": Relay.on, "reason": "x"]], tamper: true)
                .status == 401)
        #expect(try listener.post("sendgrid", Array("[]".utf8)).status == 401)
        #expect(try listener.recorded().count == 2)
    }

    @Test("SendGrid: a batch signed 30 days ago, or an hour ahead, is refused 401 and records nothing")
    func sendGridStale() throws {
        let listener = try Listener(signers: signers.get())
        let now = Int(Date().timeIntervalSince1970)
        let events: [[String: Any]] = [
            [
                "event": "bounce", "email": Relay.on, "sg_event_id": "sg-stale-1",
                "reason": "550 5.7.1 unauthorized sender",
            ]
        ]
        let old = try listener.sendGrid(events, timestamp: now - 30 * 86400)
        #expect(old.status == 401)
        #expect(String(decoding: old.body, as: UTF8.self) == #"{"error":"unauthorized"}"#)
        #expect(try listener.sendGrid(events, timestamp: now + 3600).status == 401)
        #expect(try listener.recorded().isEmpty)
        #expect(
            listener.metric("siwa_mailgate_esp_replays_total", #"provider="sendgrid",reason="stale""#) == 2)
        // Past SendGrid's 24 hours of retries, within the 25-hour bound: a late retry is taken.
        #expect(try listener.sendGrid(events, timestamp: now - 24 * 3600 - 60).status == 200)
        #expect(try listener.recorded().count == 1)
    }

    @Test(
        "SendGrid: the same signed batch posted three times records each event once, answered 200 each time")
    func sendGridDuplicate() throws {
        let listener = try Listener(signers: signers.get())
        let event: [String: Any] = [
            "event": "bounce", "email": Relay.on, "sg_event_id": "sg-dup-1",
            "reason": "550 5.7.1 <bounce+x@mail.sender.example>: unauthorized sender",
            "from": "bounce+x@mail.sender.example",
        ]
        let timestamp = Int(Date().timeIntervalSince1970)
        for _ in 0..<3 {
            #expect(try listener.sendGrid([event], timestamp: timestamp).status == 200)
        }
        #expect(try listener.recorded().map { $0[0] } == ["sender_unauthorized"])
        // A later batch repeating the event beside a new one records only the new one.
        var other = event
        other["sg_event_id"] = "sg-dup-2"
        other["email"] = Relay.off
        let mixed = try listener.sendGrid([event, other])
        let answer = try JSONSerialization.jsonObject(with: Data(mixed.body)) as? [String: Int]
        #expect(answer == ["recorded": 1, "ignored": 0, "duplicates": 1, "other_events": 0])
        #expect(try listener.recorded().count == 2)
        #expect(
            listener.metric("siwa_mailgate_esp_replays_total", #"provider="sendgrid",reason="duplicate""#)
                == 3)
        #expect(
            listener.metric(
                "siwa_mailgate_esp_bounces_total", #"provider="sendgrid",class="sender_unauthorized""#) == 2)
    }

    @Test("SendGrid: a batch refused 503 keeps no event id: the ESP's retry is recorded, once")
    func sendGridRetryAfterUnavailable() throws {
        let listener = try Listener(signers: signers.get())
        let owner = try listener.database.connect()
        defer { owner.close() }
        let function = "siwa.record_relay_bounce(text, text, text, text, text, text, text)"
        let events: [[String: Any]] = [
            ["event": "bounce", "email": Relay.on, "sg_event_id": "sg-retry-1", "reason": "550 5.1.1 no"]
        ]
        let timestamp = Int(Date().timeIntervalSince1970)
        try owner.execute("REVOKE EXECUTE ON FUNCTION \(function) FROM siwa_bounce")
        #expect(try listener.sendGrid(events, timestamp: timestamp).status == 503)
        try owner.execute("GRANT EXECUTE ON FUNCTION \(function) TO siwa_bounce")
        #expect(try listener.sendGrid(events, timestamp: timestamp).status == 200)
        #expect(try listener.sendGrid(events, timestamp: timestamp).status == 200)
        #expect(try listener.recorded().count == 1)
        #expect(
            try owner.query("SELECT provider, event_id FROM siwa.esp_events_seen").map {
                [try $0[0, as: String.self], try $0[1, as: String.self]]
            } == [["sendgrid", "sg-retry-1"]])
    }

    @Test("an event id is kept until it expires, then siwa.prune (as siwa_worker) deletes it")
    func seenIdsPruned() throws {
        let listener = try Listener(signers: signers.get())
        let now = Int(Date().timeIntervalSince1970)
        let events: [[String: Any]] = [
            ["event": "bounce", "email": Relay.on, "sg_event_id": "sg-kept", "reason": "550 5.1.1 no"]
        ]
        #expect(try listener.sendGrid(events, timestamp: now).status == 200)
        let owner = try listener.database.connect()
        defer { owner.close() }
        let keptFor = try owner.query(
            "SELECT extract(epoch FROM expires_at)::bigint FROM siwa.esp_events_seen WHERE event_id = 'sg-kept'"
        )
        #expect(try keptFor.first?[0, as: Int64.self] == Int64(now) + 90_000)
        try owner.execute(
            """
            INSERT INTO siwa.esp_events_seen (provider, event_id, seen_at, expires_at)
            VALUES ('ses', 'sns-expired', now() - interval '26 hours', now() - interval '1 hour')
            """)
        let worker = try listener.database.connect(asMemberOf: "siwa_worker")
        defer { worker.close() }
        _ = try worker.query("SELECT * FROM siwa.prune(NULL, NULL)")
        #expect(
            try owner.query("SELECT event_id FROM siwa.esp_events_seen ORDER BY 1").map {
                try $0[0, as: String.self]
            } == ["sg-kept"])
    }

    @Test("Postmark: a bounce's ID is recorded once")
    func postmarkDuplicate() throws {
        let listener = try Listener(signers: signers.get())
        let bounce: [String: Any] = [
            "RecordType": "Bounce", "Type": "HardBounce", "ID": 4_323_372_036_854_775_807,
            "Email": Relay.off, "Details": "smtp;550 5.1.1 user unknown",
        ]
        #expect(try listener.postmark(bounce).status == 200)
        #expect(try listener.postmark(bounce).status == 200)
        #expect(try listener.recorded().count == 1)
    }

    @Test("Postmark: Basic credentials in the webhook URL; a wrong password is refused")
    func postmark() throws {
        let listener = try Listener(signers: signers.get())
        let bounce: [String: Any] = [
            "RecordType": "Bounce", "Type": "HardBounce", "TypeCode": 1, "Email": Relay.off,
            "From": "news@mail.sender.example", "Details": "smtp;550 5.7.1 Relay not permitted",
            "Description":
                "The server was unable to deliver your message (ex: unknown user, mailbox not found).",
        ]
        #expect(try listener.postmark(bounce, password: "wrong-password-0123").status == 401)
        #expect(try listener.recorded().isEmpty)
        #expect(try listener.postmark(bounce).status == 200)
        var dmarc = bounce
        dmarc["Type"] = "DMARCPolicy"
        dmarc["Details"] = "550 5.7.26 unauthenticated email is not accepted"
        #expect(try listener.postmark(dmarc).status == 200)
        #expect(try listener.postmark(["RecordType": "Delivery", "Email": Relay.off]).status == 200)
        #expect(
            try listener.recorded().map { [$0[0], $0[2], $0[4]] } == [
                ["forwarding_off", "forwarding_off", "failed"], ["auth_failure", "forwarding_off", "failed"],
            ])
    }

    @Test("SES via SNS: signature versions 1 and 2 with the certificate fetched over HTTPS and cached")
    func ses() throws {
        let signers = try signers.get()
        let listener = try Listener(signers: signers)
        try signers.withHTTPSServer { port in
            let certificate = "https://localhost:\(port)/sns-cert.pem"
            let dead = try listener.sns(
                message: Listener.sesBounce(Relay.on, diagnostic: "smtp; 550 5.1.1 user not found"),
                certificateURL: certificate)
            #expect(try listener.post("ses", dead).status == 200)
            let transient = try listener.sns(
                message: Listener.sesBounce(
                    Relay.off, diagnostic: "smtp; 452 4.2.2 mailbox full", type: "Transient", status: "4.2.2"),
                certificateURL: certificate, version: "1")
            #expect(try listener.post("ses", transient).status == 200)
            // Signed by another key than the certificate's: refused.
            let forged = try listener.sns(
                message: Listener.sesBounce(Relay.on, diagnostic: "smtp; 550 5.1.1 user not found"),
                certificateURL: certificate, key: "other.key")
            #expect(try listener.post("ses", forged).status == 401)
            let otherTopic = try listener.sns(
                message: Listener.sesBounce(Relay.on, diagnostic: "x"), certificateURL: certificate,
                topic: "arn:aws:sns:us-east-1:123456789012:other")
            #expect(try listener.post("ses", otherTopic).status == 401)
        }
        #expect(
            try listener.recorded() == [
                [
                    "relay_address_dead", "001000.on", "forwarding_on", "5.1.1", "failed",
                    "mail.sender.example", "ses",
                ],
                [
                    "transient", "001000.off", "forwarding_off", "4.2.2", "delayed", "mail.sender.example",
                    "ses",
                ],
            ])
        #expect(
            listener.metric("siwa_mailgate_esp_requests_total", #"provider="ses",result="accepted""#) == 2)
    }

    @Test("SES via SNS: a message signed 30 days ago is refused 401; a MessageId repeated is recorded once")
    func sesReplays() throws {
        let signers = try signers.get()
        let listener = try Listener(signers: signers)
        try signers.withHTTPSServer { port in
            let certificate = "https://localhost:\(port)/sns-cert.pem"
            let bounce = Listener.sesBounce(Relay.on, diagnostic: "smtp; 550 5.1.1 user not found")
            let old = try listener.sns(
                message: bounce, certificateURL: certificate,
                signedAt: Date(timeIntervalSinceNow: -30 * 86400))
            #expect(try listener.post("ses", old).status == 401)
            let fresh = try listener.sns(message: bounce, certificateURL: certificate, messageID: "sns-dup-1")
            for _ in 0..<3 {
                #expect(try listener.post("ses", fresh).status == 200)
            }
        }
        #expect(try listener.recorded().count == 1)
        #expect(listener.metric("siwa_mailgate_esp_replays_total", #"provider="ses",reason="stale""#) == 1)
        #expect(
            listener.metric("siwa_mailgate_esp_replays_total", #"provider="ses",reason="duplicate""#) == 2)
    }

    @Test("SES via SNS: a certificate URL on a host the pattern does not allow, or over http, is refused")
    func sesDisallowedHost() throws {
        let signers = try signers.get()
        let listener = try Listener(signers: signers)
        try signers.withHTTPSServer { port in
            for url in [
                "https://127.0.0.1:\(port)/sns-cert.pem", "http://localhost:\(port)/sns-cert.pem",
                "https://localhost.attacker.example:\(port)/sns-cert.pem",
                "https://user@localhost:\(port)/sns-cert.pem",
            ] {
                let body = try listener.sns(
                    message: Listener.sesBounce(Relay.on, diagnostic: "smtp; 550 5.1.1 user not found"),
                    certificateURL: url)
                #expect(try listener.post("ses", body).status == 401, "\(url)")
            }
        }
        #expect(try listener.recorded().isEmpty)
        let amazon = SNSVerifier(configuration: .init(topicARNs: [])) { _ in [] }
        #expect(amazon.isAllowedURL("https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-abc.pem"))
        #expect(!amazon.isAllowedURL("https://sns.eu-west-1.amazonaws.com.attacker.example/x.pem"))
        #expect(!amazon.isAllowedURL("https://attacker.example/sns.eu-west-1.amazonaws.com/x.pem"))
        #expect(!amazon.isAllowedURL("http://sns.eu-west-1.amazonaws.com/x.pem"))
    }

    @Test(
        "an SNS SubscriptionConfirmation is verified and answered 200; its SubscribeURL off the pattern is not fetched"
    )
    func subscriptionConfirmation() throws {
        let signers = try signers.get()
        let listener = try Listener(signers: signers)
        try signers.withHTTPSServer { port in
            let body = try listener.sns(
                message: ["note": "confirm"], certificateURL: "https://localhost:\(port)/sns-cert.pem",
                type: "SubscriptionConfirmation", subscribeURL: "https://attacker.example/confirm")
            #expect(try listener.post("ses", body).status == 200)
        }
        #expect(try listener.recorded().isEmpty)
    }

    @Test("an SNS SubscriptionConfirmation on an allowed host is confirmed by a GET of its SubscribeURL")
    func subscriptionConfirmed() throws {
        let signers = try signers.get()
        let listener = try Listener(signers: signers)
        try signers.withHTTPSServer { certificatePort in
            try signers.withConfirmationServer { port, requests in
                let body = try listener.sns(
                    message: ["note": "confirm"],
                    certificateURL: "https://localhost:\(certificatePort)/sns-cert.pem",
                    type: "SubscriptionConfirmation",
                    subscribeURL: "https://localhost:\(port)/?Action=ConfirmSubscription&Token=abc")
                #expect(try listener.post("ses", body).status == 200)
                #expect(
                    waitUntil {
                        (try? String(contentsOf: requests, encoding: .utf8))
                            == "/?Action=ConfirmSubscription&Token=abc\n"
                    })
            }
        }
    }

    @Test("a bounce for an erased account is recorded with nothing readable: the keyed hash only")
    func erasedAccount() throws {
        let listener = try Listener(signers: signers.get())
        let owner = try listener.database.connect()
        defer { owner.close() }
        try owner.execute("UPDATE siwa.accounts SET deleted_at = now() WHERE sub = '001000.gone'")
        try owner.execute("SELECT siwa.erase_personal_data('001000.gone')")
        let response = try listener.post(
            "mailgun", listener.mailgunBody(recipient: Relay.erased, message: "550 5.1.1 user not found"))
        #expect(response.status == 200)
        let rows = try listener.recorded()
        #expect(rows.map { [$0[0], $0[1], $0[2]] } == [["relay_address_dead", nil, "account_deleted"]])
        let readable = try owner.query(
            """
            SELECT count(*) FROM siwa.relay_bounces b
             WHERE position('gone' IN concat_ws(' ', b.class, b.sending_domain, b.sub, b.gate_reason, b.status,
                                                 b.action, b.remote_mta)) > 0
            """)[0][0, as: Int64.self]
        #expect(readable == 0)
    }

    @Test("the database refusing is 503 and forgets the Mailgun token: the ESP's retry is recorded once")
    func unavailable() throws {
        let listener = try Listener(signers: signers.get())
        let owner = try listener.database.connect()
        defer { owner.close() }
        let function = "siwa.record_relay_bounce(text, text, text, text, text, text, text)"
        try owner.execute("REVOKE EXECUTE ON FUNCTION \(function) FROM siwa_bounce")
        let body = try listener.mailgunBody(recipient: Relay.on, message: "550 5.1.1 user not found")
        let refused = try listener.post("mailgun", body)
        #expect(refused.status == 503)
        #expect(refused.value(of: "Retry-After") == "30")
        try owner.execute("GRANT EXECUTE ON FUNCTION \(function) TO siwa_bounce")
        #expect(try listener.post("mailgun", body).status == 200)
        #expect(try listener.post("mailgun", body).status == 401)
        #expect(try listener.recorded().count == 1)
        #expect(
            listener.metric("siwa_mailgate_esp_requests_total", #"provider="mailgun",result="unavailable""#)
                == 1)
    }

    @Test("bad JSON is 400, another method 405, an unknown provider 404")
    func refusals() throws {
        let listener = try Listener(signers: signers.get())
        let credentials = Data("\(Secrets.postmarkUser):\(Secrets.postmarkPassword)".utf8)
            .base64EncodedString()
        let notJSON = try listener.post(
            "postmark", Array("{not json".utf8), headers: [.init("Authorization", "Basic \(credentials)")])
        #expect(notJSON.status == 400)
        #expect(try listener.post("mailgun", Array("[1,2".utf8)).status == 400)
        #expect(try listener.post("sparkpost", Array("{}".utf8)).status == 404)
        let get = try listener.client.perform(.init(url: "http://\(listener.address)/v1/esp/mailgun"))
        #expect(get.status == 405)
        #expect(
            listener.metric("siwa_mailgate_esp_requests_total", #"provider="postmark",result="malformed""#)
                == 1)
    }
}

@Suite("ESP bounce parsing")
struct ESPParsingTests {
    @Test("the enhanced status is read from the reply, else from the action")
    func status() {
        #expect(ESPBounce.status(in: "550 5.1.1 <a@b>: user not found", fallback: "5.0.0") == "5.1.1")
        #expect(ESPBounce.status(in: "550 mailbox unavailable", fallback: "5.0.0") == "5.0.0")
        #expect(ESPBounce.status(in: "version 15.1.10.2 ok", fallback: "4.0.0") == "4.0.0")
    }

    @Test("SES's Undetermined bounces are permanent; other notification types are counted, not recorded")
    func sesTypes() throws {
        let other = try SESNotification.events(message: #"{"notificationType":"Delivery"}"#)
        #expect(other == ESPEventBatch(otherEvents: 1))
        let undetermined = try SESNotification.events(
            message:
                #"{"notificationType":"Bounce","bounce":{"bounceType":"Undetermined","bouncedRecipients":[{"emailAddress":"a@icloud.com"}]}}"#
        )
        #expect(undetermined.bounces.map(\.action) == ["failed"])
        #expect(throws: ESPEventError.self) {
            try SESNotification.events(message: #"{"notificationType":"Bounce"}"#)
        }
    }
}
