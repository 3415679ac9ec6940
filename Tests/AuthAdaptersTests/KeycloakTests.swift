import AuthPlatforms
import Foundation
import HostedPlatforms
import TestSupport
import Testing

/// The Keycloak adapter against the fake Keycloak (checked with python-keycloak: HostedFakeTests).
@Suite("Keycloak: Apple's events through the Admin REST API")
struct KeycloakTests {
    let fake: HostedPlatformFake
    let api: HostedAPI

    init() throws {
        fake = try HostedPlatformFake("keycloak")
        api = try Self.api(fake)
    }

    static func api(_ fake: HostedPlatformFake, dryRun: Bool = false, secret: String? = nil) throws
        -> HostedAPI
    {
        var fields = fake.credentials
        if let secret { fields["client_secret"] = secret }
        let text = String(decoding: try JSONSerialization.data(withJSONObject: fields), as: UTF8.self)
        let keycloak = try Keycloak(
            provider: "apple", credentials: HostedCredentials(text, platform: "keycloak"))
        return HostedAPI(platform: keycloak, timeout: .seconds(5), dryRun: dryRun)
    }

    func apply(_ event: AuthEvent, _ sub: String, _ policy: AuthPolicy = AuthPolicy()) throws -> AuthChange {
        try api.platform.apply(event, sub: sub, policy: policy, api: api)
    }

    func user(_ sub: String) throws -> [String: Any]? { try fake.user(withIdentity: "apple", sub) }

    @Test("consent revoked ends every session of the linked user only; an unknown sub is no_user")
    func consentRevoked() throws {
        try fake.seed(email: "a@example.com", appleSub: "kc.a", sessions: 2)
        try fake.seed(email: "b@example.com", appleSub: "kc.b", sessions: 1)
        #expect(try apply(.consentRevoked, "kc.a").counts.sessionsEnded == 2)
        #expect(try user("kc.a")?["sessions"] as? Int == 0)
        #expect(try user("kc.b")?["sessions"] as? Int == 1)
        #expect(try apply(.consentRevoked, "kc.nobody") == .noUser)
    }

    @Test(
        "account deleted, unlink: an Apple-only user is disabled first, then unlinked; one with a password keeps signing in"
    )
    func unlink() throws {
        let only = try fake.seed(email: "a@example.com", appleSub: "kc.a")
        let withPassword = try fake.seed(email: "b@example.com", appleSub: "kc.b", password: true)
        let a = try apply(.accountDeleted, "kc.a").counts
        #expect(a.identitiesUnlinked == 1 && a.usersDisabled == 1 && a.sessionsEnded == 1)
        let b = try apply(.accountDeleted, "kc.b").counts
        #expect(b.identitiesUnlinked == 1 && b.usersDisabled == 0)
        let users = try fake.users()
        let disabled = Dictionary(
            uniqueKeysWithValues: users.map { ($0["id"] as! String, $0["disabled"] as! Bool) })
        #expect(disabled[only["id"] as! String] == true)
        #expect(disabled[withPassword["id"] as! String] == false)
        #expect(try user("kc.a") == nil && user("kc.b") == nil)
        // Applied again (a retry after the record was lost): nothing is linked any more.
        #expect(try apply(.accountDeleted, "kc.a") == .noUser)
    }

