public import Foundation

/// Verifies Sign in with Apple server-to-server notification tokens.
///
/// Checks run in this order, so unsigned input never gets its claims interpreted:
/// 1. header: `alg` is exactly `RS256` (pinned here, never taken from the token), no `crit`,
///    a non-empty `kid`; `jku`, `x5u`, `jwk` and `x5c` are ignored;
/// 2. key lookup by `kid` only;
/// 3. the RS256 signature;
/// 4. claims: `iss`, `aud`, `iat`, `exp`, `jti`, then `events`.
///
/// A token with `exp` must not be past it; a token without `exp` must not be older than
/// ``maxTokenAge`` (measured from `iat`), so a captured token cannot be replayed for ever, e.g. after
/// retention has pruned the row that made it a duplicate. Both allow ``leeway`` for clock skew.
///
/// `iat` and `exp` are NumericDates: integers or finite fractional numbers between 0 and 10^11
/// seconds; anything else is ``NotificationError/Code/badClaim``. `event_time` above 10^11 is read
/// as milliseconds (captured traffic), otherwise as seconds (Apple's documentation example).
///
/// An event cannot have happened after Apple signed the token that tells of it, so an `event_time`
/// later than `iat` + ``leeway`` is not believed: the notification is still accepted (it is signed, and
/// losing it is worse), but its ``ServerNotification/eventTime`` is `iat` + ``leeway`` and the signed
/// value is kept in ``ServerNotification/claimedEventTime``. This is the one place the effective event
/// time is decided; everything downstream (the store, the worker's ordering and revocation cut-offs)
/// uses ``ServerNotification/eventTime``.
public struct NotificationVerifier: Sendable {
    /// The only accepted issuer.
    public static let issuer = "https://appleid.apple.com"
    /// The only accepted algorithm.
    public static let algorithm = "RS256"

    /// The client IDs (bundle IDs or Services IDs) this endpoint serves.
    public let audiences: Set<String>
    /// Clock skew tolerated for `iat` and `exp`, in seconds.
    public let leeway: TimeInterval
    /// The oldest a token without `exp` may be, in seconds after its `iat` (plus ``leeway``);
    /// older ones are refused with ``NotificationError/Code/tooOld``. Tokens with `exp` are bound
    /// by their `exp` alone.
    public let maxTokenAge: TimeInterval

    /// The default ``leeway``: 60 seconds, the receiver's (an `event_time` beyond `iat` + 60 s is not
    /// believed).
    public static let defaultLeeway: TimeInterval = 60

    /// The default ``maxTokenAge``: 24 hours, the lifetime Apple's tokens carry in `exp`.
    public static let defaultMaxTokenAge: TimeInterval = 24 * 3600

    /// Creates a verifier; an empty audience set, a negative leeway or a `maxTokenAge` that is not
    /// positive is refused.
    public init(
        audiences: Set<String>, leeway: TimeInterval = NotificationVerifier.defaultLeeway,
        maxTokenAge: TimeInterval = NotificationVerifier.defaultMaxTokenAge
    ) throws(NotificationError) {
        guard !audiences.isEmpty, !audiences.contains("") else {
            throw NotificationError(.malformed, .noAudiences, "at least one non-empty client ID is required")
        }
        guard leeway >= 0, leeway.isFinite else {
            throw NotificationError(.malformed, .badClaim, "leeway must be a non-negative number")
        }
        guard maxTokenAge > 0, maxTokenAge.isFinite else {
            throw NotificationError(.malformed, .badClaim, "maxTokenAge must be a positive number")
        }
        self.audiences = audiences
        self.leeway = leeway
        self.maxTokenAge = maxTokenAge
    }

    /// Parses and verifies a token against a key set; a `kid` not in the set is
    /// ``NotificationError/Kind/keyNotAvailable`` (the set may need a refresh).
    public func verify(token: String, keys: JSONWebKeySet, now: Date = Date()) throws(NotificationError)
        -> ServerNotification
    {
        let jws = try CompactJWS(token)
        return try verify(jws, now: now) { kid throws(NotificationError) in
            guard let key = keys.key(id: kid) else {
                throw NotificationError(.keyNotAvailable, .unknownKeyID, "kid not in the key set")
            }
            return key
        }
    }

    /// Full check of a parsed token; `key` maps a `kid` to a key or throws
    /// (``NotificationError/Kind/keyNotAvailable`` or ``NotificationError/Code/unknownKeyID``).
    public func verify(
        _ jws: CompactJWS, now: Date = Date(), key: (String) throws(NotificationError) -> RSAPublicKey
    ) throws(NotificationError) -> ServerNotification {
        // 1. Header.
        guard jws.algorithm == Self.algorithm else {
            throw .verificationFailed(.algorithmNotAllowed, "only RS256 is accepted")
        }
        guard !jws.hasCriticalHeader else {
            throw .verificationFailed(.criticalHeader, "crit header is not supported")
        }
        guard let kid = jws.keyID, !kid.isEmpty else {
            throw .verificationFailed(.missingKeyID, "header has no kid")
        }
        // 2. Key, 3. signature.
        let publicKey = try key(kid)
        guard publicKey.verifyRS256(signature: jws.signature, signedData: jws.signingInput) else {
            throw .verificationFailed(.badSignature, "RS256 signature does not verify")
        }
        // 4. Claims.
        return try claims(jws.payload, now: now)
    }

