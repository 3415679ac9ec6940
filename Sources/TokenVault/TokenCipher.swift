import Crypto
import Foundation
import ServiceSupport

/// Encrypts Apple refresh tokens at rest: AES-256-GCM (Crypto's, over OpenSSL EVP), a fresh 96-bit nonce per token,
/// and additional authenticated data binding each ciphertext to its row, so a ciphertext copied onto
/// another row does not decrypt.
///
/// Keys come from a key file (see ``TokenCipher/init(keyFile:setting:)``): the first key encrypts, every key
/// decrypts, and each ciphertext names the key that made it, so keys rotate without re-encrypting:
/// put the new key first, keep the old ones until no ciphertext names them.
///
/// Ciphertext layout: format (1 byte), key-id length (1 byte), key id (ASCII), nonce (12 bytes),
/// encrypted token, GCM tag (16 bytes). Format 2 (what ``encrypt(_:clientID:)`` makes) binds the
/// client ID and the token's SHA-256 — the row's `token_sha256`, unique and never rewritten — so it
/// survives a team transfer, which changes the row's sub. Format 1 (schema version 4's sign-in API)
/// bound the sub instead; it still decrypts, under the sub it was stored with (``Row/subs``: the row's
/// sub, then the subs a transfer replaced by it).
public struct TokenCipher: Sendable {
    /// What a stored ciphertext is checked against: the row it was read from.
    public struct Row: Sendable, Equatable {
        /// The row's client ID.
        public var clientID: String
        /// The row's `token_sha256` (format 2 is bound to it; a row without one cannot hold format 2).
        public var tokenSHA256: [UInt8]?
        /// Format 1 only: the subs the ciphertext may have been stored under, tried in order (the row's
        /// sub first, then every sub a team transfer replaced by it).
        public var subs: [String]

        /// A row.
        public init(clientID: String, tokenSHA256: [UInt8]?, subs: [String] = []) {
            self.clientID = clientID
            self.tokenSHA256 = tokenSHA256
            self.subs = subs
        }
    }

    /// One AES-256 key and its id.
    public struct Key: Sendable {
        /// 1 to 32 characters of `A-Z a-z 0-9 . _ -`.
        public let id: String
        let bytes: [UInt8]

