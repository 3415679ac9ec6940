import Foundation
import Postgres
import TestSupport
import Testing

/// siwactl mail bounce's group role.
private let bounceRole = "siwa_bounce"

/// A database where Apple said forwarding off for one relay address and on for another.
private func bounceDatabase() throws -> AdminDatabase {
    let database = try AdminDatabase.make()
    let owner = try database.connectAsOwner()
    defer { owner.close() }
    let now = Date()
    try owner.storeAsReceiver(
        [
            ("b1", "email-disabled", "001000.off", "off@privaterelay.appleid.com"),
            ("b2", "email-enabled", "001000.on", "on@privaterelay.appleid.com"),
        ].enumerated().map { index, event in
            SeededNotification(
                jti: event.0, type: event.1, sub: event.2, email: event.3, isPrivateEmail: true,
                eventTime: now.addingTimeInterval(Double(index) - 600))
        })
    let worker = try database.connect(as: .worker)
    defer { worker.close() }
    try worker.transaction { connection in
        _ = try connection.query("SELECT * FROM siwa.process_due_notifications(100, 5, interval '1 ms')")
    }
    return database
}

/// Records one bounced recipient as siwa_bounce: (recorded, gate_reason, account_matched).
private func record(
    _ connection: PostgresConnection, _ bounceClass: String, _ recipient: String,
    domain: String? = "Mail.Sender.Example",
    status: String = "5.1.1"
) throws -> (Bool, String?, Bool) {
    let row = try connection.query(
        "SELECT recorded, gate_reason, account_matched FROM siwa.record_relay_bounce($1, $2, $3, $4, 'failed', 'mx.privaterelay.appleid.com')",
        [.text(bounceClass), .text(recipient), domain.map(PostgresData.text), .text(status)])[0]
    return (try row[0, as: Bool.self], try row[1, as: String?.self], try row[2, as: Bool.self])
}

