public import AppleID
public import AppleNotifications
public import Foundation
import HTTPClient
public import HTTPServer
import ServiceSupport
import Synchronization

/// The token side of the local Apple (`siwactl fake-apple`, ``FakeAppleServer``): `/auth/token`,
/// `/auth/revoke`, `/auth/usermigrationinfo` and the test-only `/fake/authorize` and `/fake/faults`, with
/// Apple's answers, kept in memory.
///
/// Behaves as Apple documents and as observed: client secrets are checked (ES256 signature with the
/// team's key, `kid`, `iss`, `sub` = `client_id`, `aud`, `iat`/`exp` at most six months apart, not
/// expired); errors are `{"error":"…"}` with status 400; authorization codes are single-use and
/// expire after five minutes; refresh tokens stay valid until revoked; `/auth/revoke` answers 200
/// even for unknown tokens, and when it revoked a real one, POSTs a signed `consent-revoked`
/// notification to the configured URL.
public final class FakeAppleAuthority: Sendable {
    /// The team and clients Apple knows, and where it sends notifications.
    public struct Settings: Sendable {
        /// The team whose client secrets are accepted (`iss`).
        public var teamID: String
        /// Its key ID (`kid`).
        public var keyID: String
        /// The client IDs Apple knows; the first is the default of `/fake/authorize`.
        public var clientIDs: [String]
        /// The team key's public half, to check client secrets.
        public var teamKey: ClientSecretVerifier
        /// Where to POST `consent-revoked` after a revocation.
        public var notifyURL: String?
        /// How long authorization codes stay valid, in seconds.
        public var codeLifetime: TimeInterval
        /// More teams whose client secrets are accepted (the recipient of an app transfer), by team ID.
        public var otherTeams: [String: (keyID: String, key: ClientSecretVerifier)]
        /// Users Apple knows for the migration endpoint (email, is_private_email), by the old team's sub.
        public var migrationUsers: [String: (email: String?, isPrivate: Bool)]

        /// Settings for one team.
        public init(
            teamID: String, keyID: String, clientIDs: [String], teamKey: ClientSecretVerifier,
            notifyURL: String? = nil, codeLifetime: TimeInterval = 300,
            otherTeams: [String: (keyID: String, key: ClientSecretVerifier)] = [:],
            migrationUsers: [String: (email: String?, isPrivate: Bool)] = [:]
        ) {
            self.teamID = teamID
            self.keyID = keyID
            self.clientIDs = clientIDs
            self.teamKey = teamKey
            self.notifyURL = notifyURL
            self.codeLifetime = codeLifetime
            self.otherTeams = otherTeams
            self.migrationUsers = migrationUsers
        }
    }

    /// Failures on demand: for the next `remaining` calls (nil: all) to `endpoints`, wait `delay`, then
    /// answer `failWith` (an OAuth error word, or an HTTP status) instead of the real answer. Only for
    /// calls about `subjects` (the migration endpoint's sub or transfer_sub), when given; only every
    /// `every`-th call to the endpoints, when given.
    public struct FaultPlan: Sendable, Equatable {
        /// An OAuth error word, or an HTTP status 429 / 500–599; nil: only the delay.
        public var failWith: String?
        /// How long to wait before answering.
        public var delay: Duration = .zero
        /// How long to hold the answer after the call was carried out (a revoke's token revoked and its
        /// consent-revoked sent): Apple acting, then answering late. Not with `failWith`.
        public var answerDelay: Duration = .zero
        /// How many more calls fail (nil: all).
        public var remaining: Int?
        /// `token`, `revoke`, `migration`.
        public var endpoints: Set<String> = ["token", "revoke"]
        /// Only migration calls about these subs or transfer_subs.
        public var subjects: Set<String>?
        /// Only every n-th call.
        public var every: Int?
        var calls = 0

        /// A plan that fails nothing.
        public init() {}

