public import AuthPlatforms
import Foundation
public import HTTPClient

/// Auth0's Management API v2 with a machine-to-machine application's client credentials: credentials
/// `domain`, `client_id`, `client_secret` (optional `audience`, default `https://{domain}/api/v2/`, and
/// `base_url`, default `https://{domain}`); scopes `read:users`, `update:users`, `delete:users`,
/// `delete:sessions`, `delete:refresh_tokens`. The provider is the Apple connection (`apple`): a user
/// whose primary identity is Apple's has the id `apple|<sub>`. Calls per event: docs/adapters.md.
public struct Auth0: HostedPlatform {
    public let name = "auth0"
    public let provider: String
    public let baseURL: String
    let audience: String
    let clientID: String
    let clientSecret: String

    /// Auth0 at the credentials' `domain`.
    public init(provider: String, credentials: HostedCredentials) throws(HostedCallError) {
        self.provider = provider
        let domain = try credentials.string("domain")
        baseURL = try credentials.baseURL("base_url", default: "https://\(domain)")
        audience = credentials.optional("audience") ?? "https://\(domain)/api/v2/"
        clientID = try credentials.string("client_id")
        clientSecret = try credentials.string("client_secret")
    }

    /// Every policy: Auth0 blocks, deletes, unlinks secondary identities and keeps app metadata.
    public func validate(_ policy: AuthPolicy) throws(AuthPlatformError) {}

    /// The client credentials grant at `/oauth/token` for the Management API's audience.
    public func obtainToken(_ http: OutboundHTTP.Session) throws(HostedCallError) -> BearerToken {
        let endpoint = "POST /oauth/token"
        let body: [String: Any] = [
            "grant_type": "client_credentials", "client_id": clientID, "client_secret": clientSecret,
            "audience": audience,
        ]
        return try HostedAPI.requestToken(
            OutboundHTTP.Request(
                method: "POST", url: "\(baseURL)/oauth/token",
                headers: [OutboundHTTP.Header("Content-Type", "application/json")],
                body: Array((try? JSONSerialization.data(withJSONObject: body)) ?? Data())),
            endpoint: endpoint, platform: name, http: http,
            refusal: "the token endpoint refused the client credentials or the audience")
    }

    public func apply(_ event: AuthEvent, sub: String, policy: AuthPolicy, api: HostedAPI)
        throws(HostedCallError)
        -> AuthChange
    {
        try Auth0Accounts(auth0: self, api: api).apply(event, sub: sub, policy: policy)
    }
}

/// The tenant's users through one ``HostedAPI``, for one event: the user objects read (by the lookup,
/// or later) are kept, so an event reads each user once.
struct Auth0Accounts: AccountOperations {
    let auth0: Auth0
    let api: HostedAPI
    private let seen = Seen()

    /// The user objects this event has read, by user id.
    final class Seen {
        var users: [String: [String: Any]] = [:]
    }

    init(auth0: Auth0, api: HostedAPI) {
        self.auth0 = auth0
        self.api = api
    }

    func user(_ id: String) -> String { "/api/v2/users/\(HostedAPI.segment(id))" }

    /// The user object, as this event read it, or read now.
    func object(_ id: String) throws(HostedCallError) -> [String: Any] {
        if let known = seen.users[id] { return known }
        let read = try api.read(user(id), endpoint: "/api/v2/users/{id}").object
        seen.users[id] = read
        return read
    }

    /// The id of a found user object, kept for the event's later steps.
    func keep(_ found: [String: Any]) -> String? {
        guard let id = found["user_id"] as? String else { return nil }
        seen.users[id] = found
        return id
    }
    func error(_ kind: HostedCallError.Kind, _ cause: String) -> HostedCallError {
        HostedCallError(kind, platform: auth0.name, cause: cause)
    }

    /// The user whose identity (primary `apple|<sub>`, or linked) is the sub, or whose app metadata
    /// records it as the sub after a team transfer (``move(user:from:to:into:)``).
    func findUser(sub: String) throws(HostedCallError) -> String? {
        let primary = try api.read(
            user("\(auth0.provider)|\(sub)"), endpoint: "/api/v2/users/{id}", expecting: [200, 404])
        if primary.status == 200 { return keep(primary.object) }
        let quoted =
            "\""
            + sub.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
            + "\""
        for query in [
            "identities.user_id:\(quoted) AND identities.provider:\"\(auth0.provider)\"",
            "app_metadata.siwa_apple_sub:\(quoted)",
        ] {
            let found = try api.read(
                "/api/v2/users", endpoint: "/api/v2/users?q", query: [("q", query), ("search_engine", "v3")]
            ).objects
            guard found.count <= 1 else { throw error(.ambiguous, "the sub is linked to more than one user") }
            if let first = found.first { return keep(first) }
        }
        return nil
    }