@Suite("siwa.relay_bounces: relay bounces recorded by siwa_bounce as keyed hashes, read by admins")
struct RelayBounceTests {
    @Test("relay addresses are recorded with the account and the gate's reason; foreign ones are not")
    func records() throws {
        let database = try bounceDatabase()
        let bounce = try database.connect(asMemberOf: bounceRole)
        defer { bounce.close() }
        #expect(
            try record(bounce, "relay_address_dead", "off@privaterelay.appleid.com") == (
                true, "forwarding_off", true
            ))
        #expect(
            try record(bounce, "relay_address_dead", "on@PrivateRelay.AppleID.com") == (
                true, "forwarding_on", true
            ))
        #expect(
            try record(bounce, "sender_unauthorized", "new@privaterelay.appleid.com") == (
                true, "looks_like_relay", false
            ))
        #expect(try record(bounce, "other", "someone@example.com") == (false, "not_ours", false))
        #expect(try record(bounce, "other", "not an address") == (false, "malformed", false))

        let admin = try database.connect(as: .admin)
        defer { admin.close() }
        let history = try admin.query(
            """
            SELECT class, sending_domain, sub, gate_reason, account_state, matches_apple_events
              FROM siwa.relay_bounce_history ORDER BY id
            """
        ).map { row in
            [
                try row[0, as: String?.self], try row[1, as: String?.self], try row[2, as: String?.self],
                try row[3, as: String?.self], try row[4, as: String?.self],
                try row[5, as: Bool?.self].map { "\($0)" },
            ]
        }
        #expect(
            history == [
                [
                    "relay_address_dead", "mail.sender.example", "001000.off", "forwarding_off",
                    "forwarding_off", "true",
                ],
                [
                    "relay_address_dead", "mail.sender.example", "001000.on", "forwarding_on",
                    "forwarding_on", "false",
                ],
                ["sender_unauthorized", "mail.sender.example", nil, "looks_like_relay", nil, nil],
            ])
        let counts = try admin.query("SELECT class, total, last_24h FROM siwa.relay_bounce_counts").map {
            "\(try $0[0, as: String.self])=\(try $0[1, as: Int.self])/\(try $0[2, as: Int.self])"
        }
        #expect(
            counts == [
                "sender_unauthorized=1/1", "relay_address_dead=2/2", "forwarding_off=0/0", "auth_failure=0/0",
                "transient=0/0", "other=0/0",
            ])
    }

    @Test("no address is kept: the recipient is the gate's keyed hash, and erasure leaves it so")
    func keyedHashOnly() throws {
        let database = try bounceDatabase()
        let bounce = try database.connect(asMemberOf: bounceRole)
        defer { bounce.close() }
        _ = try record(bounce, "relay_address_dead", "off@privaterelay.appleid.com")
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let stored = try owner.query(
            """
            SELECT b.recipient_hmac = siwa.hmac_sha256_padded(h.inner_pad, h.outer_pad,
                                                              convert_to('off@privaterelay.appleid.com', 'UTF8')),
                   position('@' IN concat_ws(' ', b.class, b.sending_domain, b.sub, b.gate_reason, b.status,
                                              b.action, b.remote_mta)) > 0
              FROM siwa.relay_bounces b, siwa.mail_address_hash_key h
            """)[0]
        #expect(try stored[0, as: Bool.self])
        #expect(try stored[1, as: Bool.self] == false)
        try owner.execute("UPDATE siwa.accounts SET deleted_at = now() WHERE sub = '001000.off'")
        try owner.execute("SELECT siwa.erase_personal_data('001000.off')")
        let admin = try database.connect(as: .admin)
        defer { admin.close() }
        let after = try admin.query("SELECT account_state, sub FROM siwa.relay_bounce_history")[0]
        #expect(try after[0, as: String?.self] == "deleted")
        #expect(try after[1, as: String?.self] == "001000.off")
        // The same address bounced again after the erasure: the gate still knows it, as erased.
        #expect(
            try record(bounce, "relay_address_dead", "off@privaterelay.appleid.com") == (
                true, "account_deleted", false
            ))
    }

    @Test("siwa_bounce records and does nothing else; siwa_admin reads the two views, never the table")
    func privileges() throws {
        let database = try bounceDatabase()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let login = try database.loginRole(memberOf: bounceRole)
        let relations = try owner.query(
            """
            SELECT c.oid::regclass::text FROM pg_class c
             WHERE c.relnamespace = 'siwa'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
               AND (has_table_privilege($1, c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
                    OR has_any_column_privilege($1, c.oid, 'SELECT, INSERT, UPDATE, REFERENCES'))
            """, [.text(login)]
        ).map { try $0[0, as: String.self] }
        #expect(relations == [])
        let functions = try owner.query(
            """
            SELECT p.oid::regprocedure::text FROM pg_proc p
             WHERE p.pronamespace = 'siwa'::regnamespace AND has_function_privilege($1, p.oid, 'EXECUTE')
            """, [.text(login)]
        ).map { try $0[0, as: String.self] }
        #expect(
            functions.sorted() == [
                "siwa.record_esp_event(text,text,timestamp with time zone)",
                "siwa.record_relay_bounce(text,text,text,text,text,text,text)",
            ])
        let bounce = try database.connect(asMemberOf: bounceRole)
        defer { bounce.close() }
        for sql in [
            "SELECT count(*) FROM siwa.relay_bounces", "SELECT count(*) FROM siwa.relay_bounce_history",
            "SELECT * FROM siwa.relay_mail_decision('off@privaterelay.appleid.com')",
        ] {
            #expect(sqlState { _ = try bounce.query(sql) } == permissionDenied, "\(sql)")
        }
        let admin = try database.connect(as: .admin)
        defer { admin.close() }
        #expect(
            sqlState { _ = try admin.query("SELECT count(*) FROM siwa.relay_bounces") } == permissionDenied)
        #expect(sqlState { _ = try admin.query("SELECT count(*) FROM siwa.relay_bounce_counts") } == nil)
        #expect(
            sqlState {
                _ = try admin.query(
                    "SELECT siwa.record_relay_bounce('other', 'a@icloud.com', NULL, '5.0.0', 'failed', NULL)")
            }
                == permissionDenied)
    }

    @Test("an unknown class is refused by the table")
    func classChecked() throws {
        let database = try bounceDatabase()
        let bounce = try database.connect(asMemberOf: bounceRole)
        defer { bounce.close() }
        #expect(sqlState { _ = try record(bounce, "hard_bounce", "off@privaterelay.appleid.com") } == "23514")
    }
}