        /// The OAuth error words `failWith` may be.
        public static let errorWords: Set<String> = [
            "invalid_grant", "invalid_client", "invalid_request", "unsupported_grant_type",
            "unauthorized_client", "invalid_scope",
        ]

        /// Whether `failWith` is an error word or a status 429 / 500–599.
        public static func isValid(failWith: String) -> Bool {
            if errorWords.contains(failWith) { return true }
            guard let status = Int(failWith) else { return false }
            return status == 429 || (500...599).contains(status)
        }
    }

    /// What a user granted to one client.
    private struct Grant: Sendable {
        var sub: String
        var email: String?
        var isPrivateEmail: Bool
        var realUserStatus: Int
        var clientID: String
        var nonce: String?
        var redirectURI: String?
        var authTime: Int64
    }

    private struct State: Sendable {
        var codes: [String: (grant: Grant, issuedAt: Date, used: Bool)] = [:]
        /// Refresh token → grant; removed when revoked.
        var refreshTokens: [String: Grant] = [:]
        /// Access token → its refresh token.
        var accessTokens: [String: String] = [:]
        /// Access tokens for the migration endpoint: client ID, team, when issued.
        var migrationTokens: [String: (clientID: String, teamID: String, issuedAt: Date)] = [:]
        var faults: [FaultPlan] = []
    }

    /// The team and clients; nil: the token endpoints answer 404.
    public let settings: Settings?
    /// Signs id_tokens and consent-revoked notifications (Apple's key).
    public let signer: NotificationSigner
    private let state = Mutex(State())
    private let log: @Sendable (String) -> Void

    /// An authority with `settings` (nil: no token endpoints), signing with `signer`, failing as `fault`
    /// says from the start, logging one line per notable event to `log`.
    public init(
        settings: Settings?, signer: NotificationSigner, fault: FaultPlan?,
        log: @escaping @Sendable (String) -> Void
    ) {
        self.settings = settings
        self.signer = signer
        self.log = log
        state.withLock { $0.faults = fault.map { [$0] } ?? [] }
    }

    /// The answer for the paths this owns, or nil.
    public func handle(_ request: HTTPRequest) -> HTTPResponse? {
        switch request.path {
        case "/auth/token", "/auth/revoke", "/auth/usermigrationinfo", "/fake/authorize", "/fake/faults":
            break
        default: return nil
        }
        guard request.method == "POST" else { return .error(status: 405, "method not allowed") }
        guard let settings else {
            return .error(
                status: 404,
                "token endpoints not configured (give --team-id, --key-id, --team-key, --client-id)")
        }
        switch request.path {
        case "/fake/authorize": return authorize(request, settings)
        case "/fake/faults": return setFaults(request)
        default: break
        }
        let endpoint =
            switch request.path {
            case "/auth/token": "token"
            case "/auth/usermigrationinfo": "migration"
            default: "revoke"
            }
        let form = parseForm(request)
        let subject = endpoint == "migration" ? (form?["sub"] ?? form?["transfer_sub"]) : nil
        let fault = takeFault(endpoint: endpoint, subject: subject)
        if let fault {
            if fault.delay > .zero { Thread.sleep(forTimeInterval: fault.delay.inSeconds) }
            if let failWith = fault.failWith {
                log("\(request.path): failing on demand with \(failWith)")
                if let status = Int(failWith) { return .error(status: status, "server_error") }
                return .error(status: 400, failWith)
            }
        }
        guard let form else { return .error(status: 400, "invalid_request") }
        let response: HTTPResponse
        switch endpoint {
        case "token": response = token(form, settings)
        case "migration":
            response = migrationInfo(form, authorization: request.headers["Authorization"], settings)
        default: response = revoke(form, settings)
        }
        if let fault, fault.answerDelay > .zero {
            log("\(request.path): done; holding the answer \(fault.answerDelay) on demand")
            Thread.sleep(forTimeInterval: fault.answerDelay.inSeconds)
        }
        return response
    }

