import AppleID
import Foundation
import Postgres
import QueueConsumer
import Revoker
import SignIn
import TestSupport
import Testing
import TokenVault

@Suite("Revocation as a transactional outbox")
struct RevocationTests {
    /// A revoker for the fixture's database, clients and key file (or `cipher`).
    func revoker(_ fixture: SignInFixture, cipher: TokenCipher? = nil) throws -> Revoker {
        try Revoker(
            configuration: Revoker.Configuration(
                database: try fixture.login("worker_test_login"),
                clients: [LocalApple.clientID: try fixture.apple.client()], cipher: cipher ?? fixture.cipher,
                pollInterval: .milliseconds(100), retryBaseDelay: .milliseconds(100)),
            logger: fixture.logs.logger())
    }

    /// Signs `sub` in through the API; returns the refresh token as stored (decrypted).
    func signIn(_ fixture: SignInFixture, sub: String) throws -> String {
        #expect(try fixture.post("/v1/sign-ins", fixture.signInBody(sub: sub)).status == 200)
        let row = try fixture.query(
            "SELECT token_ciphertext, token_sha256 FROM siwa.refresh_tokens WHERE sub = $1", [.text(sub)])[0]
        return try fixture.cipher.decrypt(
            [UInt8](try row[0, as: Data.self]),
            for: TokenCipher.Row(
                clientID: LocalApple.clientID, tokenSHA256: [UInt8](try row[1, as: Data.self])))
    }

    /// Applies due notifications as the worker does.
    func applyNotifications(_ fixture: SignInFixture) throws {
        _ = try fixture.query("SELECT * FROM siwa.process_due_notifications(64, 20, interval '1 second')")
    }

