import Foundation
import HTTPClient

/// Calls Apple's Sign in with Apple REST endpoints for one client ID: `/auth/token` (exchange an
/// authorization code, refresh) and `/auth/revoke`.
///
/// Blocking: each call holds the calling thread for at most its deadline. Over `https` only, except
/// `http` to a loopback host (for `siwactl fake-apple`), as ``OutboundHTTP`` enforces. A value type,
/// safe to share; the client secret is minted and renewed by its ``ClientSecretProvider``.
public struct AppleIDClient: Sendable {
    /// Where Apple is and how long a call may take.
    public struct Configuration: Sendable {
        /// Apple's base URL: `https://appleid.apple.com`, or a local stand-in's.
        public var baseURL: String
        /// The deadline of each call unless the call gives its own.
        public var timeout: Duration
        /// The largest answer accepted, in bytes.
        public var maxResponseBytes: Int
        /// The executable's environment, for `https_proxy`, `no_proxy` and `SSL_CERT_FILE`.
        public var environment: [String: String]
        /// A CA bundle to trust instead of the system's (tests).
        public var caFile: String?

        /// A configuration; `baseURL` must be `https`, or `http` to a loopback host.
        public init(
            baseURL: String = "https://appleid.apple.com", timeout: Duration = .seconds(10),
            maxResponseBytes: Int = 64 << 10, environment: [String: String] = [:], caFile: String? = nil
        ) {
            self.baseURL = baseURL
            self.timeout = timeout
            self.maxResponseBytes = maxResponseBytes
            self.environment = environment
            self.caFile = caFile
        }
    }

    /// Which kind of token ``AppleIDClient/revoke(token:hint:timeout:)`` is given.
    public struct TokenTypeHint: Hashable, Sendable, CustomStringConvertible {
        /// The value sent as `token_type_hint`.
        public let rawValue: String
        private init(_ rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }

        /// A refresh token (what the service stores).
        public static let refreshToken = TokenTypeHint("refresh_token")
        /// An access token.
        public static let accessToken = TokenTypeHint("access_token")
    }

    /// The configuration.
    public let configuration: Configuration
    /// The client secret's source; its client ID is the one sent.
    public let clientSecret: ClientSecretProvider
    private let base: String

    /// A client for `clientSecret`'s client ID.
    /// - Throws: ``AppleIDError/Code/configuration`` when the base URL is neither `https` nor `http`
    ///   to a loopback host.
    public init(configuration: Configuration = Configuration(), clientSecret: ClientSecretProvider)
        throws(AppleIDError)
    {
        var base = configuration.baseURL
        while base.hasSuffix("/") { base.removeLast() }
        guard let url = URL(string: base), let scheme = url.scheme?.lowercased(), let host = url.host,
            scheme == "https" || (scheme == "http" && OutboundHTTP.isLoopback(host: host)),
            url.query == nil, url.user == nil
        else {
            throw AppleIDError(.configuration, "the base URL must be https (or http to a loopback host)")
        }
        guard configuration.timeout > .zero, configuration.maxResponseBytes > 0 else {
            throw AppleIDError(.configuration, "the timeout and the response size limit must be positive")
        }
        self.configuration = configuration
        self.clientSecret = clientSecret
        self.base = base
    }

    /// Exchanges a sign-in's authorization code (single-use, valid five minutes) for tokens.
    /// `redirectURI` is required when the code came from a web sign-in with one.
    public func exchange(code: String, redirectURI: String? = nil, timeout: Duration? = nil)
        throws(AppleIDError) -> TokenResponse
    {
        var form = [("grant_type", "authorization_code"), ("code", code)]
        if let redirectURI { form.append(("redirect_uri", redirectURI)) }
        return try tokens(try call("/auth/token", form, timeout: timeout))
    }

    /// Validates a refresh token and gets a new access token (Apple sends no new refresh token).
    /// ``AppleIDError/Code/invalidGrant`` means the user's consent is gone.
    public func refresh(token: String, timeout: Duration? = nil) throws(AppleIDError) -> TokenResponse {
        try tokens(
            try call(
                "/auth/token", [("grant_type", "refresh_token"), ("refresh_token", token)], timeout: timeout))
    }

    /// Revokes a refresh or access token. Apple answers 200 even for a token it does not know, so
    /// success proves only that Apple accepted the call; Apple then sends `consent-revoked`.
    public func revoke(token: String, hint: TokenTypeHint = .refreshToken, timeout: Duration? = nil)
        throws(AppleIDError)
    {
        _ = try call(
            "/auth/revoke", [("token", token), ("token_type_hint", hint.rawValue)], timeout: timeout)
    }

