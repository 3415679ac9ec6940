import Crypto
public import Foundation

/// An RSA public key used to check RS256 signatures.
///
/// Immutable wrapper around Crypto's `RSA.PublicKey`. Verification only reads the key, so one instance
/// may be shared across threads.
public final class RSAPublicKey: Sendable {
    /// The key Crypto checks signatures with.
    let key: RSA.PublicKey

    /// The modulus size in bits.
    public var bits: Int { key.bits }
    /// The modulus `n`, big-endian without leading zero bytes.
    public var modulus: Data { key.modulus }
    /// The public exponent `e`, big-endian without leading zero bytes.
    public var exponent: Data { key.exponent }

    init(_ key: RSA.PublicKey) { self.key = key }

    /// Builds a public key from its big-endian modulus and exponent (OpenSSL 3 `EVP_PKEY_fromdata`).
    public convenience init(modulus: Data, exponent: Data) throws(NotificationError) {
        do {
            self.init(try RSA.PublicKey(modulus: modulus, exponent: exponent))
        } catch {
            throw .malformed(.badKey, error.description)
        }
    }

    /// Checks an RSASSA-PKCS1-v1_5 signature with SHA-256 (RS256). The algorithm is fixed here,
    /// never chosen by the token.
    public func verifyRS256(signature: Data, signedData: Data) -> Bool {
        key.isValidSHA256Signature(signature, for: signedData)
    }

    /// A JWK object for this key (`kty`, `kid`, `use`, `alg`, `n`, `e`).
    public func jwk(keyID: String) -> [String: String] {
        [
            "kty": "RSA", "kid": keyID, "use": "sig", "alg": "RS256",
            "n": Base64URL.encode(modulus), "e": Base64URL.encode(exponent),
        ]
    }

    /// A stable short identifier: base64url of SHA-256 of the modulus, first 16 characters.
    public var thumbprintKeyID: String {
        String(Base64URL.encode(sha256(modulus)).prefix(16))
    }
}

/// SHA-256 (Crypto's).
func sha256(_ data: Data) -> Data { Digest.sha256(data) }
