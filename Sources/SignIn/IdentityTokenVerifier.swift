public import AppleNotifications
import Crypto
public import Foundation
import ServiceSupport

/// What a verified Sign in with Apple `id_token` says about the user.
public struct IdentityClaims: Sendable, Equatable {
    /// The user's team-scoped identifier.
    public var sub: String
    /// The client ID the token was issued to.
    public var audience: String
    /// The email, when shared.
    public var email: String?
    /// Whether Apple verified the email.
    public var emailVerified: Bool?
    /// Whether the email is a private relay address.
    public var isPrivateEmail: Bool?
    /// 0 unsupported, 1 unknown, 2 likely real.
    public var realUserStatus: Int?
    /// The `nonce` claim (the SHA-256 hex of the app's raw nonce).
    public var nonce: String?
}

/// Verifies the `id_token` an app receives from Sign in with Apple (and the one `/auth/token` returns):
/// RS256 with a key from Apple's key set (by `kid`; the algorithm is pinned), `iss`
/// `https://appleid.apple.com`, `aud` among the configured client IDs, `exp` not past, `iat` not in the
/// future (both with leeway), and, when a raw nonce is given, `nonce` equal to its SHA-256 hex with
/// `nonce_supported` true.
public struct IdentityTokenVerifier: Sendable {
    /// Why a token was refused; `description` never holds the token.
    public struct Failure: Error, Sendable, Equatable, CustomStringConvertible {
        /// A short snake_case reason, also the API's `error` word.
        public let reason: String
        /// Whether the key set could not be consulted (retry later) rather than the token being bad.
        public let isTemporary: Bool
        /// A failure with `reason`.
        public init(_ reason: String, temporary: Bool = false) {
            self.reason = reason
            self.isTemporary = temporary
        }
        public var description: String { reason }
    }

    /// The accepted client IDs.
    public let audiences: Set<String>
    /// Clock skew tolerated, in seconds.
    public let leeway: TimeInterval

    /// A verifier for `audiences` (not empty).
    public init(audiences: Set<String>, leeway: TimeInterval = 60) {
        self.audiences = audiences
        self.leeway = leeway
    }

    /// The SHA-256 of `raw`, lowercase hex: what an app sends to Apple as the nonce.
    public static func nonceHash(_ raw: String) -> String {
        Digest.sha256(raw).map { String(format: "%02x", $0) }.joined()
    }

    /// Verifies `token`; `rawNonce`, when given, must hash to its `nonce` claim.
    public func verify(
        _ token: String, rawNonce: String?, now: Date = Date(),
        key: (String) throws(NotificationError) -> RSAPublicKey
    ) throws(Failure) -> IdentityClaims {
        let jws: CompactJWS
        do { jws = try CompactJWS(token) } catch { throw Failure("malformed_id_token") }
        guard jws.algorithm == "RS256", !jws.hasCriticalHeader else {
            throw Failure("id_token_algorithm_not_allowed")
        }
        guard let kid = jws.keyID, !kid.isEmpty else { throw Failure("id_token_without_kid") }
        let publicKey: RSAPublicKey
        do {
            publicKey = try key(kid)
        } catch {
            if error.kind == .keyNotAvailable { throw Failure("apple_keys_unavailable", temporary: true) }
            throw Failure("id_token_unknown_key")
        }
        guard publicKey.verifyRS256(signature: jws.signature, signedData: jws.signingInput) else {
            throw Failure("id_token_bad_signature")
        }
        guard let claims = try? JSONSerialization.jsonObject(with: jws.payload) as? [String: Any] else {
            throw Failure("malformed_id_token")
        }
        guard claims["iss"] as? String == "https://appleid.apple.com" else {
            throw Failure("id_token_wrong_issuer")
        }
        let tokenAudiences: [String]
        if let single = claims["aud"] as? String {
            tokenAudiences = [single]
        } else if let many = claims["aud"] as? [String] {
            tokenAudiences = many
        } else {
            throw Failure("id_token_wrong_audience")
        }
        guard let audience = tokenAudiences.first(where: { audiences.contains($0) }) else {
            throw Failure("id_token_wrong_audience")
        }
        guard let exp = (claims["exp"] as? NSNumber)?.doubleValue, exp.isFinite else {
            throw Failure("id_token_without_exp")
        }
        guard exp > now.timeIntervalSince1970 - leeway else { throw Failure("id_token_expired") }
        guard let iat = (claims["iat"] as? NSNumber)?.doubleValue, iat.isFinite else {
            throw Failure("id_token_without_iat")
        }
        guard iat <= now.timeIntervalSince1970 + leeway else { throw Failure("id_token_issued_in_future") }
        guard let sub = claims["sub"] as? String, (1...255).contains(sub.utf8.count) else {
            throw Failure("id_token_without_sub")
        }
        let nonce = claims["nonce"] as? String
        if let rawNonce {
            guard flag(claims["nonce_supported"]) == true else { throw Failure("nonce_not_supported") }
            guard let nonce, constantTimeEqual(nonce, Self.nonceHash(rawNonce)) else {
                throw Failure("nonce_mismatch")
            }
        }
        let status = (claims["real_user_status"] as? NSNumber)?.intValue
        return IdentityClaims(
            sub: sub, audience: audience, email: claims["email"] as? String,
            emailVerified: flag(claims["email_verified"]), isPrivateEmail: flag(claims["is_private_email"]),
            realUserStatus: status.flatMap { (0...2).contains($0) ? $0 : nil }, nonce: nonce)
    }
}

/// A JSON boolean, or Apple's strings "true" / "false".
private func flag(_ value: Any?) -> Bool? {
    switch value {
    case let string as String: return string == "true" ? true : string == "false" ? false : nil
    case let number as NSNumber: return number.boolValue
    default: return nil
    }
}

/// SHA-256 of text, raw bytes.
func sha256(_ text: String) -> Data { Data(Digest.sha256(text)) }
