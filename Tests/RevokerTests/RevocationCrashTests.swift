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

@Suite(
    "Revocation leases sized to the call: a revoker killed mid-call is taken over within seconds", .serialized
)
struct RevocationCrashTests {
    let helper = RevocationTests()

    /// The worker's flags for the fixture's Apple, key file and database.
    func workerArguments(_ fixture: SignInFixture) -> [String] {
        [
            "--poll-interval", "0.2", "--revocation-poll-interval", "0.2", "--log-level", "info",
            "--apple-key-file", fixture.apple.teamKeyFile.path, "--apple-team-id", LocalApple.teamID,
            "--apple-key-id", LocalApple.keyID, "--client-id", LocalApple.clientID,
            "--token-key-file", fixture.keyFile, "--apple-url", fixture.apple.baseURL,
            "--jwks-url", fixture.apple.baseURL + "/auth/keys",
        ]
    }

    @Test(
        "kill -9 of siwa-worker while Apple answers /auth/revoke: Apple's echo, sent meanwhile, is matched; after the restart the request is revoked again within 30 s"
    )
    func killedDuringTheCall() throws {
        let fixture = try SignInFixture()
        _ = try helper.signIn(fixture, sub: "001.killed")
        // Apple revokes the token and sends its consent-revoked, then holds its answer (longer than the
        // worker's 10 s deadline: the kill lands during the call).
        try fixture.apple.fault(["--answer-delay-ms", "15000", "--times", "1", "--endpoint", "revoke"])
        let id = try fixture.query("SELECT siwa.request_revocation('001.killed', 'deleted')")[0][
            0, as: Int.self]
        let databaseURL = try PostgresCluster.shared.url(database: fixture.receiver.database.database ?? "")
        let first = try WorkerProcess(workerArguments(fixture), databaseURL: databaseURL)
        // The call is out: Apple revoked the token, sent its consent-revoked and holds its answer.
        #expect(
            waitUntil(timeout: .seconds(20)) { fixture.apple.log.contains("holding the answer") },
            "worker: \(first.log)\napple: \(fixture.apple.log)")
        // The echo is applied and matched while the call is still out (a live lease, no answer yet); the
        // wait ends well before the call's 10 s deadline, so the kill below lands during the call.
        let matched = try waitUntil(timeout: .seconds(5)) {
            try fixture.count(
                """
                SELECT count(*) FROM siwa.revocation_ledger l JOIN siwa.revocation_requests r USING (id)
                 WHERE l.id = \(id) AND l.state = 'pending' AND l.attempts = 1 AND l.echo_jti IS NOT NULL
                   AND r.lease_expires_at > clock_timestamp()
                """) == 1
        }
        #expect(matched, "worker: \(first.log)\napple: \(fixture.apple.log)")
        // The lease covers the call: its deadline (10 s) plus the margin, from the claim.
        let lease = try fixture.query(
            "SELECT extract(epoch FROM lease_expires_at - last_attempt_at)::float8 FROM siwa.revocation_requests WHERE id = $1",
            [.int(Int64(id))])[0][0, as: Double?.self]
        #expect(
            lease.map { abs($0 - CallLease.covering(.seconds(10)).inSeconds) < 1 } == true, "\(lease ?? -1)")
        first.send(SIGKILL)
        #expect(first.waitForExit(timeout: .seconds(10)) == 128 + SIGKILL)
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.revocation_ledger WHERE id = \(id) AND state = 'pending'") == 1)

        let restarted = ContinuousClock.now
        let second = try WorkerProcess(workerArguments(fixture), databaseURL: databaseURL)
        defer {
            second.send(SIGTERM)
            _ = second.waitForExit(timeout: .seconds(20))
        }
        let revoked = try waitUntil(timeout: .seconds(30)) {
            try fixture.count(
                "SELECT count(*) FROM siwa.revocation_ledger WHERE id = \(id) AND state = 'revoked'")
                == 1
        }
        let elapsed = ContinuousClock.now - restarted
        #expect(revoked, "worker: \(second.log)\napple: \(fixture.apple.log)")
        #expect(elapsed < .seconds(30))
        let row = try helper.ledger(fixture, id)
        #expect(try row["attempts", as: Int.self] == 2)  // the killed call, then the one that recorded
        #expect(try row["tokens_revoked", as: Int.self] == 1)
        #expect(try row["echo_jti", as: String?.self] != nil)
        // One echo: the second revoke found the token gone at Apple (200, nothing sent).
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.event_history WHERE sub = '001.killed' AND event_type = 'consent-revoked'"
            ) == 1)
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.refresh_tokens WHERE sub = '001.killed' AND token_ciphertext IS NOT NULL"
            ) == 0)
        print("revocation crash: revoked \(elapsed) after the restart")
    }
}