    @Test("account deleted with delete, disable and sessions-only")
    func otherPolicies() throws {
        try fake.seed(email: "a@example.com", appleSub: "kc.a")
        try fake.seed(email: "b@example.com", appleSub: "kc.b", sessions: 2)
        try fake.seed(email: "c@example.com", appleSub: "kc.c", sessions: 3)
        #expect(
            try apply(.accountDeleted, "kc.a", AuthPolicy(onAccountDeleted: .delete)).counts.usersDeleted == 1
        )
        let disabled = try apply(.accountDeleted, "kc.b", AuthPolicy(onAccountDeleted: .disable)).counts
        #expect(disabled.usersDisabled == 1 && disabled.sessionsEnded == 2)
        // Disabled already: not counted again.
        #expect(
            try apply(.accountDeleted, "kc.b", AuthPolicy(onAccountDeleted: .disable)).counts.usersDisabled
                == 0)
        let sessions = try apply(.accountDeleted, "kc.c", AuthPolicy(onAccountDeleted: .sessionsOnly)).counts
        #expect(sessions.sessionsEnded == 3 && sessions.identitiesUnlinked == 0)
        #expect(try fake.users().count == 2)
        #expect(try user("kc.c") != nil)
    }

    @Test(
        "a team transfer moves the identity to the new sub once; a new sub held by another user is a conflict"
    )
    func transfer() throws {
        let a = try fake.seed(email: "a@example.com", appleSub: "kc.old")
        try fake.seed(email: "b@example.com", appleSub: "kc.taken")
        #expect(try apply(.subTransferred(from: "kc.old"), "kc.new").counts.identitiesMoved == 1)
        #expect(try user("kc.new")?["id"] as? String == a["id"] as? String)
        #expect(try user("kc.old") == nil)
        #expect(try apply(.subTransferred(from: "kc.old"), "kc.new") == .applied(AuthCounts()))
        #expect(throws: HostedCallError.self) { try apply(.subTransferred(from: "kc.new"), "kc.taken") }
        #expect(try user("kc.new")?["id"] as? String == a["id"] as? String)
        // Then the account's deletion, on the new sub.
        #expect(try apply(.accountDeleted, "kc.new").counts.identitiesUnlinked == 1)
    }

    @Test("forwarding off/on recorded in the user's attributes, the others kept; ignored by default")
    func forwarding() throws {
        try fake.seed(email: "a@example.com", appleSub: "kc.a")
        #expect(try apply(.forwardingChanged(on: false), "kc.a").counts.metadataRecorded == 0)
        let record = AuthPolicy(onForwardingChange: .record)
        #expect(try apply(.forwardingChanged(on: false), "kc.a", record).counts.metadataRecorded == 1)
        #expect(
            (try user("kc.a")?["metadata"] as? [String: Any])?["siwa_email_forwarding"] as? [String] == [
                "off"
            ])
        _ = try apply(.forwardingChanged(on: true), "kc.a", record)
        #expect(
            (try user("kc.a")?["metadata"] as? [String: Any])?["siwa_email_forwarding"] as? [String] == ["on"]
        )
    }

    @Test("a dry run reads and counts, and changes nothing")
    func dryRun() throws {
        try fake.seed(email: "a@example.com", appleSub: "kc.a", sessions: 2)
        let before = try fake.users() as NSArray
        let dry = try Self.api(fake, dryRun: true)
        let counts = try dry.platform.apply(.accountDeleted, sub: "kc.a", policy: AuthPolicy(), api: dry)
            .counts
        #expect(counts.identitiesUnlinked == 1 && counts.usersDisabled == 1 && counts.sessionsEnded == 2)
        #expect((try fake.users() as NSArray).isEqual(to: before as! [Any]))
    }

    @Test(
        "429 is rate_limited with Retry-After; refused or revoked credentials are named, no secret in the error"
    )
    func faults() throws {
        try fake.seed(email: "a@example.com", appleSub: "kc.a")
        try fake.faults(rateLimit: 1)
        let limited = thrown(HostedCallError.self) { _ = try apply(.consentRevoked, "kc.a") }
        #expect(limited?.kind == .rateLimited && limited?.retryAfter == .seconds(1))
        let wrong = try Self.api(fake, secret: "not-the-secret")
        let refused = thrown(HostedCallError.self) {
            _ = try wrong.platform.apply(.consentRevoked, sub: "kc.a", policy: AuthPolicy(), api: wrong)
        }
        #expect(refused?.kind == .credentialsRefused)
        #expect(refused?.description.contains("not-the-secret") == false)
        #expect(try apply(.consentRevoked, "kc.a").counts.sessionsEnded == 1)
        try fake.faults(revokeCredentials: true)
        let revoked = thrown(HostedCallError.self) { _ = try apply(.consentRevoked, "kc.a") }
        #expect(
            revoked?.kind == .credentialsRefused && revoked?.status == 401, "\(String(describing: revoked))")
        #expect(revoked?.description.contains(fake.credentials["client_secret"] ?? "-") == false)
        try fake.faults(outage: 1, revokeCredentials: false)
        // The token was dropped with the refusal: the new token's request meets the outage, and says so.
        let down = thrown(HostedCallError.self) { _ = try apply(.consentRevoked, "kc.a") }
        #expect(down?.kind == .unavailable && down?.status == 503)
        #expect(
            down?.description
                == "keycloak: POST /realms/{realm}/protocol/openid-connect/token: the platform failed (HTTP 503)"
        )
    }

    @Test(
        "a 404 about the user found is user_gone (the adapter ends the row no_user); a 404 elsewhere is the call's failure"
    )
    func userGone() throws {
        try fake.seed(email: "a@example.com", appleSub: "kc.a")
        let gone = thrown(HostedCallError.self) {
            _ = try api.read(
                "/admin/realms/siwa/users/no-such-id", endpoint: "/admin/realms/{realm}/users/{id}")
        }
        #expect(gone?.kind == .userGone && gone?.status == 404)
        let misconfigured = thrown(HostedCallError.self) {
            _ = try api.read(
                "/admin/realms/siwa/nothing-here", endpoint: "/admin/realms/{realm}/nothing-here")
        }
        #expect(misconfigured?.kind == .callFailed && misconfigured?.status == 404)
    }
}
