import AppleNotifications
import Foundation
import Postgres
import TestSupport
import Testing

/// The relay-mail gate's group role.
private let mailRole = "siwa_mail"

/// One answer of the gate.
private struct Answer: Equatable, CustomStringConvertible {
    var decision: String
    var reason: String
    var since: Date?

    var description: String { "\(decision)/\(reason) since \(since.map { "\($0)" } ?? "NULL")" }
}

/// Asks `siwa.relay_mail_decision` as a member of siwa_mail, as the gate does.
private func decide(_ database: AdminDatabase, _ address: String?) throws -> Answer {
    let mail = try database.connect(asMemberOf: mailRole)
    defer { mail.close() }
    let rows = try mail.query(
        "SELECT decision, reason, since FROM siwa.relay_mail_decision($1)", [address.map(PostgresData.text)])
    #expect(rows.count == 1)
    let row = try #require(rows.first)
    return Answer(
        decision: try row[0, as: String.self], reason: try row[1, as: String.self],
        since: try row[2, as: Date?.self])
}

/// Asks `siwa.relay_mail_decisions` as a member of siwa_mail: (ord, address, decision, reason) per row.
private func decideAll(_ database: AdminDatabase, _ addresses: [String?]) throws -> [(
    ord: Int, address: String?, answer: Answer
)] {
    let mail = try database.connect(asMemberOf: mailRole)
    defer { mail.close() }
    return try mail.query(
        "SELECT ord, address, decision, reason, since FROM siwa.relay_mail_decisions($1::text[])",
        [.array(addresses.map { $0.map(PostgresData.text) })]
    ).map { row in
        (
            try row[0, as: Int.self], try row[1, as: String?.self],
            Answer(
                decision: try row[2, as: String.self], reason: try row[3, as: String.self],
                since: try row[4, as: Date?.self])
        )
    }
}

/// Stores notifications the way siwa-receiver does, then runs the worker's SQL entry point as the worker.
private func deliver(_ database: AdminDatabase, _ notifications: [SeededNotification]) throws {
    let owner = try database.connectAsOwner()
    defer { owner.close() }
    try owner.storeAsReceiver(notifications)
    let worker = try database.connect(as: .worker)
    defer { worker.close() }
    let outcomes = try worker.transaction { connection in
        try connection.query("SELECT outcome FROM siwa.process_due_notifications(100, 5, interval '1 ms')")
            .map { try $0[0, as: String.self] }
    }
    #expect(outcomes.allSatisfy { $0 == "applied" }, "\(outcomes)")
}

/// A notification of `type` for `sub` that happened `ago` seconds before now.
private func event(
    _ jti: String, _ type: String, _ sub: String, email: String? = nil, ago: TimeInterval
) -> SeededNotification {
    SeededNotification(
        jti: jti, type: type, sub: sub, email: email, isPrivateEmail: email.map { _ in true },
        eventTime: Date().addingTimeInterval(-ago))
}

/// Records a sign-in through the sign-in API's functions, as siwa_signin.
private func signIn(_ database: AdminDatabase, sub: String, email: String?, code: String) throws {
    let signin = try database.connect(as: .signin)
    defer { signin.close() }
    _ = try signin.query(
        "SELECT siwa.begin_sign_in(sha256($1::bytea), 'com.example.app', $2)", [.text(code), .text(sub)])
    try signin.transaction { connection in
        _ = try connection.query(
            """
            SELECT siwa.record_sign_in(sha256($1::bytea), 'com.example.app', $2, $3, $4, true, 2, NULL, NULL)
            """, [.text(code), .text(sub), email.map(PostgresData.text), .bool(true)])
    }
}

/// Whether two instants are the same to the millisecond (event_time's precision).
private func same(_ a: Date?, _ b: Date?) -> Bool {
    guard let a, let b else { return a == nil && b == nil }
    return abs(a.timeIntervalSince(b)) < 0.002
}

