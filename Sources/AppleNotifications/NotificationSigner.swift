import Crypto
public import Foundation

/// Signs notifications the way Apple does, for tests and operator tooling (`siwactl sign`).
///
/// Holds an RSA private key; the default key ID is ``RSAPublicKey/thumbprintKeyID``, a short
/// stable hash of the public modulus. Tokens have Apple's shape: header `{"kid":…,"alg":"RS256"}`,
/// claims `iss`, `aud` (a string), `iat`, `exp` = `iat` + 24 h, `jti`, and `events` as a JSON string.
public struct NotificationSigner: Sendable {
    private let privateKey: RSA.PrivateKey
    private let cachedPublicKey: RSAPublicKey
    /// The `kid` put in every header and in ``jwksJSON()``.
    public var keyID: String
    /// The private key as unencrypted PKCS#8 PEM. Secret: store with mode 0600, never log.
    public let privateKeyPEM: String

    private init(privateKey: () throws(CryptoError) -> RSA.PrivateKey, keyID: String?)
        throws(NotificationError)
    {
        do {
            let key = try privateKey()
            self.privateKey = key
            self.cachedPublicKey = RSAPublicKey(try key.publicKey())
            self.privateKeyPEM = try key.pkcs8PEM()
        } catch {
            throw .malformed(.badKey, error.description)
        }
        self.keyID = keyID ?? cachedPublicKey.thumbprintKeyID
    }

    /// Generates a fresh RSA-2048 key pair.
    public static func generate(keyID: String? = nil) throws -> NotificationSigner {
        try NotificationSigner(
            privateKey: { () throws(CryptoError) in try RSA.PrivateKey.generate() }, keyID: keyID)
    }

    /// Loads an RSA private key (PKCS#8 or traditional PEM, at least 2048 bits).
    public init(privateKeyPEM: String, keyID: String) throws {
        try self.init(
            privateKey: { () throws(CryptoError) in try RSA.PrivateKey(pem: privateKeyPEM) }, keyID: keyID)
    }

    /// Loads an RSA private key and names it by ``RSAPublicKey/thumbprintKeyID``.
    public init(privateKeyPEM: String) throws {
        try self.init(
            privateKey: { () throws(CryptoError) in try RSA.PrivateKey(pem: privateKeyPEM) }, keyID: nil)
    }

    /// The public half, for verification.
    public func publicKey() -> RSAPublicKey { cachedPublicKey }

    /// A key set holding just this signer's public key.
    public func keySet() -> JSONWebKeySet { JSONWebKeySet(keys: [keyID: cachedPublicKey]) }

    /// The JWKS document (`{"keys":[…]}`) publishing this signer's public key.
    public func jwksJSON() -> Data {
        let document: [String: Any] = ["keys": [cachedPublicKey.jwk(keyID: keyID)]]
        return (try? JSONSerialization.data(withJSONObject: document, options: jsonOptions)) ?? Data()
    }

    /// The claims of a notification in Apple's shape, as a mutable dictionary for tests to alter.
    public func claims(
        type: String, subject: String, audience: String, email: String? = nil, isPrivateEmail: Bool? = nil,
        eventTime: Date = Date(), issuedAt: Date = Date(), jti: String = UUID().uuidString.lowercased()
    ) -> [String: Any] {
        var event: [String: Any] = [
            "type": type, "sub": subject,
            "event_time": Int64((eventTime.timeIntervalSince1970 * 1000).rounded()),
        ]
        if let email {
            event["email"] = email
            let isPrivate = isPrivateEmail ?? email.hasSuffix("@privaterelay.appleid.com")
            event["is_private_email"] = isPrivate ? "true" : "false"
        } else if let isPrivateEmail {
            event["is_private_email"] = isPrivateEmail ? "true" : "false"
        }
        let eventsData = (try? JSONSerialization.data(withJSONObject: event, options: jsonOptions)) ?? Data()
        let iat = Int64(issuedAt.timeIntervalSince1970.rounded(.down))
        return [
            "iss": NotificationVerifier.issuer, "aud": audience, "iat": iat, "exp": iat + 24 * 3600,
            "jti": jti, "events": String(decoding: eventsData, as: UTF8.self),
        ]
    }

    /// Signs a notification exactly as Apple would send it; returns the compact JWS.
    public func sign(
        type: String, subject: String, audience: String, email: String? = nil, isPrivateEmail: Bool? = nil,
        eventTime: Date = Date(), issuedAt: Date = Date(), jti: String = UUID().uuidString.lowercased()
    ) throws -> String {
        let claims = claims(
            type: type, subject: subject, audience: audience, email: email, isPrivateEmail: isPrivateEmail,
            eventTime: eventTime, issuedAt: issuedAt, jti: jti)
        return try sign(claims: claims)
    }

    /// Signs arbitrary claims; `header` defaults to Apple's `{"kid":…,"alg":"RS256"}`.
    public func sign(header: [String: Any]? = nil, claims: [String: Any]) throws -> String {
        let headerJSON: Data
        if let header {
            headerJSON = try JSONSerialization.data(withJSONObject: header, options: jsonOptions)
        } else {
            // Apple's member order: kid first.
            let kid = try JSONSerialization.data(withJSONObject: [keyID], options: jsonOptions).dropFirst()
                .dropLast()
            headerJSON = Data("{\"kid\":".utf8) + kid + Data(",\"alg\":\"RS256\"}".utf8)
        }
        let claimsJSON = try JSONSerialization.data(withJSONObject: claims, options: jsonOptions)
        return try sign(headerJSON: headerJSON, claimsJSON: claimsJSON)
    }

    /// Signs raw header and claims bytes with RS256, whatever they contain (for forged-token tests).
    public func sign(headerJSON: Data, claimsJSON: Data) throws -> String {
        let signingInput = Base64URL.encode(headerJSON) + "." + Base64URL.encode(claimsJSON)
        let signature: Data
        do {
            signature = try privateKey.sha256Signature(for: Data(signingInput.utf8))
        } catch {
            throw NotificationError.malformed(.badKey, error.description)
        }
        return signingInput + "." + Base64URL.encode(signature)
    }
}

private let jsonOptions: JSONSerialization.WritingOptions = [.sortedKeys, .withoutEscapingSlashes]
