import COpenSSL
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
/// Owns an OpenSSL `EVP_PKEY`, freed in `deinit`; signing only reads it, so one instance may be shared.
public final class ClientSecretSigner: @unchecked Sendable {
    /// Apple's longest accepted lifetime (`exp - iat`): 15,777,000 seconds, about six months.
    public static let maximumLifetime: TimeInterval = 15_777_000
    /// The `aud` Apple expects.
    public static let audience = "https://appleid.apple.com"

    private let pkey: OpaquePointer

    /// Loads an unencrypted PEM private key, which must be an EC key on P-256.
    public init(privateKeyPEM: String) throws(ClientSecretError) {
        guard let loaded = readPEMPrivateKey(privateKeyPEM) else {
            throw ClientSecretError(.badKey, "not an unencrypted PEM private key")
        }
        guard isP256(loaded) else {
            EVP_PKEY_free(loaded)
            throw ClientSecretError(.notP256, "the key is not an EC key on P-256 (ES256)")
        }
        pkey = loaded
    }

    deinit { EVP_PKEY_free(pkey) }

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
        let signature = try rawSignature(Data(signingInput.utf8))
        return signingInput + "." + Base64URL.encode(signature)
    }

    /// Whether `token`'s ES256 signature (raw `r||s`) is valid for this key's public half.
    public func verifySignature(of token: String) -> Bool { Self.verifyES256(token, with: pkey) }

    /// The public half as a `PUBLIC KEY` (SubjectPublicKeyInfo) PEM: what Apple holds, safe to share.
    public var publicKeyPEM: String { writePublicKeyPEM(pkey) ?? "" }

    /// Whether `keyID` has the shape of an Apple key ID: ten upper-case letters or digits (the
    /// `KEYID` of `AuthKey_KEYID.p8`). Team IDs have the same shape.
    public static func isWellFormedAppleID(_ keyID: String) -> Bool {
        keyID.utf8.count == 10
            && keyID.utf8.allSatisfy {
                (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains($0)
                    || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0)
            }
    }

    /// Checks an ES256 JWS signature (raw `r||s`) with `pkey`'s public half.
    static func verifyES256(_ token: String, with pkey: OpaquePointer) -> Bool {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let signature = try? Base64URL.decode(parts[2]), signature.count == 64,
            let der = Self.derSignature(raw: signature)
        else { return false }
        let signingInput = Data((parts[0] + "." + parts[1]).utf8)
        guard let context = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestVerifyInit(context, nil, EVP_sha256(), nil, pkey) == 1 else {
            ERR_clear_error()
            return false
        }
        let result = der.withUnsafeBytes { signatureBytes in
            signingInput.withUnsafeBytes { dataBytes in
                EVP_DigestVerify(
                    context, signatureBytes.baseAddress?.assumingMemoryBound(to: UInt8.self),
                    signatureBytes.count,
                    dataBytes.baseAddress?.assumingMemoryBound(to: UInt8.self), dataBytes.count)
            }
        }
        if result != 1 { ERR_clear_error() }
        return result == 1
    }

    /// ECDSA with SHA-256 through `EVP_DigestSign`, converted from DER to JOSE's 64-byte `r||s`.
    private func rawSignature(_ data: Data) throws(ClientSecretError) -> Data {
        guard let context = EVP_MD_CTX_new() else {
            throw ClientSecretError(.signingFailed, "cannot allocate a digest context")
        }
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestSignInit(context, nil, EVP_sha256(), nil, pkey) == 1 else {
            ERR_clear_error()
            throw ClientSecretError(.signingFailed, "cannot initialise signing")
        }
        var length = 0
        var der: [UInt8] = []
        let signed = data.withUnsafeBytes { input -> Bool in
            let base = input.baseAddress?.assumingMemoryBound(to: UInt8.self)
            guard EVP_DigestSign(context, nil, &length, base, input.count) == 1 else { return false }
            der = [UInt8](repeating: 0, count: length)
            return EVP_DigestSign(context, &der, &length, base, input.count) == 1
        }
        guard signed, let raw = Self.rawSignature(der: Array(der.prefix(length))) else {
            ERR_clear_error()
            throw ClientSecretError(.signingFailed, "ECDSA signing failed")
        }
        return raw
    }

    /// DER `ECDSA-Sig-Value` → `r||s`, each left-padded to 32 bytes.
    static func rawSignature(der: [UInt8]) -> Data? {
        der.withUnsafeBufferPointer { buffer -> Data? in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            guard let signature = d2i_ECDSA_SIG(nil, &cursor, buffer.count) else { return nil }
            defer { ECDSA_SIG_free(signature) }
            var r: OpaquePointer?
            var s: OpaquePointer?
            ECDSA_SIG_get0(signature, &r, &s)
            var out = [UInt8](repeating: 0, count: 64)
            guard let r, let s,
                out.withUnsafeMutableBufferPointer({ bytes in
                    BN_bn2binpad(r, bytes.baseAddress, 32) == 32
                        && BN_bn2binpad(s, bytes.baseAddress! + 32, 32) == 32
                })
            else { return nil }
            return Data(out)
        }
    }

    /// `r||s` → DER `ECDSA-Sig-Value`, for `EVP_DigestVerify`.
    static func derSignature(raw: Data) -> Data? {
        guard raw.count == 64, let signature = ECDSA_SIG_new() else { return nil }
        defer { ECDSA_SIG_free(signature) }
        let bytes = [UInt8](raw)
        guard let r = BN_bin2bn(bytes, 32, nil) else { return nil }
        guard let s = BN_bin2bn(Array(bytes[32...]), 32, nil) else {
            BN_free(r)
            return nil
        }
        // On success the signature owns r and s.
        guard ECDSA_SIG_set0(signature, r, s) == 1 else {
            BN_free(r)
            BN_free(s)
            return nil
        }
        let length = i2d_ECDSA_SIG(signature, nil)
        guard length > 0 else { return nil }
        var der = [UInt8](repeating: 0, count: Int(length))
        let written = der.withUnsafeMutableBufferPointer { buffer -> Int32 in
            var cursor: UnsafeMutablePointer<UInt8>? = buffer.baseAddress
            return i2d_ECDSA_SIG(signature, &cursor)
        }
        return written == length ? Data(der) : nil
    }
}

