import AuthPlatforms
import Foundation
import HostedPlatforms
import TestSupport
import Testing

/// The Clerk adapter against the fake Backend API (checked with clerk-backend-api: HostedFakeTests).
@Suite("Clerk: Apple's events through the Backend API")
struct ClerkTests {
    let fake: HostedPlatformFake
    let api: HostedAPI

    init() throws {
        fake = try HostedPlatformFake("clerk")
        api = try Self.api(fake)
    }

    static func api(_ fake: HostedPlatformFake, dryRun: Bool = false, secret: String? = nil) throws
        -> HostedAPI
    {
        var fields = fake.credentials
        if let secret { fields["secret_key"] = secret }
        let text = String(decoding: try JSONSerialization.data(withJSONObject: fields), as: UTF8.self)
        let clerk = try Clerk(provider: "apple", credentials: HostedCredentials(text, platform: "clerk"))
        return HostedAPI(platform: clerk, timeout: .seconds(5), dryRun: dryRun)
    }

    func apply(_ event: AuthEvent, _ sub: String, _ policy: AuthPolicy = AuthPolicy()) throws -> AuthChange {
        try api.platform.apply(event, sub: sub, policy: policy, api: api)
    }

    func user(_ sub: String) throws -> [String: Any]? { try fake.user(withIdentity: "oauth_apple", sub) }

    func privateMetadata(_ user: [String: Any]?) -> [String: Any]? {
        (user?["metadata"] as? [String: Any])?["private_metadata"] as? [String: Any]
    }

    /// The vendor calls `body` made, from the fake's count.
    func calls(_ body: () throws -> Void) throws -> Int {
        let before = try fake.calls().total
        try body()
        return try fake.calls().total - before
    }

    @Test("the provider is Clerk's oauth_apple, and the secret key is the bearer without a call")
    func settings() throws {
        #expect(
            api.platform.provider == "oauth_apple" && api.platform.baseURL == fake.credentials["server_url"])
        let fallback = try Clerk(
            provider: "oauth_apple",
            credentials: HostedCredentials(#"{"secret_key": "sk_x"}"#, platform: "clerk"))
        #expect(fallback.baseURL == "https://api.clerk.com/v1")
        #expect(throws: HostedCallError.self) {
            try Clerk(provider: "apple", credentials: HostedCredentials("{}", platform: "clerk"))
        }
    }

