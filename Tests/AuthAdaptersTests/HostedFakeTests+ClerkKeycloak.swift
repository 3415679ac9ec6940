import Foundation
import HTTPServer
import TestSupport
import Testing

/// The fakes of Clerk's Backend API and Keycloak's Admin REST API (Tests/Fixtures/hosted-platforms): each
/// checked with its vendor's own SDK, and over plain HTTP for what an adapter relies on (credentials refused,
/// faults, least privilege).
@Suite("Hosted platform fakes: Clerk and Keycloak")
struct HostedFakeClerkKeycloakTests {
    @Test(
        "the vendor SDK finds, updates, signs out, unlinks and deletes a user through the fake",
        arguments: ["check_clerk.py", "check_keycloak.py"])
    func sdkCheck(script: String) throws {
        let result = try HostedPlatformFake.runCheck(script)
        #expect(result.status == 0, "\(result.standardError)")
        let line = try #require(result.standardOutput.split(separator: "\n").last)
        let report = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
        #expect((report?["checked"] as? [String])?.count ?? 0 >= 10, "\(result.standardOutput)")
    }

    // MARK: Clerk

    @Test("Clerk: the Apple sub finds its user; a wrong secret key is 401 clerk_key_invalid without the key")
    func clerkFindAndWrongKey() throws {
        let fake = try HostedPlatformFake("clerk")
        defer { fake.stop() }
        let seeded = try fake.seed(email: "a@example.com", appleSub: "001.a")
        let key = try #require(fake.credentials["secret_key"])
        #expect(key.hasPrefix("sk_test_"))

        let found = try Self.get(fake, "/v1/users?provider=oauth_apple&provider_user_id=001.a", bearer: key)
        #expect(found.status == 200)
        let users = try JSONSerialization.jsonObject(with: found.data) as? [[String: Any]]
        #expect(users?.map { $0["id"] as? String } == [seeded["id"] as? String])
        let accounts = users?.first?["external_accounts"] as? [[String: Any]]
        #expect(accounts?.first?["provider"] as? String == "oauth_apple")
        #expect(accounts?.first?["provider_user_id"] as? String == "001.a")
        let none = try Self.get(fake, "/v1/users?provider=oauth_apple&provider_user_id=001.none", bearer: key)
        #expect(none.status == 200 && none.text == "[]")

        let wrong = try Self.get(fake, "/v1/users", bearer: "sk_test_wrong")
        #expect(wrong.status == 401)
        #expect(Self.clerkCode(wrong) == "clerk_key_invalid", "\(wrong.text)")
        #expect(!wrong.text.contains("sk_test_"))
        #expect(try fake.calls().byEndpoint["GET /v1/users"] == 2)
    }

    @Test("Clerk: rate_limit answers 429 with Retry-After; revoke_credentials makes the right key 401")
    func clerkFaults() throws {
        let fake = try HostedPlatformFake("clerk")
        defer { fake.stop() }
        let key = try #require(fake.credentials["secret_key"])
        try fake.faults(rateLimit: 1)
        let limited = try Self.get(fake, "/v1/users", bearer: key)
        #expect(limited.status == 429)
        #expect(limited.headers["Retry-After"] == "1")
        #expect(Self.clerkCode(limited) == "too_many_requests")
        #expect(try Self.get(fake, "/v1/users", bearer: key).status == 200)

        try fake.faults(revokeCredentials: true)
        let revoked = try Self.get(fake, "/v1/users", bearer: key)
        #expect(revoked.status == 401)
        #expect(Self.clerkCode(revoked) == "clerk_key_invalid")
        #expect(!revoked.text.contains(key))
    }

    // MARK: Keycloak

    @Test("Keycloak: a wrong client secret is refused at the token endpoint with 401, the secret not echoed")
    func keycloakWrongSecret() throws {
        let fake = try HostedPlatformFake("keycloak")
        defer { fake.stop() }
        let clientID = try #require(fake.credentials["client_id"])
        let refused = try Self.token(fake, clientID: clientID, secret: "not-the-secret")
        #expect(refused.status == 401)
        let error = try JSONSerialization.jsonObject(with: refused.data) as? [String: Any]
        #expect(error?["error"] as? String == "unauthorized_client", "\(refused.text)")
        #expect(!refused.text.contains("not-the-secret"))
        let unknown = try Self.token(fake, clientID: "nobody", secret: "x")
        #expect(unknown.status == 401)
        #expect(try Self.accessToken(fake).isEmpty == false)
    }

