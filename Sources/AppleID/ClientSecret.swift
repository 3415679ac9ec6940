import AppleNotifications
import Crypto
public import Foundation

/// A `client_secret` could not be made, read or checked; `description` never contains key material
/// or a whole token.
public struct ClientSecretError: Error, Sendable, CustomStringConvertible, Equatable {
    /// Machine-readable reason.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// A short snake_case label.
        public let rawValue: String
        private init(_ rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }

        /// The key is not a readable, unencrypted PEM private key.
        public static let badKey = Code("bad_key")
        /// The key is not an EC key on P-256 (Apple's `.p8` keys are).
        public static let notP256 = Code("not_p256")
        /// The requested lifetime is not positive or exceeds Apple's limit.
        public static let badLifetime = Code("bad_lifetime")
        /// The token is not a compact JWS with Apple's client-secret header and claims.
        public static let malformed = Code("malformed")
        /// OpenSSL failed to sign.
        public static let signingFailed = Code("signing_failed")
    }

    /// The reason.
    public var code: Code
    /// One line for people.
    public var detail: String

    /// Creates an error.
    public init(_ code: Code, _ detail: String) {
        self.code = code
        self.detail = detail
    }

    public var description: String { detail }
}

/// The header and claims of a `client_secret` JWT, read without checking its signature.
public struct ClientSecretClaims: Sendable, Equatable {
    /// `kid`: the key's ID in Apple's developer account.
    public var keyID: String
    /// `alg`: always `ES256` for a well-formed secret.
    public var algorithm: String
    /// `iss`: the team ID.
    public var teamID: String
    /// `sub`: the client ID (bundle ID or Services ID).
    public var clientID: String
    /// `aud`: `https://appleid.apple.com`.
    public var audience: String
    /// `iat`.
    public var issuedAt: Date
    /// `exp`.
    public var expiresAt: Date

    /// Decodes `token`'s header and claims; throws ``ClientSecretError/Code/malformed`` when it is
    /// not a three-part JWS with the expected members.
    public init(decoding token: String) throws(ClientSecretError) {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard token.utf8.count <= 8192, parts.count == 3 else {
            throw ClientSecretError(.malformed, "not a compact JWS (three base64url parts)")
        }
        func object(_ part: Substring, _ name: String) throws(ClientSecretError) -> [String: Any] {
            guard let data = try? Base64URL.decode(part),
                let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
            else { throw ClientSecretError(.malformed, "the \(name) is not base64url JSON") }
            return object
        }
        let header = try object(parts[0], "header")
        let claims = try object(parts[1], "claims")
        func string(_ object: [String: Any], _ key: String) throws(ClientSecretError) -> String {
            guard let value = object[key] as? String else {
                throw ClientSecretError(.malformed, "\(key) is missing or not a string")
            }
            return value
        }
        func time(_ key: String) throws(ClientSecretError) -> Date {
            guard let number = claims[key] as? NSNumber, number.doubleValue.isFinite else {
                throw ClientSecretError(.malformed, "\(key) is missing or not a number")
            }
            return Date(timeIntervalSince1970: number.doubleValue)
        }
        keyID = try string(header, "kid")
        algorithm = try string(header, "alg")
        teamID = try string(claims, "iss")
        clientID = try string(claims, "sub")
        audience = try string(claims, "aud")
        issuedAt = try time("iat")
        expiresAt = try time("exp")
    }

    /// Seconds from `now` until expiry (negative once expired).
    public func remaining(now: Date = Date()) -> TimeInterval { expiresAt.timeIntervalSince(now) }
}

/// Makes the ES256 `client_secret` JWT that Apple's token and revoke endpoints require, from the
/// P-256 private key of a `.p8` file (PKCS#8 PEM).
///
/// Holds Crypto's `P256.PrivateKey`; signing only reads it, so one instance may be shared.
public final class ClientSecretSigner: Sendable {
    /// Apple's longest accepted lifetime (`exp - iat`): 15,777,000 seconds, about six months.
    public static let maximumLifetime: TimeInterval = 15_777_000
    /// The `aud` Apple expects.
    public static let audience = "https://appleid.apple.com"

    private let key: P256.PrivateKey

    /// Loads an unencrypted PEM private key, which must be an EC key on P-256.
    public init(privateKeyPEM: String) throws(ClientSecretError) {
        do {
            key = try P256.PrivateKey(pem: privateKeyPEM)
        } catch {
            throw ClientSecretError(error.kind == .wrongKeyType ? .notP256 : .badKey, error.description)
        }
    }

