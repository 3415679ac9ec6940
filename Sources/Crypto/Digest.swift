import COpenSSL
public import Foundation

/// Message digests by OpenSSL's one-shot EVP digest; nothing hand-rolled.
public enum Digest {
    /// A digest algorithm a signature check may use.
    public enum Algorithm: Sendable, Equatable {
        /// SHA-1 (only where a peer still signs with it, e.g. SNS signature version 1).
        case sha1
        /// SHA-256.
        case sha256

        /// OpenSSL's method for it.
        var method: OpaquePointer? { self == .sha1 ? EVP_sha1() : EVP_sha256() }
    }

    /// The 32-byte SHA-256 of `bytes`.
    public static func sha256(_ bytes: [UInt8]) -> [UInt8] {
        bytes.withUnsafeBytes { sha256(buffer: $0) }
    }

    /// The 32-byte SHA-256 of `data`.
    public static func sha256(_ data: Data) -> Data {
        Data(data.withUnsafeBytes { sha256(buffer: $0) })
    }

    /// The 32-byte SHA-256 of `text`'s UTF-8 bytes.
    public static func sha256(_ text: String) -> [UInt8] { sha256(Array(text.utf8)) }

    private static func sha256(buffer: UnsafeRawBufferPointer) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let ok = EVP_Digest(buffer.baseAddress, buffer.count, &digest, &length, EVP_sha256(), nil)
        precondition(ok == 1 && length == 32, "SHA-256 failed")
        return digest
    }
}

/// HMAC-SHA256 (RFC 2104) by OpenSSL's EVP_MAC.
public enum HMACSHA256 {
    /// OpenSSL's HMAC, fetched once (a fetch looks the algorithm up in the providers; the fetched
    /// object is read-only and shared by every thread's contexts).
    nonisolated(unsafe) private static let hmac = EVP_MAC_fetch(nil, "HMAC", nil)

    /// The 32-byte HMAC-SHA256 of `message` under `key`.
    public static func authenticationCode(key: [UInt8], message: [UInt8]) -> [UInt8] {
        guard let mac = hmac else { fatalError("OpenSSL has no HMAC") }
        guard let context = EVP_MAC_CTX_new(mac) else { fatalError("EVP_MAC_CTX_new failed") }
        defer { EVP_MAC_CTX_free(context) }
        var output = [UInt8](repeating: 0, count: 32)
        var length = 0
        let ok = "digest".withCString { name in
            "SHA256".withCString { digest in
                var parameters = [
                    OSSL_PARAM_construct_utf8_string(name, UnsafeMutablePointer(mutating: digest), 0),
                    OSSL_PARAM_construct_end(),
                ]
                return key.withUnsafeBufferPointer { keyBytes in
                    EVP_MAC_init(context, keyBytes.baseAddress, keyBytes.count, &parameters) == 1
                }
            }
        }
        precondition(ok, "EVP_MAC_init failed")
        precondition(
            message.withUnsafeBufferPointer { EVP_MAC_update(context, $0.baseAddress, $0.count) } == 1,
            "EVP_MAC_update failed")
        precondition(EVP_MAC_final(context, &output, &length, output.count) == 1 && length == 32)
        return output
    }
}

/// Comparisons whose time does not depend on where the inputs differ.
public enum ConstantTime {
    /// Whether `a` and `b` hold the same bytes (OpenSSL's CRYPTO_memcmp); different lengths are unequal.
    public static func equals(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        a.count == b.count && CRYPTO_memcmp(a, b, a.count) == 0
    }
}

/// Random bytes from OpenSSL's CSPRNG (RAND_bytes).
public enum SecureRandom {
    /// `count` random bytes.
    /// - Throws: when OpenSSL has no random bytes to give.
    public static func bytes(count: Int) throws(CryptoError) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        guard count == 0 || RAND_bytes(&bytes, Int32(count)) == 1 else {
            ERR_clear_error()
            throw CryptoError(.operationFailed, "no random bytes")
        }
        return bytes
    }
}
