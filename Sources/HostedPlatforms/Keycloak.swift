public import AuthPlatforms
import Foundation
public import HTTPClient

/// Keycloak's Admin REST API (a realm's users, their federated identities and sessions), with a
/// confidential client's service account: credentials `server_url`, `realm`, `client_id`,
/// `client_secret`; roles `view-users` and `manage-users` of the realm's `realm-management` client.
/// The provider is the identity provider's alias (`apple`). Calls per event: docs/adapters.md.
public struct Keycloak: HostedPlatform {
    public let name = "keycloak"
    public let provider: String
    public let baseURL: String
    let realm: String
    let clientID: String
    let clientSecret: String

    /// Keycloak at the credentials' `server_url` (no `/auth` suffix unless the server has one).
    public init(provider: String, credentials: HostedCredentials) throws(HostedCallError) {
        self.provider = provider
        baseURL = try credentials.baseURL("server_url")
        realm = try credentials.string("realm")
        clientID = try credentials.string("client_id")
        clientSecret = try credentials.string("client_secret")
    }

    /// Every policy: Keycloak can disable (`enabled: false`), delete, unlink, move and keep attributes.
    public func validate(_ policy: AuthPolicy) throws(AuthPlatformError) {}

    /// The client credentials grant at the realm's token endpoint.
    public func obtainToken(_ http: OutboundHTTP.Session) throws(HostedCallError) -> BearerToken {
        let endpoint = "POST /realms/{realm}/protocol/openid-connect/token"
        return try HostedAPI.requestToken(
            OutboundHTTP.Request(
                method: "POST",
                url: "\(baseURL)/realms/\(HostedAPI.segment(realm))/protocol/openid-connect/token",
                headers: [OutboundHTTP.Header("Content-Type", "application/x-www-form-urlencoded")],
                body: Array(
                    HostedAPI.formEncoded([
                        ("grant_type", "client_credentials"), ("client_id", clientID),
                        ("client_secret", clientSecret),
                    ]).utf8)),
            endpoint: endpoint, platform: name, http: http,
            refusal: "the token endpoint refused the client credentials")
    }

    public func apply(_ event: AuthEvent, sub: String, policy: AuthPolicy, api: HostedAPI)
        throws(HostedCallError)
        -> AuthChange
    {
        try KeycloakAccounts(keycloak: self, api: api).apply(event, sub: sub, policy: policy)
    }
}

/// The realm's users through one ``HostedAPI``.
struct KeycloakAccounts: AccountOperations {
    let keycloak: Keycloak
    let api: HostedAPI

    var users: String { "/admin/realms/\(HostedAPI.segment(keycloak.realm))/users" }
    func user(_ id: String) -> String { "\(users)/\(HostedAPI.segment(id))" }
    var alias: String { HostedAPI.segment(keycloak.provider) }

    func findUser(sub: String) throws(HostedCallError) -> String? {
        let found = try api.read(
            users, endpoint: "/admin/realms/{realm}/users?idpAlias&idpUserId",
            query: [
                ("idpAlias", keycloak.provider), ("idpUserId", sub), ("briefRepresentation", "true"),
                ("max", "2"),
            ]
        ).objects.compactMap { $0["id"] as? String }
        guard found.count <= 1 else {
            throw HostedCallError(
                .ambiguous, platform: keycloak.name, cause: "the sub is linked to more than one user")
        }
        return found.first
    }

    func hasOtherLogin(user id: String, sub: String) throws(HostedCallError) -> Bool {
        let identities = try api.read(
            user(id) + "/federated-identity", endpoint: "/admin/realms/{realm}/users/{id}/federated-identity")
        if identities.objects.contains(where: { $0["identityProvider"] as? String != keycloak.provider }) {
            return true
        }
        let credentials = try api.read(
            user(id) + "/credentials", endpoint: "/admin/realms/{realm}/users/{id}/credentials")
        return credentials.objects.contains { $0["type"] as? String == "password" }
    }

    func endSessions(user id: String, into counts: inout AuthCounts) throws(HostedCallError) {
        let sessions = try api.read(
            user(id) + "/sessions", endpoint: "/admin/realms/{realm}/users/{id}/sessions"
        ).objects.count
        guard sessions > 0 else { return }
        try api.write("POST", user(id) + "/logout", endpoint: "/admin/realms/{realm}/users/{id}/logout")
        counts.sessionsEnded += sessions
    }

    func unlink(user id: String, sub: String, into counts: inout AuthCounts) throws(HostedCallError) {
        let answer = try api.write(
            "DELETE", user(id) + "/federated-identity/\(alias)",
            endpoint: "/admin/realms/{realm}/users/{id}/federated-identity/{provider}", expecting: [204, 404])
        if answer.status == 204 { counts.identitiesUnlinked += 1 }
    }

    func disable(user id: String, into counts: inout AuthCounts) throws(HostedCallError) {
        let current = try api.read(user(id), endpoint: "/admin/realms/{realm}/users/{id}").object
        guard current["enabled"] as? Bool != false else { return }
        try api.write(
            "PUT", user(id), endpoint: "/admin/realms/{realm}/users/{id}", json: ["enabled": false])
        counts.usersDisabled += 1
    }

    func delete(user id: String, into counts: inout AuthCounts) throws(HostedCallError) {
        let answer = try api.write(
            "DELETE", user(id), endpoint: "/admin/realms/{realm}/users/{id}", expecting: [204, 404])
        if answer.status == 204 { counts.usersDeleted += 1 }
    }

    /// Keycloak keeps one identity per provider and cannot change its user id: the link is removed and
    /// made again with the new `sub`, keeping its user name.
    func move(user id: String, from oldSub: String, to newSub: String, into counts: inout AuthCounts)
        throws(HostedCallError)
    {
        let identities = try api.read(
            user(id) + "/federated-identity", endpoint: "/admin/realms/{realm}/users/{id}/federated-identity")
        let link = identities.objects.first { $0["identityProvider"] as? String == keycloak.provider }
        let endpoint = "/admin/realms/{realm}/users/{id}/federated-identity/{provider}"
        try api.write(
            "DELETE", user(id) + "/federated-identity/\(alias)", endpoint: endpoint, expecting: [204, 404])
        let created = try api.write(
            "POST", user(id) + "/federated-identity/\(alias)", endpoint: endpoint,
            json: [
                "identityProvider": keycloak.provider, "userId": newSub,
                "userName": link?["userName"] as? String ?? newSub,
            ], expecting: [200, 201, 204, 409])
        guard created.status != 409 else { throw newSubTaken() }
        counts.identitiesMoved += 1
    }

    /// The user attribute `siwa_email_forwarding` (`on` or `off`); the others are kept (Keycloak's PUT
    /// replaces the attributes as a whole).
    func recordForwarding(user id: String, on: Bool, into counts: inout AuthCounts) throws(HostedCallError) {
        var attributes =
            try api.read(user(id), endpoint: "/admin/realms/{realm}/users/{id}").object["attributes"]
            as? [String: Any] ?? [:]
        attributes["siwa_email_forwarding"] = [on ? "on" : "off"]
        try api.write(
            "PUT", user(id), endpoint: "/admin/realms/{realm}/users/{id}", json: ["attributes": attributes])
        counts.metadataRecorded += 1
    }

    func newSubTaken() -> HostedCallError {
        HostedCallError(
            .conflict, platform: keycloak.name,
            cause: "the new sub of a transfer is already linked to another user; nothing was moved")
    }
}