    @Test("Keycloak: the view-users client reads but gets 403 on every manage call; nothing changes")
    func keycloakLeastPrivilege() throws {
        let fake = try HostedPlatformFake("keycloak")
        defer { fake.stop() }
        let seeded = try fake.seed(email: "a@example.com", appleSub: "001.a", sessions: 1)
        let id = try #require(seeded["id"] as? String)
        let viewer = try Self.accessToken(fake, viewer: true)
        let users = "/admin/realms/siwa/users"

        let found = try Self.get(fake, "\(users)?idpAlias=apple&idpUserId=001.a&exact=true", bearer: viewer)
        #expect(found.status == 200)
        let list = try JSONSerialization.jsonObject(with: found.data) as? [[String: Any]]
        #expect(list?.map { $0["id"] as? String } == [id])
        #expect(try Self.get(fake, "\(users)/\(id)/federated-identity", bearer: viewer).status == 200)

        let manage: [(String, String, String?)] = [
            ("POST", "\(users)/\(id)/logout", nil), ("PUT", "\(users)/\(id)", #"{"enabled": false}"#),
            ("DELETE", "\(users)/\(id)/federated-identity/apple", nil),
            (
                "POST", "\(users)/\(id)/federated-identity/apple",
                #"{"identityProvider": "apple", "userId": "002.a"}"#
            ),
            ("DELETE", "\(users)/\(id)", nil), ("POST", users, #"{"username": "new"}"#),
        ]
        for (method, path, body) in manage {
            let answer = try Self.call(fake, method, path, bearer: viewer, json: body)
            #expect(answer.status == 403, "\(method) \(path): \(answer.status) \(answer.text)")
        }
        let user = try #require(try fake.user(withIdentity: "apple", "001.a"))
        #expect(user["disabled"] as? Bool == false)
        #expect(user["sessions"] as? Int == 1)

        let adapter = try Self.accessToken(fake)
        #expect(try Self.call(fake, "POST", "\(users)/\(id)/logout", bearer: adapter).status == 204)
        #expect(try fake.user(withIdentity: "apple", "001.a")?["sessions"] as? Int == 0)
        let gone = try Self.get(fake, "\(users)/00000000-0000-0000-0000-000000000000", bearer: adapter)
        #expect(gone.status == 404 && gone.text.contains("User not found"))
    }

    @Test(
        "Keycloak: rate_limit is a proxy's 429 with Retry-After; revoke_credentials: old tokens 401, new refused"
    )
    func keycloakFaults() throws {
        let fake = try HostedPlatformFake("keycloak")
        defer { fake.stop() }
        let token = try Self.accessToken(fake)
        let users = "/admin/realms/siwa/users"
        try fake.faults(rateLimit: 1)
        let limited = try Self.get(fake, users, bearer: token)
        #expect(limited.status == 429)
        #expect(limited.headers["Retry-After"] == "1")
        #expect(try Self.get(fake, users, bearer: token).status == 200)

        try fake.faults(revokeCredentials: true)
        let revoked = try Self.get(fake, users, bearer: token)
        #expect(revoked.status == 401)
        #expect(revoked.text.contains("HTTP 401 Unauthorized"))
        #expect(!revoked.text.contains(token))
        let clientID = try #require(fake.credentials["client_id"])
        let secret = try #require(fake.credentials["client_secret"])
        #expect(try Self.token(fake, clientID: clientID, secret: secret).status == 401)
    }

    // MARK: Helpers

    private static func call(
        _ fake: HostedPlatformFake, _ method: String, _ path: String, bearer: String, json: String? = nil
    ) throws -> TestHTTPResponse {
        var headers = [("Authorization", "Bearer \(bearer)")]
        if json != nil { headers.append(("Content-Type", "application/json")) }
        return try TestHTTPClient.request(
            method: method, url: fake.url + path, headers: headers, body: json.map { Array($0.utf8) })
    }

    private static func get(_ fake: HostedPlatformFake, _ path: String, bearer: String) throws
        -> TestHTTPResponse
    {
        try call(fake, "GET", path, bearer: bearer)
    }

    private static func token(_ fake: HostedPlatformFake, clientID: String, secret: String) throws
        -> TestHTTPResponse
    {
        let form = "grant_type=client_credentials&client_id=\(clientID)&client_secret=\(secret)"
        return try TestHTTPClient.post(
            fake.url + "/realms/siwa/protocol/openid-connect/token", body: Array(form.utf8),
            headers: [("Content-Type", "application/x-www-form-urlencoded")])
    }

    private static func accessToken(_ fake: HostedPlatformFake, viewer: Bool = false) throws -> String {
        let prefix = viewer ? "viewer_" : ""
        let clientID = try #require(fake.credentials["\(prefix)client_id"])
        let secret = try #require(fake.credentials["\(prefix)client_secret"])
        let answer = try token(fake, clientID: clientID, secret: secret)
        #expect(answer.status == 200)
        let object = try JSONSerialization.jsonObject(with: answer.data) as? [String: Any]
        return try #require(object?["access_token"] as? String)
    }

    private static func clerkCode(_ response: TestHTTPResponse) -> String? {
        let object = try? JSONSerialization.jsonObject(with: response.data) as? [String: Any]
        guard object?["clerk_trace_id"] is String else { return nil }
        return (object?["errors"] as? [[String: Any]])?.first?["code"] as? String
    }
}