    // MARK: - /auth/token

    private func token(_ form: [String: String], _ settings: Settings) -> HTTPResponse {
        guard let clientID = form["client_id"], let secret = form["client_secret"],
            let grantType = form["grant_type"]
        else { return .error(status: 400, "invalid_request") }
        if let refusal = authenticate(clientID: clientID, secret: secret, settings) {
            log("/auth/token: invalid_client (\(refusal))")
            return .error(status: 400, "invalid_client")
        }
        let now = Date()
        switch grantType {
        case "client_credentials":
            // The migration endpoint's token: scope user.migration, valid an hour, usable many times.
            guard form["scope"] == "user.migration" else {
                log("/auth/token: invalid_scope (client_credentials needs scope user.migration)")
                return .error(status: 400, "invalid_scope")
            }
            let team = (try? ClientSecretClaims(decoding: secret).teamID) ?? ""
            let access = "m" + randomToken()
            state.withLock { state in
                state.migrationTokens = state.migrationTokens.filter {
                    now.timeIntervalSince($0.value.issuedAt) < 7200
                }
                state.migrationTokens[access] = (clientID, team, now)
            }
            return answer(["access_token": access, "token_type": "Bearer", "expires_in": 3600])
        case "authorization_code":
            guard let code = form["code"], !code.isEmpty else {
                return .error(status: 400, "invalid_request")
            }
            let outcome: Result<(Grant, String, String), Refusal> = state.withLock { state in
                guard let entry = state.codes[code] else { return .failure(Refusal("unknown code")) }
                guard !entry.used else { return .failure(Refusal("code already used")) }
                guard now.timeIntervalSince(entry.issuedAt) <= settings.codeLifetime else {
                    return .failure(Refusal("code expired"))
                }
                guard entry.grant.clientID == clientID else {
                    return .failure(Refusal("code issued to another client ID"))
                }
                if let expected = entry.grant.redirectURI, form["redirect_uri"] != expected {
                    return .failure(Refusal("redirect_uri does not match the authorization's"))
                }
                state.codes[code]!.used = true
                let refresh = "r" + randomToken()
                let access = "a" + randomToken()
                state.refreshTokens[refresh] = entry.grant
                state.accessTokens[access] = refresh
                return .success((entry.grant, refresh, access))
            }
            switch outcome {
            case .failure(let why):
                log("/auth/token: invalid_grant (\(why.description))")
                return .error(status: 400, "invalid_grant")
            case .success(let (grant, refresh, access)):
                return answer(
                    [
                        "access_token": access, "token_type": "Bearer", "expires_in": 3600,
                        "refresh_token": refresh,
                        "id_token": idToken(grant, now: now, includeNonce: true),
                    ])
            }
        case "refresh_token":
            guard let refresh = form["refresh_token"], !refresh.isEmpty else {
                return .error(status: 400, "invalid_request")
            }
            let outcome: (Grant, String)? = state.withLock { state in
                guard let grant = state.refreshTokens[refresh], grant.clientID == clientID else { return nil }
                let access = "a" + randomToken()
                state.accessTokens[access] = refresh
                return (grant, access)
            }
            guard let (grant, access) = outcome else {
                log("/auth/token: invalid_grant (unknown or revoked refresh token)")
                return .error(status: 400, "invalid_grant")
            }
            // As Apple: no new refresh token on a refresh.
            return answer(
                [
                    "access_token": access, "token_type": "Bearer", "expires_in": 3600,
                    "id_token": idToken(grant, now: now, includeNonce: false),
                ])
        default:
            return .error(status: 400, "unsupported_grant_type")
        }
    }

    // MARK: - /auth/revoke

