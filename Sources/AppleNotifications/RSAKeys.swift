import COpenSSL
public import Foundation

/// An RSA public key used to check RS256 signatures.
///
/// Immutable wrapper around an OpenSSL `EVP_PKEY`, which it owns and frees in `deinit`.
/// Verification only reads the key, so one instance may be shared across threads.
public final class RSAPublicKey: @unchecked Sendable {
    /// The owned `EVP_PKEY*`; never escapes this module.
    let pkey: OpaquePointer

    /// The modulus size in bits.
    public let bits: Int
    /// The modulus `n`, big-endian without leading zero bytes.
    public let modulus: Data
    /// The public exponent `e`, big-endian without leading zero bytes.
    public let exponent: Data

    /// Takes ownership of `pkey`.
    private init(owning pkey: OpaquePointer, modulus: Data, exponent: Data) {
        self.pkey = pkey
        self.bits = Int(EVP_PKEY_get_bits(pkey))
        self.modulus = modulus
        self.exponent = exponent
    }

    deinit {
        for context in idleContexts { EVP_PKEY_CTX_free(context) }
        EVP_PKEY_free(pkey)
    }

    /// Verification contexts set up for RS256 (`EVP_PKEY_verify_init`, PKCS #1 v1.5 padding, SHA-256),
    /// kept for reuse: setting one up costs OpenSSL 3 about as much as the RSA operation itself. A
    /// context serves one verification at a time; guarded by `contextLock`.
    private var idleContexts: [OpaquePointer] = []
    private let contextLock = NSLock()
    private static let maximumIdleContexts = 16

    /// Builds a public key from its big-endian modulus and exponent (OpenSSL 3 `EVP_PKEY_fromdata`).
    public convenience init(modulus: Data, exponent: Data) throws(NotificationError) {
        let n = modulus.drop(while: { $0 == 0 })
        let e = exponent.drop(while: { $0 == 0 })
        // e must be odd and at least 3; n at most 16384 bits, which bounds the cost of a check.
        guard !n.isEmpty, let last = e.last, last & 1 == 1, e.count > 1 || last > 1, e.count <= 8,
            n.count <= 2048
        else {
            throw .malformed(.badKey, "unusable RSA modulus or exponent")
        }
        guard let pkey = Self.makePublicKey(n: Data(n), e: Data(e)) else {
            ERR_clear_error()
            throw .malformed(.badKey, "OpenSSL refused the RSA parameters")
        }
        self.init(owning: pkey, modulus: Data(n), exponent: Data(e))
    }

    /// Wraps a key pair's public half: builds a fresh public-only key from its parameters.
    convenience init(publicHalfOf pkey: OpaquePointer) throws(NotificationError) {
        guard let n = bigNumberParameter(pkey, siwa_ossl_pkey_param_rsa_n()),
            let e = bigNumberParameter(pkey, siwa_ossl_pkey_param_rsa_e())
        else {
            ERR_clear_error()
            throw .malformed(.badKey, "cannot read RSA parameters")
        }
        try self.init(modulus: n, exponent: e)
    }

    private static func makePublicKey(n: Data, e: Data) -> OpaquePointer? {
        guard let builder = OSSL_PARAM_BLD_new() else { return nil }
        defer { OSSL_PARAM_BLD_free(builder) }
        guard let nBN = bigNumber(n) else { return nil }
        defer { BN_free(nBN) }
        guard let eBN = bigNumber(e) else { return nil }
        defer { BN_free(eBN) }
        guard OSSL_PARAM_BLD_push_BN(builder, siwa_ossl_pkey_param_rsa_n(), nBN) == 1,
            OSSL_PARAM_BLD_push_BN(builder, siwa_ossl_pkey_param_rsa_e(), eBN) == 1,
            let params = OSSL_PARAM_BLD_to_param(builder)
        else { return nil }
        defer { OSSL_PARAM_free(params) }
        guard let context = EVP_PKEY_CTX_new_from_name(nil, "RSA", nil) else { return nil }
        defer { EVP_PKEY_CTX_free(context) }
        guard EVP_PKEY_fromdata_init(context) == 1 else { return nil }
        var pkey: OpaquePointer?
        guard EVP_PKEY_fromdata(context, &pkey, siwa_evp_pkey_public_key(), params) == 1 else { return nil }
        return pkey
    }

