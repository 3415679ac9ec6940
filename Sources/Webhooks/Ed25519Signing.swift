import Crypto
public import Foundation

/// Standard Webhooks' asymmetric scheme: ed25519 key pairs written `whsk_…` (the private key) and
/// `whpk_…` (the public key), and `v1a,` signatures over the same signed content as `v1`
/// (`webhook-id.webhook-timestamp.body`).
///
/// Ed25519 is Crypto's (OpenSSL's EVP_PKEY_ED25519, EVP_DigestSign with no digest, as RFC 8032's pure
/// Ed25519 requires); nothing here is hand-rolled crypto.
extension StandardWebhooks {
    /// The prefix of a private signing key's text form.
    public static let signingKeyPrefix = "whsk_"
    /// The prefix of a public key's text form.
    public static let publicKeyPrefix = "whpk_"

    /// An ed25519 public key: 32 bytes, written `whpk_` + standard base64. Not a secret: the app
    /// verifies `v1a` signatures with it.
    public struct Ed25519PublicKey: Sendable, Equatable, CustomStringConvertible {
        /// The key's 32 bytes (RFC 8032).
        public let bytes: [UInt8]

        /// Parses `whpk_<base64 of 32 bytes>`.
        public init(_ text: String) throws(StandardWebhooks.Error) {
            guard text.hasPrefix(StandardWebhooks.publicKeyPrefix) else {
                throw Error("a webhook public key starts with whpk_")
            }
            guard let bytes = base64Bytes(text.dropFirst(StandardWebhooks.publicKeyPrefix.count)),
                bytes.count == 32
            else { throw Error("a webhook public key is whpk_ and the standard base64 of 32 bytes") }
            self.bytes = bytes
        }

        init(bytes: [UInt8]) { self.bytes = bytes }

        /// The text form, `whpk_…`.
        public var text: String { StandardWebhooks.publicKeyPrefix + Data(bytes).base64EncodedString() }

        /// The text form: a public key may be shown.
        public var description: String { text }

        /// Whether `signature` (64 bytes) is this key's ed25519 signature of `message`.
        public func isValidSignature(_ signature: [UInt8], of message: [UInt8]) -> Bool {
            guard let key = try? Ed25519.PublicKey(rawRepresentation: bytes) else { return false }
            return key.isValidSignature(signature, for: message)
        }
    }

    /// An ed25519 private key, written `whsk_` + standard base64 of its 32 bytes (the RFC 8032 private
    /// key, the seed). The 64-byte form of libsodium and NaCl (seed, then public key) is accepted too
    /// when its second half is the seed's public key. Store it like a `whsec_` secret; never print it.
    public struct Ed25519SigningKey: Sendable, Equatable, CustomStringConvertible {
        /// The 32-byte private key (seed).
        public let seed: [UInt8]
        /// Its public key.
        public let publicKey: Ed25519PublicKey

        /// Parses `whsk_<base64 of 32 bytes>` (or of 64: seed then public key).
        public init(_ text: String) throws(StandardWebhooks.Error) {
            guard text.hasPrefix(StandardWebhooks.signingKeyPrefix) else {
                throw Error("a webhook signing key starts with whsk_")
            }
            guard let bytes = base64Bytes(text.dropFirst(StandardWebhooks.signingKeyPrefix.count)),
                bytes.count == 32 || bytes.count == 64
            else { throw Error("a webhook signing key is whsk_ and the standard base64 of 32 bytes") }
            try self.init(seed: Array(bytes.prefix(32)))
            if bytes.count == 64, Array(bytes.suffix(32)) != publicKey.bytes {
                throw Error("the signing key's second half is not its public key")
            }
        }

        /// The key of a 32-byte seed.
        public init(seed: [UInt8]) throws(StandardWebhooks.Error) {
            self.init(try Self.key(seed: seed))
        }

        private init(_ key: Ed25519.PrivateKey) {
            seed = key.seed
            publicKey = Ed25519PublicKey(bytes: key.publicKey.rawRepresentation)
        }

        private static func key(seed: [UInt8]) throws(StandardWebhooks.Error) -> Ed25519.PrivateKey {
            do {
                return try Ed25519.PrivateKey(seed: seed)
            } catch {
                throw Error(error.description)
            }
        }

        /// A new key from 32 random bytes (Crypto's, OpenSSL's RAND_bytes).
        public static func generate() -> Ed25519SigningKey {
            guard let key = try? Ed25519.PrivateKey.generate() else {
                preconditionFailure("RAND_bytes failed")
            }
            return Ed25519SigningKey(key)
        }

        /// The text form, `whsk_…` (32 bytes): store it, never log or print it.
        public var text: String { StandardWebhooks.signingKeyPrefix + Data(seed).base64EncodedString() }

        /// Redacted: a private key never appears in logs or errors by accident.
        public var description: String { "whsk_…(redacted)" }

        /// The 64-byte ed25519 signature of `message` (pure Ed25519, no digest).
        public func sign(_ message: [UInt8]) -> [UInt8] {
            guard let key = try? Ed25519.PrivateKey(seed: seed) else {
                fatalError("EVP_PKEY_new_raw_private_key failed")
            }
            return key.signature(for: message)
        }
    }

    /// One of an endpoint's signing keys: an HMAC secret (`whsec_`, signs `v1`) or an ed25519 key
    /// (`whsk_`, signs `v1a`).
    public enum SigningKey: Sendable, Equatable, CustomStringConvertible {
        /// HMAC-SHA256: `v1`.
        case hmac(Secret)
        /// Ed25519: `v1a`.
        case ed25519(Ed25519SigningKey)