    private func revoke(_ form: [String: String], _ settings: Settings) -> HTTPResponse {
        guard let clientID = form["client_id"], let secret = form["client_secret"], let token = form["token"],
            !token.isEmpty
        else { return .error(status: 400, "invalid_request") }
        if let hint = form["token_type_hint"], hint != "refresh_token", hint != "access_token" {
            return .error(status: 400, "invalid_request")
        }
        if let refusal = authenticate(clientID: clientID, secret: secret, settings) {
            log("/auth/revoke: invalid_client (\(refusal))")
            return .error(status: 400, "invalid_client")
        }
        let revoked: Grant? = state.withLock { state in
            let refresh = state.refreshTokens[token] != nil ? token : state.accessTokens[token]
            guard let refresh, let grant = state.refreshTokens[refresh], grant.clientID == clientID else {
                return nil
            }
            // The user's consent for this client is gone: every token of theirs for it goes.
            let gone = Set(
                state.refreshTokens.filter { $0.value.sub == grant.sub && $0.value.clientID == clientID }.keys
            )
            for key in gone { state.refreshTokens[key] = nil }
            state.accessTokens = state.accessTokens.filter { !gone.contains($0.value) }
            return grant
        }
        guard let revoked else {
            log("/auth/revoke: unknown token, answered 200 as Apple does")
            return HTTPResponse(status: 200)
        }
        if let url = settings.notifyURL {
            notify(url: url, sub: revoked.sub, clientID: clientID)
        } else {
            log("/auth/revoke: revoked; no --notify-url, so no consent-revoked notification")
        }
        return HTTPResponse(status: 200)
    }

    /// Sends `consent-revoked` as Apple does, a moment after answering, retrying a few times.
    private func notify(url: String, sub: String, clientID: String) {
        let token: String
        let jti = UUID().uuidString.lowercased()
        do {
            token = try signer.sign(type: "consent-revoked", subject: sub, audience: clientID, jti: jti)
        } catch {
            log("cannot sign consent-revoked: \(error)")
            return
        }
        let body = Array((try? JSONSerialization.data(withJSONObject: ["payload": token])) ?? Data())
        let log = self.log
        let thread = Thread {
            let client = OutboundHTTP.Client(policy: OutboundHTTP.Policy(timeout: .seconds(5)))
            var wait = 0.2
            for attempt in 1...5 {
                Thread.sleep(forTimeInterval: attempt == 1 ? 0.05 : wait)
                if attempt > 1 { wait *= 2 }
                do {
                    let response = try client.perform(
                        OutboundHTTP.Request(
                            method: "POST", url: url, headers: [.init("Content-Type", "application/json")],
                            body: body))
                    log("consent-revoked jti=\(jti) → \(response.status) (attempt \(attempt))")
                    if response.status == 200 { return }
                } catch {
                    log(
                        "consent-revoked jti=\(jti) → no answer: \((error as? OutboundHTTP.Error)?.code.rawValue ?? "error") (attempt \(attempt))"
                    )
                }
            }
            log("consent-revoked jti=\(jti): gave up after 5 attempts")
        }
        thread.start()
    }

    // MARK: - client authentication

    /// Why the client is refused (for the log; Apple says only `invalid_client`), or nil.
    private func authenticate(clientID: String, secret: String, _ settings: Settings) -> String? {
        guard settings.clientIDs.contains(clientID) else { return "unknown client_id" }
        guard let claims = try? ClientSecretClaims(decoding: secret) else {
            return "client_secret is not a JWT"
        }
        guard claims.algorithm == "ES256" else { return "alg is not ES256" }
        let other = settings.otherTeams[claims.teamID]
        guard claims.keyID == (other?.keyID ?? settings.keyID) else { return "kid is not the team's key ID" }
        guard claims.teamID == settings.teamID || other != nil else { return "iss is not the team ID" }
        guard claims.clientID == clientID else { return "sub is not the client_id" }
        guard claims.audience == ClientSecretSigner.audience else {
            return "aud is not \(ClientSecretSigner.audience)"
        }
        let now = Date()
        guard claims.expiresAt > now else { return "the client secret has expired" }
        guard claims.issuedAt <= now.addingTimeInterval(60) else { return "iat is in the future" }
        guard claims.expiresAt.timeIntervalSince(claims.issuedAt) <= ClientSecretSigner.maximumLifetime else {
            return "exp - iat exceeds six months"
        }
        guard (other?.key ?? settings.teamKey).verifySignature(of: secret) else {
            return "bad signature for the team's key"
        }
        return nil
    }

