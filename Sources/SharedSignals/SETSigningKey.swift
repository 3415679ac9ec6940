public import AppleNotifications
public import Foundation

/// The transmitter's dedicated RS256 key (RSA, at least 2048 bits) that signs every SET, and its JWKS.
///
/// Kept apart from any key that signs Apple-shaped test notifications: a receiver trusting this JWKS
/// trusts only SETs. The private key is loaded from a secret file (PKCS#8 PEM, mode 0600).
public struct SETSigningKey: Sendable {
    private let signer: NotificationSigner

    /// The `kid` of every SET's header and of the published JWK.
    public var keyID: String { signer.keyID }
    /// The private key as unencrypted PKCS#8 PEM. Secret: written once by `siwactl ssf keygen`, never logged.
    public var privateKeyPEM: String { signer.privateKeyPEM }

    private init(signer: NotificationSigner) { self.signer = signer }

    /// Generates a fresh RSA-2048 key; its `kid` is a short hash of the public modulus.
    public static func generate() throws -> SETSigningKey {
        SETSigningKey(signer: try NotificationSigner.generate())
    }

    /// Loads a PEM private key (PKCS#8 or traditional); `kid` is a short hash of its public modulus.
    public init(privateKeyPEM: String) throws {
        self.signer = try NotificationSigner(privateKeyPEM: privateKeyPEM)
    }

    /// The JWKS document publishing the public key: `{"keys":[{"kty":"RSA","kid":…,"alg":"RS256","use":"sig",…}]}`.
    public func jwksJSON() -> Data { signer.jwksJSON() }

    /// One JWKS publishing several keys' public halves (the signing key first, then those published for a
    /// rotation: the next key before it signs, the previous one while receivers may still verify its SETs);
    /// a `kid` listed twice is published once.
    public static func jwksJSON(_ keys: [SETSigningKey]) -> Data {
        var seen = Set<String>()
        var published: [Any] = []
        for key in keys where seen.insert(key.keyID).inserted {
            let document = try? JSONSerialization.jsonObject(with: key.jwksJSON()) as? [String: Any]
            published += document?["keys"] as? [Any] ?? []
        }
        return (try? JSONSerialization.data(withJSONObject: ["keys": published], options: jsonWritingOptions))
            ?? Data()
    }

    /// The public half as a key set, for verification in process.
    public func keySet() -> JSONWebKeySet { signer.keySet() }

    /// Signs `claims` (JSON bytes) under the SET header `{"alg":"RS256","kid":…,"typ":"secevent+jwt"}`.
    func sign(claimsJSON: Data) throws -> String {
        let header: [String: Any] = ["alg": "RS256", "kid": keyID, "typ": SecurityEventToken.mediaTypeSuffix]
        let headerJSON = try JSONSerialization.data(withJSONObject: header, options: jsonWritingOptions)
        return try signer.sign(headerJSON: headerJSON, claimsJSON: claimsJSON)
    }
}

let jsonWritingOptions: JSONSerialization.WritingOptions = [.sortedKeys, .withoutEscapingSlashes]