/// Checks `client_secret` signatures with the public half of a team's `.p8` key, as Apple does
/// (used by `siwactl fake-apple`). Holds no secret.
///
/// Owns an OpenSSL `EVP_PKEY`, freed in `deinit`; verifying only reads it, so one instance may be shared.
public final class ClientSecretVerifier: @unchecked Sendable {
    private let pkey: OpaquePointer

    /// Loads a `PUBLIC KEY` PEM, or the public half of an unencrypted private key PEM; either must be
    /// on P-256.
    public init(pem: String) throws(ClientSecretError) {
        guard let loaded = readPEMPublicKey(pem) ?? readPEMPrivateKey(pem) else {
            throw ClientSecretError(.badKey, "not a PEM public key or unencrypted private key")
        }
        guard isP256(loaded) else {
            EVP_PKEY_free(loaded)
            throw ClientSecretError(.notP256, "the key is not an EC key on P-256 (ES256)")
        }
        pkey = loaded
    }

    deinit { EVP_PKEY_free(pkey) }

    /// Whether `token`'s ES256 signature (raw `r||s`) is valid for this key.
    public func verifySignature(of token: String) -> Bool {
        ClientSecretSigner.verifyES256(token, with: pkey)
    }

    /// The key as a `PUBLIC KEY` PEM (for comparing with ``ClientSecretSigner/publicKeyPEM``).
    public var publicKeyPEM: String { writePublicKeyPEM(pkey) ?? "" }
}

/// Whether `pkey` is an EC key on P-256.
private func isP256(_ pkey: OpaquePointer) -> Bool {
    var name = [CChar](repeating: 0, count: 64)
    var length = 0
    let group: String? =
        EVP_PKEY_is_a(pkey, "EC") == 1 && EVP_PKEY_get_group_name(pkey, &name, name.count, &length) == 1
        ? String(decoding: name.prefix(length).map { UInt8(bitPattern: $0) }, as: UTF8.self) : nil
    ERR_clear_error()
    return group == "prime256v1" || group == "P-256"
}

/// A `PUBLIC KEY` PEM, or nil.
private func readPEMPublicKey(_ pem: String) -> OpaquePointer? {
    let bytes = Array(pem.utf8)
    let loaded: OpaquePointer? = bytes.withUnsafeBytes { buffer in
        guard let bio = BIO_new_mem_buf(buffer.baseAddress, Int32(buffer.count)) else { return nil }
        defer { BIO_free(bio) }
        return PEM_read_bio_PUBKEY(bio, nil, { _, _, _, _ in -1 }, nil)
    }
    if loaded == nil { ERR_clear_error() }
    return loaded
}

/// `pkey`'s public half as SubjectPublicKeyInfo PEM.
private func writePublicKeyPEM(_ pkey: OpaquePointer) -> String? {
    guard let bio = BIO_new(BIO_s_mem()) else { return nil }
    defer { BIO_free(bio) }
    guard PEM_write_bio_PUBKEY(bio, pkey) == 1 else {
        ERR_clear_error()
        return nil
    }
    var pointer: UnsafeMutablePointer<CChar>?
    let length = siwa_bio_get_mem_data(bio, &pointer)
    guard length > 0, let pointer else { return nil }
    return String(
        decoding: UnsafeRawBufferPointer(start: pointer, count: Int(length)).bindMemory(to: UInt8.self),
        as: UTF8.self)
}
