import COpenSSL
public import Foundation

/// ECDSA on P-256 with SHA-256 (ES256, SendGrid's event webhook) by OpenSSL.
public enum P256 {
    /// A P-256 public key; verifying only reads it, so one instance may be shared.
    public final class PublicKey: @unchecked Sendable {
        private let key: PKey

        init(key: PKey) { self.key = key }

        /// Loads a `PUBLIC KEY` PEM, or the public half of an unencrypted private key PEM.
        /// - Throws: ``CryptoError/Kind/unreadableKey`` when it is neither,
        ///   ``CryptoError/Kind/wrongKeyType`` when the key is not on P-256.
        public convenience init(pem: String) throws(CryptoError) {
            guard let loaded = PKey.publicKey(pem: pem) ?? PKey.privateKey(pem: pem) else {
                throw CryptoError(.unreadableKey, "not a PEM public key or unencrypted private key")
            }
            guard loaded.isP256 else {
                throw CryptoError(.wrongKeyType, "the key is not an EC key on P-256 (ES256)")
            }
            self.init(key: loaded)
        }

        /// Loads a DER SubjectPublicKeyInfo, or nil when it is not a key on P-256.
        public convenience init?(subjectPublicKeyInfo der: [UInt8]) {
            guard let loaded = PKey.publicKey(der: der), loaded.isP256 else { return nil }
            self.init(key: loaded)
        }

        /// Whether `signature`, a DER `ECDSA-Sig-Value`, signs `message` (SHA-256).
        public func isValidSignature(der signature: [UInt8], for message: [UInt8]) -> Bool {
            key.verify(signature: signature, message: message, digest: EVP_sha256())
        }

        /// Whether `signature`, JOSE's 64-byte `r||s`, signs `message` (SHA-256).
        public func isValidSignature(raw signature: [UInt8], for message: [UInt8]) -> Bool {
            guard let der = P256.derSignature(raw: signature) else { return false }
            return isValidSignature(der: der, for: message)
        }

        /// The key as a `PUBLIC KEY` (SubjectPublicKeyInfo) PEM.
        public var pem: String { key.publicKeyPEM ?? "" }
    }

    /// A P-256 private key; signing only reads it, so one instance may be shared.
    public final class PrivateKey: @unchecked Sendable {
        private let key: PKey

        /// Loads an unencrypted PEM private key (PKCS#8, as in Apple's `.p8` files, or traditional).
        /// - Throws: ``CryptoError/Kind/unreadableKey`` when it is not one,
        ///   ``CryptoError/Kind/wrongKeyType`` when the key is not on P-256.
        public init(pem: String) throws(CryptoError) {
            guard let loaded = PKey.privateKey(pem: pem) else {
                throw CryptoError(.unreadableKey, "not an unencrypted PEM private key")
            }
            guard loaded.isP256 else {
                throw CryptoError(.wrongKeyType, "the key is not an EC key on P-256 (ES256)")
            }
            key = loaded
        }

        /// The public half (sharing this key's OpenSSL object).
        public var publicKey: PublicKey { PublicKey(key: key) }

        /// The ECDSA signature (SHA-256) of `message` as JOSE's 64-byte `r||s`.
        public func rawSignature(for message: [UInt8]) throws(CryptoError) -> [UInt8] {
            let der = try key.sign(message, digest: EVP_sha256())
            guard let raw = P256.rawSignature(der: der) else {
                ERR_clear_error()
                throw CryptoError(.operationFailed, "ECDSA signing failed")
            }
            return raw
        }
    }

    /// DER `ECDSA-Sig-Value` → `r||s`, each left-padded to 32 bytes; nil when it is not one.
    public static func rawSignature(der: [UInt8]) -> [UInt8]? {
        der.withUnsafeBufferPointer { buffer -> [UInt8]? in
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
            return out
        }
    }

    /// `r||s` (64 bytes) → DER `ECDSA-Sig-Value`; nil when it is not 64 bytes.
    public static func derSignature(raw: [UInt8]) -> [UInt8]? {
        guard raw.count == 64, let signature = ECDSA_SIG_new() else { return nil }
        defer { ECDSA_SIG_free(signature) }
        guard let r = BN_bin2bn(raw, 32, nil) else { return nil }
        guard let s = BN_bin2bn(Array(raw[32...]), 32, nil) else {
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
        return written == length ? der : nil
    }
}
