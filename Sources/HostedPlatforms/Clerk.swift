public import AuthPlatforms
import Foundation
public import HTTPClient

/// Clerk's Backend API (users, their external accounts and sessions), with the instance's secret key:
/// credentials `secret_key` and optional `server_url` (`https://api.clerk.com/v1`). The provider is
/// Clerk's strategy name (`oauth_apple`; a bare `apple` is read as `oauth_apple`).
///
/// A team transfer cannot move the link: Clerk's Backend API can only delete an external account, never
/// add one or change its `provider_user_id`. The transfer is recorded in the user's `private_metadata`
/// (`siwa_apple_sub`, `siwa_apple_previous_sub`) for the app's sign-in hook to match the next Sign in
/// with Apple, and is counted as metadata recorded, never as an identity moved. Until the app links
/// the new `sub`, its events find no user (`no_user`); the old `sub`'s still find the user.
public struct Clerk: HostedPlatform {
    public let name = "clerk"
    public let provider: String
    public let baseURL: String
    let secretKey: String
    /// The Backend API version the calls are written against (its answers' shapes), sent with each.
    public let headers = [OutboundHTTP.Header("Clerk-API-Version", "2025-11-10")]

    /// Clerk with the credentials' `secret_key`, at `server_url` when given.
    public init(provider: String, credentials: HostedCredentials) throws(HostedCallError) {
        self.provider = provider.hasPrefix("oauth_") ? provider : "oauth_" + provider
        baseURL = try credentials.baseURL("server_url", default: "https://api.clerk.com/v1")
        secretKey = try credentials.string("secret_key")
    }

    /// Every policy: Clerk bans (disable), deletes, unlinks and keeps private metadata; a move is
    /// recorded in the metadata (see ``Clerk``).
    public func validate(_ policy: AuthPolicy) throws(AuthPlatformError) {}

    /// The secret key itself, which does not expire (no call).
    public func obtainToken(_ http: OutboundHTTP.Session) throws(HostedCallError) -> BearerToken {
        BearerToken(value: secretKey, expiresAt: nil)
    }

    public func apply(_ event: AuthEvent, sub: String, policy: AuthPolicy, api: HostedAPI)
        throws(HostedCallError)
        -> AuthChange
    {
        try ClerkAccounts(clerk: self, api: api).apply(event, sub: sub, policy: policy)
    }
}

/// The instance's users through one ``HostedAPI``, for one event: the users found are kept, since the
/// user list answers whole user objects (external accounts, `banned`, metadata).
struct ClerkAccounts: AccountOperations {
    let clerk: Clerk
    let api: HostedAPI
    private let seen = Seen()

    /// What this event has read or done so far.
    final class Seen {
        var users: [String: [String: Any]] = [:]
        var banned: Set<String> = []
    }

    init(clerk: Clerk, api: HostedAPI) {
        self.clerk = clerk
        self.api = api
    }

    func path(_ id: String) -> String { "/users/\(HostedAPI.segment(id))" }

    /// The user object, as found by ``findUser(sub:)`` in this event or read now.
    func user(_ id: String) throws(HostedCallError) -> [String: Any] {
        if let user = seen.users[id] { return user }
        let user = try api.read(path(id), endpoint: "/users/{user_id}").object
        seen.users[id] = user
        return user
    }

    func accounts(_ user: [String: Any]) -> [[String: Any]] {
        user["external_accounts"] as? [[String: Any]] ?? []
    }

    func isApple(_ account: [String: Any], sub: String) -> Bool {
        account["provider"] as? String == clerk.provider && account["provider_user_id"] as? String == sub
    }

    func findUser(sub: String) throws(HostedCallError) -> String? {
        let found = try api.read(
            "/users", endpoint: "/users?provider&provider_user_id",
            query: [("provider", clerk.provider), ("provider_user_id", sub), ("limit", "2")]
        ).objects
        // An API version without the filter would answer every user: refuse it rather than pick one.
        guard found.allSatisfy({ accounts($0).contains { isApple($0, sub: sub) } }) else {
            throw HostedCallError(
                .callFailed, platform: clerk.name, endpoint: "GET /users?provider&provider_user_id",
                cause: "the user list ignored the provider filter; nothing was changed")
        }
        guard found.count <= 1 else {
            throw HostedCallError(
                .ambiguous, platform: clerk.name, cause: "the sub is linked to more than one user")
        }
        guard let user = found.first, let id = user["id"] as? String else { return nil }
        seen.users[id] = user
        return id
    }