    // MARK: - test-only endpoints

    /// `POST /fake/authorize`, JSON `{sub, email?, nonce?, client_id?, is_private_email?,
    /// real_user_status?, redirect_uri?}`: a fresh authorization code and the id_token the app would get.
    private func authorize(_ request: HTTPRequest, _ settings: Settings) -> HTTPResponse {
        guard let object = try? JSONSerialization.jsonObject(with: request.data) as? [String: Any],
            let sub = object["sub"] as? String, !sub.isEmpty
        else { return .error(status: 400, "expected a JSON object with sub") }
        let clientID = (object["client_id"] as? String) ?? settings.clientIDs[0]
        guard settings.clientIDs.contains(clientID) else { return .error(status: 400, "unknown client_id") }
        let email = object["email"] as? String
        let grant = Grant(
            sub: sub, email: email,
            isPrivateEmail: (object["is_private_email"] as? Bool)
                ?? (email?.hasSuffix("@privaterelay.appleid.com") ?? false),
            realUserStatus: (object["real_user_status"] as? Int) ?? 2, clientID: clientID,
            nonce: object["nonce"] as? String, redirectURI: object["redirect_uri"] as? String,
            authTime: Int64(Date().timeIntervalSince1970))
        let code = "c" + randomToken() + ".0.fake"
        let now = Date()
        state.withLock { state in
            // Forget codes long past their lifetime, so a long-running fake does not grow without bound.
            state.codes = state.codes.filter {
                now.timeIntervalSince($0.value.issuedAt) <= 2 * settings.codeLifetime + 60
            }
            state.codes[code] = (grant, now, false)
        }
        return answer(["code": code, "id_token": idToken(grant, now: Date(), includeNonce: true)])
    }

    /// `POST /fake/faults`, JSON `{fail_with?, delay_ms?, answer_delay_ms?, times?, endpoint?}`; `{}` clears.
    private func setFaults(_ request: HTTPRequest) -> HTTPResponse {
        guard let object = try? JSONSerialization.jsonObject(with: request.data) as? [String: Any] else {
            return .error(status: 400, "expected a JSON object")
        }
        var plan = FaultPlan()
        if let failWith = object["fail_with"] as? String {
            guard FaultPlan.isValid(failWith: failWith) else { return .error(status: 400, "bad fail_with") }
            plan.failWith = failWith
        }
        if let delay = object["delay_ms"] as? Int {
            guard (0...600_000).contains(delay) else { return .error(status: 400, "bad delay_ms") }
            plan.delay = .milliseconds(delay)
        }
        if let delay = object["answer_delay_ms"] as? Int {
            guard (0...600_000).contains(delay), plan.failWith == nil || delay == 0 else {
                return .error(status: 400, "bad answer_delay_ms (0 to 600000, not with fail_with)")
            }
            plan.answerDelay = .milliseconds(delay)
        }
        if let times = object["times"] as? Int {
            guard times > 0 else { return .error(status: 400, "bad times") }
            plan.remaining = times
        }
        if let endpoint = object["endpoint"] as? String {
            switch endpoint {
            case "token", "revoke", "migration": plan.endpoints = [endpoint]
            case "both": break
            default: return .error(status: 400, "bad endpoint")
            }
        }
        if let subjects = object["subjects"] as? [String] {
            guard !subjects.isEmpty else { return .error(status: 400, "bad subjects") }
            plan.subjects = Set(subjects)
        }
        if let every = object["every"] as? Int {
            guard every > 0 else { return .error(status: 400, "bad every") }
            plan.every = every
        }
        let add = (object["add"] as? Bool) ?? false
        let active = plan.failWith != nil || plan.delay > .zero || plan.answerDelay > .zero
        state.withLock { state in
            if !add { state.faults = [] }
            if active { state.faults.append(plan) }
        }
        log(
            "faults: \(active ? "\(add ? "added " : "")\(plan.failWith ?? "no failure"), delay \(plan.delay)\(plan.answerDelay > .zero ? ", answer held \(plan.answerDelay)" : ""), times \(plan.remaining.map(String.init) ?? "all"), \(plan.endpoints.sorted().joined(separator: "+"))\(plan.subjects.map { ", \($0.count) subjects" } ?? "")\(plan.every.map { ", every \($0)th call" } ?? "")" : "cleared")"
        )
        return HTTPResponse(status: 204)
    }

