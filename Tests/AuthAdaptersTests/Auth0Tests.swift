import AuthPlatforms
import Foundation
import HostedPlatforms
import TestSupport
import Testing

/// The Auth0 adapter against the fake tenant (checked with auth0-python: HostedFakeTests).
@Suite("Auth0: Apple's events through the Management API")
struct Auth0Tests {
    let fake: HostedPlatformFake
    let api: HostedAPI

    init() throws {
        fake = try HostedPlatformFake("auth0")
        api = try Self.api(fake)
    }

    static func api(_ fake: HostedPlatformFake, dryRun: Bool = false, limited: Bool = false) throws
        -> HostedAPI
    {
        var fields = fake.credentials
        fields["base_url"] = fake.url
        if limited {
            fields["client_id"] = fields["limited_client_id"]
            fields["client_secret"] = fields["limited_client_secret"]
        }
        let text = String(decoding: try JSONSerialization.data(withJSONObject: fields), as: UTF8.self)
        let auth0 = try Auth0(provider: "apple", credentials: HostedCredentials(text, platform: "auth0"))
        return HostedAPI(platform: auth0, timeout: .seconds(5), dryRun: dryRun)
    }

    func apply(_ event: AuthEvent, _ sub: String, _ policy: AuthPolicy = AuthPolicy(), api: HostedAPI? = nil)
        throws -> AuthChange
    {
        let api = api ?? self.api
        return try api.platform.apply(event, sub: sub, policy: policy, api: api)
    }

    func user(_ id: String) throws -> [String: Any]? { try fake.users().first { $0["id"] as? String == id } }

    @Test("consent revoked ends the user's sessions and refresh tokens; an unknown sub is no_user")
    func consentRevoked() throws {
        let a = try fake.seed(email: "a@example.com", appleSub: "a0.a", sessions: 2)
        try fake.seed(email: "b@example.com", appleSub: "a0.b", sessions: 1)
        let counts = try apply(.consentRevoked, "a0.a").counts
        #expect(counts.sessionsEnded == 1 && counts.refreshTokensRevoked == 1)
        #expect(try user(a["id"] as! String)?["sessions"] as? Int == 0)
        #expect(try fake.user(withIdentity: "apple", "a0.b")?["sessions"] as? Int == 1)
        #expect(try apply(.consentRevoked, "a0.nobody") == .noUser)
        print("auth0 calls, consent revoked: \(api.calls) (token included)")
    }

    @Test(
        "account deleted: a primary Apple user is blocked; a linked Apple identity is unlinked, its standalone user removed"
    )
    func unlink() throws {
        let primary = try fake.seed(email: "a@example.com", appleSub: "a0.a")
        let linked = try fake.seed(email: "b@example.com", appleSub: "a0.b", password: true)
        _ = try apply(.consentRevoked, "a0.nobody")  // the token, not counted below
        let first = api.calls
        let a = try apply(.accountDeleted, "a0.a").counts
        // The user read once: found, blocked, sessions and refresh tokens ended.
        #expect(api.calls - first == 4)
        #expect(a.usersDisabled == 1 && a.identitiesUnlinked == 0)
        #expect(try user(primary["id"] as! String)?["disabled"] as? Bool == true)
        let before = api.calls
        let b = try apply(.accountDeleted, "a0.b").counts
        #expect(b.identitiesUnlinked == 1 && b.usersDisabled == 0)
        // Found (a direct read, a search), sessions and refresh tokens, the identity and its standalone user.
        #expect(api.calls - before == 6)
        let kept = try #require(try user(linked["id"] as! String))
        #expect(kept["disabled"] as? Bool == false)
        #expect((kept["identities"] as? [[String: Any]])?.map { $0["provider"] as? String } == ["auth0"])
        #expect(try fake.users().count == 2, "no standalone apple|a0.b user is left")
        #expect(try apply(.accountDeleted, "a0.b") == .noUser)
    }

