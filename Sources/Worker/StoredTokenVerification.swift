public import AppleNotifications
public import Foundation

/// How the worker checks each claimed notification's stored token before anything of it is applied:
/// the receiver's database role may store junk, so the worker applies only what Apple signed.
///
/// A row the receiver stored (origin `apple`) is applied only when its `raw_token`
/// - verifies with ``NotificationVerifier`` (the receiver's verifier: RS256 pinned, the key by `kid`
///   only, the signature over the exact bytes, `iss`), with the row's `received_at` (set by the
///   database, which the receiver's role cannot write) as the time of the `iat`/`exp` checks, so a
///   genuine token captured and inserted again once its `exp` has passed is refused;
/// - names the row's `audience` in `aud`, and that audience is one of ``audiences`` (when given);
/// - carries exactly the row's `jti`, `events.sub`, `events.type`, `event_time`, `email`,
///   `is_private_email`, `iat` and `exp`.
/// A row without a token (origin `apple`) is rejected: what it says cannot be checked. The refresh
/// check's own rows (origin `refresh-check`, a column the receiver's role cannot write) have no token
/// and are applied as they are.
///
/// Keys come from two closures: ``heldKey`` never blocks (the worker calls it inside its transaction),
/// ``fetchKey`` may fetch the key set (called with no transaction open, for a `kid` not held).
public struct StoredTokenVerification: Sendable {
    /// The client IDs the worker serves (the receiver's `--audience`); empty: the stored audience need
    /// only be one the token names.
    public let audiences: Set<String>
    /// Clock skew tolerated between the receiver's clock and the database's `received_at`, in seconds.
    public let leeway: TimeInterval
    /// The oldest a token without `exp` may be when it was received (the receiver's largest
    /// `--max-token-age`, 6 days).
    public let maxTokenAge: TimeInterval
    /// The key for a `kid` if it is held now; never fetches, never blocks on the network.
    public let heldKey: @Sendable (String) -> RSAPublicKey?
    /// The key for a `kid`, fetching the key set under its policy if needed; throws
    /// ``NotificationError/Kind/keyNotAvailable`` while it cannot be fetched, and
    /// ``NotificationError/Kind/verificationFailed`` for a `kid` a fresh set does not hold.
    public let fetchKey: @Sendable (String) throws(NotificationError) -> RSAPublicKey

    /// A verification with keys from a cache (e.g. the receiver's `KeyStore`: `heldKey(id:)` and
    /// `key(id:)`).
    public init(
        audiences: Set<String>, leeway: TimeInterval = 300, maxTokenAge: TimeInterval = 6 * 86_400,
        heldKey: @escaping @Sendable (String) -> RSAPublicKey?,
        fetchKey: @escaping @Sendable (String) throws(NotificationError) -> RSAPublicKey
    ) {
        self.audiences = audiences
        self.leeway = leeway
        self.maxTokenAge = maxTokenAge
        self.heldKey = heldKey
        self.fetchKey = fetchKey
    }

    /// A verification against one fixed key set (nothing is fetched: a `kid` not in it is unknown).
    public init(audiences: Set<String>, keys: JSONWebKeySet) {
        self.init(
            audiences: audiences, heldKey: { keys.key(id: $0) },
            fetchKey: { kid throws(NotificationError) in
                guard let key = keys.key(id: kid) else {
                    throw NotificationError(.verificationFailed, .unknownKeyID, "kid not in the key set")
                }
                return key
            })
    }

    /// What the check decided about one claimed row.
    enum Verdict: Equatable {
        case verified
        /// Nothing of it is applied; the reason is stored (no claim value in it).
        case rejected(String)
        /// Its `kid` is not held: fetch it (outside the transaction) and try again.
        case needsKey(String)
    }

    /// Checks one claimed row with the keys held now. `fetched` holds the kids a fetch found missing
    /// from a fresh key set (rejected without asking again) and the kids whose fetch failed.
    func check(_ row: ClaimedNotification, unknownKeys: Set<String>) -> Verdict {
        switch row.origin {
        case "refresh-check": return .verified
        case "apple": break
        default: return .rejected("unknown origin")
        }
        guard let token = row.rawToken else { return .rejected("no stored token to verify") }
        guard !row.audience.isEmpty, audiences.isEmpty || audiences.contains(row.audience) else {
            return .rejected("audience is not a configured client ID")
        }
        let jws: CompactJWS
        let verifier: NotificationVerifier
        do {
            jws = try CompactJWS(token)
            verifier = try NotificationVerifier(
                audiences: [row.audience], leeway: leeway, maxTokenAge: maxTokenAge)
        } catch {
            return .rejected("\(error.code)")
        }
        var missing: String?
        let claims: ServerNotification
        do {
            claims = try verifier.verify(jws, now: row.receivedAt) { kid throws(NotificationError) in
                if let key = heldKey(kid) { return key }
                if !unknownKeys.contains(kid) { missing = kid }
                throw NotificationError(.verificationFailed, .unknownKeyID, "kid not in Apple's key set")
            }
        } catch {
            if let missing { return .needsKey(missing) }
            return .rejected("\(error.code)")
        }
        if let mismatch = Self.mismatch(claims, row) {
            return .rejected("\(mismatch) differs from the token")
        }
        return .verified
    }

    /// The first stored column that differs from the verified claims, or nil.
    static func mismatch(_ claims: ServerNotification, _ row: ClaimedNotification) -> String? {
        func same(_ a: Date?, _ b: Date?) -> Bool {
            switch (a, b) {
            case (nil, nil): true
            case (let a?, let b?): abs(a.timeIntervalSince(b)) < 0.000_01  // microseconds, as stored
            default: false
            }
        }
        if claims.jti != row.jti { return "jti" }
        if claims.subject != row.sub { return "sub" }
        if claims.eventType.rawValue != row.eventType { return "event type" }
        if claims.audience != row.audience { return "audience" }
        // The signed event time must be the one stored; where the receiver did not believe it (beyond
        // iat + its leeway, whatever this check's own leeway), the stored effective time is iat + that.
        if !same(claims.claimedEventTime ?? claims.eventTime, row.claimedEventTime ?? row.eventTime) {
            return "event time"
        }
        if row.claimedEventTime != nil,
            !same(row.eventTime, row.issuedAt?.addingTimeInterval(NotificationVerifier.defaultLeeway))
        {
            return "event time"
        }
        if !same(claims.issuedAt, row.issuedAt) { return "issued at" }
        if !same(claims.expiresAt, row.expiresAt) { return "expires at" }
        if claims.email != row.email { return "email" }
        if claims.isPrivateEmail != row.isPrivateEmail { return "is_private_email" }
        return nil
    }
}

/// One row of `siwa.claim_notifications`: what the worker verifies before applying.
struct ClaimedNotification: Sendable {
    var id: Int64
    var refused: Bool
    var origin: String
    var rawToken: String?
    var jti: String
    var eventType: String
    var sub: String
    var audience: String
    var email: String?
    var isPrivateEmail: Bool?
    var eventTime: Date?
    /// The signed `event_time` when it lay beyond `iat` + leeway (`eventTime` is then the effective one).
    var claimedEventTime: Date?
    var issuedAt: Date?
    var expiresAt: Date?
    var receivedAt: Date
    var attempts: Int
}