    private func claims(_ payload: Data, now: Date) throws(NotificationError) -> ServerNotification {
        let claims = try SignedClaims(payload)

        guard claims.issuerIsApple else {
            throw .verificationFailed(.wrongIssuer, "iss is not Apple")
        }

        let tokenAudiences: [String]
        switch claims.audience {
        case .string(let value)?:
            tokenAudiences = [value]
        case .array(let values)?:
            var strings: [String] = []
            for value in values {
                guard let string = value.stringValue else {
                    throw .malformed(.badClaim, "aud is not strings")
                }
                strings.append(string)
            }
            tokenAudiences = strings
        case nil:
            throw .verificationFailed(.wrongAudience, "aud is missing")
        default:
            throw .malformed(.badClaim, "aud is neither a string nor an array")
        }
        guard let audience = tokenAudiences.first(where: { audiences.contains($0) }) else {
            var error = NotificationError.verificationFailed(
                .wrongAudience, "aud names no configured client ID")
            // Signed by Apple (the signature verified above): a client ID, shown printable and bounded.
            error.refusedAudience = String(
                String(
                    tokenAudiences.joined(separator: ",").unicodeScalars.filter {
                        $0.value >= 0x20 && $0.value < 0x7f
                    }
                )
                .prefix(200))
            throw error
        }

        guard let iat = claims.issuedAt else { throw .malformed(.missingClaim, "iat is missing") }
        let issuedAt = try numericDate(iat, name: "iat")
        guard issuedAt.timeIntervalSince(now) <= leeway else {
            throw .verificationFailed(.issuedInFuture, "iat is in the future")
        }
        var expiresAt: Date?
        if let exp = claims.expiresAt {
            let date = try numericDate(exp, name: "exp")
            guard date.timeIntervalSince(now) > -leeway else {
                throw .verificationFailed(.expired, "exp is in the past")
            }
            expiresAt = date
        } else {
            guard now.timeIntervalSince(issuedAt) <= maxTokenAge + leeway else {
                throw .verificationFailed(.tooOld, "no exp, and iat is older than the maximum token age")
            }
        }

        guard let jtiValue = claims.jti else { throw .malformed(.missingClaim, "jti is missing") }
        guard let jti = jtiValue.stringValue, !jti.isEmpty else {
            throw .malformed(.badClaim, "jti is not a non-empty string")
        }

        let event = try events(claims.events)
        // Dated after the token was signed (beyond the clock-skew leeway): not believed.
        let latest = issuedAt.addingTimeInterval(leeway)
        let future = event.time > latest
        return ServerNotification(
            eventType: event.type, subject: event.subject, email: event.email,
            isPrivateEmail: event.isPrivateEmail, eventTime: future ? latest : event.time, jti: jti,
            audience: audience, audiences: tokenAudiences, issuedAt: issuedAt, expiresAt: expiresAt,
            claimedEventTime: future ? event.time : nil)
    }

    private func numericDate(_ value: JSONValue, name: StaticString) throws(NotificationError) -> Date {
        guard case .number(let seconds) = value, seconds.isFinite, seconds >= 0, seconds <= 1e11 else {
            throw .malformed(.badClaim, "\(name) is not a valid NumericDate")
        }
        return Date(timeIntervalSince1970: seconds)
    }

    private struct Event {
        var type: EventType
        var subject: String
        var email: String?
        var isPrivateEmail: Bool?
        var time: Date
    }

    private func events(_ value: SignedClaims.Events) throws(NotificationError) -> Event {
        let object: SignedEvent
        switch value {
        case .string(let text):
            // Real traffic: the events object JSON-encoded into a string.
            object = try SignedEvent(json: text)
        case .object(let value):
            // Apple's documentation: a plain object.
            object = value
        case .missing:
            throw .malformed(.missingClaim, "events is missing")
        case .other:
            throw .malformed(.badEvents, "events is neither a string nor an object")
        }

        guard let type = object.type?.stringValue, !type.isEmpty else {
            throw .malformed(.badEvents, "events.type is not a non-empty string")
        }
        guard let subject = object.subject?.stringValue, !subject.isEmpty else {
            throw .malformed(.badEvents, "events.sub is not a non-empty string")
        }
        var email: String?
        switch object.email {
        case nil, .null?: email = nil
        case .string(let value)?: email = value
        default: throw .malformed(.badEvents, "events.email is not a string")
        }
        var isPrivateEmail: Bool?
        switch object.isPrivateEmail {
        case nil, .null?: isPrivateEmail = nil
        case .bool(let value)?: isPrivateEmail = value
        case .string("true")?: isPrivateEmail = true
        case .string("false")?: isPrivateEmail = false
        default: throw .malformed(.badEvents, "events.is_private_email is not a boolean")
        }
        guard case .number(let rawTime)? = object.eventTime, rawTime.isFinite, rawTime >= 0 else {
            throw .malformed(.badEvents, "events.event_time is not a non-negative number")
        }
        let seconds = rawTime > 1e11 ? rawTime / 1000 : rawTime
        guard seconds <= 1e11 else { throw .malformed(.badEvents, "events.event_time is absurd") }
        return Event(
            type: EventType(rawValue: type), subject: subject, email: email,
            isPrivateEmail: isPrivateEmail, time: Date(timeIntervalSince1970: seconds))
    }
}
