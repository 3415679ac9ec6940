/// Why a notification (or a key set) was refused.
///
/// The ``kind`` tells a receiver how to answer: ``Kind/malformed`` is permanent (HTTP 400),
/// ``Kind/verificationFailed`` is permanent (HTTP 401) and ``Kind/keyNotAvailable`` is worth a
/// retry once the key set has been refreshed (HTTP 503). The ``code`` is a stable, short label
/// fit for metrics. The ``description`` is one line and never contains the token, an email
/// address or any other claim value.
public struct NotificationError: Error, Sendable, CustomStringConvertible, Equatable {
    /// The three classes of failure a receiver must tell apart.
    public struct Kind: Hashable, Sendable, CustomStringConvertible {
        /// A stable name: `malformed`, `verification_failed` or `key_not_available`.
        public let rawValue: String
        private init(_ rawValue: String) { self.rawValue = rawValue }

        /// The input is not a well-formed token, key set or notification. Permanent.
        public static let malformed = Kind("malformed")
        /// The token is well formed but is not a valid notification for us. Permanent.
        public static let verificationFailed = Kind("verification_failed")
        /// The key the token names is not among the keys held. Retry after a refresh.
        public static let keyNotAvailable = Kind("key_not_available")

        public var description: String { rawValue }
    }

    /// What exactly went wrong; new codes may be added without breaking callers.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// A short snake_case label, usable as a metrics label.
        public let rawValue: String
        private init(_ rawValue: String) { self.rawValue = rawValue }

        // Malformed input.
        /// The request body is not a JSON object with a `payload` string.
        public static let badBody = Code("bad_body")
        /// The input is larger than the bound allowed for it.
        public static let tooLarge = Code("too_large")
        /// A compact JWS that does not have exactly three segments.
        public static let badSegments = Code("bad_segments")
        /// A segment that is not strict, unpadded base64url.
        public static let badBase64 = Code("bad_base64")
        /// Bytes that are not the JSON expected (an object, usually).
        public static let badJSON = Code("bad_json")
        /// A required claim is absent.
        public static let missingClaim = Code("missing_claim")
        /// A claim has the wrong type or an absurd value.
        public static let badClaim = Code("bad_claim")
        /// The `events` claim cannot be understood.
        public static let badEvents = Code("bad_events")
        /// A JSON Web Key Set that cannot be used at all.
        public static let badKeySet = Code("bad_key_set")
        /// A key that cannot be generated, imported or used for signing.
        public static let badKey = Code("bad_key")

        // Verification failures.
        /// The `alg` header is anything but `RS256`.
        public static let algorithmNotAllowed = Code("algorithm_not_allowed")
        /// The header has a `crit` member; no extension is understood.
        public static let criticalHeader = Code("critical_header")
        /// The header has no usable `kid`.
        public static let missingKeyID = Code("missing_key_id")
        /// The `kid` is not in the key set (kind tells whether a refresh may help).
        public static let unknownKeyID = Code("unknown_key_id")
        /// The RS256 signature does not verify with the key named by `kid`.
        public static let badSignature = Code("bad_signature")
        /// `iss` is not `https://appleid.apple.com`.
        public static let wrongIssuer = Code("wrong_issuer")
        /// `aud` names none of the configured client IDs.
        public static let wrongAudience = Code("wrong_audience")
        /// `exp` is in the past (beyond the leeway).
        public static let expired = Code("expired")
        /// The token has no `exp` and its `iat` is older than the verifier's maximum token age
        /// (beyond the leeway).
        public static let tooOld = Code("too_old")
        /// `iat` is in the future (beyond the leeway).
        public static let issuedInFuture = Code("issued_in_future")
        /// The verifier was configured without any client ID.
        public static let noAudiences = Code("no_audiences")

        public var description: String { rawValue }
    }

    /// The class of failure: malformed, verification failed or key not available.
    public var kind: Kind
    /// The precise reason.
    public var code: Code
    /// A short, fixed explanation written by this library (never contains input values).
    public var detail: String?
    /// For ``Code/wrongAudience`` of a token whose signature verified: the `aud` it names (a client
    /// ID Apple signed, comma-separated when several, at most 200 characters), so that an operator sees
    /// which app's notifications are refused. `nil` otherwise.
    public var refusedAudience: String?

    /// Creates an error; `detail` must never contain token material or personal data.
    public init(_ kind: Kind, _ code: Code, _ detail: String? = nil) {
        self.kind = kind
        self.code = code
        self.detail = detail
    }

    public var description: String {
        var text = "\(kind.rawValue): \(code.rawValue)"
        if let detail { text += " (\(detail))" }
        return text
    }

    static func malformed(_ code: Code, _ detail: String? = nil) -> NotificationError {
        NotificationError(.malformed, code, detail)
    }

    static func verificationFailed(_ code: Code, _ detail: String? = nil) -> NotificationError {
        NotificationError(.verificationFailed, code, detail)
    }
}
