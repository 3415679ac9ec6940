public import AuthPlatforms
import Crypto
import Foundation
public import HTTPClient

/// Firebase Authentication (and Identity Platform) through the Identity Toolkit v1 admin API, with a
/// Google service account: the credentials file is its JSON key file (`project_id`, `client_email`,
/// `private_key`, `token_uri`), plus an optional `api_url` (default
/// `https://identitytoolkit.googleapis.com`); the account needs the role Firebase Authentication Admin.
/// The provider is the provider id of Apple's identities (`apple.com`). Each event is a lookup by
/// the `sub`, then one `accounts:update` or `accounts:delete` per change (FirebaseTests counts them).
public struct FirebaseAuth: HostedPlatform {
    public let name = "firebase"
    public let provider: String
    public let baseURL: String
    let project: String
    let clientEmail: String
    let keyID: String?
    let tokenURI: String
    let privateKey: RSA.PrivateKey

    /// The scopes firebase-admin asks for that cover Identity Toolkit; the account's roles limit the rest.
    static let scopes =
        "https://www.googleapis.com/auth/identitytoolkit https://www.googleapis.com/auth/cloud-platform"

    /// Firebase with the service account of `credentials`; a private key that does not parse is refused
    /// here (the key is never quoted).
    public init(provider: String = "apple.com", credentials: HostedCredentials) throws(HostedCallError) {
        self.provider = provider
        baseURL = try credentials.baseURL("api_url", default: "https://identitytoolkit.googleapis.com")
        project = try credentials.string("project_id")
        clientEmail = try credentials.string("client_email")
        keyID = credentials.optional("private_key_id")
        tokenURI = try credentials.baseURL("token_uri", default: "https://oauth2.googleapis.com/token")
        let pem = try credentials.string("private_key")
        do {
            privateKey = try RSA.PrivateKey(pem: pem)
        } catch {
            throw HostedCallError(
                .invalidCredentials, platform: "firebase",
                cause: "\"private_key\" is not an unencrypted PEM RSA private key of at least 2048 bits")
        }
    }

    /// Every policy: Identity Toolkit can disable, delete, unlink, relink and keep custom claims.
    public func validate(_ policy: AuthPolicy) throws(AuthPlatformError) {}

    /// The JWT bearer grant (RFC 7523): an RS256 assertion of the service account at `token_uri`.
    public func obtainToken(_ http: OutboundHTTP.Session) throws(HostedCallError) -> BearerToken {
        let endpoint = "POST {token_uri}"
        let assertion = try self.assertion(now: Date())
        return try HostedAPI.requestToken(
            OutboundHTTP.Request(
                method: "POST", url: tokenURI,
                headers: [OutboundHTTP.Header("Content-Type", "application/x-www-form-urlencoded")],
                body: Array(
                    HostedAPI.formEncoded([
                        ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
                        ("assertion", assertion),
                    ]).utf8)),
            endpoint: endpoint, platform: name, http: http,
            refusal: "the token endpoint refused the service account's key: rotate it in the credentials file"
        )
    }

    /// The signed assertion: `iss` the service account, `aud` the token endpoint, valid one hour.
    func assertion(now: Date) throws(HostedCallError) -> String {
        let iat = Int(now.timeIntervalSince1970)
        var header: [String: Any] = ["alg": "RS256", "typ": "JWT"]
        if let keyID { header["kid"] = keyID }
        let claims: [String: Any] = [
            "iss": clientEmail, "scope": Self.scopes, "aud": tokenURI, "iat": iat, "exp": iat + 3600,
        ]
        let input = Self.base64URL(Self.json(header)) + "." + Self.base64URL(Self.json(claims))
        do {
            return input + "." + Self.base64URL(try privateKey.sha256Signature(for: Data(input.utf8)))
        } catch {
            throw HostedCallError(
                .invalidCredentials, platform: name, cause: "the service account's key cannot sign")
        }
    }

