import AppleID
import Foundation
import Postgres
import QueueConsumer
import Revoker
import ServiceSupport
import Synchronization
import TestSupport
import Testing
import TokenVault

@Suite("Revocation where features meet: team transfers, Apple's echo, later sign-ins, rows it cannot read")
struct RevocationEdgeTests {
    let helper = RevocationTests()

    /// The newest stored token of `sub`: its row id and the token (decrypted as the revoker would).
    func newestToken(_ fixture: SignInFixture, sub: String) throws -> (id: Int, token: String) {
        let row = try #require(
            try fixture.query(
                "SELECT id, token_ciphertext, token_sha256 FROM siwa.refresh_tokens WHERE sub = $1 ORDER BY id DESC LIMIT 1",
                [.text(sub)]
            ).first)
        let token = try fixture.cipher.decrypt(
            [UInt8](try row[1, as: Data.self]),
            for: TokenCipher.Row(
                clientID: LocalApple.clientID, tokenSHA256: [UInt8](try row[2, as: Data.self])))
        return (try row[0, as: Int.self], token)
    }

    /// `siwa.request_revocation` in the app's own transaction, as siwa_app.
    func requestAsApp(_ fixture: SignInFixture, sub: String) throws -> Int {
        let connection = try PostgresConnection(configuration: fixture.receiver.database)
        defer { connection.close() }
        _ = try connection.simpleQuery("SET ROLE siwa_app")
        return try connection.transaction { connection in
            try connection.query(
                "SELECT siwa.request_revocation($1, 'account deleted in app')", [.text(sub)])[
                    0][0, as: Int.self]
        }
    }

    /// Moves `old` to `new` as a team transfer's rewrite does (as the owner).
    func transfer(_ fixture: SignInFixture, _ old: String, to new: String, id: String = "team-move") throws {
        let outcome = try fixture.query(
            """
            SELECT outcome FROM siwa.apply_sub_transfer($1, ARRAY[$2::text], ARRAY[$3::text],
                                                        ARRAY[NULL::text], ARRAY[NULL::boolean])
            """, [.text(id), .text(old), .text(new)])[0][0, as: String.self]
        #expect(outcome == "applied")
    }

    /// How often the local Apple answered a revoke with 200.
    func revokes(_ fixture: SignInFixture) -> Int {
        fixture.apple.log.components(separatedBy: "POST /auth/revoke 200").count - 1
    }

    @Test(
        "a token stored through the sign-in API before a team transfer is revoked at Apple after it, when the app deletes the account under its new sub"
    )
    func revokedAfterTransfer() throws {
        let fixture = try SignInFixture(notify: false)
        let token = try helper.signIn(fixture, sub: "001.before")
        try transfer(fixture, "001.before", to: "002.after")
        #expect(try fixture.count("SELECT count(*) FROM siwa.refresh_tokens WHERE sub = '002.after'") == 1)
        let id = try requestAsApp(fixture, sub: "002.after")
        #expect(try helper.revoker(fixture).drainOnce() == [Revoker.Outcome(id: id, state: "revoked")])
        // Apple received the revoke: the token is dead there.
        #expect(revokes(fixture) == 1)
        #expect(appleError { _ = try fixture.apple.client().refresh(token: token) }?.code == .invalidGrant)
        let row = try helper.ledger(fixture, id)
        #expect(try row["state", as: String.self] == "revoked")
        #expect(try row["tokens_revoked", as: Int.self] == 1)
        #expect(try row["last_error", as: String?.self] == nil)
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.refresh_tokens WHERE sub = '002.after' AND token_ciphertext IS NOT NULL"
            )
                == 0)
    }

    @Test(
        "a token stored in schema version 4's format (bound to the sub) survives two team transfers: the refresh check reads it and the revoker revokes it"
    )
    func format1AfterTransfers() throws {
        let fixture = try SignInFixture(notify: false)
        let token = try helper.signIn(fixture, sub: "001.v4")
        // The row as version 4's sign-in API stored it: format 1, bound to the sub of that time.
        let format1 = try fixture.cipher.encryptInFormat1(token, sub: "001.v4", clientID: LocalApple.clientID)
        _ = try fixture.query(
            "UPDATE siwa.refresh_tokens SET token_ciphertext = $1 WHERE sub = '001.v4'",
            [.bytes(Data(format1))])
        try transfer(fixture, "001.v4", to: "002.mid", id: "first-move")
        try transfer(fixture, "002.mid", to: "003.now", id: "second-move")
        let revoker = try helper.revoker(fixture)
        #expect(try revoker.checkRefreshTokensOnce(interval: .seconds(86400)).map(\.outcome) == ["valid"])
        let id = try requestAsApp(fixture, sub: "003.now")
        #expect(try revoker.drainOnce() == [Revoker.Outcome(id: id, state: "revoked")])
        #expect(appleError { _ = try fixture.apple.client().refresh(token: token) }?.code == .invalidGrant)
        #expect(try helper.ledger(fixture, id)["tokens_revoked", as: Int.self] == 1)
    }

    @Test(
        "the revoker dies between Apple's 200 and its commit and Apple's echo is applied before the retry: matched at once (the attempt counts from its claim), and the retry keeps it"
    )
    func echoBeforeTheRetry() throws {
        let fixture = try SignInFixture()
        _ = try helper.signIn(fixture, sub: "001.echo")
        let id = try requestAsApp(fixture, sub: "001.echo")
        let owner = try PostgresConnection(configuration: fixture.receiver.database)
        defer { owner.close() }
        _ = try owner.simpleQuery(
            """
            CREATE FUNCTION siwa.test_fail_ledger() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'simulated crash before commit'; END $$;
            CREATE TRIGGER test_fail_ledger BEFORE UPDATE ON siwa.revocation_requests
                FOR EACH ROW WHEN (NEW.state <> 'pending') EXECUTE FUNCTION siwa.test_fail_ledger();
            """)
        let revoker = try helper.revoker(fixture)
        #expect(throws: (any Error).self) { try revoker.drainOnce() }
        // Apple echoes consent-revoked; the worker applies it while the attempt is not recorded.
        #expect(
            try waitUntil(timeout: .seconds(20)) {
                try fixture.count("SELECT count(*) FROM siwa.notifications WHERE sub = '001.echo'") == 1
            })
        try helper.applyNotifications(fixture)
        let pending = try helper.ledger(fixture, id)
        #expect(try pending["state", as: String.self] == "pending")
        #expect(try pending["echo_matched_at", as: Date?.self] != nil)
        _ = try owner.simpleQuery("DROP TRIGGER test_fail_ledger ON siwa.revocation_requests")
        #expect(try revoker.drainOnce() == [Revoker.Outcome(id: id, state: "revoked")])
        let row = try helper.ledger(fixture, id)
        #expect(try row["echo_event_time", as: Date?.self] != nil)
        #expect(try row["echo_matched_at", as: Date?.self] != nil)
        #expect(try row["echo_jti", as: String?.self] != nil)
        // The documented alert (revoked, no echo after an hour) finds nothing.
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.revocation_ledger WHERE state = 'revoked' AND echo_matched_at IS NULL"
            )
                == 0)
    }

    @Test(
        "Apple's echo applied in a transaction still open when the revoker records: the record waits for the account row and matches it"
    )
    func echoAtTheSameMoment() throws {
        let fixture = try SignInFixture(notify: false)
        _ = try helper.signIn(fixture, sub: "001.race")
        let id = try requestAsApp(fixture, sub: "001.race")
        // The worker applying a consent-revoked for the user: the account updated, not yet committed
        // (its echo trigger ran and found no recorded attempt to match).
        let applying = try PostgresConnection(configuration: fixture.receiver.database)
        defer { applying.close() }
        _ = try applying.simpleQuery(
            "BEGIN; UPDATE siwa.accounts SET consent_revoked_at = clock_timestamp() WHERE sub = '001.race'")
        let revoker = try RevocationLeaseTests().revoker(fixture, applicationName: "siwa-test-race-revoker")
        let result = Mutex<[Revoker.Outcome]?>(nil)
        let thread = JoinableThread(name: "race-revoker") {
            let outcomes = try? revoker.drainOnce()
            result.withLock { $0 = outcomes }
        }
        // The record waits for the applying transaction's account row instead of committing without it.
        #expect(
            try waitUntil(timeout: .seconds(20)) {
                try fixture.count(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'siwa-test-race-revoker' AND wait_event_type = 'Lock'"
                ) == 1
            })
        _ = try applying.simpleQuery("COMMIT")
        thread.join()
        #expect(result.withLock { $0 } == [Revoker.Outcome(id: id, state: "revoked")])
        let row = try helper.ledger(fixture, id)
        #expect(try row["echo_matched_at", as: Date?.self] != nil)
        #expect(try row["echo_event_time", as: Date?.self] != nil)
    }

    @Test(
        "the app revoked the token at Apple itself before the revoker ran: Apple's echo, applied first, is matched at the record"
    )
    func echoBeforeTheClaim() throws {
        let fixture = try SignInFixture()
        let token = try helper.signIn(fixture, sub: "001.self")
        let id = try requestAsApp(fixture, sub: "001.self")
        try fixture.apple.client().revoke(token: token)
        #expect(
            try waitUntil(timeout: .seconds(20)) {
                try fixture.count("SELECT count(*) FROM siwa.notifications WHERE sub = '001.self'") == 1
            })
        try helper.applyNotifications(fixture)
        #expect(try helper.revoker(fixture).drainOnce() == [Revoker.Outcome(id: id, state: "revoked")])
        let row = try helper.ledger(fixture, id)
        #expect(try row["echo_matched_at", as: Date?.self] != nil)
        #expect(try row["echo_jti", as: String?.self] != nil)
    }

    @Test(
        "an echo that predates the revoked token is not matched: a consent-revoked before the user signed in again is not Apple's answer"
    )
    func oldConsentNotMatched() throws {
        let fixture = try SignInFixture()
        let first = try helper.signIn(fixture, sub: "001.twice")
        // The user revoked consent long ago (Apple notified; applied), then signed in again.
        try fixture.apple.client().revoke(token: first)
        #expect(
            try waitUntil(timeout: .seconds(20)) {
                try fixture.count("SELECT count(*) FROM siwa.notifications WHERE sub = '001.twice'") == 1
            })
        try helper.applyNotifications(fixture)
        #expect(try fixture.post("/v1/sign-ins", fixture.signInBody(sub: "001.twice")).status == 200)
        // The revoker has nothing to revoke at Apple (the old token's row: revoked, ciphertext kept
        // until now) besides the new token; Apple's echo of this revocation is not applied in this test.
        let id = try requestAsApp(fixture, sub: "001.twice")
        #expect(try helper.revoker(fixture).drainOnce() == [Revoker.Outcome(id: id, state: "revoked")])
        #expect(try helper.ledger(fixture, id)["echo_matched_at", as: Date?.self] == nil)
    }

    @Test(
        "Apple down, the user signs in again, Apple back: the pending request revokes only the token that existed when it was made"
    )
    func onlyTokensAtTheRequest() throws {
        let fixture = try SignInFixture(notify: false)
        _ = try helper.signIn(fixture, sub: "001.again")
        let id = try requestAsApp(fixture, sub: "001.again")
        try fixture.apple.fault(["--fail-with", "503", "--times", "1", "--endpoint", "revoke"])
        let revoker = try helper.revoker(fixture)
        #expect(try revoker.drainOnce() == [Revoker.Outcome(id: id, state: "retry")])
        // The user signs in again (a new account in the app) while the request waits for its retry.
        #expect(try fixture.post("/v1/sign-ins", fixture.signInBody(sub: "001.again")).status == 200)
        let newer = try newestToken(fixture, sub: "001.again")
        #expect(try waitUntil { try revoker.drainOnce() == [Revoker.Outcome(id: id, state: "revoked")] })
        #expect(try helper.ledger(fixture, id)["tokens_revoked", as: Int.self] == 1)
        // Apple was asked to revoke the older token only; the new one's row keeps its ciphertext.
        #expect(revokes(fixture) == 1)
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.refresh_tokens WHERE id = $1 AND token_ciphertext IS NOT NULL AND revoked_at IS NULL",
                [.int(Int64(newer.id))]) == 1)
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.refresh_tokens WHERE sub = '001.again' AND token_ciphertext IS NULL"
            )
                == 1)
    }

    @Test(
        "a row the revoker cannot read (the app's own format) does not stop the rest: every other token is revoked, the row recorded, the request partially_revoked"
    )
    func partiallyRevoked() throws {
        let fixture = try SignInFixture(notify: false)
        // The app stored a token of its own first (its own encryption), as siwa_app may.
        let app = try PostgresConnection(configuration: fixture.receiver.database)
        defer { app.close() }
        _ = try app.simpleQuery("SET ROLE siwa_app")
        _ = try app.query(
            """
            INSERT INTO siwa.refresh_tokens (sub, client_id, token_sha256, token_ciphertext)
            VALUES ('001.mixed', $1, sha256('app-token'::bytea), 'app-own-format:0123456789abcdef0123456789'::bytea)
            """, [.text(LocalApple.clientID)])
        #expect(try fixture.post("/v1/sign-ins", fixture.signInBody(sub: "001.mixed")).status == 200)
        let token = try newestToken(fixture, sub: "001.mixed").token
        let id = try requestAsApp(fixture, sub: "001.mixed")
        #expect(
            try helper.revoker(fixture).drainOnce() == [Revoker.Outcome(id: id, state: "partially_revoked")])
        #expect(appleError { _ = try fixture.apple.client().refresh(token: token) }?.code == .invalidGrant)
        let row = try helper.ledger(fixture, id)
        #expect(try row["state", as: String.self] == "partially_revoked")
        #expect(try row["tokens_revoked", as: Int.self] == 1)
        #expect(try row["tokens_not_revoked", as: Int.self] == 1)
        #expect(try row["last_error", as: String.self].contains("not in the service's format"))
        // Per row: which token, what became of it; no ciphertext, token or key material.
        let outcomes = try fixture.query(
            """
            SELECT o->>'outcome', (o->>'service_format')::boolean, o->>'detail'
              FROM siwa.revocation_ledger l, jsonb_array_elements(l.token_outcomes) AS o
             WHERE l.id = $1 ORDER BY (o->>'token_id')::bigint
            """, [.int(Int64(id))])
        #expect(try outcomes.map { try $0[0, as: String.self] } == ["not_service_format", "revoked"])
        #expect(try outcomes.map { try $0[1, as: Bool.self] } == [false, true])
        #expect(try !outcomes[0][2, as: String.self].contains("app-own-format"))
        // The row the revoker could not read keeps its ciphertext (the app's to revoke); the other is gone.
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.refresh_tokens WHERE sub = '001.mixed' AND token_ciphertext IS NOT NULL AND NOT service_format"
            ) == 1)
        // Only the service's own write path marks a row as its format: the app may not.
        #expect(throws: PostgresError.self) {
            try app.query(
                "INSERT INTO siwa.refresh_tokens (sub, client_id, token_ciphertext, service_format) VALUES ('001.x', 'c', '\\x00', true)"
            )
        }
    }

    @Test(
        "a service-format row whose key is gone and one whose client is not configured are recorded per row; the rest is revoked"
    )
    func undecryptableAndNoClient() throws {
        let fixture = try SignInFixture(clientIDs: [LocalApple.clientID, "com.example.web"], notify: false)
        _ = try helper.signIn(fixture, sub: "001.rows")
        // A second row in the service's format made with a key the revoker does not hold.
        let stranger = try TokenCipher(
            keyFile: writeKeyFile([("gone", randomKey())], in: fixture.apple.directory))
        let lost = try stranger.encrypt("r.lost", clientID: LocalApple.clientID)
        _ = try fixture.query(
            """
            INSERT INTO siwa.refresh_tokens (sub, client_id, token_sha256, token_ciphertext, service_format)
            VALUES ('001.rows', $1, sha256('r.lost'::bytea), $2, true),
                   ('001.rows', 'com.example.unknown', sha256('r.other'::bytea), $2, true)
            """, [.text(LocalApple.clientID), .bytes(Data(lost))])
        let id = try requestAsApp(fixture, sub: "001.rows")
        #expect(
            try helper.revoker(fixture).drainOnce() == [Revoker.Outcome(id: id, state: "partially_revoked")])
        let outcomes = try fixture.query(
            """
            SELECT o->>'outcome' FROM siwa.revocation_ledger l, jsonb_array_elements(l.token_outcomes) AS o
             WHERE l.id = $1 ORDER BY (o->>'token_id')::bigint
            """, [.int(Int64(id))]
        ).map { try $0[0, as: String.self] }
        #expect(outcomes == ["revoked", "undecryptable", "no_client"])
        let row = try helper.ledger(fixture, id)
        #expect(try row["tokens_revoked", as: Int.self] == 1)
        #expect(try row["tokens_not_revoked", as: Int.self] == 2)
    }
}
