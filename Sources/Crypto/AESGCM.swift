import COpenSSL

/// AES-256-GCM by OpenSSL's EVP cipher: a 32-byte key, a 12-byte nonce, a 16-byte tag.
public enum AESGCM {
    /// The encryption of `plaintext` under `key` and `nonce`, authenticating `aad` too, and its tag.
    /// - Throws: when the key is not 32 bytes, the nonce not 12, or OpenSSL fails.
    public static func seal(_ plaintext: [UInt8], key: [UInt8], nonce: [UInt8], authenticating aad: [UInt8])
        throws(CryptoError) -> (ciphertext: [UInt8], tag: [UInt8])
    {
        let (ciphertext, tag) = try gcm(
            encrypt: true, key: key, nonce: nonce, aad: aad, input: plaintext, tag: nil)
        return (ciphertext, tag)
    }

    /// The decryption of `ciphertext`, once `tag` authenticates it and `aad` under `key` and `nonce`.
    /// - Throws: when the key is not 32 bytes, the nonce not 12, the tag not 16, or the ciphertext, tag
    ///   or associated data were altered.
    public static func open(
        _ ciphertext: [UInt8], tag: [UInt8], key: [UInt8], nonce: [UInt8], authenticating aad: [UInt8]
    ) throws(CryptoError) -> [UInt8] {
        try gcm(encrypt: false, key: key, nonce: nonce, aad: aad, input: ciphertext, tag: tag).output
    }

    private static func gcm(
        encrypt: Bool, key: [UInt8], nonce: [UInt8], aad: [UInt8], input: [UInt8], tag: [UInt8]?
    )
        throws(CryptoError) -> (output: [UInt8], tag: [UInt8])
    {
        guard key.count == 32 else { throw CryptoError(.unreadableKey, "an AES-256 key is 32 bytes") }
        guard nonce.count == 12 else { throw CryptoError(.operationFailed, "an AES-GCM nonce is 12 bytes") }
        guard let context = EVP_CIPHER_CTX_new() else {
            throw CryptoError(.operationFailed, "cannot create a cipher context")
        }
        defer { EVP_CIPHER_CTX_free(context) }
        let initialised =
            encrypt
            ? EVP_EncryptInit_ex(context, EVP_aes_256_gcm(), nil, key, nonce)
            : EVP_DecryptInit_ex(context, EVP_aes_256_gcm(), nil, key, nonce)
        guard initialised == 1 else { throw CryptoError(.operationFailed, "cannot initialise AES-256-GCM") }
        var length: Int32 = 0
        var output = [UInt8](repeating: 0, count: input.count + 16)
        let aadOK =
            encrypt
            ? EVP_EncryptUpdate(context, nil, &length, aad, Int32(aad.count))
            : EVP_DecryptUpdate(context, nil, &length, aad, Int32(aad.count))
        guard aadOK == 1 else {
            throw CryptoError(.operationFailed, "AES-256-GCM refused the associated data")
        }
        var written: Int32 = 0
        if !input.isEmpty {
            let updated =
                encrypt
                ? EVP_EncryptUpdate(context, &output, &written, input, Int32(input.count))
                : EVP_DecryptUpdate(context, &output, &written, input, Int32(input.count))
            guard updated == 1 else { throw CryptoError(.operationFailed, "AES-256-GCM failed") }
        }
        var outTag = [UInt8](repeating: 0, count: 16)
        var final: Int32 = 0
        if encrypt {
            let finished = output.withUnsafeMutableBufferPointer { buffer in
                EVP_EncryptFinal_ex(context, buffer.baseAddress! + Int(written), &final)
            }
            guard finished == 1,
                EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_GET_TAG, 16, &outTag) == 1
            else { throw CryptoError(.operationFailed, "AES-256-GCM failed") }
        } else {
            var expected = tag ?? []
            guard expected.count == 16,
                EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_SET_TAG, 16, &expected) == 1
            else { throw CryptoError(.operationFailed, "bad tag") }
            let finished = output.withUnsafeMutableBufferPointer { buffer in
                EVP_DecryptFinal_ex(context, buffer.baseAddress! + Int(written), &final)
            }
            guard finished == 1 else {
                ERR_clear_error()
                throw CryptoError(.operationFailed, "the ciphertext does not authenticate")
            }
        }
        return (Array(output[0..<Int(written + final)]), outTag)
    }
}