    /// The first fault plan that applies to this call, counted (and dropped when used up).
    private func takeFault(endpoint: String, subject: String?) -> FaultPlan? {
        state.withLock { state in
            var chosen: FaultPlan?
            for index in state.faults.indices where state.faults[index].endpoints.contains(endpoint) {
                state.faults[index].calls += 1
                let plan = state.faults[index]
                guard chosen == nil else { continue }
                if let subjects = plan.subjects, !subjects.contains(subject ?? "") { continue }
                if let every = plan.every, plan.calls % every != 0 { continue }
                chosen = plan
                if let remaining = plan.remaining { state.faults[index].remaining = remaining - 1 }
            }
            state.faults.removeAll { $0.remaining.map { $0 <= 0 } ?? false }
            return chosen
        }
    }

    // MARK: - /auth/usermigrationinfo

    /// Both sides of Apple's user migration. The old team sends `sub` and `target` (the recipient's team
    /// ID) and gets `transfer_sub`; the recipient sends `transfer_sub` and gets its own `sub`, `email`
    /// and `is_private_email`. Both with a bearer access token from the client_credentials grant (scope
    /// user.migration) of the same client ID. Transfer identifiers and new subs are deterministic (a
    /// restarted fake answers the same), one-to-one per target team.
    private func migrationInfo(_ form: [String: String], authorization: String?, _ settings: Settings)
        -> HTTPResponse
    {
        guard let clientID = form["client_id"], let secret = form["client_secret"] else {
            return .error(status: 400, "invalid_request")
        }
        if let refusal = authenticate(clientID: clientID, secret: secret, settings) {
            log("/auth/usermigrationinfo: invalid_client (\(refusal))")
            return .error(status: 400, "invalid_client")
        }
        guard let bearer = AuthorizationHeader.bearerToken(authorization) else {
            log("/auth/usermigrationinfo: invalid_request (no bearer token)")
            return .error(status: 400, "invalid_request")
        }
        let now = Date()
        let grant = state.withLock { $0.migrationTokens[bearer] }
        guard let grant, now.timeIntervalSince(grant.issuedAt) < 3600, grant.clientID == clientID else {
            log("/auth/usermigrationinfo: invalid_grant (unknown, expired or another client's access token)")
            return .error(status: 400, "invalid_grant")
        }
        if let sub = form["sub"], let target = form["target"] {
            guard !sub.isEmpty, Self.isTeamID(target), target != grant.teamID, form["transfer_sub"] == nil
            else {
                return .error(status: 400, "invalid_request")
            }
            let transferSub = "\(target).\(grant.teamID).\(Self.hex(sub))"
            return answer(["transfer_sub": transferSub])
        }
        if let transferSub = form["transfer_sub"], form["sub"] == nil {
            let parts = transferSub.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
            guard parts.count == 3, parts[0] == grant.teamID, let oldSub = Self.unhex(parts[2]),
                !oldSub.isEmpty
            else {
                log("/auth/usermigrationinfo: invalid_request (not a transfer identifier for this team)")
                return .error(status: 400, "invalid_request")
            }
            let newSub = "\(grant.teamID.lowercased()).\(Self.hex(oldSub))"
            var body: [String: Any] = ["sub": newSub]
            if let user = settings.migrationUsers[oldSub] {
                if user.isPrivate {
                    body["email"] = "\(Self.hex(newSub).suffix(16))@privaterelay.appleid.com"
                    body["is_private_email"] = true
                } else if let email = user.email {
                    body["email"] = email
                    body["is_private_email"] = false
                }
            }
            return answer(body)
        }
        return .error(status: 400, "invalid_request")
    }