    static func json(_ object: [String: Any]) -> Data {
        (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes]))
            ?? Data()
    }

    /// Base64url without padding (RFC 7515 §2).
    static func base64URL(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(
            of: "/", with: "_"
        )
        .replacingOccurrences(of: "=", with: "")
    }

    public func apply(_ event: AuthEvent, sub: String, policy: AuthPolicy, api: HostedAPI)
        throws(HostedCallError)
        -> AuthChange
    {
        try FirebaseAccounts(firebase: self, api: api).apply(event, sub: sub, policy: policy)
    }
}

/// The project's accounts through one ``HostedAPI``; the users each lookup found are kept for the
/// event's later steps, so an event reads each user once.
struct FirebaseAccounts: AccountOperations {
    let firebase: FirebaseAuth
    let api: HostedAPI
    private let found = Found()

    /// The users looked up during one event, by local id.
    final class Found {
        var users: [String: [String: Any]] = [:]
    }

    init(firebase: FirebaseAuth, api: HostedAPI) {
        self.firebase = firebase
        self.api = api
    }

    /// Google's fixed error codes an adapter reads (the message's first word).
    static let userNotFound = "USER_NOT_FOUND"
    static let alreadyLinked = "FEDERATED_USER_ID_ALREADY_LINKED"

    /// Sends `accounts:<verb>` with `body` (a read is sent in a dry run too) and returns the answer's
    /// object, or the Google error code of a 400 that is one of `accepting`; other 400s throw, naming
    /// the code only when it is one of Google's fixed codes (the message may quote data).
    func call(_ verb: String, _ body: [String: Any], read: Bool = false, accepting: Set<String> = [])
        throws(HostedCallError) -> (object: [String: Any], code: String?)
    {
        let path = "/v1/projects/\(HostedAPI.segment(firebase.project))/accounts:\(verb)"
        let endpoint = "/v1/projects/{project}/accounts:\(verb)"
        let answer =
            read
            ? try api.read(path, method: "POST", endpoint: endpoint, json: body, expecting: [200, 400])
            : try api.write("POST", path, endpoint: endpoint, json: body, expecting: [200, 400])
        guard answer.status == 400 else { return (answer.object, nil) }
        let code = Self.code(answer.object)
        if let code, accepting.contains(code) { return ([:], code) }
        if code == "QUOTA_EXCEEDED" {
            // Identity Toolkit answers some per-project quotas as 400: waited for as a 429.
            throw HostedCallError(
                .rateLimited, platform: firebase.name, endpoint: "POST \(endpoint)", status: 400,
                cause: "quota exceeded (QUOTA_EXCEEDED)", retryAfter: .seconds(1))
        }
        throw HostedCallError(
            .callFailed, platform: firebase.name, endpoint: "POST \(endpoint)", status: 400,
            cause: code.map { "refused (\($0))" } ?? "refused")
    }

    /// The code of Google's `error.message` (`USER_NOT_FOUND`, or `INVALID_ID_TOKEN : …`'s first word)
    /// when it is made of capitals and underscores only; nil for free text.
    static func code(_ object: [String: Any]) -> String? {
        guard let message = (object["error"] as? [String: Any])?["message"] as? String else { return nil }
        let word = message.prefix { $0 != " " && $0 != ":" }
        guard !word.isEmpty, word.count <= 64, word.allSatisfy({ ($0 >= "A" && $0 <= "Z") || $0 == "_" })
        else { return nil }
        return String(word)
    }

    func user(_ id: String) throws(HostedCallError) -> [String: Any] {
        if let user = found.users[id] { return user }
        let users =
            try call("lookup", ["localId": [id]], read: true).object["users"] as? [[String: Any]] ?? []
        let user = users.first ?? [:]
        found.users[id] = user
        return user
    }

    func providers(_ user: [String: Any]) -> [[String: Any]] {
        user["providerUserInfo"] as? [[String: Any]] ?? []
    }

    func findUser(sub: String) throws(HostedCallError) -> String? {
        let users =
            try call(
                "lookup", ["federatedUserId": [["providerId": firebase.provider, "rawId": sub]]], read: true
            )
            .object["users"] as? [[String: Any]] ?? []
        guard users.count <= 1 else {
            throw HostedCallError(
                .ambiguous, platform: firebase.name, cause: "the sub is linked to more than one user")
        }
        guard let user = users.first, let id = user["localId"] as? String else { return nil }
        found.users[id] = user
        return id
    }