    /// A password, a passkey, a web3 wallet or another verified account signs in; a verified email or
    /// phone does not count: whether its codes sign in is an instance setting the user object lacks.
    func hasOtherLogin(user id: String, sub: String) throws(HostedCallError) -> Bool {
        let user = try user(id)
        if user["password_enabled"] as? Bool == true { return true }
        let others = ["passkeys", "web3_wallets", "saml_accounts", "enterprise_accounts"].flatMap {
            user[$0] as? [[String: Any]] ?? []
        }
        return (accounts(user).filter { !isApple($0, sub: sub) } + others).contains {
            let status = ($0["verification"] as? [String: Any])?["status"] as? String
            return status == nil || status == "verified"
        }
    }

    /// The user's active sessions, every page.
    func activeSessions(_ id: String) throws(HostedCallError) -> [String] {
        var sessions: [String] = []
        let limit = 100
        while true {
            let page = try api.read(
                "/sessions", endpoint: "/sessions?user_id&status",
                query: [
                    ("user_id", id), ("status", "active"), ("limit", "\(limit)"),
                    ("offset", "\(sessions.count)"),
                ]
            ).objects.compactMap { $0["id"] as? String }
            sessions += page
            if page.count < limit { return sessions }
        }
    }

    /// Each active session revoked (Clerk has no call for all of a user's); none after this event's ban,
    /// which revoked them.
    func endSessions(user id: String, into counts: inout AuthCounts) throws(HostedCallError) {
        guard !seen.banned.contains(id) else { return }
        for session in try activeSessions(id) {
            let answer = try api.write(
                "POST", "/sessions/\(HostedAPI.segment(session))/revoke",
                endpoint: "/sessions/{session_id}/revoke",
                expecting: [200, 404])
            if answer.status == 200 { counts.sessionsEnded += 1 }
        }
    }

    func unlink(user id: String, sub: String, into counts: inout AuthCounts) throws(HostedCallError) {
        guard let account = accounts(try user(id)).first(where: { isApple($0, sub: sub) })?["id"] as? String
        else { return }
        let answer = try api.write(
            "DELETE", path(id) + "/external_accounts/\(HostedAPI.segment(account))",
            endpoint: "/users/{user_id}/external_accounts/{external_account_id}", expecting: [200, 404])
        if answer.status == 200 { counts.identitiesUnlinked += 1 }
    }

    /// A ban, which also revokes the user's sessions: they are listed first to be counted.
    func disable(user id: String, into counts: inout AuthCounts) throws(HostedCallError) {
        guard try user(id)["banned"] as? Bool != true else { return }
        let sessions = try activeSessions(id).count
        try api.write("POST", path(id) + "/ban", endpoint: "/users/{user_id}/ban", expecting: [200])
        seen.banned.insert(id)
        counts.usersDisabled += 1
        counts.sessionsEnded += sessions
    }

    func delete(user id: String, into counts: inout AuthCounts) throws(HostedCallError) {
        let answer = try api.write("DELETE", path(id), endpoint: "/users/{user_id}", expecting: [200, 404])
        if answer.status == 200 { counts.usersDeleted += 1 }
    }

    /// The transfer recorded in `private_metadata`, the link left as it is (see ``Clerk``); already
    /// recorded, nothing is written.
    func move(user id: String, from oldSub: String, to newSub: String, into counts: inout AuthCounts)
        throws(HostedCallError)
    {
        try mergePrivate(
            ["siwa_apple_sub": newSub, "siwa_apple_previous_sub": oldSub], user: id, into: &counts)
    }

    /// `siwa_email_forwarding` (`on` or `off`) in `private_metadata`; the other keys are kept.
    func recordForwarding(user id: String, on: Bool, into counts: inout AuthCounts) throws(HostedCallError) {
        try mergePrivate(["siwa_email_forwarding": on ? "on" : "off"], user: id, into: &counts)
    }

    /// Clerk's metadata merge of `values` into `private_metadata`, unless they are there already.
    func mergePrivate(_ values: [String: String], user id: String, into counts: inout AuthCounts)
        throws(HostedCallError)
    {
        let current = try user(id)["private_metadata"] as? [String: Any] ?? [:]
        guard values.contains(where: { current[$0.key] as? String != $0.value }) else { return }
        try api.write(
            "PATCH", path(id) + "/metadata", endpoint: "/users/{user_id}/metadata",
            json: ["private_metadata": values], expecting: [200])
        counts.metadataRecorded += 1
    }

    func newSubTaken() -> HostedCallError {
        HostedCallError(
            .conflict, platform: clerk.name,
            cause: "the new sub of a transfer is already linked to another user; nothing was recorded")
    }
}
