import AuthPlatforms
import Crypto
import Foundation
import TestSupport
import Testing

@testable import HostedPlatforms

/// The Firebase adapter against the fake Identity Toolkit (checked with firebase-admin: HostedFakeTests).
@Suite("Firebase: Apple's events through Identity Toolkit v1")
struct FirebaseTests {
    let fake: HostedPlatformFake
    let api: HostedAPI

    init() throws {
        fake = try HostedPlatformFake("firebase")
        api = try Self.api(fake)
    }

    /// The service-account key file of the fake, `api_url` the fake's, with `privateKey` instead.
    static func credentials(_ fake: HostedPlatformFake, privateKey: String? = nil) throws -> String {
        let text = fake.credentials["service_account_json"] ?? "{}"
        var fields = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] ?? [:]
        fields["api_url"] = fake.url
        if let privateKey { fields["private_key"] = privateKey }
        return String(decoding: try JSONSerialization.data(withJSONObject: fields), as: UTF8.self)
    }

    static func api(_ fake: HostedPlatformFake, dryRun: Bool = false, privateKey: String? = nil) throws
        -> HostedAPI
    {
        let firebase = try FirebaseAuth(
            credentials: HostedCredentials(
                try credentials(fake, privateKey: privateKey), platform: "firebase"))
        return HostedAPI(platform: firebase, timeout: .seconds(5), dryRun: dryRun)
    }

    func apply(_ event: AuthEvent, _ sub: String, _ policy: AuthPolicy = AuthPolicy()) throws -> AuthChange {
        try api.platform.apply(event, sub: sub, policy: policy, api: api)
    }

    func user(_ sub: String) throws -> [String: Any]? { try fake.user(withIdentity: "apple.com", sub) }

    /// Sets a user's custom claims directly, with the emulator's admin token.
    func setClaims(_ id: String, _ claims: [String: Any]) throws {
        let text = String(decoding: try JSONSerialization.data(withJSONObject: claims), as: UTF8.self)
        let body = try JSONSerialization.data(withJSONObject: ["localId": id, "customAttributes": text])
        let answer = try TestHTTPClient.post(
            "\(fake.credentials["api_base"] ?? "")/accounts:update", body: body,
            headers: [("Content-Type", "application/json"), ("Authorization", "Bearer owner")])
        #expect(answer.status == 200)
    }

    @Test("consent revoked revokes the refresh tokens of the linked user only; an unknown sub is no_user")
    func consentRevoked() throws {
        try fake.seed(email: "a@example.com", appleSub: "fb.a", sessions: 2)
        try fake.seed(email: "b@example.com", appleSub: "fb.b", sessions: 1)
        #expect(try apply(.consentRevoked, "fb.a").counts.refreshTokensRevoked == 1)
        #expect(try user("fb.a")?["tokens_valid_since"] as? Int != nil)
        #expect(try user("fb.a")?["sessions"] as? Int == 0)
        #expect(try user("fb.b")?["tokens_valid_since"] as? Int == nil)
        #expect(try user("fb.b")?["sessions"] as? Int == 1)
        #expect(try apply(.consentRevoked, "fb.nobody") == .noUser)
    }

    @Test(
        "account deleted, unlink: an Apple-only user is disabled first, then unlinked; one with a password or another provider keeps signing in"
    )
    func unlink() throws {
        let only = try fake.seed(email: "a@example.com", appleSub: "fb.a")
        let withPassword = try fake.seed(email: "b@example.com", appleSub: "fb.b", password: true)
        let withGoogle = try fake.seed(
            email: "c@example.com", appleSub: "fb.c", otherProviders: ["google.com"])
        let a = try apply(.accountDeleted, "fb.a").counts
        #expect(a.identitiesUnlinked == 1 && a.usersDisabled == 1 && a.refreshTokensRevoked == 1)
        let b = try apply(.accountDeleted, "fb.b").counts
        #expect(b.identitiesUnlinked == 1 && b.usersDisabled == 0)
        let c = try apply(.accountDeleted, "fb.c").counts
        #expect(c.identitiesUnlinked == 1 && c.usersDisabled == 0)
        let users = try fake.users()
        let disabled = Dictionary(
            uniqueKeysWithValues: users.map { ($0["id"] as! String, $0["disabled"] as! Bool) })
        #expect(disabled[only["id"] as! String] == true)
        #expect(disabled[withPassword["id"] as! String] == false)
        #expect(disabled[withGoogle["id"] as! String] == false)
        #expect(try user("fb.a") == nil && user("fb.b") == nil && user("fb.c") == nil)
        #expect(try fake.users().allSatisfy { $0["tokens_valid_since"] as? Int != nil })
        // Applied again (a retry after the record was lost): nothing is linked any more.
        #expect(try apply(.accountDeleted, "fb.a") == .noUser)
    }

    @Test("account deleted with delete, disable and sessions-only")
    func otherPolicies() throws {
        try fake.seed(email: "a@example.com", appleSub: "fb.a")
        try fake.seed(email: "b@example.com", appleSub: "fb.b", sessions: 2)
        try fake.seed(email: "c@example.com", appleSub: "fb.c", sessions: 3)
        #expect(
            try apply(.accountDeleted, "fb.a", AuthPolicy(onAccountDeleted: .delete)).counts.usersDeleted == 1
        )
        let disabled = try apply(.accountDeleted, "fb.b", AuthPolicy(onAccountDeleted: .disable)).counts
        #expect(disabled.usersDisabled == 1 && disabled.refreshTokensRevoked == 1)
        // Disabled already: not counted again.
        #expect(
            try apply(.accountDeleted, "fb.b", AuthPolicy(onAccountDeleted: .disable)).counts.usersDisabled
                == 0)
        let sessions = try apply(.accountDeleted, "fb.c", AuthPolicy(onAccountDeleted: .sessionsOnly)).counts
        #expect(sessions.refreshTokensRevoked == 1 && sessions.identitiesUnlinked == 0)
        #expect(try fake.users().count == 2)
        #expect(try user("fb.b")?["disabled"] as? Bool == true)
        #expect(try user("fb.c")?["sessions"] as? Int == 0 && user("fb.c")?["disabled"] as? Bool == false)
    }

    @Test(
        "a team transfer moves the identity to the new sub once; a new sub held by another user is a conflict"
    )
    func transfer() throws {
        let a = try fake.seed(email: "a@example.com", appleSub: "fb.old")
        try fake.seed(email: "b@example.com", appleSub: "fb.taken")
        #expect(try apply(.subTransferred(from: "fb.old"), "fb.new").counts.identitiesMoved == 1)
        #expect(try user("fb.new")?["id"] as? String == a["id"] as? String)
        #expect(try user("fb.old") == nil)
        #expect(try apply(.subTransferred(from: "fb.old"), "fb.new") == .applied(AuthCounts()))
        let taken = thrown(HostedCallError.self) {
            _ = try apply(.subTransferred(from: "fb.new"), "fb.taken")
        }
        #expect(taken?.kind == .conflict)
        #expect(taken?.description.contains("fb.") == false)
        #expect(try user("fb.new")?["id"] as? String == a["id"] as? String)
        // Then the account's deletion, on the new sub.
        #expect(try apply(.accountDeleted, "fb.new").counts.identitiesUnlinked == 1)
    }

    @Test("forwarding off/on merged into the custom claims, the others kept; too long a claim set is refused")
    func forwarding() throws {
        let a = try fake.seed(email: "a@example.com", appleSub: "fb.a")
        try setClaims(a["id"] as! String, ["role": "admin"])
        #expect(try apply(.forwardingChanged(on: false), "fb.a").counts.metadataRecorded == 0)
        let record = AuthPolicy(onForwardingChange: .record)
        #expect(try apply(.forwardingChanged(on: false), "fb.a", record).counts.metadataRecorded == 1)
        var claims = try user("fb.a")?["metadata"] as? [String: Any]
        #expect(claims?["siwa_email_forwarding"] as? String == "off" && claims?["role"] as? String == "admin")
        _ = try apply(.forwardingChanged(on: true), "fb.a", record)
        claims = try user("fb.a")?["metadata"] as? [String: Any]
        #expect(claims?["siwa_email_forwarding"] as? String == "on" && claims?["role"] as? String == "admin")

        let b = try fake.seed(email: "b@example.com", appleSub: "fb.b")
        try setClaims(b["id"] as! String, ["notes": String(repeating: "x", count: 980)])
        let long = thrown(HostedCallError.self) {
            _ = try apply(.forwardingChanged(on: false), "fb.b", record)
        }
        #expect(long?.kind == .callFailed && long?.description.contains("1000") == true)
        #expect((try user("fb.b")?["metadata"] as? [String: Any])?["siwa_email_forwarding"] == nil)
    }

    @Test("a dry run reads and counts, and changes nothing")
    func dryRun() throws {
        try fake.seed(email: "a@example.com", appleSub: "fb.a", sessions: 2)
        let before = try fake.users() as NSArray
        let dry = try Self.api(fake, dryRun: true)
        let counts = try dry.platform.apply(.accountDeleted, sub: "fb.a", policy: AuthPolicy(), api: dry)
            .counts
        #expect(
            counts.identitiesUnlinked == 1 && counts.usersDisabled == 1 && counts.refreshTokensRevoked == 1)
        let moved = try dry.platform.apply(
            .subTransferred(from: "fb.a"), sub: "fb.b", policy: AuthPolicy(), api: dry
        ).counts
        #expect(moved.identitiesMoved == 1)
        #expect((try fake.users() as NSArray).isEqual(to: before as! [Any]))
    }

    @Test(
        "429 is rate_limited (1 s: Google sends no Retry-After); revoked, wrong or broken keys are named, never quoted"
    )
    func faults() throws {
        try fake.seed(email: "a@example.com", appleSub: "fb.a")
        try fake.faults(rateLimit: 1)
        let limited = thrown(HostedCallError.self) { _ = try apply(.consentRevoked, "fb.a") }
        #expect(limited?.kind == .rateLimited && limited?.retryAfter == .seconds(1))
        #expect(try apply(.consentRevoked, "fb.a").counts.refreshTokensRevoked == 1)

        let key =
            try JSONSerialization.jsonObject(
                with: Data((fake.credentials["service_account_json"] ?? "{}").utf8)) as? [String: Any]
        let pem = key?["private_key"] as? String ?? "-"
        let secretLine = pem.split(separator: "\n").dropFirst().first.map(String.init) ?? "-"

        try fake.faults(revokeCredentials: true)
        let revoked = thrown(HostedCallError.self) { _ = try apply(.consentRevoked, "fb.a") }
        #expect(revoked?.kind == .credentialsRefused, "\(String(describing: revoked))")
        #expect(revoked?.endpoint == "POST {token_uri}")
        #expect(revoked?.description.contains(secretLine) == false)
        try fake.faults(revokeCredentials: false)

        let otherKey = try RSA.PrivateKey.generate().pkcs8PEM()
        let wrong = try Self.api(fake, privateKey: otherKey)
        let refused = thrown(HostedCallError.self) {
            _ = try wrong.platform.apply(.consentRevoked, sub: "fb.a", policy: AuthPolicy(), api: wrong)
        }
        #expect(refused?.kind == .credentialsRefused && refused?.status == 400)
        let otherLine = otherKey.split(separator: "\n").dropFirst().first.map(String.init) ?? "-"
        #expect(refused?.description.contains(otherLine) == false)

        let broken = "-----BEGIN PRIVATE KEY-----\nbm90LWEta2V5LXNlY3JldA==\n-----END PRIVATE KEY-----\n"
        let unreadable = thrown(HostedCallError.self) { _ = try Self.api(fake, privateKey: broken) }
        #expect(unreadable?.kind == .invalidCredentials)
        #expect(unreadable?.description.contains("bm90LWEta2V5LXNlY3JldA") == false)
        #expect(try apply(.consentRevoked, "fb.a").counts.refreshTokensRevoked == 1)
    }

    @Test("Google's fixed error codes are read from error.message; free text never is")
    func errorCodes() {
        func code(_ message: String) -> String? { FirebaseAccounts.code(["error": ["message": message]]) }
        #expect(code("USER_NOT_FOUND") == "USER_NOT_FOUND")
        #expect(code("INVALID_ID_TOKEN : the token of a@example.com") == "INVALID_ID_TOKEN")
        #expect(code("Quota exceeded for quota metric 'Account management requests'") == nil)
        #expect(code("fb.a") == nil)
        #expect(FirebaseAccounts.code(["error": "invalid_grant"]) == nil)
    }

    @Test("the assertion: RS256, the service account as iss, the token endpoint as aud, one hour")
    func assertion() throws {
        let firebase = try #require(api.platform as? FirebaseAuth)
        let parts = try firebase.assertion(now: Date(timeIntervalSince1970: 1_800_000_000)).split(
            separator: ".")
        #expect(parts.count == 3 && !parts.joined().contains("=") && !parts.joined().contains("+"))
        func object(_ part: Substring) throws -> [String: Any] {
            var text = part.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
            text += String(repeating: "=", count: (4 - text.count % 4) % 4)
            return try JSONSerialization.jsonObject(with: try #require(Data(base64Encoded: text)))
                as? [String: Any]
                ?? [:]
        }
        #expect(try object(parts[0])["alg"] as? String == "RS256")
        let claims = try object(parts[1])
        #expect(claims["iss"] as? String == "siwa-adapter@siwa-fake-project.iam.gserviceaccount.com")
        #expect(claims["aud"] as? String == "\(fake.url)/token")
        #expect(claims["iat"] as? Int == 1_800_000_000 && claims["exp"] as? Int == 1_800_003_600)
        #expect(
            (claims["scope"] as? String)?.contains("https://www.googleapis.com/auth/identitytoolkit") == true)
    }

    @Test("the calls each event makes, the token's once per API client")
    func callsPerEvent() throws {
        try fake.seed(email: "a@example.com", appleSub: "fb.a")
        try fake.seed(email: "b@example.com", appleSub: "fb.b", password: true)
        try fake.seed(email: "c@example.com", appleSub: "fb.c")
        try fake.seed(email: "d@example.com", appleSub: "fb.d")
        try fake.seed(email: "e@example.com", appleSub: "fb.e")
        #expect(try apply(.consentRevoked, "fb.none") == .noUser)
        #expect(api.calls == 2)  // the token, then the lookup
        var lines: [String] = []
        func count(_ name: String, _ event: AuthEvent, _ sub: String, _ policy: AuthPolicy = AuthPolicy())
            throws -> Int
        {
            let before = api.calls
            _ = try apply(event, sub, policy)
            lines.append("\(name) \(api.calls - before)")
            return api.calls - before
        }
        #expect(try count("consent_revoked", .consentRevoked, "fb.a") == 2)
        #expect(try count("account_delete:unlink(apple only)", .accountDeleted, "fb.a") == 4)
        #expect(try count("account_delete:unlink(password)", .accountDeleted, "fb.b") == 3)
        #expect(
            try count("account_delete:delete", .accountDeleted, "fb.c", AuthPolicy(onAccountDeleted: .delete))
                == 2)
        #expect(
            try count(
                "account_delete:disable", .accountDeleted, "fb.d", AuthPolicy(onAccountDeleted: .disable))
                == 3)
        #expect(
            try count(
                "email_forwarding(record)", .forwardingChanged(on: false), "fb.e",
                AuthPolicy(onForwardingChange: .record)) == 2)
        #expect(try count("sub_transferred(move)", .subTransferred(from: "fb.e"), "fb.f") == 4)
        #expect(try count("sub_transferred(again)", .subTransferred(from: "fb.e"), "fb.f") == 2)
        #expect(try count("no_user", .consentRevoked, "fb.none") == 1)
        print("firebase calls: " + lines.joined(separator: ", ") + " (plus one token per hour)")
    }
}
