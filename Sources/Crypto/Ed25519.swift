import COpenSSL

/// Pure Ed25519 (RFC 8032) by OpenSSL (EVP_PKEY_ED25519, EVP_DigestSign with no digest).
public enum Ed25519 {
    /// An Ed25519 public key: its 32 bytes.
    public struct PublicKey: Sendable, Equatable {
        /// The key's 32 bytes (RFC 8032).
        public let rawRepresentation: [UInt8]

        /// A key of 32 bytes.
        /// - Throws: ``CryptoError/Kind/unreadableKey`` unless `rawRepresentation` is 32 bytes.
        public init(rawRepresentation: [UInt8]) throws(CryptoError) {
            guard rawRepresentation.count == 32 else {
                throw CryptoError(.unreadableKey, "an ed25519 public key is 32 bytes")
            }
            self.rawRepresentation = rawRepresentation
        }

        /// Whether `signature` (64 bytes) is this key's signature of `message`.
        public func isValidSignature(_ signature: [UInt8], for message: [UInt8]) -> Bool {
            guard signature.count == 64,
                let key = rawRepresentation.withUnsafeBufferPointer({
                    EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nil, $0.baseAddress, $0.count)
                })
            else {
                ERR_clear_error()
                return false
            }
            return PKey(owning: key).verify(signature: signature, message: message, digest: nil)
        }
    }

    /// An Ed25519 private key: its 32-byte seed (the RFC 8032 private key) and public key. A secret.
    public struct PrivateKey: Sendable, Equatable {
        /// The 32-byte private key (seed).
        public let seed: [UInt8]
        /// Its public key.
        public let publicKey: PublicKey

        /// The key of a 32-byte seed.
        /// - Throws: ``CryptoError/Kind/unreadableKey`` unless `seed` is 32 bytes OpenSSL accepts,
        ///   ``CryptoError/Kind/operationFailed`` when no public key can be derived.
        public init(seed: [UInt8]) throws(CryptoError) {
            let key = try Self.pkey(seed)
            var publicBytes = [UInt8](repeating: 0, count: 32)
            var length = 32
            guard EVP_PKEY_get_raw_public_key(key.pointer, &publicBytes, &length) == 1, length == 32 else {
                ERR_clear_error()
                throw CryptoError(.operationFailed, "OpenSSL derived no ed25519 public key")
            }
            self.seed = seed
            publicKey = try PublicKey(rawRepresentation: publicBytes)
        }

        /// A new key from 32 random bytes.
        public static func generate() throws(CryptoError) -> PrivateKey {
            try PrivateKey(seed: SecureRandom.bytes(count: 32))
        }

        /// The 64-byte signature of `message`.
        public func signature(for message: [UInt8]) -> [UInt8] {
            guard let key = try? Self.pkey(seed) else { fatalError("EVP_PKEY_new_raw_private_key failed") }
            guard let signature = try? key.sign(message, digest: nil), signature.count == 64 else {
                fatalError("EVP_DigestSign failed")
            }
            return signature
        }

        private static func pkey(_ seed: [UInt8]) throws(CryptoError) -> PKey {
            guard seed.count == 32,
                let key = seed.withUnsafeBufferPointer({
                    EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nil, $0.baseAddress, $0.count)
                })
            else {
                ERR_clear_error()
                throw CryptoError(.unreadableKey, "an ed25519 private key is 32 bytes")
            }
            return PKey(owning: key)
        }
    }
}
