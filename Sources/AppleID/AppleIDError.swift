import Foundation

/// A call to Apple's token or revoke endpoint failed. `description` never holds a token, a client
/// secret, a code or a response body: only the kind of failure, the HTTP status and Apple's error code.
public struct AppleIDError: Error, Sendable, CustomStringConvertible, Equatable {
    /// The kind of failure; an open set (new codes may be added).
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// A short label.
        public let rawValue: String
        private init(_ rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }

        /// Apple's `invalid_grant`: the code is unknown, used or expired (five minutes), the refresh
        /// token was revoked (consent is gone), or the code was issued to another client ID.
        public static let invalidGrant = Code("invalid_grant")
        /// Apple's `invalid_client`: the client secret is expired, badly signed, for another team, key
        /// or client ID (bundle ID vs Services ID), or the client ID is unknown.
        public static let invalidClient = Code("invalid_client")
        /// Apple's `invalid_request`: a parameter is missing or malformed.
        public static let invalidRequest = Code("invalid_request")
        /// Apple's `unsupported_grant_type`.
        public static let unsupportedGrantType = Code("unsupported_grant_type")
        /// Apple's `unauthorized_client`: the client may not use this grant.
        public static let unauthorizedClient = Code("unauthorized_client")
        /// Apple's `invalid_scope`.
        public static let invalidScope = Code("invalid_scope")
        /// Another 4xx answer, or an error code this version does not know (see ``AppleIDError/appleError``).
        public static let rejected = Code("rejected")
        /// HTTP 429: Apple asks to slow down. Retryable.
        public static let rateLimited = Code("rate_limited")
        /// A 5xx answer. Retryable.
        public static let serverError = Code("server_error")
        /// The call's deadline passed. Retryable (the request may or may not have been applied).
        public static let timeout = Code("timeout")
        /// No answer: name resolution, connection, TLS or the exchange failed. Retryable.
        public static let transport = Code("transport")
        /// A 200 answer that is not the JSON Apple sends, or another unexpected status.
        public static let malformedResponse = Code("malformed_response")
        /// The client secret could not be made (bad key, bad settings), or the configuration is invalid.
        public static let configuration = Code("configuration")
    }

    /// The kind of failure.
    public var code: Code
    /// The HTTP status, when Apple answered.
    public var status: Int?
    /// Apple's `error` member, when it was a short snake_case word (anything else is dropped).
    public var appleError: String?
    /// One line for people, without secrets.
    public var detail: String

    /// An error.
    public init(_ code: Code, status: Int? = nil, appleError: String? = nil, _ detail: String) {
        self.code = code
        self.status = status
        self.appleError = appleError
        self.detail = detail
    }

    /// Whether trying again later may succeed (5xx, 429, timeouts, transport failures); Apple's
    /// 4xx verdicts will not change on a retry.
    public var isRetryable: Bool {
        [.serverError, .rateLimited, .timeout, .transport].contains(code)
    }

    public var description: String {
        var text = "\(code)"
        if let status { text += " (HTTP \(status))" }
        return text + ": " + detail
    }
}