    /// POSTs the form with client_id and client_secret (and `bearer` as the Authorization header);
    /// returns the body of a 200 answer.
    func call(_ path: String, _ form: [(String, String)], bearer: String? = nil, timeout: Duration?)
        throws(AppleIDError) -> [UInt8]
    {
        let deadline = timeout ?? configuration.timeout
        guard deadline > .zero else { throw AppleIDError(.configuration, "the deadline must be positive") }
        let secret = try clientSecret.current()
        let fields = [("client_id", clientSecret.clientID), ("client_secret", secret)] + form
        let body = fields.map { formEncode($0.0) + "=" + formEncode($0.1) }.joined(separator: "&")
        let client = OutboundHTTP.Client(
            policy: OutboundHTTP.Policy(
                timeout: deadline, maxResponseBodyBytes: configuration.maxResponseBytes,
                refusesContentEncoding: true, caFile: configuration.caFile),
            environment: configuration.environment)
        let response: OutboundHTTP.Response
        do {
            response = try client.perform(
                OutboundHTTP.Request(
                    method: "POST", url: base + path,
                    headers: [
                        .init("Content-Type", "application/x-www-form-urlencoded"),
                        .init("Accept", "application/json"),
                    ] + (bearer.map { [.init("Authorization", "Bearer " + $0)] } ?? []),
                    body: Array(body.utf8)))
        } catch {
            switch error.code {
            case .timeout: throw AppleIDError(.timeout, "no answer from Apple within \(deadline)")
            case .policy: throw AppleIDError(.configuration, "request refused by the HTTP policy: \(error)")
            case .tooLarge, .contentEncoding, .malformed:
                throw AppleIDError(.malformedResponse, "Apple's answer was refused: \(error.code)")
            default: throw AppleIDError(.transport, "no answer from Apple: \(error.code)")
            }
        }
        switch response.status {
        case 200:
            return response.body
        case 429:
            throw AppleIDError(.rateLimited, status: 429, "Apple asks to slow down")
        case 500...599:
            throw AppleIDError(.serverError, status: response.status, "Apple's server failed")
        case 400...499:
            let word = appleErrorWord(response.body)
            let code: AppleIDError.Code
            switch word {
            case "invalid_grant": code = .invalidGrant
            case "invalid_client": code = .invalidClient
            case "invalid_request": code = .invalidRequest
            case "unsupported_grant_type": code = .unsupportedGrantType
            case "unauthorized_client": code = .unauthorizedClient
            case "invalid_scope": code = .invalidScope
            default: code = .rejected
            }
            throw AppleIDError(
                code, status: response.status, appleError: word, "Apple refused the call to \(path)")
        default:
            throw AppleIDError(.malformedResponse, status: response.status, "unexpected answer to \(path)")
        }
    }

    private func tokens(_ body: [UInt8]) throws(AppleIDError) -> TokenResponse {
        guard let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any],
            let accessToken = object["access_token"] as? String, let idToken = object["id_token"] as? String,
            let tokenType = object["token_type"] as? String
        else {
            throw AppleIDError(
                .malformedResponse, status: 200, "the token answer lacks access_token, token_type or id_token"
            )
        }
        let expiresIn = (object["expires_in"] as? NSNumber)?.intValue ?? 0
        return TokenResponse(
            accessToken: accessToken, tokenType: tokenType, expiresIn: expiresIn,
            refreshToken: object["refresh_token"] as? String, idToken: idToken)
    }
}

/// What `/auth/token` answers. Its `description` (and `dump`) never shows the tokens.
public struct TokenResponse: Sendable, CustomStringConvertible, CustomDebugStringConvertible,
    CustomReflectable
{
    /// A short-lived access token (Apple offers no API that uses it, but it may be revoked).
    public var accessToken: String
    /// `Bearer`.
    public var tokenType: String
    /// Seconds the access token is valid.
    public var expiresIn: Int
    /// The refresh token: only after exchanging an authorization code, never after a refresh. Secret.
    public var refreshToken: String?
    /// The RS256 identity token; verify it (issuer, audience, expiry, nonce) before trusting it.
    public var idToken: String

    /// A response.
    public init(
        accessToken: String, tokenType: String, expiresIn: Int, refreshToken: String?, idToken: String
    ) {
        self.accessToken = accessToken
        self.tokenType = tokenType
        self.expiresIn = expiresIn
        self.refreshToken = refreshToken
        self.idToken = idToken
    }

    public var description: String {
        "TokenResponse(token_type: \(tokenType), expires_in: \(expiresIn), refresh_token: \(refreshToken == nil ? "none" : "redacted"), access_token: redacted, id_token: redacted)"
    }
    public var debugDescription: String { description }
    public var customMirror: Mirror { Mirror(self, children: ["description": description]) }
}

/// Apple's `error` member if it is a short snake_case word; nil otherwise (never echo a body).
private func appleErrorWord(_ body: [UInt8]) -> String? {
    guard body.count <= 4096,
        let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any],
        let word = object["error"] as? String, (1...64).contains(word.utf8.count),
        word.utf8.allSatisfy({
            (UInt8(ascii: "a")...UInt8(ascii: "z")).contains($0) || $0 == UInt8(ascii: "_")
        })
    else { return nil }
    return word
}

/// `application/x-www-form-urlencoded`: everything but unreserved characters percent-encoded.
func formEncode(_ text: String) -> String {
    var out = ""
    for byte in text.utf8 {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
            UInt8(ascii: "~"):
            out.unicodeScalars.append(Unicode.Scalar(byte))
        default:
            out += String(format: "%%%02X", byte)
        }
    }
    return out
}