    /// Another sign-in: a password, a phone number, or any other provider entry (`password` included).
    func hasOtherLogin(user id: String, sub: String) throws(HostedCallError) -> Bool {
        let user = try user(id)
        return user["passwordHash"] != nil || user["passwordUpdatedAt"] != nil || user["phoneNumber"] != nil
            || providers(user).contains { $0["providerId"] as? String != firebase.provider }
    }

    /// `validSince` now revokes every refresh token; Firebase lists no sessions, so one revocation is
    /// counted (ID tokens already issued live until they expire, at most an hour).
    func endSessions(user id: String, into counts: inout AuthCounts) throws(HostedCallError) {
        if try update(id, ["validSince": String(Int(Date().timeIntervalSince1970))]) {
            counts.refreshTokensRevoked += 1
        }
    }

    func unlink(user id: String, sub: String, into counts: inout AuthCounts) throws(HostedCallError) {
        let linked = providers(try user(id)).contains { $0["providerId"] as? String == firebase.provider }
        guard linked else { return }
        if try update(id, ["deleteProvider": [firebase.provider]]) { counts.identitiesUnlinked += 1 }
    }

    func disable(user id: String, into counts: inout AuthCounts) throws(HostedCallError) {
        guard try user(id)["disabled"] as? Bool != true else { return }
        if try update(id, ["disableUser": true]) { counts.usersDisabled += 1 }
    }

    func delete(user id: String, into counts: inout AuthCounts) throws(HostedCallError) {
        let answer = try call("delete", ["localId": id], accepting: [Self.userNotFound])
        if answer.code == nil { counts.usersDeleted += 1 }
    }

    /// A provider entry's `rawId` cannot be edited: it is deleted and linked again with the new `sub`.
    /// A crash between the two leaves the user unlinked; a retry then finds neither sub (no_user).
    func move(user id: String, from oldSub: String, to newSub: String, into counts: inout AuthCounts)
        throws(HostedCallError)
    {
        guard try update(id, ["deleteProvider": [firebase.provider]]) else { return }
        let linked = try call(
            "update",
            ["localId": id, "linkProviderUserInfo": ["providerId": firebase.provider, "rawId": newSub]],
            accepting: [Self.alreadyLinked, Self.userNotFound])
        if linked.code == Self.alreadyLinked {
            // Linked to another user since the engine's check: the old sub is linked back first.
            try update(id, ["linkProviderUserInfo": ["providerId": firebase.provider, "rawId": oldSub]])
            throw newSubTaken()
        }
        if linked.code == nil { counts.identitiesMoved += 1 }
    }

    /// The custom claim `siwa_email_forwarding` (`on` or `off`); the others are kept (`customAttributes`
    /// replaces them all, and reaches ID tokens: at most 1000 characters).
    func recordForwarding(user id: String, on: Bool, into counts: inout AuthCounts) throws(HostedCallError) {
        let current = try user(id)["customAttributes"] as? String ?? "{}"
        var claims = (try? JSONSerialization.jsonObject(with: Data(current.utf8)) as? [String: Any]) ?? [:]
        claims["siwa_email_forwarding"] = on ? "on" : "off"
        let text = String(decoding: FirebaseAuth.json(claims), as: UTF8.self)
        guard text.count <= 1000 else {
            throw HostedCallError(
                .callFailed, platform: firebase.name, endpoint: "POST /v1/projects/{project}/accounts:update",
                cause:
                    "the user's custom claims would exceed Firebase's 1000 characters; nothing was recorded")
        }
        if try update(id, ["customAttributes": text]) { counts.metadataRecorded += 1 }
    }

    /// `accounts:update` of the user with `fields`: false when the user is gone meanwhile.
    @discardableResult
    func update(_ id: String, _ fields: [String: Any]) throws(HostedCallError) -> Bool {
        try call("update", fields.merging(["localId": id]) { $1 }, accepting: [Self.userNotFound]).code == nil
    }

    func newSubTaken() -> HostedCallError {
        HostedCallError(
            .conflict, platform: firebase.name,
            cause: "the new sub of a transfer is already linked to another user; nothing was moved")
    }
}