@Suite("The relay-mail gate: siwa.relay_mail_decision(s) as siwa_mail asks it")
struct RelayMailDecisionTests {
    @Test("forwarding off blocks, forwarding on and never turned off allow, each since its event")
    func decisionsFromEmailEvents() throws {
        let database = try AdminDatabase.make()
        let off = event(
            "off", "email-disabled", "001000.off", email: "off@privaterelay.appleid.com", ago: 3600)
        let on = event("on", "email-enabled", "001000.on", email: "on@private.icloud.com", ago: 1800)
        try deliver(database, [off, on])
        try signIn(database, sub: "001000.new", email: "new@privaterelay.appleid.com", code: "c-new")

        let blocked = try decide(database, "off@privaterelay.appleid.com")
        #expect(blocked.decision == "block" && blocked.reason == "forwarding_off")
        #expect(same(blocked.since, off.notification.eventTime), "\(blocked)")
        let allowed = try decide(database, "on@private.icloud.com")
        #expect(allowed.decision == "allow" && allowed.reason == "forwarding_on")
        #expect(same(allowed.since, on.notification.eventTime), "\(allowed)")
        #expect(
            try decide(database, "new@privaterelay.appleid.com")
                == Answer(decision: "allow", reason: "never_turned_off", since: nil))
    }

    @Test("unknown: not ours, looks like relay (each of Apple's domains), malformed")
    func unknownAddresses() throws {
        let database = try AdminDatabase.make()
        #expect(
            try decide(database, "someone@example.com") == Answer(decision: "unknown", reason: "not_ours"))
        for domain in ["privaterelay.appleid.com", "Private.iCloud.com", "ICLOUD.COM"] {
            #expect(
                try decide(database, "nobody@\(domain)")
                    == Answer(decision: "unknown", reason: "looks_like_relay"), "\(domain)")
        }
        // A subdomain is not one of Apple's domains.
        #expect(
            try decide(database, "x@mail.icloud.com.example")
                == Answer(decision: "unknown", reason: "not_ours"))
        for malformed in [
            nil, "", "plain", "@example.com", "a@", "a@b@c", "a b@example.com", "a@exa\tmple.com",
            " a@example.com", String(repeating: "a", count: 320) + "@example.com",
        ] as [String?] {
            #expect(
                try decide(database, malformed) == Answer(decision: "unknown", reason: "malformed"),
                "\(String(describing: malformed))")
        }
    }

    @Test("the domain matches in any case, the local part only exactly")
    func caseOfDomainAndLocalPart() throws {
        let database = try AdminDatabase.make()
        try deliver(
            database,
            [event("m", "email-disabled", "001000.case", email: "Ab.Cd@PrivateRelay.AppleID.com", ago: 60)])
        #expect(try decide(database, "Ab.Cd@privaterelay.appleid.com").reason == "forwarding_off")
        #expect(try decide(database, "Ab.Cd@PRIVATERELAY.APPLEID.COM").reason == "forwarding_off")
        #expect(try decide(database, "ab.cd@privaterelay.appleid.com").reason == "looks_like_relay")
        #expect(try decide(database, "AB.CD@privaterelay.appleid.com").reason == "looks_like_relay")
    }

    @Test("the latest email event by event_time decides, whatever the order they arrive in")
    func outOfOrderEvents() throws {
        let database = try AdminDatabase.make()
        let a = "late.enable@privaterelay.appleid.com"
        let b = "late.disable@privaterelay.appleid.com"
        // Enabled after disabled, in order; then a disable older than both arrives: still on.
        let disabled = event("a1", "email-disabled", "001000.a", email: a, ago: 7200)
        let enabled = event("a2", "email-enabled", "001000.a", email: a, ago: 3600)
        try deliver(database, [disabled])
        #expect(try decide(database, a).reason == "forwarding_off")
        try deliver(database, [enabled])
        try deliver(database, [event("a3", "email-disabled", "001000.a", email: a, ago: 10_800)])
        let on = try decide(database, a)
        #expect(on.reason == "forwarding_on" && same(on.since, enabled.notification.eventTime), "\(on)")
        // The reverse: a disable after an enable, then an older enable arrives late: still off.
        let later = event("b2", "email-disabled", "001000.b", email: b, ago: 3600)
        try deliver(database, [event("b1", "email-enabled", "001000.b", email: b, ago: 7200), later])
        try deliver(database, [event("b3", "email-enabled", "001000.b", email: b, ago: 10_800)])
        let off = try decide(database, b)
        #expect(off.reason == "forwarding_off" && same(off.since, later.notification.eventTime), "\(off)")
    }

    @Test("a new relay address replaces the old one: the old one is no longer ours")
    func addressChange() throws {
        let database = try AdminDatabase.make()
        try deliver(
            database,
            [event("c1", "email-enabled", "001000.c", email: "old.c@privaterelay.appleid.com", ago: 7200)])
        try deliver(
            database,
            [event("c2", "email-disabled", "001000.c", email: "new.c@private.icloud.com", ago: 3600)])
        #expect(try decide(database, "new.c@private.icloud.com").reason == "forwarding_off")
        #expect(try decide(database, "old.c@privaterelay.appleid.com").reason == "looks_like_relay")
    }

    @Test("after a team transfer the new team's address answers, the old team's is no longer ours")
    func teamTransfer() throws {
        let database = try AdminDatabase.make()
        try deliver(
            database,
            [event("t1", "email-disabled", "old.team", email: "oldteam@privaterelay.appleid.com", ago: 3600)])
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        #expect(
            try applyTransfer(owner, [("old.team", "new.team", "newteam@privaterelay.appleid.com", true)])
                == ["old.team": "applied"])
        #expect(try decide(database, "oldteam@privaterelay.appleid.com").reason == "looks_like_relay")
        // The account keeps its forwarding state under the new sub and address.
        #expect(try decide(database, "newteam@privaterelay.appleid.com").reason == "forwarding_off")
        // A late event under the old sub follows the account's current address.
        try deliver(
            database,
            [event("t2", "email-enabled", "old.team", email: "newteam@privaterelay.appleid.com", ago: 60)])
        #expect(try decide(database, "newteam@privaterelay.appleid.com").reason == "forwarding_on")
        #expect(try decide(database, "oldteam@privaterelay.appleid.com").reason == "looks_like_relay")
    }

    @Test(
        "a deleted account blocks; once erased its addresses are kept only as a keyed hash, and still block")
    func deletionAndErasure() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        // Delayed erasure first: the deleted account still holds its address.
        try owner.execute("UPDATE siwa.settings SET erase_personal_data_after = interval '1 day'")
        let first = "First.Address@privaterelay.appleid.com"
        let current = "Current.Address@PrivateRelay.appleid.com"
        try deliver(database, [event("d1", "email-enabled", "001000.d", email: first, ago: 7200)])
        try deliver(database, [event("d2", "email-disabled", "001000.d", email: current, ago: 3600)])
        let deletion = event("d3", "account-delete", "001000.d", ago: 1800)
        try deliver(database, [deletion])
        let deleted = try decide(database, current)
        #expect(deleted.decision == "block" && deleted.reason == "account_deleted")
        #expect(same(deleted.since, deletion.notification.eventTime), "\(deleted)")
        #expect(try decide(database, first).reason == "looks_like_relay")  // replaced before the deletion

        // The erasure (the worker's maintenance pass).
        try owner.execute("UPDATE siwa.settings SET erase_personal_data_after = interval '0'")
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        #expect(try worker.query("SELECT siwa.erase_due_personal_data(10)")[0][0, as: Int.self] == 1)
        for address in [
            current, first,
            current.lowercased().replacingOccurrences(of: "current.address", with: "Current.Address"),
        ] {
            let answer = try decide(database, address)
            #expect(answer.decision == "block" && answer.reason == "account_deleted", "\(address): \(answer)")
            #expect(same(answer.since, deletion.notification.eventTime), "\(answer)")
        }
        #expect(try decide(database, "current.address@privaterelay.appleid.com").reason == "looks_like_relay")

        // No table of schema siwa holds either address in any case, the hashes aside.
        let tables = try owner.query(
            """
            SELECT c.oid::regclass::text FROM pg_class c
             WHERE c.relnamespace = 'siwa'::regnamespace AND c.relkind = 'r' ORDER BY 1
            """
        ).map { try $0[0, as: String.self] }
        #expect(tables.contains("siwa.erased_mail_addresses") && tables.contains("siwa.accounts"))
        for table in tables {
            for address in [first, current] {
                let holding = try owner.query(
                    "SELECT count(*)::bigint FROM \(table) t WHERE lower(t::text) LIKE '%' || lower($1) || '%'",
                    [.text(address)])[0][0, as: Int.self]
                #expect(holding == 0, "\(table) holds \(address)")
            }
        }
        #expect(
            try owner.query("SELECT count(*)::bigint FROM siwa.erased_mail_addresses")[0][0, as: Int.self]
                == 2)
    }

    @Test("an account erased in the deletion's own transaction blocks too")
    func erasedAtOnce() throws {
        let database = try AdminDatabase.make()
        let address = "gone@privaterelay.appleid.com"
        try deliver(
            database,
            [
                event("e1", "email-enabled", "001000.e", email: address, ago: 600),
                event("e2", "account-delete", "001000.e", ago: 300),
            ])
        #expect(try decide(database, address).reason == "account_deleted")
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        #expect(
            try owner.query("SELECT count(*)::bigint FROM siwa.accounts WHERE email IS NOT NULL")[0][
                0, as: Int.self]
                == 0)
    }

    @Test(
        "consent-revoked allows by default; with the setting at block it blocks until forwarding or a sign-in"
    )
    func consentRevokedSetting() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let address = "revoked@privaterelay.appleid.com"
        #expect(
            try owner.query("SELECT relay_mail_after_consent_revoked FROM siwa.settings")[0][
                0, as: String.self]
                == "allow")
        let revoked = event("r2", "consent-revoked", "001000.r", ago: 3600)
        try deliver(database, [event("r1", "email-enabled", "001000.r", email: address, ago: 7200), revoked])
        #expect(try decide(database, address).reason == "forwarding_on")

        try owner.execute("UPDATE siwa.settings SET relay_mail_after_consent_revoked = 'block'")
        let blocked = try decide(database, address)
        #expect(blocked.decision == "block" && blocked.reason == "consent_revoked", "\(blocked)")
        #expect(same(blocked.since, revoked.notification.eventTime))
        // Forwarding turned off still says so first.
        try deliver(database, [event("r3", "email-disabled", "001000.r", email: address, ago: 1800)])
        #expect(try decide(database, address).reason == "forwarding_off")
        try deliver(database, [event("r4", "email-enabled", "001000.r", email: address, ago: 900)])
        #expect(try decide(database, address).reason == "forwarding_on")

        // A user who revoked and signed in again is mailed again.
        try signIn(database, sub: "001000.s", email: "back@privaterelay.appleid.com", code: "c-s1")
        try deliver(database, [event("s1", "consent-revoked", "001000.s", ago: 0)])
        #expect(try decide(database, "back@privaterelay.appleid.com").reason == "consent_revoked")
        try signIn(database, sub: "001000.s", email: nil, code: "c-s2")
        #expect(try decide(database, "back@privaterelay.appleid.com").reason == "never_turned_off")

        #expect(
            sqlState {
                try owner.execute("UPDATE siwa.settings SET relay_mail_after_consent_revoked = 'maybe'")
            }
                == "23514")
    }

    @Test("the bulk form answers every element in order, NULLs and duplicates kept, as the single form does")
    func bulkKeepsOrder() throws {
        let database = try AdminDatabase.make()
        try deliver(
            database,
            [event("k1", "email-disabled", "001000.k", email: "k@privaterelay.appleid.com", ago: 60)])
        let input: [String?] = [
            "z@example.com", nil, "k@privaterelay.appleid.com", "junk", "k@PRIVATERELAY.appleid.com", nil,
            "z@example.com", "y@icloud.com",
        ]
        let rows = try decideAll(database, input)
        #expect(rows.map(\.ord) == Array(1...input.count))
        #expect(rows.map(\.address) == input)
        #expect(
            rows.map(\.answer.reason) == [
                "not_ours", "malformed", "forwarding_off", "malformed", "forwarding_off", "malformed",
                "not_ours",
                "looks_like_relay",
            ])
        for (row, address) in zip(rows, input) {
            #expect(try decide(database, address) == row.answer)
        }
        #expect(try decideAll(database, []).isEmpty)
    }

    @Test("10,001 addresses in one call are answered (the HTTP layer is what limits a request to 10,000)")
    func tenThousandAndOne() throws {
        let database = try AdminDatabase.make()
        try deliver(
            database,
            [event("n1", "email-enabled", "001000.n", email: "n5000@privaterelay.appleid.com", ago: 60)])
        let input = (1...10_001).map { "n\($0)@privaterelay.appleid.com" }
        let rows = try decideAll(database, input)
        #expect(rows.count == 10_001)
        #expect(rows.map(\.ord) == Array(1...10_001))
        #expect(rows[4999].answer.reason == "forwarding_on")
        #expect(rows.filter { $0.answer.reason == "looks_like_relay" }.count == 10_000)
    }

    @Test("siwa_mail calls the two functions and nothing else: no table, view, sequence, function or CREATE")
    func siwaMailMayDoNothingElse() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let mail = try database.connect(asMemberOf: mailRole)
        defer { mail.close() }
        let login = try database.loginRole(memberOf: mailRole)
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
             ORDER BY 1
            """, [.text(login)]
        ).map { try $0[0, as: String.self] }
        #expect(functions == ["siwa.relay_mail_decision(text)", "siwa.relay_mail_decisions(text[])"])
        #expect(
            try owner.query("SELECT has_schema_privilege($1, 'siwa', 'CREATE')", [.text(login)])[0][
                0, as: Bool.self] == false)
        for sql in [
            "SELECT count(*) FROM siwa.accounts", "SELECT count(*) FROM siwa.erased_mail_addresses",
            "SELECT * FROM siwa.mail_address_hash_key", "SELECT count(*) FROM siwa.account_overview",
            "SELECT siwa.mail_address_key('a@b')", "SELECT siwa.current_sub('x')",
            "SELECT siwa.remember_erased_mail_addresses(ARRAY['a@b'], ARRAY[now()])",
            "CREATE TABLE siwa.planted (x int)",
            "CREATE FUNCTION siwa.apple_relay_domains_2() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        ] {
            #expect(sqlState { _ = try mail.query(sql) } == permissionDenied, "\(sql)")
        }
    }

    @Test("objects planted on siwa_mail's search_path change none of its answers")
    func searchPathTricks() throws {
        let database = try AdminDatabase.make()
        try deliver(
            database,
            [event("p1", "email-disabled", "001000.p", email: "p@privaterelay.appleid.com", ago: 60)])
        let input = ["p@PrivateRelay.appleid.com", "q@icloud.com", "r@example.com", "junk"]
        let before = try decideAll(database, input).map(\.answer)
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.simpleQuery(
            """
            CREATE SCHEMA planted;
            CREATE FUNCTION planted.lower(text) RETURNS text LANGUAGE sql AS 'SELECT ''planted''';
            CREATE FUNCTION planted.split_part(text, text, integer) RETURNS text LANGUAGE sql AS 'SELECT ''x''';
            CREATE FUNCTION planted.textregexeq(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT false';
            CREATE OPERATOR planted.~ (LEFTARG = text, RIGHTARG = text, FUNCTION = planted.textregexeq);
            CREATE TABLE planted.accounts (sub text, email text);
            CREATE FUNCTION planted.sha256(bytea) RETURNS bytea LANGUAGE sql AS 'SELECT ''\\x00''::bytea';
            GRANT USAGE ON SCHEMA planted TO PUBLIC;
            GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA planted TO PUBLIC;
            GRANT SELECT ON planted.accounts TO PUBLIC;
            """)
        let mail = try database.connect(asMemberOf: mailRole)
        defer { mail.close() }
        try mail.simpleQuery("SET search_path = planted, pg_catalog, siwa")
        let after = try mail.query(
            "SELECT decision, reason, since FROM siwa.relay_mail_decisions($1::text[])",
            [.array(input.map { .text($0) })]
        ).map {
            Answer(
                decision: try $0[0, as: String.self], reason: try $0[1, as: String.self],
                since: try $0[2, as: Date?.self])
        }
        #expect(after == before)
        #expect(before.map(\.reason) == ["forwarding_off", "looks_like_relay", "not_ours", "malformed"])
    }

    @Test("HMAC-SHA-256 in SQL matches RFC 4231, and the database's key is one random 64-byte key")
    func hmacAndKey() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let vectors: [(key: String, data: String, mac: String)] = [
            (
                String(repeating: "0b", count: 20), "4869205468657265",
                "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
            ),
            (
                "4a656665", "7768617420646f2079612077616e7420666f72206e6f7468696e673f",
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
            ),
            (
                String(repeating: "aa", count: 131),
                "54657374205573696e67204c6172676572205468616e20426c6f636b2d53697a65204b6579202d2048617368204b6579204669727374",
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
            ),
        ]
        for vector in vectors {
            #expect(
                try owner.query(
                    "SELECT encode(siwa.hmac_sha256(decode($1, 'hex'), decode($2, 'hex')), 'hex')",
                    [.text(vector.key), .text(vector.data)])[0][0, as: String.self] == vector.mac)
        }
        // inner XOR outer is 0x36 XOR 0x5c in every byte: the two pads of one key.
        #expect(
            try owner.query(
                """
                SELECT count(*)::bigint FROM siwa.mail_address_hash_key k, generate_series(0, 63) i
                 WHERE get_byte(k.inner_pad, i) # get_byte(k.outer_pad, i) = 106
                """)[0][0, as: Int.self] == 64)
        // Applying schema.sql again keeps the key.
        let before = try owner.query("SELECT encode(inner_pad, 'hex') FROM siwa.mail_address_hash_key")[0][
            0, as: String.self]
        try TestSchema.apply(on: owner)
        #expect(
            try owner.query("SELECT encode(inner_pad, 'hex') FROM siwa.mail_address_hash_key")[0][
                0, as: String.self]
                == before)
    }
}
