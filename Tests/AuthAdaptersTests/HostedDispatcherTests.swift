import AuthAdapters
import Foundation
import Postgres
import QueueConsumer
import ServiceSupport
import TestSupport
import Testing

/// The adapter lanes of hosted platforms, against their fakes: many users' interleaved events through
/// the platform's faults, a hanging platform beside a database one, rotated credentials.
@Suite("Auth adapters: hosted platforms through their admin API")
struct HostedDispatcherTests {
    /// The value of `key` anywhere in `metadata` (Clerk nests it in `private_metadata`), as text.
    func recorded(_ key: String, in metadata: Any?) -> String? {
        guard let object = metadata as? [String: Any] else { return nil }
        if let value = object[key] { return (value as? [String])?.first ?? value as? String }
        return object.values.lazy.compactMap { recorded(key, in: $0) }.first
    }

    @Test(
        "40 users' interleaved events through 429s and an outage: each user ends as the events and the platform's policy table say",
        arguments: ["keycloak", "firebase", "auth0", "clerk"])
    func interleaved(platform: String) throws {
        let fixture = try AdapterFixture()
        let fake = try HostedPlatformFake(platform)
        let apple = AdapterFixture.appleProvider[platform] ?? "apple"
        _ = try fixture.siwa.value("SELECT siwa.remove_auth_adapter('supabase-main')", as: Bool.self)
        try fixture.addHosted("hosted", fake: fake, arguments: ", p_on_forwarding_change => 'record'")
        var ids: [String] = []
        for index in 0..<40 {
            let seeded = try fake.seed(
                email: "u\(index)@example.com", appleSub: "s.\(index)", password: index % 8 == 1, sessions: 2)
            ids.append(seeded["id"] as! String)
        }
        // Round-robin over the users, so each user's events are interleaved with the others'.
        var queues: [[(String, String, String?)]] = (0..<40).map { index in
            let sub = "s.\(index)"
            switch index % 4 {
            case 0: return [("siwa.consent_revoked", sub, nil)]
            case 1: return [("siwa.account_deleted", sub, nil)]
            case 2:
                return [
                    ("siwa.sub_transferred", sub + ".new", sub), ("siwa.account_deleted", sub + ".new", nil),
                ]
            default: return [("siwa.email_disabled", sub, nil), ("siwa.consent_revoked", sub, nil)]
            }
        }
        var changes: [(String, String, String?)] = []
        while queues.contains(where: { !$0.isEmpty }) {
            for index in queues.indices where !queues[index].isEmpty {
                changes.append(queues[index].removeFirst())
            }
        }
        try fixture.insertChanges(changes)
        try fake.faults(rateLimit: 3, outage: 2)
        let dispatcher = try fixture.dispatcher()
        var outcomes: [String: Int] = [:]
        #expect(
            waitUntil(timeout: .seconds(60)) {
                for outcome in (try? dispatcher.drainOnce()) ?? [] {
                    outcomes[outcome.state, default: 0] += 1
                }
                return (try? fixture.rows().allSatisfy { $0.state != "pending" }) == true
            })
        #expect(outcomes["rate_limited"] == 3 && outcomes["retry"] == 2, "\(outcomes)")
        // Auth0 and Clerk cannot move a link: the transfer is recorded in metadata. Auth0 then finds the
        // user by it; Clerk cannot search metadata, so the new sub's deletion finds no user there.
        let moves = platform == "keycloak" || platform == "firebase"
        #expect(
            try fixture.rows().map(\.state).filter { $0 != "done" }
                == Array(repeating: "no_user", count: platform == "clerk" ? 10 : 0))
        for (index, id) in ids.enumerated() {
            let state = try #require(try fake.users().first { $0["id"] as? String == id }, "user \(index)")
            let subs = (state["identities"] as? [[String: Any]] ?? []).filter {
                $0["provider"] as? String == apple
            }
            .compactMap { $0["user_id"] as? String }
            let sessions = state["sessions"] as? Int
            let disabled = state["disabled"] as? Bool
            let context = "\(platform) user \(index): \(state)"
            switch index % 4 {
            case 0:
                #expect(subs == ["s.\(index)"] && sessions == 0 && disabled == false, "\(context)")
            case 1:
                // A user with a password keeps signing in; Auth0's primary Apple identity cannot be unlinked.
                let password = index % 8 == 1
                #expect(subs == (platform == "auth0" && !password ? ["s.\(index)"] : []), "\(context)")
                #expect(sessions == 0 && disabled == !password, "\(context)")
            case 2:
                if moves {
                    #expect(subs.isEmpty && disabled == true && sessions == 0, "\(context)")
                } else if platform == "auth0" {
                    #expect(subs == ["s.\(index)"] && disabled == true && sessions == 0, "\(context)")
                } else {
                    #expect(subs == ["s.\(index)"] && disabled == false && sessions == 2, "\(context)")
                    #expect(
                        recorded("siwa_apple_sub", in: state["metadata"]) == "s.\(index).new", "\(context)")
                }
            default:
                #expect(subs == ["s.\(index)"] && sessions == 0, "\(context)")
                #expect(recorded("siwa_email_forwarding", in: state["metadata"]) == "off", "\(context)")
            }
        }
        print("\(platform): \(changes.count) events, \(try fake.calls().total) calls answered")
    }

    @Test("a hanging platform holds up its own lane only: the database adapter's change is applied meanwhile")
    func hangingPlatform() throws {
        let fixture = try AdapterFixture()
        let fake = try HostedPlatformFake("keycloak")
        try fixture.addHosted("kc", fake: fake)
        try fake.seed(email: "x@example.com", appleSub: "001.a", sessions: 1)
        try fake.faults(hang: 3)
        let dispatcher = try fixture.dispatcher()
        let lanes = JoinableThread(name: "adapter-lanes") { dispatcher.run() }
        defer {
            dispatcher.stop()
            lanes.join()
        }
        try fixture.insertChanges([("siwa.consent_revoked", "001.a", nil)])
        // Supabase's row is done while Keycloak's call still hangs.
        #expect(
            waitUntil(timeout: .seconds(3)) {
                (try? fixture.siwa.value(
                    """
                    SELECT string_agg(a.name || ' ' || e.state, ',' ORDER BY a.name)
                      FROM siwa.auth_adapter_events e JOIN siwa.auth_adapters a ON a.id = e.adapter_id
                    """, as: String.self)) == "kc pending,supabase-main done"
            })
        #expect(try fixture.sessions(of: AdapterFixture.userA) == 0)
        try fake.faults(hang: 0)
        #expect(waitUntil(timeout: .seconds(20)) { (try? fixture.rows().map(\.state)) == ["done", "done"] })
    }

    @Test(
        "refused credentials are retried with the cause named and nothing marked done; the rotated file is used at the next attempt, no restart"
    )
    func rotatedCredentials() throws {
        let fixture = try AdapterFixture()
        let fake = try HostedPlatformFake("keycloak")
        _ = try fixture.siwa.value("SELECT siwa.remove_auth_adapter('supabase-main')", as: Bool.self)
        try fixture.addHosted("kc", fake: fake, extra: ["client_secret": "an-old-secret"])
        try fake.seed(email: "x@example.com", appleSub: "kc.a", sessions: 1)
        try fixture.insertChanges([("siwa.consent_revoked", "kc.a", nil)])
        let dispatcher = try fixture.dispatcher()
        #expect(try dispatcher.drainOnce().map(\.state) == ["retry"])
        let failed = try #require(try fixture.rows().first)
        #expect(failed.state == "pending")
        #expect(failed.error?.contains("refused") == true && failed.error?.contains("an-old-secret") == false)
        #expect(try fake.user(withIdentity: "apple", "kc.a")?["sessions"] as? Int == 1)
        let file = fixture.connectionFile + "-kc"
        try JSONSerialization.data(withJSONObject: fake.credentials).write(to: URL(fileURLWithPath: file))
        #expect(waitUntil(timeout: .seconds(10)) { (try? dispatcher.drainOnce().map(\.state)) == ["done"] })
        #expect(try fake.user(withIdentity: "apple", "kc.a")?["sessions"] as? Int == 0)
    }
}
