import COpenSSL
public import Foundation

/// RSA with PKCS #1 v1.5 signatures (RS256 and the like) by OpenSSL.
public enum RSA {
    /// An RSA public key; verifying only reads it, so one instance may be shared across threads.
    public final class PublicKey: @unchecked Sendable {
        private let key: PKey

        /// The modulus size in bits.
        public let bits: Int
        /// The modulus `n`, big-endian without leading zero bytes.
        public let modulus: Data
        /// The public exponent `e`, big-endian without leading zero bytes.
        public let exponent: Data

        /// Verification contexts set up for PKCS #1 v1.5 with SHA-256 (`EVP_PKEY_verify_init`), kept
        /// for reuse: setting one up costs OpenSSL 3 about as much as the RSA operation itself. A context
        /// serves one verification at a time; guarded by `contextLock`.
        private var idleContexts: [OpaquePointer] = []
        private let contextLock = NSLock()
        private static let maximumIdleContexts = 16

        private init(key: PKey, modulus: Data, exponent: Data) {
            self.key = key
            self.bits = Int(EVP_PKEY_get_bits(key.pointer))
            self.modulus = modulus
            self.exponent = exponent
        }

        deinit {
            for context in idleContexts { EVP_PKEY_CTX_free(context) }
        }

        /// Builds a public key from its big-endian modulus and exponent (a JWK's `n` and `e`).
        /// - Throws: when `e` is not odd and at least 3, `n` is over 16384 bits, or OpenSSL refuses them.
        public convenience init(modulus: Data, exponent: Data) throws(CryptoError) {
            let n = modulus.drop(while: { $0 == 0 })
            let e = exponent.drop(while: { $0 == 0 })
            // e must be odd and at least 3; n at most 16384 bits, which bounds the cost of a check.
            guard !n.isEmpty, let last = e.last, last & 1 == 1, e.count > 1 || last > 1, e.count <= 8,
                n.count <= 2048
            else {
                throw CryptoError(.unreadableKey, "unusable RSA modulus or exponent")
            }
            guard let pointer = Self.makePublicKey(n: Data(n), e: Data(e)) else {
                ERR_clear_error()
                throw CryptoError(.unreadableKey, "OpenSSL refused the RSA parameters")
            }
            self.init(key: PKey(owning: pointer), modulus: Data(n), exponent: Data(e))
        }

        /// The RSA public key (at least 2048 bits) of a PEM X.509 certificate, or nil.
        public convenience init?(certificatePEM pem: [UInt8]) {
            guard let key = PKey.publicKey(certificatePEM: pem) else { return nil }
            guard key.isRSA(atLeast: 2048),
                let n = bigNumberParameter(key.pointer, siwa_ossl_pkey_param_rsa_n()),
                let e = bigNumberParameter(key.pointer, siwa_ossl_pkey_param_rsa_e())
            else {
                ERR_clear_error()
                return nil
            }
            self.init(key: key, modulus: n, exponent: e)
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
            guard EVP_PKEY_fromdata(context, &pkey, siwa_evp_pkey_public_key(), params) == 1 else {
                return nil
            }
            return pkey
        }

        /// Whether `signature` is an RSASSA-PKCS1-v1_5 signature with SHA-256 (RS256) of `message`.
        public func isValidSHA256Signature(_ signature: Data, for message: Data) -> Bool {
            // A PKCS#1 v1.5 signature is exactly as long as the modulus.
            guard signature.count == (bits + 7) / 8, let sha256 = SHA256Method.shared.md else { return false }
            var digest = [UInt8](repeating: 0, count: 32)
            var digestLength: UInt32 = 0
            let digested = message.withUnsafeBytes { data in
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

        /// Whether `signature` is an RSASSA-PKCS1-v1_5 signature of `message` with `digest`
        /// (EVP_DigestVerify; SNS signs with SHA-1 or SHA-256).
        public func isValidSignature(_ signature: [UInt8], for message: [UInt8], digest: Digest.Algorithm)
            -> Bool
        {
            key.verify(signature: signature, message: message, digest: digest.method)
        }

        /// An idle verification context, or a new one.
        private func takeContext(_ sha256: OpaquePointer) -> OpaquePointer? {
            if let context = contextLock.withLock({ idleContexts.popLast() }) { return context }
            guard let context = EVP_PKEY_CTX_new_from_pkey(nil, key.pointer, nil) else { return nil }
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
    }

    /// An RSA private key (key pair); signing only reads it, so one instance may be shared.
    public final class PrivateKey: @unchecked Sendable {
        private let key: PKey

        private init(key: PKey) { self.key = key }

        /// Generates a fresh key pair of `bits` bits.
        public static func generate(bits: Int32 = 2048) throws(CryptoError) -> PrivateKey {
            guard let context = EVP_PKEY_CTX_new_from_name(nil, "RSA", nil) else {
                throw CryptoError(.operationFailed, "cannot create key generation context")
            }
            defer { EVP_PKEY_CTX_free(context) }
            var pkey: OpaquePointer?
            guard EVP_PKEY_keygen_init(context) == 1,
                EVP_PKEY_CTX_set_rsa_keygen_bits(context, bits) == 1,
                EVP_PKEY_generate(context, &pkey) == 1,
                let pkey
            else {
                ERR_clear_error()
                throw CryptoError(.operationFailed, "RSA key generation failed")
            }
            return PrivateKey(key: PKey(owning: pkey))
        }

        /// Imports an unencrypted PEM private key (PKCS#8 or traditional); it must be RSA of at least
        /// 2048 bits.
        public init(pem: String) throws(CryptoError) {
            guard let loaded = PKey.privateKey(pem: pem) else {
                throw CryptoError(.unreadableKey, "not a PEM private key")
            }
            guard loaded.isRSA(atLeast: 2048) else {
                throw CryptoError(.wrongKeyType, "private key is not RSA of at least 2048 bits")
            }
            key = loaded
        }

        /// The public half, as a fresh public-only key.
        public func publicKey() throws(CryptoError) -> PublicKey {
            guard let n = bigNumberParameter(key.pointer, siwa_ossl_pkey_param_rsa_n()),
                let e = bigNumberParameter(key.pointer, siwa_ossl_pkey_param_rsa_e())
            else {
                ERR_clear_error()
                throw CryptoError(.unreadableKey, "cannot read RSA parameters")
            }
            return try PublicKey(modulus: n, exponent: e)
        }

        /// The private key as unencrypted PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`): a secret.
        public func pkcs8PEM() throws(CryptoError) -> String {
            guard let pem = key.pkcs8PEM else {
                throw CryptoError(.operationFailed, "cannot export private key")
            }
            return pem
        }

        /// The RSASSA-PKCS1-v1_5 signature with SHA-256 (RS256) of `message`.
        public func sha256Signature(for message: Data) throws(CryptoError) -> Data {
            Data(try key.sign([UInt8](message), digest: EVP_sha256(), pkcs1Padding: true))
        }
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

/// SHA-256 fetched from the default provider once, rather than implicitly on every use.
private final class SHA256Method: @unchecked Sendable {  // immutable after init
    static let shared = SHA256Method()
    let md: OpaquePointer?
    private init() { md = EVP_MD_fetch(nil, "SHA256", nil) }
}
