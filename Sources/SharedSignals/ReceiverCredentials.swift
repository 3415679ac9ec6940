import AppleNotifications
public import Foundation

/// The secrets of the transmitter API's OAuth clients and tokens: generated here, stored only hashed.
///
/// A client secret is stored as SHA-256(salt ‖ secret) with a random 16-byte salt; an access token (random,
/// short-lived) as SHA-256(token). Both are 32 random bytes, so a fast hash is as strong as a slow one.
public enum ReceiverCredentials {
    /// A new random secret or token: 32 bytes from the system's CSPRNG, base64url (43 characters).
    public static func newSecret() -> String {
        Base64URL.encode(randomBytes(32))
    }

    /// A new client id: `ssf-` and 16 random bytes in hex.
    public static func newClientID() -> String {
        "ssf-" + randomBytes(16).map { String(format: "%02x", $0) }.joined()
    }

    /// A new 16-byte salt.
    public static func newSalt() -> Data { Data(randomBytes(16)) }

    /// SHA-256(salt ‖ secret), what `siwa.ssf_receivers.secret_hash` holds.
    public static func secretHash(_ secret: String, salt: Data) -> Data {
        SHA256Digest.hash(salt + Data(secret.utf8))
    }

    /// SHA-256(token), what `siwa.ssf_access_tokens.token_hash` holds.
    public static func tokenHash(_ token: String) -> Data {
        SHA256Digest.hash(Data(token.utf8))
    }

    private static func randomBytes(_ count: Int) -> [UInt8] {
        var generator = SystemRandomNumberGenerator()
        return (0..<count).map { _ in UInt8.random(in: .min ... .max, using: &generator) }
    }
}
