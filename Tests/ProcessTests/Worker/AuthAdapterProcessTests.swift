import Foundation
import Postgres
import TestSupport
import Testing

@Suite("siwa-worker --auth-adapters on: Apple's changes applied in the auth database, through a crash")
struct AuthAdapterProcessTests {
    @Test(
        "a change is applied in Supabase Auth within seconds of its commit; --print-connections counts the lane"
    )
    func applied() throws {
        let fixture = try AdapterFixture()
        let arguments = ["--auth-adapters", "on", "--webhook-concurrency", "0", "--log-level", "info"]
        let plan = try WorkerProcess(arguments + ["--print-connections"], databaseURL: fixture.siwa.url)
        #expect(plan.waitForExit(timeout: .seconds(20)) == 0)
        let worker = try WorkerProcess(arguments, databaseURL: fixture.siwa.url)
        defer {
            worker.send(SIGTERM)
            _ = worker.waitForExit(timeout: .seconds(20))
        }
        try fixture.insertChanges([("siwa.consent_revoked", "001.a", nil)])
        // The row is recorded done after the auth database's commit: wait for the record.
        #expect(
            waitUntil(timeout: .seconds(20)) { (try? fixture.rows().map(\.state)) == ["done"] },
            "\(worker.log)")
        #expect(try fixture.sessions(of: AdapterFixture.userA) == 0)
        #expect(try fixture.sessions(of: AdapterFixture.userB) == 1)
        #expect(worker.log.contains("auth adapters started"))
        #expect(!worker.log.contains(fixture.auth.url))
    }

    @Test(
        "kill -9 of siwa-worker while its event waits for a row lock in the auth database: applied once after the restart"
    )
    func killedMidTransaction() throws {
        let fixture = try AdapterFixture()
        try fixture.insertChanges([("siwa.account_deleted", "001.a", nil)])
        // Another session of the auth system holds the identity row the adapter locks first.
        let holder = try fixture.auth.connect()
        defer { holder.close() }
        try holder.execute("BEGIN")
        try holder.execute("SELECT 1 FROM auth.identities WHERE provider_id = '001.a' FOR UPDATE")
        let arguments = [
            "--auth-adapters", "on", "--auth-adapter-timeout", "3", "--webhook-concurrency", "0",
            "--log-level",
            "info",
        ]
        let first = try WorkerProcess(arguments, databaseURL: fixture.siwa.url)
        #expect(
            waitUntil(timeout: .seconds(20)) {
                (try? fixture.auth.value(
                    "SELECT count(*)::int FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
                    as: Int.self)) == 1
            }, "\(first.log)")
        first.send(SIGKILL)
        #expect(first.waitForExit(timeout: .seconds(10)) == 128 + SIGKILL)
        try holder.execute("ROLLBACK")
        let killed = ContinuousClock.now
        let second = try WorkerProcess(arguments, databaseURL: fixture.siwa.url)
        defer {
            second.send(SIGTERM)
            _ = second.waitForExit(timeout: .seconds(20))
        }
        #expect(
            waitUntil(timeout: .seconds(30)) { (try? fixture.rows().map(\.state)) == ["done"] },
            "\(second.log)")
        // Unlinked once (A had no other login: banned), the other user untouched; taken over after the lease.
        #expect(try fixture.linkedUser(sub: "001.a") == nil)
        #expect(try fixture.linkedUser(sub: "001.b") == AdapterFixture.userB)
        #expect(try fixture.siwa.value("SELECT attempts FROM siwa.auth_adapter_events", as: Int.self) == 2)
        print("auth adapter crash: applied \(ContinuousClock.now - killed) after the kill")
    }

    @Test(
        "siwactl adapters disable and enable while siwa-worker runs: the paused adapter's change queues, and is applied once it is enabled, without a restart"
    )
    func followsTheTable() throws {
        let fixture = try AdapterFixture()
        func adapters(_ verb: String) throws -> ExecutableLocator.Result {
            try siwactl(
                [
                    "adapters", verb, "supabase-main", "--database-url",
                    try fixture.siwa.url(asMemberOf: "siwa_admin"),
                ])
        }
        #expect(try adapters("disable").status == 0)
        let worker = try WorkerProcess(
            ["--auth-adapters", "on", "--webhook-concurrency", "0", "--log-level", "info"],
            databaseURL: fixture.siwa.url)
        defer {
            worker.send(SIGTERM)
            _ = worker.waitForExit(timeout: .seconds(20))
        }
        #expect(waitUntil(timeout: .seconds(20)) { worker.log.contains("none is enabled") }, "\(worker.log)")
        try fixture.insertChanges([("siwa.consent_revoked", "001.a", nil)])
        #expect(try fixture.rows().map(\.state) == ["pending"])
        let enabled = try adapters("enable")
        #expect(enabled.status == 0 && enabled.standardOutput == "adapter supabase-main: enabled\n")
        #expect(
            waitUntil(timeout: .seconds(20)) { (try? fixture.rows().map(\.state)) == ["done"] },
            "\(worker.log)")
        #expect(try fixture.sessions(of: AdapterFixture.userA) == 0)
        #expect(try fixture.siwa.value("SELECT attempts FROM siwa.auth_adapter_events", as: Int.self) == 1)
        // Paused again: the lanes stop (and a later change would queue, as the SQL suite shows).
        #expect(
            try adapters("disable").standardOutput == "adapter supabase-main: disabled (its changes queue)\n")
        #expect(
            waitUntil(timeout: .seconds(20)) { worker.log.contains("auth adapters stopped") }, "\(worker.log)"
        )
        #expect(try adapters("enable").status == 0)
        #expect(
            try siwactl(["adapters", "enable", "nobody", "--database-url", fixture.siwa.url]).status != 0)
    }

    @Test(
        "kill -9 of siwa-worker while a hosted platform's call hangs: a transfer meeting the deletion is applied once after the restart, as the platform's policy table says",
        arguments: ["keycloak", "firebase", "auth0", "clerk"])
    func killedMidCall(platform: String) throws {
        let fixture = try AdapterFixture()
        let fake = try HostedPlatformFake(platform)
        _ = try fixture.siwa.value("SELECT siwa.remove_auth_adapter('supabase-main')", as: Bool.self)
        try fixture.addHosted("hosted", fake: fake)
        let seeded = try fake.seed(email: "x@example.com", appleSub: "s.old", sessions: 2)
        // A team transfer meets the account's deletion: the transfer is in flight when the worker dies.
        try fixture.insertChanges([
            ("siwa.sub_transferred", "s.new", "s.old"), ("siwa.account_deleted", "s.new", nil),
        ])
        try fake.faults(hang: 30)
        let arguments = [
            "--auth-adapters", "on", "--auth-adapter-timeout", "1", "--webhook-concurrency", "0",
            "--log-level",
            "info",
        ]
        let first = try WorkerProcess(arguments, databaseURL: fixture.siwa.url)
        #expect(
            waitUntil(timeout: .seconds(20)) {
                (try? fixture.siwa.value(
                    "SELECT count(*)::int FROM siwa.auth_adapter_events WHERE lease_owner IS NOT NULL",
                    as: Int.self)) == 1
            }, "\(first.log)")
        first.send(SIGKILL)
        #expect(first.waitForExit(timeout: .seconds(10)) == 128 + SIGKILL)
        try fake.faults(hang: 0)
        let second = try WorkerProcess(arguments, databaseURL: fixture.siwa.url)
        defer {
            second.send(SIGTERM)
            _ = second.waitForExit(timeout: .seconds(20))
        }
        // Clerk cannot move the link nor search the metadata that records the move: the deletion of the
        // new sub finds no user there (docs/adapters.md, Clerk).
        let expected = platform == "clerk" ? ["done", "no_user"] : ["done", "done"]
        #expect(
            waitUntil(timeout: .seconds(60)) { (try? fixture.rows().map(\.state)) == expected },
            "\(second.log)")
        let user = try #require(try fake.users().first { $0["id"] as? String == seeded["id"] as? String })
        let subs = (user["identities"] as? [[String: Any]] ?? []).compactMap { $0["user_id"] as? String }
        switch platform {
        case "clerk":
            #expect(subs == ["s.old"] && user["disabled"] as? Bool == false, "\(user)")
        case "auth0":
            #expect(
                subs == ["s.old"] && user["disabled"] as? Bool == true && user["sessions"] as? Int == 0,
                "\(user)")
        default:
            #expect(
                subs.isEmpty && user["disabled"] as? Bool == true && user["sessions"] as? Int == 0, "\(user)")
        }
        for secret in fake.credentials.values where secret.count >= 16 {
            #expect(!second.log.contains(secret) && !first.log.contains(secret))
        }
    }
}