    @Test("account deleted with delete, disable and sessions-only")
    func otherPolicies() throws {
        try fake.seed(email: "a@example.com", appleSub: "a0.a")
        let b = try fake.seed(email: "b@example.com", appleSub: "a0.b", sessions: 1)
        #expect(
            try apply(.accountDeleted, "a0.a", AuthPolicy(onAccountDeleted: .delete)).counts.usersDeleted == 1
        )
        #expect(try fake.user(withIdentity: "apple", "a0.a") == nil)
        let disabled = try apply(.accountDeleted, "a0.b", AuthPolicy(onAccountDeleted: .disable)).counts
        #expect(disabled.usersDisabled == 1 && disabled.sessionsEnded == 1)
        #expect(
            try apply(.accountDeleted, "a0.b", AuthPolicy(onAccountDeleted: .disable)).counts.usersDisabled
                == 0)
        #expect(try user(b["id"] as! String)?["disabled"] as? Bool == true)
        #expect(
            try apply(.accountDeleted, "a0.b", AuthPolicy(onAccountDeleted: .sessionsOnly)).counts
                .usersDeleted == 0)
    }

    @Test(
        "a team transfer is recorded in app metadata (identities cannot be renamed); the new sub's events then find the user"
    )
    func transfer() throws {
        let a = try fake.seed(email: "a@example.com", appleSub: "a0.old", sessions: 1)
        #expect(try apply(.subTransferred(from: "a0.old"), "a0.new").counts.metadataRecorded == 1)
        let metadata = try user(a["id"] as! String)?["metadata"] as? [String: String]
        #expect(metadata?["siwa_apple_sub"] == "a0.new" && metadata?["siwa_apple_previous_sub"] == "a0.old")
        #expect(try apply(.subTransferred(from: "a0.old"), "a0.new").counts.metadataRecorded == 1)
        // The deletion that follows, on the new sub: the user is found by its metadata and blocked.
        let deleted = try apply(.accountDeleted, "a0.new").counts
        #expect(deleted.usersDisabled == 1 && deleted.sessionsEnded == 1)
        // A new sub already another user's: a conflict, nothing recorded.
        try fake.seed(email: "b@example.com", appleSub: "a0.b")
        try fake.seed(email: "c@example.com", appleSub: "a0.c")
        #expect(
            thrown(HostedCallError.self) { _ = try apply(.subTransferred(from: "a0.b"), "a0.c") }?.kind
                == .conflict)
    }

    @Test("forwarding off/on recorded in app metadata; a dry run changes nothing")
    func forwardingAndDryRun() throws {
        let a = try fake.seed(email: "a@example.com", appleSub: "a0.a", sessions: 1)
        let record = AuthPolicy(onForwardingChange: .record)
        #expect(try apply(.forwardingChanged(on: false), "a0.a", record).counts.metadataRecorded == 1)
        #expect(
            (try user(a["id"] as! String)?["metadata"] as? [String: String])?["siwa_email_forwarding"]
                == "off")
        let before = try fake.users() as NSArray
        let dry = try Self.api(fake, dryRun: true)
        let counts = try apply(.accountDeleted, "a0.a", api: dry).counts
        #expect(counts.usersDisabled == 1 && counts.sessionsEnded == 1)
        #expect((try fake.users() as NSArray).isEqual(to: before as! [Any]))
    }

    @Test(
        "a tenant without the sessions feature: consent revoked ends nothing there and says so by its counts; a missing scope is refused credentials"
    )
    func sessionsFeature() throws {
        try fake.seed(email: "a@example.com", appleSub: "a0.a", sessions: 1)
        _ = try TestHTTPClient.post(
            "\(fake.url)/_fake/options", body: Array(#"{"sessions_api": false}"#.utf8))
        #expect(try apply(.consentRevoked, "a0.a") == .applied(AuthCounts()))
        let limited = try Self.api(fake, limited: true)
        let refused = thrown(HostedCallError.self) {
            _ = try apply(.accountDeleted, "a0.a", AuthPolicy(onAccountDeleted: .delete), api: limited)
        }
        #expect(
            refused?.kind == .credentialsRefused && refused?.status == 403, "\(String(describing: refused))")
    }

    @Test("429 waits for x-ratelimit-reset; revoked credentials are refused, no secret in the error")
    func faults() throws {
        try fake.seed(email: "a@example.com", appleSub: "a0.a")
        try fake.faults(rateLimit: 1)
        let limited = thrown(HostedCallError.self) { _ = try apply(.consentRevoked, "a0.a") }
        #expect(limited?.kind == .rateLimited)
        #expect(limited.flatMap(\.retryAfter).map { $0 > .zero && $0 <= .seconds(3) } == true)
        try fake.faults(revokeCredentials: true)
        let revoked = thrown(HostedCallError.self) { _ = try apply(.consentRevoked, "a0.a") }
        #expect(revoked?.kind == .credentialsRefused)
        #expect(revoked?.description.contains(fake.credentials["client_secret"] ?? "-") == false)
    }
}
