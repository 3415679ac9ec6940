import COpenSSL
import Foundation

/// A public key held by OpenSSL (`EVP_PKEY`, freed in `deinit`); verifying only reads it, so one instance
/// is shared by every thread.
final class VerificationKey: @unchecked Sendable {
    private let pkey: OpaquePointer

    private init(_ pkey: OpaquePointer) { self.pkey = pkey }

    deinit { EVP_PKEY_free(pkey) }

    /// A DER SubjectPublicKeyInfo on P-256 (SendGrid's verification key, base64-decoded), or nil.
    static func p256(subjectPublicKeyInfo der: [UInt8]) -> VerificationKey? {
        let loaded: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            return d2i_PUBKEY(nil, &cursor, buffer.count)
        }
        guard let loaded else {
            ERR_clear_error()
            return nil
        }
        var name = [CChar](repeating: 0, count: 64)
        var length = 0
        let group: String? =
            EVP_PKEY_is_a(loaded, "EC") == 1
                && EVP_PKEY_get_group_name(loaded, &name, name.count, &length) == 1
            ? String(decoding: name.prefix(length).map { UInt8(bitPattern: $0) }, as: UTF8.self) : nil
        ERR_clear_error()
        guard group == "prime256v1" || group == "P-256" else {
            EVP_PKEY_free(loaded)
            return nil
        }
        return VerificationKey(loaded)
    }

    /// The RSA public key of a PEM certificate (SNS's signing certificate), or nil.
    static func rsa(certificatePEM pem: [UInt8]) -> VerificationKey? {
        let key: OpaquePointer? = pem.withUnsafeBytes { buffer in
            guard let bio = BIO_new_mem_buf(buffer.baseAddress, Int32(buffer.count)) else { return nil }
            defer { BIO_free(bio) }
            guard let certificate = PEM_read_bio_X509(bio, nil, nil, nil) else { return nil }
            defer { X509_free(certificate) }
            return X509_get_pubkey(certificate)
        }
        guard let key else {
            ERR_clear_error()
            return nil
        }
        guard EVP_PKEY_is_a(key, "RSA") == 1, EVP_PKEY_get_bits(key) >= 2048 else {
            EVP_PKEY_free(key)
            ERR_clear_error()
            return nil
        }
        return VerificationKey(key)
    }

    enum Digest { case sha1, sha256 }

    /// Whether `signature` (DER ECDSA, or PKCS #1 v1.5 for RSA) signs `message` under this key.
    func verify(signature: [UInt8], message: [UInt8], digest: Digest = .sha256) -> Bool {
        guard let context = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(context) }
        let md = digest == .sha1 ? EVP_sha1() : EVP_sha256()
        guard EVP_DigestVerifyInit(context, nil, md, nil, pkey) == 1 else {
            ERR_clear_error()
            return false
        }
        let ok = signature.withUnsafeBufferPointer { sig in
            message.withUnsafeBufferPointer { data in
                EVP_DigestVerify(context, sig.baseAddress, sig.count, data.baseAddress, data.count) == 1
            }
        }
        ERR_clear_error()
        return ok
    }
}

/// HMAC-SHA256 by OpenSSL (EVP_Q_mac).
func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] {
    var output = [UInt8](repeating: 0, count: 32)
    var length = 0
    let ok = key.withUnsafeBufferPointer { keyBytes in
        message.withUnsafeBufferPointer { data in
            EVP_Q_mac(
                nil, "HMAC", nil, "SHA256", nil, keyBytes.baseAddress, keyBytes.count, data.baseAddress,
                data.count, &output, output.count, &length) != nil
        }
    }
    precondition(ok && length == 32, "OpenSSL's HMAC-SHA256 failed")
    return output
}

/// Lower-case hexadecimal.
func hex(_ bytes: [UInt8]) -> String {
    let digits = Array("0123456789abcdef".utf8)
    var out = [UInt8]()
    out.reserveCapacity(bytes.count * 2)
    for byte in bytes {
        out.append(digits[Int(byte >> 4)])
        out.append(digits[Int(byte & 15)])
    }
    return String(decoding: out, as: UTF8.self)
}
