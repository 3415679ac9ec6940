import COpenSSL

/// An OpenSSL `EVP_PKEY`, owned and freed in `deinit`; never leaves this module. Operations only read
/// it, so one instance is shared by every thread.
final class PKey: @unchecked Sendable {
    let pointer: OpaquePointer

    /// Takes ownership of `pointer`.
    init(owning pointer: OpaquePointer) { self.pointer = pointer }

    deinit { EVP_PKEY_free(pointer) }

    /// Reads an unencrypted PEM private key (PKCS#8 or traditional) of any type; nil when the text is
    /// not one. The password callback refuses, so an encrypted key fails instead of prompting.
    static func privateKey(pem: String) -> PKey? {
        let bytes = Array(pem.utf8)
        let loaded: OpaquePointer? = bytes.withUnsafeBytes { buffer in
            guard let bio = BIO_new_mem_buf(buffer.baseAddress, Int32(buffer.count)) else { return nil }
            defer { BIO_free(bio) }
            return PEM_read_bio_PrivateKey(bio, nil, { _, _, _, _ in -1 }, nil)
        }
        guard let loaded else {
            ERR_clear_error()
            return nil
        }
        return PKey(owning: loaded)
    }

    /// Reads a `PUBLIC KEY` (SubjectPublicKeyInfo) PEM; nil when the text is not one.
    static func publicKey(pem: String) -> PKey? {
        let bytes = Array(pem.utf8)
        let loaded: OpaquePointer? = bytes.withUnsafeBytes { buffer in
            guard let bio = BIO_new_mem_buf(buffer.baseAddress, Int32(buffer.count)) else { return nil }
            defer { BIO_free(bio) }
            return PEM_read_bio_PUBKEY(bio, nil, { _, _, _, _ in -1 }, nil)
        }
        guard let loaded else {
            ERR_clear_error()
            return nil
        }
        return PKey(owning: loaded)
    }

    /// Reads a DER SubjectPublicKeyInfo; nil when the bytes are not one.
    static func publicKey(der: [UInt8]) -> PKey? {
        let loaded: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            return d2i_PUBKEY(nil, &cursor, buffer.count)
        }
        guard let loaded else {
            ERR_clear_error()
            return nil
        }
        return PKey(owning: loaded)
    }

    /// The public key of a PEM X.509 certificate; nil when the text is not one.
    static func publicKey(certificatePEM pem: [UInt8]) -> PKey? {
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
        return PKey(owning: key)
    }

    /// Whether the key is an EC key on P-256.
    var isP256: Bool {
        var name = [CChar](repeating: 0, count: 64)
        var length = 0
        let group: String? =
            EVP_PKEY_is_a(pointer, "EC") == 1
                && EVP_PKEY_get_group_name(pointer, &name, name.count, &length) == 1
            ? String(decoding: name.prefix(length).map { UInt8(bitPattern: $0) }, as: UTF8.self) : nil
        ERR_clear_error()
        return group == "prime256v1" || group == "P-256"
    }

    /// Whether the key is RSA of at least `bits` bits.
    func isRSA(atLeast bits: Int32) -> Bool {
        EVP_PKEY_is_a(pointer, "RSA") == 1 && EVP_PKEY_get_bits(pointer) >= bits
    }

    /// Whether `signature` signs `message` with `digest` (EVP_DigestVerify: DER for ECDSA, PKCS #1 v1.5
    /// for RSA keys, raw for Ed25519 with a nil digest).
    func verify(signature: [UInt8], message: [UInt8], digest: OpaquePointer?) -> Bool {
        guard let context = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestVerifyInit(context, nil, digest, nil, pointer) == 1 else {
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

    /// The signature of `message` with `digest` (EVP_DigestSign), padding left at the key's default.
    func sign(_ message: [UInt8], digest: OpaquePointer?, pkcs1Padding: Bool = false) throws(CryptoError)
        -> [UInt8]
    {
        guard let context = EVP_MD_CTX_new() else {
            throw CryptoError(.operationFailed, "cannot allocate a digest context")
        }
        defer { EVP_MD_CTX_free(context) }
        var keyContext: OpaquePointer?
        guard EVP_DigestSignInit(context, &keyContext, digest, nil, pointer) == 1,
            !pkcs1Padding || EVP_PKEY_CTX_set_rsa_padding(keyContext, siwa_rsa_pkcs1_padding()) == 1
        else {
            ERR_clear_error()
            throw CryptoError(.operationFailed, "cannot initialise signing")
        }
        var length = 0
        var signature: [UInt8] = []
        let signed = message.withUnsafeBufferPointer { input -> Bool in
            guard EVP_DigestSign(context, nil, &length, input.baseAddress, input.count) == 1 else {
                return false
            }
            signature = [UInt8](repeating: 0, count: length)
            return EVP_DigestSign(context, &signature, &length, input.baseAddress, input.count) == 1
        }
        guard signed else {
            ERR_clear_error()
            throw CryptoError(.operationFailed, "signing failed")
        }
        return Array(signature.prefix(length))
    }

    /// The public half as a `PUBLIC KEY` (SubjectPublicKeyInfo) PEM, or nil.
    var publicKeyPEM: String? {
        guard let bio = BIO_new(BIO_s_mem()) else { return nil }
        defer { BIO_free(bio) }
        guard PEM_write_bio_PUBKEY(bio, pointer) == 1 else {
            ERR_clear_error()
            return nil
        }
        return memoryText(bio)
    }

    /// The private key as unencrypted PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`), or nil.
    var pkcs8PEM: String? {
        guard let bio = BIO_new(BIO_s_mem()) else { return nil }
        defer { BIO_free(bio) }
        guard PEM_write_bio_PKCS8PrivateKey(bio, pointer, nil, nil, 0, nil, nil) == 1 else {
            ERR_clear_error()
            return nil
        }
        return memoryText(bio)
    }
}

/// What a memory BIO holds, as text; nil when empty.
private func memoryText(_ bio: OpaquePointer) -> String? {
    var pointer: UnsafeMutablePointer<CChar>?
    let length = siwa_bio_get_mem_data(bio, &pointer)
    guard length > 0, let pointer else { return nil }
    return String(
        decoding: UnsafeRawBufferPointer(start: pointer, count: Int(length)).bindMemory(to: UInt8.self),
        as: UTF8.self)
}