    @Test("consent revoked revokes each active session of the linked user only; an unknown sub is no_user")
    func consentRevoked() throws {
        try fake.seed(email: "a@example.com", appleSub: "ck.a", sessions: 2)
        try fake.seed(email: "b@example.com", appleSub: "ck.b", sessions: 1)
        var counts = AuthCounts()
        // find 1 + list sessions 1 + revoke 1 per session.
        #expect(try calls { counts = try apply(.consentRevoked, "ck.a").counts } == 4)
        #expect(counts.sessionsEnded == 2)
        #expect(try user("ck.a")?["sessions"] as? Int == 0)
        #expect(try user("ck.b")?["sessions"] as? Int == 1)
        #expect(try apply(.consentRevoked, "ck.nobody") == .noUser)
        #expect(try apply(.consentRevoked, "ck.a").counts == AuthCounts())
        // Every call named the API version the adapter reads its answers as.
        let versions = try TestHTTPClient.get("\(fake.url)/_fake/api_versions")
        #expect(
            (try JSONSerialization.jsonObject(with: versions.data) as? [String: Any])?["api_versions"]
                as? [String]
                == ["2025-11-10"])
    }

    @Test("more than a page of sessions is revoked to the last; a sub linked to two users is ambiguous")
    func pagingAndAmbiguity() throws {
        try fake.seed(email: "a@example.com", appleSub: "ck.a", sessions: 105)
        var counts = AuthCounts()
        // find 1 + two pages of sessions + 105 revokes.
        #expect(try calls { counts = try apply(.consentRevoked, "ck.a").counts } == 108)
        #expect(counts.sessionsEnded == 105)
        #expect(try user("ck.a")?["sessions"] as? Int == 0)
        try fake.seed(email: "b@example.com", appleSub: "ck.twice")
        try fake.seed(email: "c@example.com", appleSub: "ck.twice")
        let ambiguous = thrown(HostedCallError.self) { _ = try apply(.accountDeleted, "ck.twice") }
        #expect(ambiguous?.kind == .ambiguous && ambiguous?.description.contains("ck.twice") == false)
        #expect(try fake.users().allSatisfy { $0["disabled"] as? Bool == false })
    }

    @Test("the calls per event, for docs/adapters.md")
    func callsPerEvent() throws {
        try fake.seed(email: "a@example.com", appleSub: "ck.a", sessions: 2)
        try fake.seed(email: "b@example.com", appleSub: "ck.b", sessions: 2)
        try fake.seed(email: "c@example.com", appleSub: "ck.c", password: true, sessions: 2)
        let consent = try calls { _ = try apply(.consentRevoked, "ck.a") }
        let transfer = try calls { _ = try apply(.subTransferred(from: "ck.a"), "ck.a2") }
        let again = try calls { _ = try apply(.subTransferred(from: "ck.a"), "ck.a2") }
        let appleOnly = try calls { _ = try apply(.accountDeleted, "ck.b") }
        let withPassword = try calls { _ = try apply(.accountDeleted, "ck.c") }
        print(
            "clerk calls: consent revoked (2 sessions) \(consent), transfer \(transfer) (again \(again)),"
                + " account deleted/unlink Apple-only \(appleOnly), with a password (2 sessions) \(withPassword)"
        )
        #expect([consent, transfer, again, appleOnly, withPassword] as [Int] == [4, 3, 2, 4, 5])
    }

    @Test(
        "account deleted, unlink: an Apple-only user is banned, then unlinked; one with a password or another account is not"
    )
    func unlink() throws {
        let only = try fake.seed(email: "a@example.com", appleSub: "ck.a", sessions: 2)
        let withPassword = try fake.seed(email: "b@example.com", appleSub: "ck.b", password: true)
        let withGoogle = try fake.seed(email: "c@example.com", appleSub: "ck.c", otherProviders: ["google"])
        var a = AuthCounts()
        // find 1 + list sessions 1 + ban 1 (which revokes them) + delete the external account 1.
        #expect(try calls { a = try apply(.accountDeleted, "ck.a").counts } == 4)
        #expect(a.identitiesUnlinked == 1 && a.usersDisabled == 1 && a.sessionsEnded == 2)
        var b = AuthCounts()
        // find 1 + list sessions 1 + revoke 1 + delete the external account 1.
        #expect(try calls { b = try apply(.accountDeleted, "ck.b").counts } == 4)
        #expect(b.identitiesUnlinked == 1 && b.usersDisabled == 0 && b.sessionsEnded == 1)
        #expect(try apply(.accountDeleted, "ck.c").counts.usersDisabled == 0)
        let users = try fake.users()
        let disabled = Dictionary(
            uniqueKeysWithValues: users.map { ($0["id"] as! String, $0["disabled"] as! Bool) })
        #expect(disabled[only["id"] as! String] == true)
        #expect(disabled[withPassword["id"] as! String] == false)
        #expect(disabled[withGoogle["id"] as! String] == false)
        #expect(users.allSatisfy { $0["sessions"] as? Int == 0 })
        #expect(try user("ck.a") == nil && user("ck.b") == nil && user("ck.c") == nil)
        let google = users.first { $0["id"] as? String == withGoogle["id"] as? String }?["identities"]
        #expect((google as? [[String: Any]])?.map { $0["provider"] as? String } == ["oauth_google"])
        // Applied again (a retry after the record was lost): nothing is linked any more.
        #expect(try apply(.accountDeleted, "ck.a") == .noUser)
    }

    @Test("account deleted with delete, disable (a ban, not counted twice) and sessions-only")
    func otherPolicies() throws {
        try fake.seed(email: "a@example.com", appleSub: "ck.a")
        try fake.seed(email: "b@example.com", appleSub: "ck.b", sessions: 2)
        try fake.seed(email: "c@example.com", appleSub: "ck.c", sessions: 3)
        #expect(
            try apply(.accountDeleted, "ck.a", AuthPolicy(onAccountDeleted: .delete)).counts.usersDeleted == 1
        )
        let disable = AuthPolicy(onAccountDeleted: .disable)
        let disabled = try apply(.accountDeleted, "ck.b", disable).counts
        #expect(disabled.usersDisabled == 1 && disabled.sessionsEnded == 2)
        #expect(try apply(.accountDeleted, "ck.b", disable).counts == AuthCounts())
        let sessions = try apply(.accountDeleted, "ck.c", AuthPolicy(onAccountDeleted: .sessionsOnly)).counts
        #expect(sessions.sessionsEnded == 3 && sessions.identitiesUnlinked == 0)
        #expect(try fake.users().count == 2)
        #expect(try user("ck.b")?["disabled"] as? Bool == true)
        #expect(try user("ck.c")?["disabled"] as? Bool == false)
    }

    @Test(
        "a team transfer is recorded in private metadata, the link kept, once; a new sub held by another user is a conflict"
    )
    func transfer() throws {
        let a = try fake.seed(email: "a@example.com", appleSub: "ck.old")
        try fake.seed(email: "b@example.com", appleSub: "ck.taken")
        var moved = AuthCounts()
        // find the old sub 1 + find the new sub 1 + merge the metadata 1.
        #expect(try calls { moved = try apply(.subTransferred(from: "ck.old"), "ck.new").counts } == 3)
        #expect(moved.metadataRecorded == 1 && moved.identitiesMoved == 0)
        let recorded = try user("ck.old")
        #expect(recorded?["id"] as? String == a["id"] as? String)
        #expect(privateMetadata(recorded)?["siwa_apple_sub"] as? String == "ck.new")
        #expect(privateMetadata(recorded)?["siwa_apple_previous_sub"] as? String == "ck.old")
        // Applied again: the old sub still finds the user, the metadata is there already.
        #expect(try apply(.subTransferred(from: "ck.old"), "ck.new") == .applied(AuthCounts()))
        let conflict = thrown(HostedCallError.self) {
            _ = try apply(.subTransferred(from: "ck.old"), "ck.taken")
        }
        #expect(conflict?.kind == .conflict)
        #expect(privateMetadata(try user("ck.old"))?["siwa_apple_sub"] as? String == "ck.new")
        #expect(privateMetadata(try user("ck.taken"))?.isEmpty == true)
        // The link is the old sub's until the app links the new one.
        #expect(try apply(.consentRevoked, "ck.new") == .noUser)
        #expect(try apply(.consentRevoked, "ck.old").counts.sessionsEnded == 1)
    }

    @Test("forwarding off/on recorded in private metadata, the other keys kept; ignored by default")
    func forwarding() throws {
        try fake.seed(email: "a@example.com", appleSub: "ck.a")
        #expect(try apply(.forwardingChanged(on: false), "ck.a").counts.metadataRecorded == 0)
        _ = try apply(.subTransferred(from: "ck.a"), "ck.a2")
        let record = AuthPolicy(onForwardingChange: .record)
        #expect(try apply(.forwardingChanged(on: false), "ck.a", record).counts.metadataRecorded == 1)
        #expect(privateMetadata(try user("ck.a"))?["siwa_email_forwarding"] as? String == "off")
        #expect(try apply(.forwardingChanged(on: true), "ck.a", record).counts.metadataRecorded == 1)
        let metadata = privateMetadata(try user("ck.a"))
        #expect(metadata?["siwa_email_forwarding"] as? String == "on")
        #expect(metadata?["siwa_apple_sub"] as? String == "ck.a2")
    }

    @Test("a dry run reads and counts, and changes nothing")
    func dryRun() throws {
        try fake.seed(email: "a@example.com", appleSub: "ck.a", sessions: 2)
        try fake.seed(email: "b@example.com", appleSub: "ck.b", password: true, sessions: 1)
        let before = try fake.users() as NSArray
        let dry = try Self.api(fake, dryRun: true)
        func apply(_ event: AuthEvent, _ sub: String, _ policy: AuthPolicy = AuthPolicy()) throws
            -> AuthCounts
        {
            try dry.platform.apply(event, sub: sub, policy: policy, api: dry).counts
        }
        let a = try apply(.accountDeleted, "ck.a")
        #expect(a.identitiesUnlinked == 1 && a.usersDisabled == 1 && a.sessionsEnded == 2)
        let b = try apply(.accountDeleted, "ck.b")
        #expect(b.identitiesUnlinked == 1 && b.usersDisabled == 0 && b.sessionsEnded == 1)
        #expect(try apply(.consentRevoked, "ck.a").sessionsEnded == 2)
        #expect(try apply(.subTransferred(from: "ck.a"), "ck.new").metadataRecorded == 1)
        #expect(
            try apply(.accountDeleted, "ck.a", AuthPolicy(onAccountDeleted: .delete)).usersDeleted == 1)
        #expect((try fake.users() as NSArray).isEqual(to: before as! [Any]))
    }

    @Test(
        "429 is rate_limited with Retry-After; a wrong or revoked secret key is refused, never in the error"
    )
    func faults() throws {
        try fake.seed(email: "a@example.com", appleSub: "ck.a")
        try fake.faults(rateLimit: 1)
        let limited = thrown(HostedCallError.self) { _ = try apply(.consentRevoked, "ck.a") }
        #expect(limited?.kind == .rateLimited && limited?.retryAfter == .seconds(1))
        let wrong = try Self.api(fake, secret: "sk_test_not-the-secret")
        let refused = thrown(HostedCallError.self) {
            _ = try wrong.platform.apply(.consentRevoked, sub: "ck.a", policy: AuthPolicy(), api: wrong)
        }
        #expect(refused?.kind == .credentialsRefused && refused?.status == 401)
        #expect(refused?.description.contains("not-the-secret") == false)
        #expect(try apply(.consentRevoked, "ck.a").counts.sessionsEnded == 1)
        try fake.faults(revokeCredentials: true)
        let revoked = thrown(HostedCallError.self) { _ = try apply(.consentRevoked, "ck.a") }
        #expect(
            revoked?.kind == .credentialsRefused && revoked?.status == 401, "\(String(describing: revoked))")
        #expect(revoked?.description.contains(fake.credentials["secret_key"] ?? "-") == false)
        #expect(revoked?.description.contains("ck.a") == false)
        try fake.faults(outage: 1, revokeCredentials: false)
        let down = thrown(HostedCallError.self) { _ = try apply(.consentRevoked, "ck.a") }
        #expect(down?.kind == .unavailable && down?.status == 503)
        #expect(
            down?.description == "clerk: GET /users?provider&provider_user_id: the platform failed (HTTP 503)"
        )
    }
}