    /// Whether `text` is a team ID: ten upper-case letters and digits.
    public static func isTeamID(_ text: String) -> Bool {
        text.count == 10 && text.allSatisfy { $0.isASCII && ($0.isUppercase || $0.isNumber) }
    }

    static func hex(_ text: String) -> String {
        text.utf8.map { String(format: "%02x", $0) }.joined()
    }

    static func unhex(_ text: String) -> String? {
        guard text.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        var index = text.startIndex
        while index < text.endIndex {
            let next = text.index(index, offsetBy: 2)
            guard let byte = UInt8(text[index..<next], radix: 16) else { return nil }
            bytes.append(byte)
            index = next
        }
        return String(validating: bytes, as: UTF8.self)
    }

    // MARK: - helpers

    private func idToken(_ grant: Grant, now: Date, includeNonce: Bool) -> String {
        let iat = Int64(now.timeIntervalSince1970)
        var claims: [String: Any] = [
            "iss": NotificationVerifier.issuer, "aud": grant.clientID, "sub": grant.sub, "iat": iat,
            "exp": iat + 86400, "auth_time": grant.authTime, "nonce_supported": true,
        ]
        if let email = grant.email {
            claims["email"] = email
            claims["email_verified"] = true
            claims["is_private_email"] = grant.isPrivateEmail
        }
        if includeNonce {
            if let nonce = grant.nonce { claims["nonce"] = nonce }
            claims["real_user_status"] = grant.realUserStatus
        }
        return (try? signer.sign(claims: claims)) ?? ""
    }

    private func answer(_ object: [String: Any]) -> HTTPResponse {
        let data =
            (try? JSONSerialization.data(
                withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data()
        return HTTPResponse(
            status: 200, headers: ["Content-Type": "application/json", "Cache-Control": "no-store"],
            body: [UInt8](data))
    }
}

/// An `application/x-www-form-urlencoded` body as a dictionary; nil when the content type is another,
/// a field repeats (RFC 6749 §3.2) or the encoding is broken.
public func parseForm(_ request: HTTPRequest) -> [String: String]? {
    guard let type = request.headers["Content-Type"]?.lowercased(),
        type.split(separator: ";").first?.trimmingCharacters(in: .whitespaces)
            == "application/x-www-form-urlencoded"
    else { return nil }
    var form: [String: String] = [:]
    for pair in String(decoding: request.body, as: UTF8.self).split(separator: "&") {
        let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
        guard let name = formDecode(parts[0]), let value = formDecode(parts.count > 1 ? parts[1] : ""),
            form[name] == nil
        else { return nil }
        form[name] = value
    }
    return form
}

private func formDecode(_ text: Substring) -> String? {
    text.replacingOccurrences(of: "+", with: " ").removingPercentEncoding
}

/// Why a code is refused (for the log; Apple says only `invalid_grant`).
private struct Refusal: Error {
    var description: String
    init(_ description: String) { self.description = description }
}

/// 32 random bytes as hex (the system's CSPRNG).
private func randomToken() -> String {
    var generator = SystemRandomNumberGenerator()
    return (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &generator)) }.joined()
}