    func ledger(_ fixture: SignInFixture, _ id: Int) throws -> PostgresRow {
        try #require(
            try fixture.query("SELECT * FROM siwa.revocation_ledger WHERE id = $1", [.int(Int64(id))]).first)
    }

    @Test("request_revocation as siwa_app in a rolled-back transaction leaves nothing")
    func rolledBack() throws {
        let fixture = try SignInFixture()
        let connection = try PostgresConnection(configuration: fixture.receiver.database)
        defer { connection.close() }
        _ = try connection.simpleQuery("SET ROLE siwa_app")
        _ = try connection.simpleQuery("BEGIN")
        #expect(
            try connection.query("SELECT siwa.request_revocation('001.gone', 'account deleted')")[0][
                0, as: Int.self] > 0)
        _ = try connection.simpleQuery("ROLLBACK")
        #expect(try fixture.count("SELECT count(*) FROM siwa.revocation_requests") == 0)
        #expect(try revoker(fixture).drainOnce().isEmpty)
    }

    @Test(
        "a committed request is revoked at Apple, the ciphertext destroyed, and the echoed consent-revoked matched"
    )
    func revokedAndEchoed() throws {
        let fixture = try SignInFixture()
        let token = try signIn(fixture, sub: "001.delete")
        let connection = try PostgresConnection(configuration: fixture.receiver.database)
        defer { connection.close() }
        _ = try connection.simpleQuery("SET ROLE siwa_app")
        let id = try connection.transaction { connection in
            // The app's own deletion would run here, in the same transaction.
            try connection.query("SELECT siwa.request_revocation('001.delete', 'account deleted in app')")[0][
                0, as: Int.self]
        }
        #expect(try revoker(fixture).drainOnce() == [Revoker.Outcome(id: id, state: "revoked")])
        #expect(appleError { _ = try fixture.apple.client().refresh(token: token) }?.code == .invalidGrant)
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.refresh_tokens WHERE sub = '001.delete' AND token_ciphertext IS NOT NULL"
            )
                == 0)
        var row = try ledger(fixture, id)
        #expect(try row["state", as: String.self] == "revoked")
        #expect(try row["attempts", as: Int.self] == 1)
        #expect(try row["apple_answer", as: String.self] == "200")
        #expect(try row["tokens_revoked", as: Int.self] == 1)
        #expect(try row["completed_at", as: Date?.self] != nil)
        // Apple (fake-apple) echoes consent-revoked to the receiver; the worker applies it; the ledger matches it.
        #expect(
            try waitUntil(timeout: .seconds(20)) {
                try fixture.count("SELECT count(*) FROM siwa.notifications WHERE sub = '001.delete'") == 1
            })
        try applyNotifications(fixture)
        row = try ledger(fixture, id)
        #expect(try row["echo_event_time", as: Date?.self] != nil)
        #expect(try row["echo_jti", as: String?.self] != nil)
    }

    @Test("Apple answering 503 is retried with backoff and then revoked; the ledger shows both answers")
    func retriedAfter5xx() throws {
        let fixture = try SignInFixture()
        _ = try signIn(fixture, sub: "001.retry")
        let id = try fixture.query("SELECT siwa.request_revocation('001.retry', 'deleted')")[0][
            0, as: Int.self]
        try fixture.apple.fault(["--fail-with", "503", "--times", "1", "--endpoint", "revoke"])
        let revoker = try revoker(fixture)
        #expect(try revoker.drainOnce() == [Revoker.Outcome(id: id, state: "retry")])
        var row = try ledger(fixture, id)
        #expect(try row["state", as: String.self] == "pending")
        #expect(try row["apple_answer", as: String.self] == "server_error (HTTP 503)")
        #expect(try row["last_error", as: String.self].contains("server_error"))
        #expect(try row["next_attempt_at", as: Date.self] > row["last_attempt_at", as: Date.self])
        #expect(
            try fixture.count("SELECT count(*) FROM siwa.refresh_tokens WHERE token_ciphertext IS NOT NULL")
                == 1)
        #expect(try waitUntil { try revoker.drainOnce() == [Revoker.Outcome(id: id, state: "revoked")] })
        row = try ledger(fixture, id)
        #expect(try row["attempts", as: Int.self] == 2)
        #expect(try row["apple_answer", as: String.self] == "200")
        #expect(try row["last_error", as: String?.self] == nil)
    }

    @Test(
        "a worker dying between Apple's 200 and its commit: the next attempt revokes again, harmlessly, and the ledger ends complete"
    )
    func diesAfterApplesAnswer() throws {
        let fixture = try SignInFixture()
        let token = try signIn(fixture, sub: "001.crash")
        let id = try fixture.query("SELECT siwa.request_revocation('001.crash', 'deleted')")[0][
            0, as: Int.self]
        // The ledger update fails after Apple has answered 200, as if the process died before COMMIT.
        let owner = try PostgresConnection(configuration: fixture.receiver.database)
        defer { owner.close() }
        _ = try owner.simpleQuery(
            """
            CREATE FUNCTION siwa.test_fail_ledger() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'simulated crash before commit'; END $$;
            CREATE TRIGGER test_fail_ledger BEFORE UPDATE ON siwa.revocation_requests
                FOR EACH ROW WHEN (NEW.state = 'revoked') EXECUTE FUNCTION siwa.test_fail_ledger();
            """)
        let revoker = try revoker(fixture)
        #expect(throws: (any Error).self) { try revoker.drainOnce() }
        #expect(appleError { _ = try fixture.apple.client().refresh(token: token) }?.code == .invalidGrant)
        var row = try ledger(fixture, id)
        #expect(try row["state", as: String.self] == "pending")
        #expect(try row["attempts", as: Int.self] == 1)  // counted at the claim
        #expect(
            try fixture.count("SELECT count(*) FROM siwa.refresh_tokens WHERE token_ciphertext IS NOT NULL")
                == 1)
        _ = try fixture.query("DROP TRIGGER test_fail_ledger ON siwa.revocation_requests")
        #expect(try revoker.drainOnce() == [Revoker.Outcome(id: id, state: "revoked")])
        row = try ledger(fixture, id)
        #expect(try row["attempts", as: Int.self] == 2)
        #expect(try row["apple_answer", as: String.self] == "200")
        #expect(try row["tokens_revoked", as: Int.self] == 1)
        #expect(
            try fixture.count("SELECT count(*) FROM siwa.refresh_tokens WHERE token_ciphertext IS NOT NULL")
                == 0)
        // Apple was asked twice and answered 200 both times (a revoked token is still 200).
        #expect(fixture.apple.log.components(separatedBy: "POST /auth/revoke 200").count - 1 == 2)
    }

    @Test(
        "the refresh check finds consent gone without Apple's notification and applies a consent-revoked of our own"
    )
    func refreshCheck() throws {
        let fixture = try SignInFixture(notify: false)
        _ = try signIn(fixture, sub: "001.still")
        let gone = try signIn(fixture, sub: "001.gone")
        // The user stopped using Sign in with Apple; the notification never reaches us.
        try fixture.apple.client().revoke(token: gone)
        let revoker = try revoker(fixture)
        let found = try revoker.checkRefreshTokensOnce(interval: .seconds(86400))
        #expect(found.map(\.outcome).sorted() == ["invalid_grant", "valid"])
        // Checked within the interval: nothing is due again.
        #expect(try revoker.checkRefreshTokensOnce(interval: .seconds(86400)).isEmpty)
        let event = try #require(
            try fixture.query(
                "SELECT jti, state FROM siwa.event_history WHERE sub = '001.gone' AND event_type = 'consent-revoked'"
            ).first)
        #expect(try event[0, as: String.self].hasPrefix("siwa-refresh-check:"))
        #expect(try event[1, as: String.self] == "pending")
        #expect(try fixture.count("SELECT count(*) FROM siwa.event_history WHERE sub = '001.still'") == 0)
        try applyNotifications(fixture)
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.accounts WHERE sub = '001.gone' AND consent_revoked_at IS NOT NULL"
            ) == 1)
        #expect(
            try fixture.count(
                """
                SELECT count(*) FROM siwa.refresh_tokens
                 WHERE sub = '001.gone' AND revoked_at IS NOT NULL AND token_ciphertext IS NULL
                """) == 1)
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.refresh_tokens WHERE sub = '001.still' AND token_ciphertext IS NOT NULL"
            )
                == 1)
        // The worker may record such an event only through siwa.record_consent_lost, only for a user with
        // a stored token, and may still not insert notifications itself.
        let worker = try PostgresConnection(configuration: fixture.login("worker_test_login"))
        defer { worker.close() }
        for sql in [
            "SELECT siwa.record_consent_lost('001.stranger', 'com.example.app')",
            """
            INSERT INTO siwa.notifications (jti, event_type, sub, audience, event_time, issued_at)
            VALUES ('j', 'consent-revoked', '001.still', 'a', now(), now())
            """,
        ] {
            #expect(throws: PostgresError.self, "\(sql)") { try worker.query(sql) }
        }
    }

    @Test("sign-in codes a day old are forgotten by the revoker; younger ones are kept")
    func pruneCodes() throws {
        let fixture = try SignInFixture()
        _ = try signIn(fixture, sub: "001.old")
        _ = try signIn(fixture, sub: "001.young")
        _ = try fixture.query(
            "UPDATE siwa.sign_in_codes SET created_at = now() - interval '25 hours' WHERE sub = '001.old'")
        #expect(try revoker(fixture).pruneSignInCodes() == 1)
        #expect(try fixture.count("SELECT count(*) FROM siwa.sign_in_codes WHERE sub = '001.young'") == 1)
        #expect(try fixture.count("SELECT count(*) FROM siwa.sign_in_codes") == 1)
    }

    @Test("a user without a stored token is recorded as no_token, not pretended revoked")
    func noToken() throws {
        let fixture = try SignInFixture()
        let id = try fixture.post("/v1/revocations", ["sub": "001.never", "reason": "deleted"])
        #expect(id.status == 202)
        let requestID = try #require(id.json["id"] as? Int)
        #expect(try revoker(fixture).drainOnce() == [Revoker.Outcome(id: requestID, state: "no_token")])
        #expect(try ledger(fixture, requestID)["state", as: String.self] == "no_token")
        #expect(try fixture.post("/v1/revocations", ["sub": "", "reason": "x"]).status == 400)
        #expect(try fixture.count("SELECT count(*) FROM siwa.revocation_requests") == 1)
    }

    @Test(
        "a token encrypted with a rotated-out key still decrypts with the old key kept; without it the request fails clearly"
    )
    func rotationAtRevocation() throws {
        let fixture = try SignInFixture()
        _ = try signIn(fixture, sub: "001.rotate")
        _ = try signIn(fixture, sub: "001.lost")
        let oldKeys = try String(contentsOfFile: fixture.keyFile, encoding: .utf8)
            .split(separator: "\n").filter { !$0.hasPrefix("#") }.map(String.init)
        let newKey = ("k2", randomKey())
        let rotated = try TokenCipher(
            keyFile: writeKeyFile(
                [newKey]
                    + oldKeys.map { line in
                        let parts = line.split(separator: " ")
                        return (String(parts[0]), [UInt8](Data(base64Encoded: String(parts[1]))!))
                    }, in: fixture.apple.directory))
        let first = try fixture.query("SELECT siwa.request_revocation('001.rotate', 'deleted')")[0][
            0, as: Int.self]
        #expect(
            try revoker(fixture, cipher: rotated).drainOnce() == [
                Revoker.Outcome(id: first, state: "revoked")
            ])
        let onlyNew = try TokenCipher(keyFile: writeKeyFile([newKey], in: fixture.apple.directory))
        let second = try fixture.query("SELECT siwa.request_revocation('001.lost', 'deleted')")[0][
            0, as: Int.self]
        #expect(
            try revoker(fixture, cipher: onlyNew).drainOnce() == [
                Revoker.Outcome(id: second, state: "failed")
            ])
        let row = try ledger(fixture, second)
        #expect(try row["last_error", as: String.self].contains("key k1 is not in the key file"))
    }

    @Test("siwa_app cannot read ciphertexts, tokens, errors or the ledger; siwa_admin reads the ledger only")
    func privileges() throws {
        let fixture = try SignInFixture()
        _ = try signIn(fixture, sub: "001.private")
        _ = try fixture.query("SELECT siwa.request_revocation('001.private', 'deleted')")
        let connection = try PostgresConnection(configuration: fixture.receiver.database)
        defer { connection.close() }
        _ = try connection.simpleQuery("SET ROLE siwa_app")
        for sql in [
            "SELECT token_ciphertext FROM siwa.refresh_tokens",
            "SELECT token_sha256 FROM siwa.refresh_tokens",
            "SELECT last_error FROM siwa.revocation_requests", "SELECT sub FROM siwa.revocation_requests",
            "SELECT * FROM siwa.revocation_ledger", "SELECT * FROM siwa.sign_in_codes",
            "UPDATE siwa.revocation_requests SET state = 'revoked'",
            "INSERT INTO siwa.revocation_requests (sub, reason, state) VALUES ('x', 'y', 'revoked')",
        ] {
            do {
                _ = try connection.query(sql)
                Issue.record("siwa_app could run: \(sql)")
            } catch let error as PostgresError {
                #expect(error.sqlState == "42501", "\(sql)")
            }
        }
        _ = try connection.simpleQuery("RESET ROLE; SET ROLE siwa_admin")
        #expect(try connection.query("SELECT count(*) FROM siwa.revocation_ledger")[0][0, as: Int.self] == 1)
        #expect(throws: PostgresError.self) {
            try connection.query("SELECT token_ciphertext FROM siwa.refresh_tokens")
        }
    }

    @Test("erasing a deleted account's personal data destroys its stored tokens")
    func erasure() throws {
        let fixture = try SignInFixture()
        _ = try signIn(fixture, sub: "001.erase")
        _ = try fixture.query("SELECT siwa.erase_personal_data('001.erase')")
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.refresh_tokens WHERE sub = '001.erase' AND token_ciphertext IS NULL"
            )
                == 1)
        #expect(
            try fixture.count("SELECT count(*) FROM siwa.accounts WHERE sub = '001.erase' AND email IS NULL")
                == 1)
    }
}