    /// The signed secret: header `{"alg":"ES256","kid":keyID}`, claims `iss` = team ID, `iat`,
    /// `exp` = `iat` + `lifetime`, `aud` = ``audience``, `sub` = client ID.
    ///
    /// - Throws: ``ClientSecretError/Code/badLifetime`` unless 0 < `lifetime` ≤ ``maximumLifetime``.
    public func sign(
        teamID: String, keyID: String, clientID: String, issuedAt: Date = Date(),
        lifetime: TimeInterval = 180 * 86400
    ) throws(ClientSecretError) -> String {
        guard lifetime > 0, lifetime <= Self.maximumLifetime else {
            throw ClientSecretError(
                .badLifetime, "the lifetime must be positive and at most \(Int(Self.maximumLifetime)) seconds"
            )
        }
        guard !teamID.isEmpty, !keyID.isEmpty, !clientID.isEmpty else {
            throw ClientSecretError(.malformed, "team ID, key ID and client ID must not be empty")
        }
        let iat = Int64(issuedAt.timeIntervalSince1970.rounded(.down))
        let header: [String: Any] = ["alg": "ES256", "kid": keyID]
        let claims: [String: Any] = [
            "iss": teamID, "iat": iat, "exp": iat + Int64(lifetime.rounded(.down)), "aud": Self.audience,
            "sub": clientID,
        ]
        let options: JSONSerialization.WritingOptions = [.sortedKeys, .withoutEscapingSlashes]
        guard let headerJSON = try? JSONSerialization.data(withJSONObject: header, options: options),
            let claimsJSON = try? JSONSerialization.data(withJSONObject: claims, options: options)
        else { throw ClientSecretError(.malformed, "cannot encode the header or claims") }
        let signingInput = Base64URL.encode(headerJSON) + "." + Base64URL.encode(claimsJSON)
        let signature: [UInt8]
        do {
            signature = try key.rawSignature(for: Array(signingInput.utf8))
        } catch {
            throw ClientSecretError(.signingFailed, error.description)
        }
        return signingInput + "." + Base64URL.encode(Data(signature))
    }

    /// Whether `token`'s ES256 signature (raw `r||s`) is valid for this key's public half.
    public func verifySignature(of token: String) -> Bool { Self.verifyES256(token, with: key.publicKey) }

    /// The public half as a `PUBLIC KEY` (SubjectPublicKeyInfo) PEM: what Apple holds, safe to share.
    public var publicKeyPEM: String { key.publicKey.pem }

    /// Whether `keyID` has the shape of an Apple key ID: ten upper-case letters or digits (the
    /// `KEYID` of `AuthKey_KEYID.p8`). Team IDs have the same shape.
    public static func isWellFormedAppleID(_ keyID: String) -> Bool {
        keyID.utf8.count == 10
            && keyID.utf8.allSatisfy {
                (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains($0)
                    || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0)
            }
    }

    /// Checks an ES256 JWS signature (raw `r||s`) with `key`.
    static func verifyES256(_ token: String, with key: P256.PublicKey) -> Bool {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let signature = try? Base64URL.decode(parts[2]), signature.count == 64 else {
            return false
        }
        return key.isValidSignature(raw: [UInt8](signature), for: Array((parts[0] + "." + parts[1]).utf8))
    }
}

/// Checks `client_secret` signatures with the public half of a team's `.p8` key, as Apple does
/// (used by `siwactl fake-apple`). Holds no secret.
///
/// Holds Crypto's `P256.PublicKey`; verifying only reads it, so one instance may be shared.
public final class ClientSecretVerifier: Sendable {
    private let key: P256.PublicKey

    /// Loads a `PUBLIC KEY` PEM, or the public half of an unencrypted private key PEM; either must be
    /// on P-256.
    public init(pem: String) throws(ClientSecretError) {
        do {
            key = try P256.PublicKey(pem: pem)
        } catch {
            throw ClientSecretError(error.kind == .wrongKeyType ? .notP256 : .badKey, error.description)
        }
    }

    /// Whether `token`'s ES256 signature (raw `r||s`) is valid for this key.
    public func verifySignature(of token: String) -> Bool {
        ClientSecretSigner.verifyES256(token, with: key)
    }

    /// The key as a `PUBLIC KEY` PEM (for comparing with ``ClientSecretSigner/publicKeyPEM``).
    public var publicKeyPEM: String { key.pem }
}
