import Foundation
import HTTPServer
import TestSupport
import Testing

/// The fakes of Firebase Auth and Auth0 (Tests/Fixtures/hosted-platforms): each checked by its vendor's own
/// SDK, and their token endpoints, faults and scopes as an adapter sees them over plain HTTP.
@Suite("Hosted platform fakes: Firebase Auth and Auth0")
struct HostedFakeFirebaseAuth0Tests {
    @Test("the vendor's own SDK accepts the fake", arguments: ["check_firebase.py", "check_auth0.py"])
    func sdkCheck(script: String) throws {
        let result = try HostedPlatformFake.runCheck(script)
        #expect(result.status == 0, "\(script): \(result.standardError)")
        let line = try #require(result.standardOutput.split(separator: "\n").last)
        let summary = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect((summary["checked"] as? [String])?.isEmpty == false)
    }

    @Test(
        "Firebase: a forged assertion is refused at /token; lookup by the Apple sub; 429 and 401 in Google's shape"
    )
    func firebase() throws {
        let fake = try HostedPlatformFake("firebase")
        defer { fake.stop() }
        let form =
            "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=eyJhbGciOiJSUzI1NiJ9.e30.AAAA"
        let refused = try TestHTTPClient.post(
            "\(fake.url)/token", body: Data(form.utf8),
            headers: [("Content-Type", "application/x-www-form-urlencoded")])
        #expect(refused.status == 400)
        #expect(try json(refused)["error"] as? String == "invalid_grant")

        let seeded = try fake.seed(email: "a@privaterelay.appleid.com", appleSub: "001.a")
        let lookup = "\(fake.url)/v1/projects/\(fake.credentials["project_id"] ?? "")/accounts:lookup"
        let found = try firebasePost(
            lookup, ["federatedUserId": [["providerId": "apple.com", "rawId": "001.a"]]])
        #expect(found.status == 200)
        let users = try json(found)["users"] as? [[String: Any]]
        #expect(users?.map { $0["localId"] as? String } == [seeded["id"] as? String])
        let nobody = try firebasePost(
            lookup, ["federatedUserId": [["providerId": "apple.com", "rawId": "009.z"]]])
        #expect(nobody.status == 200)
        #expect(try json(nobody)["users"] == nil)

        try fake.faults(rateLimit: 1)
        let limited = try firebasePost(lookup, ["localId": [seeded["id"] as? String ?? ""]])
        #expect(limited.status == 429)
        #expect(limited.headers["Retry-After"] == nil)
        #expect((try json(limited)["error"] as? [String: Any])?["status"] as? String == "RESOURCE_EXHAUSTED")
        #expect(try firebasePost(lookup, ["localId": [seeded["id"] as? String ?? ""]]).status == 200)

        try fake.faults(revokeCredentials: true)
        let revoked = try firebasePost(lookup, ["localId": [seeded["id"] as? String ?? ""]])
        #expect(revoked.status == 401)
        #expect((try json(revoked)["error"] as? [String: Any])?["status"] as? String == "UNAUTHENTICATED")
        #expect(try fake.calls().byEndpoint["POST /v1/projects/{project}/accounts:lookup"] == 3)
    }

    @Test(
        "Auth0: a wrong secret is refused; a read-only client gets 403 insufficient_scope; 429 headers; 401")
    func auth0() throws {
        let fake = try HostedPlatformFake("auth0")
        defer { fake.stop() }
        let credentials = fake.credentials
        let wrong = try token(fake, credentials["client_id"] ?? "", "not-the-secret")
        #expect(wrong.status == 401)
        #expect(try json(wrong)["error"] as? String == "access_denied")

        let seeded = try fake.seed(email: "a@privaterelay.appleid.com", appleSub: "001.a", sessions: 2)
        let userID = try #require(seeded["id"] as? String)
        #expect(userID == "apple|001.a")
        let path = "\(fake.url)/api/v2/users/\(userID.replacingOccurrences(of: "|", with: "%7C"))"
        let limitedToken = try accessToken(
            fake, credentials["limited_client_id"] ?? "", credentials["limited_client_secret"] ?? "")
        #expect(try auth0Request("GET", path, limitedToken).status == 200)
        for (method, url) in [("DELETE", path), ("DELETE", "\(path)/sessions")] {
            let forbidden = try auth0Request(method, url, limitedToken)
            #expect(forbidden.status == 403, "\(method) \(url)")
            #expect(try json(forbidden)["errorCode"] as? String == "insufficient_scope")
        }
        #expect(try fake.user(withIdentity: "apple", "001.a")?["sessions"] as? Int == 2)

        let fullToken = try accessToken(
            fake, credentials["client_id"] ?? "", credentials["client_secret"] ?? "")
        let options = try TestHTTPClient.post(
            "\(fake.url)/_fake/options", body: Data(#"{"sessions_api": false}"#.utf8),
            headers: [("Content-Type", "application/json")])
        #expect(options.status == 200)
        let notOnPlan = try auth0Request("DELETE", "\(path)/sessions", fullToken)
        #expect(notOnPlan.status == 403)
        #expect(try json(notOnPlan)["errorCode"] as? String == "operation_not_supported")

        try fake.faults(rateLimit: 1)
        let limited = try auth0Request("GET", path, fullToken)
        #expect(limited.status == 429)
        #expect(limited.headers["x-ratelimit-remaining"] == "0")
        #expect(limited.headers["x-ratelimit-limit"] != nil)
        let reset = try #require(limited.headers["x-ratelimit-reset"].flatMap { Int($0) })
        #expect(reset >= Int(Date().timeIntervalSince1970))
        #expect(try json(limited)["statusCode"] as? Int == 429)

        try fake.faults(revokeCredentials: true)
        let revoked = try auth0Request("GET", path, fullToken)
        #expect(revoked.status == 401)
        #expect(try json(revoked)["message"] as? String == "Invalid token")
        #expect(
            try token(fake, credentials["client_id"] ?? "", credentials["client_secret"] ?? "").status == 401)
    }

    private func json(_ response: TestHTTPResponse) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: response.data) as? [String: Any])
    }

    /// A Firebase admin call with the Auth emulator's admin token, as firebase-admin sends it.
    private func firebasePost(_ url: String, _ body: [String: Any]) throws -> TestHTTPResponse {
        try TestHTTPClient.post(
            url, body: try JSONSerialization.data(withJSONObject: body),
            headers: [("Content-Type", "application/json"), ("Authorization", "Bearer owner")])
    }

    private func token(_ fake: HostedPlatformFake, _ clientID: String, _ secret: String) throws
        -> TestHTTPResponse
    {
        let body: [String: Any] = [
            "grant_type": "client_credentials", "client_id": clientID, "client_secret": secret,
            "audience": fake.credentials["audience"] ?? "",
        ]
        return try TestHTTPClient.post(
            "\(fake.url)/oauth/token", body: try JSONSerialization.data(withJSONObject: body),
            headers: [("Content-Type", "application/json")])
    }

    private func accessToken(_ fake: HostedPlatformFake, _ clientID: String, _ secret: String) throws
        -> String
    {
        let response = try token(fake, clientID, secret)
        #expect(response.status == 200)
        return try #require(try json(response)["access_token"] as? String)
    }

    private func auth0Request(_ method: String, _ url: String, _ token: String) throws -> TestHTTPResponse {
        try TestHTTPClient.request(
            method: method, url: url, headers: [("Authorization", "Bearer \(token)")], body: nil)
    }
}