    /// Checks an RSASSA-PKCS1-v1_5 signature with SHA-256 (RS256). The algorithm is fixed here,
    /// never chosen by the token.
    public func verifyRS256(signature: Data, signedData: Data) -> Bool {
        // A PKCS#1 v1.5 signature is exactly as long as the modulus.
        guard signature.count == (bits + 7) / 8, let sha256 = SHA256Method.shared.md else { return false }
        var digest = [UInt8](repeating: 0, count: 32)
        var digestLength: UInt32 = 0
        let digested = signedData.withUnsafeBytes { data in
            EVP_Digest(data.baseAddress, data.count, &digest, &digestLength, sha256, nil)
        }
        guard digested == 1, digestLength == 32, let context = takeContext(sha256) else {
            ERR_clear_error()
            return false
        }
        let result = signature.withUnsafeBytes { signatureBytes in
            EVP_PKEY_verify(
                context, signatureBytes.baseAddress?.assumingMemoryBound(to: UInt8.self),
                signatureBytes.count,
                digest, digest.count)
        }
        if result != 1 { ERR_clear_error() }
        returnContext(context)
        return result == 1
    }

    /// An idle verification context, or a new one.
    private func takeContext(_ sha256: OpaquePointer) -> OpaquePointer? {
        if let context = contextLock.withLock({ idleContexts.popLast() }) { return context }
        guard let context = EVP_PKEY_CTX_new_from_pkey(nil, pkey, nil) else { return nil }
        guard EVP_PKEY_verify_init(context) == 1,
            EVP_PKEY_CTX_set_rsa_padding(context, siwa_rsa_pkcs1_padding()) == 1,
            EVP_PKEY_CTX_set_signature_md(context, sha256) == 1
        else {
            EVP_PKEY_CTX_free(context)
            return nil
        }
        return context
    }