        /// Parses `whsec_…` or `whsk_…` by its prefix.
        public init(_ text: String) throws(StandardWebhooks.Error) {
            if text.hasPrefix(StandardWebhooks.signingKeyPrefix) {
                self = .ed25519(try Ed25519SigningKey(text))
            } else {
                self = .hmac(try Secret(text))
            }
        }

        /// The signature identifier it signs with: `v1` or `v1a`.
        public var scheme: String {
            switch self {
            case .hmac: "v1"
            case .ed25519: "v1a"
            }
        }

        /// The text form to store (`whsec_…` or `whsk_…`).
        public var text: String {
            switch self {
            case .hmac(let secret): secret.text
            case .ed25519(let key): key.text
            }
        }

        /// The public key an app verifies with: only for ed25519.
        public var publicKey: Ed25519PublicKey? {
            if case .ed25519(let key) = self { return key.publicKey }
            return nil
        }

        /// Redacted.
        public var description: String {
            switch self {
            case .hmac(let secret): secret.description
            case .ed25519(let key): key.description
            }
        }
    }

    /// One signature with `key`: `v1,<base64 HMAC-SHA256>` or `v1a,<base64 ed25519 signature>`.
    public static func signature(id: String, timestamp: Int, body: [UInt8], key: SigningKey) -> String {
        switch key {
        case .hmac(let secret): return signature(id: id, timestamp: timestamp, body: body, secret: secret)
        case .ed25519(let signingKey):
            let content = signedContent(id: id, timestamp: timestamp, body: body)
            return "v1a," + Data(signingKey.sign(content)).base64EncodedString()
        }
    }

    /// The `webhook-signature` header value: one signature per key (of either scheme), space-separated.
    public static func signatureHeader(id: String, timestamp: Int, body: [UInt8], keys: [SigningKey])
        -> String
    {
        keys.map { signature(id: id, timestamp: timestamp, body: body, key: $0) }.joined(separator: " ")
    }

    /// Verifies a received message's `v1a` signatures against any of `publicKeys`; the timestamp must be
    /// within `tolerance` of `now`.
    /// - Throws: ``Error`` naming what failed (missing header, timestamp, no matching signature).
    public static func verify(
        id: String?, timestamp: String?, signature: String?, body: [UInt8], publicKeys: [Ed25519PublicKey],
        tolerance: Duration = defaultTolerance, now: Date = Date()
    ) throws(StandardWebhooks.Error) {
        try verify(
            id: id, timestamp: timestamp, signature: signature, body: body,
            keys: publicKeys.map { .ed25519($0) },
            tolerance: tolerance, now: now)
    }

    /// A key a receiver verifies with: an HMAC secret (`whsec_`, checks `v1`) or an ed25519 public key
    /// (`whpk_`, checks `v1a`).
    public enum VerificationKey: Sendable, Equatable, CustomStringConvertible {
        /// HMAC-SHA256: `v1`.
        case hmac(Secret)
        /// Ed25519: `v1a`.
        case ed25519(Ed25519PublicKey)

        /// Parses `whsec_…` or `whpk_…` by its prefix. A private key (`whsk_…`) is refused: a receiver
        /// needs only its public key.
        public init(_ text: String) throws(StandardWebhooks.Error) {
            if text.hasPrefix(StandardWebhooks.publicKeyPrefix) {
                self = .ed25519(try Ed25519PublicKey(text))
            } else if text.hasPrefix(StandardWebhooks.signingKeyPrefix) {
                throw Error("a whsk_ key signs: verify with its whpk_ public key")
            } else {
                self = .hmac(try Secret(text))
            }
        }

        /// The signature identifier it checks: `v1` or `v1a`.
        public var scheme: String {
            switch self {
            case .hmac: "v1"
            case .ed25519: "v1a"
            }
        }

        /// Redacted for a secret; a public key may be shown.
        public var description: String {
            switch self {
            case .hmac(let secret): secret.description
            case .ed25519(let key): key.description
            }
        }
    }

    /// Verifies a received message against any of `keys`, of either scheme: one `v1` signature matching a
    /// secret or one `v1a` signature valid under a public key suffices; the timestamp must be within
    /// `tolerance` of `now`.
    /// - Throws: ``Error`` naming what failed (missing header, timestamp, no matching signature).
    public static func verify(
        id: String?, timestamp: String?, signature: String?, body: [UInt8], keys: [VerificationKey],
        tolerance: Duration = defaultTolerance, now: Date = Date()
    ) throws(StandardWebhooks.Error) {
        let (content, signature) = try receivedContent(
            id: id, timestamp: timestamp, signature: signature, body: body, tolerance: tolerance, now: now)
        var macs: [[UInt8]] = []
        var publicKeys: [Ed25519PublicKey] = []
        for key in keys {
            switch key {
            case .hmac(let secret): macs.append(hmacSHA256(key: secret.key, message: content))
            case .ed25519(let publicKey): publicKeys.append(publicKey)
            }
        }
        for candidate in signature.split(separator: " ") {
            if candidate.hasPrefix("v1,"), let given = base64Bytes(candidate.dropFirst(3)) {
                for mac in macs where mac.count == given.count {
                    if ConstantTime.equals(mac, given) { return }
                }
            } else if candidate.hasPrefix("v1a,"), let given = base64Bytes(candidate.dropFirst(4)) {
                if publicKeys.contains(where: { $0.isValidSignature(given, of: content) }) { return }
            }
        }
        throw Error("no matching signature")
    }

    /// The bytes of padded standard base64, or nil.
    static func base64Bytes(_ encoded: Substring) -> [UInt8]? {
        guard !encoded.isEmpty, encoded.count % 4 == 0,
            encoded.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "+/=".contains($0)) }),
            let data = Data(base64Encoded: String(encoded))
        else { return nil }
        return [UInt8](data)
    }
}