    /// Another connection's identity (a password, another social login); an Apple one, even of another
    /// sub (the one a transfer left), is no other login.
    func hasOtherLogin(user id: String, sub: String) throws(HostedCallError) -> Bool {
        let identities = try object(id)["identities"] as? [[String: Any]]
        return (identities ?? []).contains { $0["provider"] as? String != auth0.provider }
    }

    /// Auth0's sessions and refresh tokens (an Enterprise feature): on a tenant without it (a 403 other
    /// than a missing scope) nothing can be ended there, and nothing is counted.
    func endSessions(user id: String, into counts: inout AuthCounts) throws(HostedCallError) {
        for (path, scope) in [("sessions", "delete:sessions"), ("refresh-tokens", "delete:refresh_tokens")] {
            let answer = try api.write(
                "DELETE", user(id) + "/\(path)", endpoint: "/api/v2/users/{id}/\(path)",
                expecting: [200, 202, 204, 403, 404])
            if answer.status == 403 {
                guard answer.object["errorCode"] as? String != "insufficient_scope" else {
                    throw HostedCallError(
                        .credentialsRefused, platform: auth0.name,
                        endpoint: "DELETE /api/v2/users/{id}/\(path)",
                        status: 403, cause: "the client lacks the scope \(scope)")
                }
                continue
            }
            if answer.status != 404 {
                if path == "sessions" { counts.sessionsEnded += 1 } else { counts.refreshTokensRevoked += 1 }
            }
        }
    }

    /// A linked (secondary) Apple identity — of the sub, or of the sub a transfer left — is unlinked, and
    /// the standalone user Auth0 makes of it deleted; a primary one cannot be unlinked (the user is the
    /// Apple identity; the policy's disable, when asked, is what ends it).
    func unlink(user id: String, sub: String, into counts: inout AuthCounts) throws(HostedCallError) {
        let current = try object(id)
        let subs: Set<String> = [
            sub, (current["app_metadata"] as? [String: Any])?["siwa_apple_previous_sub"] as? String ?? sub,
        ]
        let linked = (current["identities"] as? [[String: Any]] ?? []).compactMap { identity -> String? in
            guard identity["provider"] as? String == auth0.provider,
                let userID = identity["user_id"] as? String,
                subs.contains(userID), id != "\(auth0.provider)|\(userID)"
            else { return nil }
            return userID
        }
        for userID in linked {
            let answer = try api.write(
                "DELETE",
                user(id) + "/identities/\(HostedAPI.segment(auth0.provider))/\(HostedAPI.segment(userID))",
                endpoint: "/api/v2/users/{id}/identities/{provider}/{user_id}", expecting: [200, 204, 404])
            guard answer.status != 404 else { continue }
            try api.write(
                "DELETE", user("\(auth0.provider)|\(userID)"), endpoint: "/api/v2/users/{id}",
                expecting: [204, 404])
            counts.identitiesUnlinked += 1
        }
    }

    func disable(user id: String, into counts: inout AuthCounts) throws(HostedCallError) {
        guard try object(id)["blocked"] as? Bool != true else { return }
        try api.write("PATCH", user(id), endpoint: "/api/v2/users/{id}", json: ["blocked": true])
        seen.users[id]?["blocked"] = true
        counts.usersDisabled += 1
    }

    /// Auth0 answers 204 whether or not the user existed; it was found just before.
    func delete(user id: String, into counts: inout AuthCounts) throws(HostedCallError) {
        try api.write("DELETE", user(id), endpoint: "/api/v2/users/{id}", expecting: [204, 404])
        counts.usersDeleted += 1
    }

    /// Auth0 cannot change an identity's user id: the transfer is recorded in app metadata
    /// (`siwa_apple_sub`, `siwa_apple_previous_sub`), which ``findUser(sub:)`` reads, so later events of
    /// the new sub find the user; a login Action can link the next sign-in (docs/adapters.md). Not
    /// counted as moved.
    func move(user id: String, from oldSub: String, to newSub: String, into counts: inout AuthCounts)
        throws(HostedCallError)
    {
        try api.write(
            "PATCH", user(id), endpoint: "/api/v2/users/{id}",
            json: ["app_metadata": ["siwa_apple_sub": newSub, "siwa_apple_previous_sub": oldSub]])
        counts.metadataRecorded += 1
    }

    /// App metadata `siwa_email_forwarding` (`on` or `off`); Auth0 merges app metadata one level deep.
    func recordForwarding(user id: String, on: Bool, into counts: inout AuthCounts) throws(HostedCallError) {
        try api.write(
            "PATCH", user(id), endpoint: "/api/v2/users/{id}",
            json: ["app_metadata": ["siwa_email_forwarding": on ? "on" : "off"]])
        counts.metadataRecorded += 1
    }

    func newSubTaken() -> HostedCallError {
        error(.conflict, "the new sub of a transfer is already linked to another user; nothing was moved")
    }
}
