import AppleID
import Dispatch
import Foundation
import Postgres
import QueueConsumer
import Revoker
import ServiceSupport
import Synchronization
import TestSupport
import Testing
import TokenVault

@Suite("Revocation leases: no lock held across Apple's call, a held token row never stalls the revoker")
struct RevocationLeaseTests {
    let helper = RevocationTests()

    func revoker(_ fixture: SignInFixture, client: AppleIDClient? = nil, applicationName: String? = nil)
        throws
        -> Revoker
    {
        var database = try fixture.login("worker_test_login")
        database.applicationName = applicationName
        return try Revoker(
            configuration: Revoker.Configuration(
                database: database, clients: [LocalApple.clientID: try client ?? fixture.apple.client()],
                cipher: fixture.cipher, pollInterval: .milliseconds(100), retryBaseDelay: .milliseconds(100)),
            logger: fixture.logs.logger())
    }

    @Test(
        "Apple hanging and the user's token row locked by another session: the revoker's connection holds no lock, another user's revocation proceeds, and the request is revoked once the row is free"
    )
    func noLockAcrossTheCall() throws {
        let fixture = try SignInFixture(notify: false)
        _ = try helper.signIn(fixture, sub: "001.held")
        _ = try helper.signIn(fixture, sub: "001.other")
        let held = try fixture.query("SELECT siwa.request_revocation('001.held', 'deleted')")[0][
            0, as: Int.self]
        // An app's transaction holds the user's token row for the whole call.
        let holder = try PostgresConnection(configuration: fixture.receiver.database)
        defer { holder.close() }
        _ = try holder.simpleQuery(
            "BEGIN; SELECT 1 FROM siwa.refresh_tokens WHERE sub = '001.held' FOR UPDATE")
        // Apple that reads the revoke and answers nothing until released.
        let gate = DispatchSemaphore(value: 0)
        let apple = try ScriptedHTTPServer { _, write in
            gate.wait()
            _ = write(Array("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".utf8))
        }
        let hangingClient = try AppleIDClient(
            configuration: AppleIDClient.Configuration(
                baseURL: "http://127.0.0.1:\(apple.port)", timeout: .seconds(60)),
            clientSecret: fixture.apple.provider())
        let hung = try revoker(fixture, client: hangingClient, applicationName: "siwa-test-hung-revoker")
        let result = Mutex<[Revoker.Outcome]?>(nil)
        let thread = JoinableThread(name: "hung-revoker") {
            let outcomes = try? hung.drainOnce()
            result.withLock { $0 = outcomes }
        }
        #expect(waitUntil { apple.requestHeads.count == 1 })
        let pid = try fixture.query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'siwa-test-hung-revoker'")[0][
                0, as: Int.self]
        for _ in 0..<10 {
            #expect(try fixture.count("SELECT count(*) FROM pg_locks WHERE pid = \(pid)") == 0)
            #expect(
                try fixture.count(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = \(pid) AND state = 'idle' AND backend_xid IS NULL"
                ) == 1)
            Thread.sleep(forTimeInterval: 0.02)  // samples spread over the call, not a wait for an outcome
        }
        // The request is held by its committed lease only.
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.revocation_requests WHERE id = \(held) AND lease_expires_at > now()"
            ) == 1)
        // Another user's revocation goes through meanwhile (another worker's revoker).
        let other = try fixture.query("SELECT siwa.request_revocation('001.other', 'deleted')")[0][
            0, as: Int.self]
        let free = try revoker(fixture)
        #expect(try free.drainOnce() == [Revoker.Outcome(id: other, state: "revoked")])
        // Apple answers; the token row is still held: the request is put off, not waited on.
        gate.signal()
        thread.join()
        #expect(result.withLock { $0 } == [Revoker.Outcome(id: held, state: "busy")])
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.refresh_tokens WHERE sub = '001.held' AND token_ciphertext IS NOT NULL"
            ) == 1)
        _ = try holder.simpleQuery("COMMIT")
        #expect(try waitUntil { try free.drainOnce() == [Revoker.Outcome(id: held, state: "revoked")] })
        let row = try helper.ledger(fixture, held)
        #expect(try row["tokens_revoked", as: Int.self] == 1)
        #expect(try row["attempts", as: Int.self] == 2)  // the put-off attempt called Apple too
    }

    @Test("a revoker dying with a claim out: the lease expires and exactly one of two revokers takes it over")
    func rescuedOnce() throws {
        let fixture = try SignInFixture(notify: false)
        _ = try helper.signIn(fixture, sub: "001.dies")
        let id = try fixture.query("SELECT siwa.request_revocation('001.dies', 'deleted')")[0][
            0, as: Int.self]
        let dying = try PostgresConnection(configuration: fixture.login("worker_test_login"))
        #expect(
            try dying.query(
                "SELECT count(*) FROM siwa.claim_revocation('dead-revoker', interval '1 second')")[0][
                    0, as: Int.self] == 1)
        dying.close()
        #expect(try revoker(fixture).drainOnce().isEmpty)
        #expect(
            try waitUntil {
                try fixture.count(
                    "SELECT count(*) FROM siwa.revocation_requests WHERE id = \(id) AND lease_expires_at <= clock_timestamp()"
                ) == 1
            })
        let outcomes = Mutex<[Revoker.Outcome]>([])
        let threads = try (0..<2).map { _ in
            let revoker = try revoker(fixture)
            return JoinableThread(name: "rescue") {
                let mine = (try? revoker.drainOnce()) ?? []
                outcomes.withLock { $0 += mine }
            }
        }
        for thread in threads { thread.join() }
        #expect(outcomes.withLock { $0 } == [Revoker.Outcome(id: id, state: "revoked")])
        #expect(fixture.apple.log.components(separatedBy: "POST /auth/revoke 200").count - 1 == 1)
        let dead = try PostgresConnection(configuration: fixture.login("worker_test_login"))
        defer { dead.close() }
        #expect(
            try dead.query(
                "SELECT siwa.record_revocation($1, 'dead-revoker', '{}', '{}', 'revoked', NULL, NULL, 1)",
                [.int(Int64(id))])[0][0, as: String.self] == "lost")
    }

    @Test(
        "the record destroys exactly the tokens Apple accepted: a row whose token changed meanwhile keeps it")
    func recheckAtRecord() throws {
        let fixture = try SignInFixture(notify: false)
        _ = try helper.signIn(fixture, sub: "001.changed")
        let id = try fixture.query("SELECT siwa.request_revocation('001.changed', 'deleted')")[0][
            0, as: Int.self]
        let worker = try PostgresConnection(configuration: fixture.login("worker_test_login"))
        defer { worker.close() }
        let claimed = try worker.query(
            "SELECT token_id, token_ciphertext FROM siwa.claim_revocation('w', interval '1 minute')")[0]
        let token = try claimed[0, as: Int.self]
        let old = try claimed[1, as: Data.self]
        // Meanwhile the row gets another token (a new sign-in stored one).
        _ = try fixture.query(
            "UPDATE siwa.refresh_tokens SET token_ciphertext = token_ciphertext || '\\x00'::bytea WHERE id = \(token)"
        )
        #expect(
            try worker.query(
                "SELECT siwa.record_revocation($1, 'w', $2::bigint[], $3::bytea[], 'revoked', NULL, NULL, 1)",
                [.int(Int64(id)), .array([.int(Int64(token))]), .array([.bytes(old)])])[0][0, as: String.self]
                == "revoked")
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.refresh_tokens WHERE id = \(token) AND token_ciphertext IS NOT NULL"
            )
                == 1)
        #expect(try helper.ledger(fixture, id)["tokens_revoked", as: Int.self] == 0)
    }

    @Test(
        "a refresh check whose process died is checked again once its lease (the call's deadline plus the margin) is over, not a day later"
    )
    func refreshCheckRescued() throws {
        let fixture = try SignInFixture(notify: false)
        _ = try helper.signIn(fixture, sub: "001.checked")
        let dying = try PostgresConnection(configuration: fixture.login("worker_test_login"))
        #expect(
            try dying.query(
                "SELECT count(*) FROM siwa.claim_refresh_check(interval '1 day', interval '6 seconds')")[0][
                    0, as: Int.self] == 1)
        dying.close()
        // A check's lease is judged by the claimer's: its call's deadline (1 s here) plus the margin.
        let revoker = try revoker(fixture, client: fixture.apple.client(timeout: .seconds(1)))
        // While the lease lives, the check is another's; after it, it is due again.
        #expect(try revoker.checkRefreshTokensOnce(interval: .seconds(86400)).isEmpty)
        #expect(
            try waitUntil(timeout: .seconds(20)) {
                try revoker.checkRefreshTokensOnce(interval: .seconds(86400)).map(\.outcome) == ["valid"]
            })
        #expect(try revoker.checkRefreshTokensOnce(interval: .seconds(86400)).isEmpty)
        #expect(revoker.configuration.lease == CallLease.covering(.seconds(1)))
    }

    @Test(
        "a request whose revoker stops during the call every time ends failed after 5 such leases, with the reason, and is not claimed again"
    )
    func crashesBounded() throws {
        let fixture = try SignInFixture(notify: false)
        _ = try helper.signIn(fixture, sub: "001.crashes")
        let id = try fixture.query("SELECT siwa.request_revocation('001.crashes', 'deleted')")[0][
            0, as: Int.self]
        let dying = try PostgresConnection(configuration: fixture.login("worker_test_login"))
        defer { dying.close() }
        for _ in 0..<5 {
            #expect(
                try dying.query("SELECT outcome FROM siwa.claim_revocation('crashing', interval '1 minute')")
                    .map { try $0[0, as: String.self] } == ["claimed"])
            // The process dies during the call: its lease runs out unrecorded.
            _ = try fixture.query(
                "UPDATE siwa.revocation_requests SET lease_expires_at = clock_timestamp() WHERE id = $1",
                [.int(Int64(id))])
        }
        let revoker = try revoker(fixture)
        #expect(try revoker.drainOnce() == [Revoker.Outcome(id: id, state: "failed")])
        let row = try helper.ledger(fixture, id)
        #expect(try row["state", as: String.self] == "failed")
        #expect(try row["last_error", as: String?.self] == "the worker stopped during this call 5 times")
        #expect(try row["attempts", as: Int.self] == 5)
        #expect(try row["completed_at", as: Date?.self] != nil)
        #expect(try revoker.drainOnce().isEmpty)
        #expect(
            try dying.query(
                "SELECT count(*) FROM siwa.claim_revocation('w', interval '1 minute', clock_timestamp() + interval '1 day')"
            )[0][0, as: Int.self] == 0)
        #expect(!fixture.apple.log.contains("/auth/revoke"))
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.refresh_tokens WHERE sub = '001.crashes' AND token_ciphertext IS NOT NULL"
            ) == 1)
    }

    @Test(
        "recorded retries are not crashes: a request retried more often than the crash bound stays pending on its retry schedule"
    )
    func retriesAreNotCrashes() throws {
        let fixture = try SignInFixture(notify: false)
        _ = try helper.signIn(fixture, sub: "001.retries")
        let id = try fixture.query("SELECT siwa.request_revocation('001.retries', 'deleted')")[0][
            0, as: Int.self]
        let worker = try PostgresConnection(configuration: fixture.login("worker_test_login"))
        defer { worker.close() }
        for _ in 0..<7 {
            #expect(
                try worker.query(
                    "SELECT outcome FROM siwa.claim_revocation('w', interval '1 minute', clock_timestamp() + interval '1 day')"
                ).map { try $0[0, as: String.self] } == ["claimed"])
            #expect(
                try worker.query(
                    "SELECT siwa.record_revocation($1, 'w', '{}', '{}', 'retry', 'server_error (HTTP 503)', 'Apple answered 503', 3600)",
                    [.int(Int64(id))])[0][0, as: String.self] == "retry")
            // Due again in an hour, not before.
            #expect(
                try worker.query("SELECT count(*) FROM siwa.claim_revocation('w', interval '1 minute')")[0][
                    0, as: Int.self] == 0)
        }
        let row = try helper.ledger(fixture, id)
        #expect(try row["state", as: String.self] == "pending")
        #expect(try row["attempts", as: Int.self] == 7)
        #expect(try row["last_error", as: String?.self] == "Apple answered 503")
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.revocation_requests WHERE id = \(id) AND next_attempt_at > now() + interval '59 minutes'"
            ) == 1)
    }

    @Test(
        "a refresh check whose process stops during the call every time ends worker_stopped after 5 such leases and is not checked again"
    )
    func refreshCheckCrashesBounded() throws {
        let fixture = try SignInFixture(notify: false)
        _ = try helper.signIn(fixture, sub: "001.check-crashes")
        let token = try fixture.query("SELECT id FROM siwa.refresh_tokens WHERE sub = '001.check-crashes'")[
            0][
                0, as: Int.self]
        let dying = try PostgresConnection(configuration: fixture.login("worker_test_login"))
        defer { dying.close() }
        for _ in 0..<5 {
            #expect(
                try dying.query(
                    "SELECT count(*) FROM siwa.claim_refresh_check(interval '1 day', interval '1 minute')")[
                        0][
                        0, as: Int.self] == 1)
            // The process dies during the call: the check, begun two minutes ago, was never recorded.
            _ = try fixture.query(
                "UPDATE siwa.refresh_token_checks SET checked_at = checked_at - interval '2 minutes' WHERE token_id = $1",
                [.int(Int64(token))])
        }
        let calls = fixture.apple.log.components(separatedBy: "/auth/token").count
        let revoker = try revoker(fixture)
        #expect(
            try revoker.checkRefreshTokensOnce(interval: .seconds(86400))
                == [Revoker.CheckOutcome(tokenID: token, outcome: "worker_stopped")])
        #expect(try revoker.checkRefreshTokensOnce(interval: .seconds(86400)).isEmpty)
        #expect(
            try dying.query(
                "SELECT count(*) FROM siwa.claim_refresh_check(interval '0', interval '1 minute')")[0][
                    0, as: Int.self] == 0)
        #expect(fixture.apple.log.components(separatedBy: "/auth/token").count == calls)
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.refresh_token_checks WHERE token_id = \(token) AND outcome = 'worker_stopped'"
            ) == 1)
    }
}
