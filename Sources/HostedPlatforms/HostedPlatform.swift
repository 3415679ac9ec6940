public import AuthPlatforms
public import Foundation
public import HTTPClient

/// A hosted auth platform (Firebase Auth, Auth0, Clerk, Keycloak) and how Apple's events are applied
/// there: through its admin API, with the adapter's credentials, each event a short sequence of calls.
///
/// Unlike a database there is no transaction: each call is idempotent or checked before it is made (a
/// user already disabled is not disabled again, an identity already moved is not moved), so an event
/// retried after half its calls is finished by the retry, never applied twice. docs/adapters.md
/// "Hosted platforms" gives the calls per event and the permissions each needs.
public protocol HostedPlatform: Sendable {
    /// The platform's name in errors (`keycloak`, …).
    var name: String { get }
    /// The platform's name for Apple's identities (an identity provider alias, a connection, a
    /// provider id).
    var provider: String { get }
    /// Where its admin API is (`https://…`; `http` only to loopback, for tests).
    var baseURL: String { get }

    /// Headers every admin API call carries besides the token (an API version the adapter was written
    /// against); none by default.
    var headers: [OutboundHTTP.Header] { get }

    /// Refuses a policy the platform cannot express, naming the choice.
    func validate(_ policy: AuthPolicy) throws(AuthPlatformError)

    /// A bearer token for the admin API, from the adapter's credentials (a token endpoint's grant, or
    /// the secret itself); ``HostedAPI`` keeps it until shortly before it expires.
    func obtainToken(_ http: OutboundHTTP.Session) throws(HostedCallError) -> BearerToken

    /// Applies `event` for `sub` under `policy` through `api`, and returns what changed
    /// (``AuthChange/noUser`` when `sub` links no user). With ``HostedAPI/dryRun`` no change is sent:
    /// the counts are what the event would change.
    func apply(_ event: AuthEvent, sub: String, policy: AuthPolicy, api: HostedAPI) throws(HostedCallError)
        -> AuthChange
}

extension HostedPlatform {
    public var headers: [OutboundHTTP.Header] { [] }
}

/// An admin API's bearer token and when it stops being good.
public struct BearerToken: Sendable {
    /// The token (never logged).
    public var value: String
    /// When it expires; nil: it does not (a secret key).
    public var expiresAt: Date?

    /// A token.
    public init(value: String, expiresAt: Date?) {
        self.value = value
        self.expiresAt = expiresAt
    }
}

/// Why a hosted platform's call failed. It names the platform, the endpoint as a template
/// (`DELETE /admin/realms/{realm}/users/{id}`: never a user id, a `sub` or an address), the status and
/// the cause; never the platform's message text (which may quote data) or a credential.
public struct HostedCallError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The kind of failure.
    public enum Kind: String, Sendable, Hashable {
        /// The platform could not be reached, timed out, or answered 5xx: tried again later.
        case unavailable
        /// The platform asked us to slow down (429): the adapter waits ``HostedCallError/retryAfter``.
        case rateLimited = "rate_limited"
        /// The credentials were refused (401 after a fresh token, 403, or the token endpoint's refusal):
        /// rotate or fix them; nothing was marked done.
        case credentialsRefused = "credentials_refused"
        /// The credentials file lacks a field or is not JSON.
        case invalidCredentials = "invalid_credentials"
        /// Any other refusal of a call (400, 409, 422, …) or an answer we cannot read.
        case callFailed = "call_failed"
        /// The `sub` is linked to more than one user.
        case ambiguous
        /// A transfer's new `sub` already belongs to another user.
        case conflict
        /// A call about the user found answered 404: the platform no longer has them (deleted meanwhile).
        case userGone = "user_gone"
    }

    /// The kind of failure.
    public var kind: Kind
    /// The platform.
    public var platform: String
    /// The endpoint, as a template.
    public var endpoint: String?
    /// The HTTP status, when there was an answer.
    public var status: Int?
    /// What went wrong, in words that never quote data.
    public var cause: String
    /// How long the platform asked us to wait (429's `Retry-After` or rate-limit reset).
    public var retryAfter: Duration?

    /// An error.
    public init(
        _ kind: Kind, platform: String, endpoint: String? = nil, status: Int? = nil, cause: String,
        retryAfter: Duration? = nil
    ) {
        self.kind = kind
        self.platform = platform
        self.endpoint = endpoint
        self.status = status
        self.cause = cause
        self.retryAfter = retryAfter
    }

    /// `<platform>: <endpoint>: <cause> (HTTP <status>)`.
    public var description: String {
        [platform, endpoint, cause + (status.map { " (HTTP \($0))" } ?? "")].compactMap { $0 }.joined(
            separator: ": ")
    }
}

/// An adapter's credentials file, read as a JSON object (`siwactl adapters add --connection-file`):
/// each platform takes the fields it documents; a missing one is named, the values never.
public struct HostedCredentials: Sendable {
    /// The platform reading them, for errors.
    public let platform: String
    private let fields: [String: String]

    /// Parses `text` (a JSON object whose values are strings).
    public init(_ text: String, platform: String) throws(HostedCallError) {
        self.platform = platform
        guard let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else {
            throw HostedCallError(
                .invalidCredentials, platform: platform, cause: "the credentials file is not a JSON object")
        }
        fields = object.compactMapValues { $0 as? String }
    }

    /// The field `key`, not empty; else an error naming it.
    public func string(_ key: String) throws(HostedCallError) -> String {
        guard let value = fields[key], !value.isEmpty else {
            throw HostedCallError(
                .invalidCredentials, platform: platform, cause: "the credentials file has no \"\(key)\"")
        }
        return value
    }

    /// The field `key`, or nil when absent or empty.
    public func optional(_ key: String) -> String? { fields[key].flatMap { $0.isEmpty ? nil : $0 } }

    /// The field `key` (or `fallback`) as a URL without a trailing slash: `https`, or `http` to loopback.
    public func baseURL(_ key: String, default fallback: String? = nil) throws(HostedCallError) -> String {
        let value = optional(key) ?? fallback ?? ""
        guard let url = URL(string: value), let host = url.host, !host.isEmpty,
            url.scheme == "https" || (url.scheme == "http" && OutboundHTTP.isLoopback(host: host))
        else {
            throw HostedCallError(
                .invalidCredentials, platform: platform,
                cause: "\"\(key)\" is not an https URL (http only to loopback)")
        }
        return value.hasSuffix("/") ? String(value.dropLast()) : value
    }
}