        /// A key; `bytes` must be 32 bytes.
        public init(id: String, bytes: [UInt8]) throws(TokenCipherError) {
            guard (1...32).contains(id.utf8.count),
                id.utf8.allSatisfy({ byte in
                    (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte)
                        || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte)
                        || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
                        || [UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "-")].contains(byte)
                })
            else { throw TokenCipherError("a key id is 1 to 32 characters of A-Z a-z 0-9 . _ -") }
            guard bytes.count == 32 else { throw TokenCipherError("key \(id) is not 32 bytes (AES-256)") }
            self.id = id
            self.bytes = bytes
        }
    }

    /// The key that encrypts.
    public let current: Key
    private let keys: [String: Key]

    /// A cipher encrypting with `current` and decrypting with it and `previous`.
    public init(current: Key, previous: [Key] = []) throws(TokenCipherError) {
        var keys = [current.id: current]
        for key in previous {
            guard keys[key.id] == nil else { throw TokenCipherError("key id \(key.id) appears twice") }
            keys[key.id] = key
        }
        self.current = current
        self.keys = keys
    }

    /// Reads a key file: one key per line, `KEY_ID BASE64_OF_32_BYTES`; blank lines and lines starting
    /// with `#` are ignored; the first key encrypts. The file is read through ``SecretFile``: refused
    /// when group or others may read it, with an error naming `setting`, the path and the mode.
    /// Make a key with `printf 'k2026 %s\n' "$(openssl rand -base64 32)"`.
    public init(keyFile path: String, setting: String = "the token key file") throws(TokenCipherError) {
        let data: Data
        do {
            data = try SecretFile.read(path, setting: setting)
        } catch {
            throw TokenCipherError(error.message)
        }
        guard let text = String(data: data, encoding: .utf8) else {
            throw TokenCipherError("\(setting) \(path) is not UTF-8 text")
        }
        var parsed: [Key] = []
        for (number, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.trimmingCharacters(in: .whitespaces)
            if line.isEmpty || line.hasPrefix("#") { continue }
            let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            guard fields.count == 2, let bytes = Data(base64Encoded: String(fields[1])) else {
                throw TokenCipherError("token key file line \(number + 1): expected KEY_ID BASE64_KEY")
            }
            parsed.append(try Key(id: String(fields[0]), bytes: [UInt8](bytes)))
        }
        guard let first = parsed.first else { throw TokenCipherError("the token key file holds no key") }
        try self.init(current: first, previous: Array(parsed.dropFirst()))
    }

    /// The ids of every key held, the current one first.
    public var keyIDs: [String] { [current.id] + keys.keys.filter { $0 != current.id }.sorted() }

    /// The formats this cipher reads; the last one is what it writes.
    public static let formats: [UInt8] = [1, 2]

    /// The format a ciphertext says it is in (1 or 2), or nil when it is not one of ours.
    public static func format(of ciphertext: [UInt8]) -> Int? {
        guard keyID(of: ciphertext) != nil else { return nil }
        return Int(ciphertext[0])
    }

    /// The key id a ciphertext names, or nil when it is not one of ours.
    public static func keyID(of ciphertext: [UInt8]) -> String? {
        guard ciphertext.count > 2, formats.contains(ciphertext[0]) else { return nil }
        let length = Int(ciphertext[1])
        guard ciphertext.count >= 2 + length + 12 + 16 else { return nil }
        return String(decoding: ciphertext[2..<(2 + length)], as: UTF8.self)
    }

    /// SHA-256 of a token's text: what the row's `token_sha256` holds.
    public static func sha256(of token: String) -> [UInt8] {
        Digest.sha256(token)
    }

    /// Encrypts `token` for a row of `clientID` with the current key, in format 2: bound to the client ID
    /// and the token's SHA-256 (store ``sha256(of:)`` as the row's `token_sha256`), not to the sub.
    public func encrypt(_ token: String, clientID: String) throws(TokenCipherError) -> [UInt8] {
        try seal(
            token, format: 2,
            binding: Self.format2Binding(clientID: clientID, tokenSHA256: Self.sha256(of: token)))
    }

    /// Encrypts `token` in format 1, bound to `sub` and `clientID`: what schema version 4's sign-in API
    /// stored. Only for tests and tools that must make such a row; the service writes format 2.
    public func encryptInFormat1(_ token: String, sub: String, clientID: String) throws(TokenCipherError)
        -> [UInt8]
    {
        try seal(token, format: 1, binding: Self.format1Binding(sub: sub, clientID: clientID))
    }

    /// Decrypts a ciphertext stored on `row`, with whichever held key it names: format 2 against the
    /// row's client ID and `token_sha256`, format 1 against its client ID and each of ``Row/subs``.
    /// - Throws: when the key is not held, or the ciphertext was altered or belongs to another row.
    public func decrypt(_ ciphertext: [UInt8], for row: Row) throws(TokenCipherError) -> String {
        guard let id = Self.keyID(of: ciphertext) else { throw TokenCipherError("not a token ciphertext") }
        guard let key = keys[id] else {
            throw TokenCipherError("the ciphertext's key \(id) is not in the key file")
        }
        let headerLength = 2 + id.utf8.count + 12
        let header = Array(ciphertext[0..<headerLength])
        let nonce = Array(header[(headerLength - 12)...])
        let body = Array(ciphertext[headerLength..<(ciphertext.count - 16)])
        let tag = Array(ciphertext[(ciphertext.count - 16)...])
        let bindings: [[UInt8]]
        if ciphertext[0] == 2 {
            guard let hash = row.tokenSHA256, hash.count == 32 else {
                throw TokenCipherError("the row has no token_sha256, which a format 2 ciphertext is bound to")
            }
            bindings = [Self.format2Binding(clientID: row.clientID, tokenSHA256: hash)]
        } else {
            guard !row.subs.isEmpty else {
                throw TokenCipherError("a format 1 ciphertext needs the sub it was stored under")
            }
            bindings = row.subs.map { Self.format1Binding(sub: $0, clientID: row.clientID) }
        }
        for binding in bindings {
            guard
                let (plain, _) = try? gcm(
                    encrypt: false, key: key.bytes, nonce: nonce, aad: binding + header, input: body, tag: tag
                )
            else { continue }
            guard let token = String(validating: plain, as: UTF8.self) else {
                throw TokenCipherError("the decrypted token is not text")
            }
            return token
        }
        throw TokenCipherError("the ciphertext does not authenticate (altered, or another row's)")
    }

    private func seal(_ token: String, format: UInt8, binding: [UInt8]) throws(TokenCipherError) -> [UInt8] {
        guard let nonce = try? SecureRandom.bytes(count: 12) else {
            throw TokenCipherError("no random bytes for the nonce")
        }
        let header = [format, UInt8(current.id.utf8.count)] + Array(current.id.utf8) + nonce
        let (sealed, tag) = try gcm(
            encrypt: true, key: current.bytes, nonce: nonce, aad: binding + header, input: Array(token.utf8),
            tag: nil)
        return header + sealed + tag
    }

    /// The associated data before the header. Format 1: its label, the sub and the client ID; format 2:
    /// its label, the client ID and the token's SHA-256.
    private static func format1Binding(sub: String, clientID: String) -> [UInt8] {
        Array("siwa refresh token v1".utf8) + [0] + Array(sub.utf8) + [0] + Array(clientID.utf8) + [0]
    }

    private static func format2Binding(clientID: String, tokenSHA256: [UInt8]) -> [UInt8] {
        Array("siwa refresh token v2".utf8) + [0] + Array(clientID.utf8) + [0] + tokenSHA256
    }

    private func gcm(encrypt: Bool, key: [UInt8], nonce: [UInt8], aad: [UInt8], input: [UInt8], tag: [UInt8]?)
        throws(TokenCipherError) -> ([UInt8], [UInt8])
    {
        do {
            if encrypt {
                let (sealed, tag) = try AESGCM.seal(input, key: key, nonce: nonce, authenticating: aad)
                return (sealed, tag)
            }
            return (try AESGCM.open(input, tag: tag ?? [], key: key, nonce: nonce, authenticating: aad), [])
        } catch {
            throw TokenCipherError(error.description)
        }
    }
}

/// Why a token could not be encrypted or decrypted, or the key file is unusable. Never holds a token or
/// key material.
public struct TokenCipherError: Error, Sendable, CustomStringConvertible {
    /// One line for people.
    public let description: String
    /// An error.
    public init(_ description: String) { self.description = description }
}