    private func returnContext(_ context: OpaquePointer) {
        let kept = contextLock.withLock {
            guard idleContexts.count < Self.maximumIdleContexts else { return false }
            idleContexts.append(context)
            return true
        }
        if !kept { EVP_PKEY_CTX_free(context) }
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

/// An RSA private key (key pair), owned and freed in `deinit`. Signing only reads the key.
final class RSAPrivateKey: @unchecked Sendable {
    let pkey: OpaquePointer

    private init(owning pkey: OpaquePointer) { self.pkey = pkey }
    deinit { EVP_PKEY_free(pkey) }

    /// Generates a fresh RSA key pair.
    static func generate(bits: Int32 = 2048) throws(NotificationError) -> RSAPrivateKey {
        guard let context = EVP_PKEY_CTX_new_from_name(nil, "RSA", nil) else {
            throw .malformed(.badKey, "cannot create key generation context")
        }
        defer { EVP_PKEY_CTX_free(context) }
        var pkey: OpaquePointer?
        guard EVP_PKEY_keygen_init(context) == 1,
            EVP_PKEY_CTX_set_rsa_keygen_bits(context, bits) == 1,
            EVP_PKEY_generate(context, &pkey) == 1,
            let pkey
        else {
            ERR_clear_error()
            throw .malformed(.badKey, "RSA key generation failed")
        }
        return RSAPrivateKey(owning: pkey)
    }

    /// Imports a PEM private key (PKCS#8 or traditional); must be RSA of at least 2048 bits.
    init(pem: String) throws(NotificationError) {
        guard let loaded = readPEMPrivateKey(pem) else {
            throw .malformed(.badKey, "not a PEM private key")
        }
        guard EVP_PKEY_is_a(loaded, "RSA") == 1, EVP_PKEY_get_bits(loaded) >= 2048 else {
            EVP_PKEY_free(loaded)
            throw .malformed(.badKey, "private key is not RSA of at least 2048 bits")
        }
        self.pkey = loaded
    }

    /// The private key as PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`), unencrypted.
    func pkcs8PEM() throws(NotificationError) -> String {
        guard let bio = BIO_new(BIO_s_mem()) else { throw .malformed(.badKey, "cannot allocate BIO") }
        defer { BIO_free(bio) }
        guard PEM_write_bio_PKCS8PrivateKey(bio, pkey, nil, nil, 0, nil, nil) == 1 else {
            ERR_clear_error()
            throw .malformed(.badKey, "cannot export private key")
        }
        var pointer: UnsafeMutablePointer<CChar>?
        let length = siwa_bio_get_mem_data(bio, &pointer)
        guard let pointer, length > 0 else { throw .malformed(.badKey, "cannot export private key") }
        return String(decoding: UnsafeRawBufferPointer(start: pointer, count: length), as: UTF8.self)
    }

    /// Signs with RSASSA-PKCS1-v1_5 and SHA-256.
    func signRS256(_ data: Data) throws(NotificationError) -> Data {
        guard let context = EVP_MD_CTX_new() else { throw .malformed(.badKey, "cannot allocate digest") }
        defer { EVP_MD_CTX_free(context) }
        var keyContext: OpaquePointer?
        guard EVP_DigestSignInit(context, &keyContext, EVP_sha256(), nil, pkey) == 1,
            EVP_PKEY_CTX_set_rsa_padding(keyContext, siwa_rsa_pkcs1_padding()) == 1
        else {
            ERR_clear_error()
            throw .malformed(.badKey, "cannot initialise signing")
        }
        var length = 0
        let ok = data.withUnsafeBytes { input -> Bool in
            let base = input.baseAddress?.assumingMemoryBound(to: UInt8.self)
            guard EVP_DigestSign(context, nil, &length, base, input.count) == 1 else { return false }
            return true
        }
        guard ok else {
            ERR_clear_error()
            throw .malformed(.badKey, "signing failed")
        }
        var signature = [UInt8](repeating: 0, count: length)
        let signed = data.withUnsafeBytes { input -> Bool in
            let base = input.baseAddress?.assumingMemoryBound(to: UInt8.self)
            return EVP_DigestSign(context, &signature, &length, base, input.count) == 1
        }
        guard signed else {
            ERR_clear_error()
            throw .malformed(.badKey, "signing failed")
        }
        return Data(signature.prefix(length))
    }
}

private func bigNumber(_ bytes: Data) -> OpaquePointer? {
    bytes.withUnsafeBytes { buffer in
        BN_bin2bn(buffer.baseAddress?.assumingMemoryBound(to: UInt8.self), Int32(buffer.count), nil)
    }
}

private func bigNumberParameter(_ pkey: OpaquePointer, _ name: UnsafePointer<CChar>) -> Data? {
    var value: OpaquePointer?
    guard EVP_PKEY_get_bn_param(pkey, name, &value) == 1, let value else { return nil }
    defer { BN_free(value) }
    let count = (BN_num_bits(value) + 7) / 8
    var bytes = [UInt8](repeating: 0, count: Int(count))
    _ = BN_bn2bin(value, &bytes)
    return Data(bytes)
}

/// SHA-256 through the EVP one-shot digest.
func sha256(_ data: Data) -> Data {
    var digest = [UInt8](repeating: 0, count: 32)
    var length: UInt32 = 0
    let ok = data.withUnsafeBytes { buffer in
        EVP_Digest(buffer.baseAddress, buffer.count, &digest, &length, EVP_sha256(), nil)
    }
    precondition(ok == 1 && length == 32, "SHA-256 failed")
    return Data(digest)
}

/// Reads an unencrypted PEM private key (PKCS#8 or traditional) of any type; nil when the text is not
/// one. The caller owns the returned `EVP_PKEY`. The password callback refuses, so an encrypted key fails
/// instead of prompting on a terminal.
func readPEMPrivateKey(_ pem: String) -> OpaquePointer? {
    let bytes = Array(pem.utf8)
    let loaded: OpaquePointer? = bytes.withUnsafeBytes { buffer in
        guard let bio = BIO_new_mem_buf(buffer.baseAddress, Int32(buffer.count)) else { return nil }
        defer { BIO_free(bio) }
        return PEM_read_bio_PrivateKey(bio, nil, { _, _, _, _ in -1 }, nil)
    }
    if loaded == nil { ERR_clear_error() }
    return loaded
}

/// SHA-256 fetched from the default provider once, rather than implicitly on every use.
private final class SHA256Method: @unchecked Sendable {  // immutable after init
    static let shared = SHA256Method()
    let md: OpaquePointer?
    private init() { md = EVP_MD_fetch(nil, "SHA256", nil) }
}
