public import Foundation

/// A JSON Web Key Set (RFC 7517) reduced to the keys usable for RS256 verification.
///
/// A key is used only if `kty` is `RSA`, its modulus has 2048 to 16384 bits, and `alg` and `use`,
/// when present, are `RS256` and `sig`. Every other entry is recorded in ``skipped`` with a reason.
/// If two entries share a `kid`, that kid is ambiguous: both entries are skipped, so a token
/// naming it gets ``NotificationError/Kind/keyNotAvailable`` rather than a guess.
public struct JSONWebKeySet: Sendable {
    /// The largest key-set document accepted, in bytes.
    public static let maximumLength = 256 * 1024

    /// An entry that will never be used, and why.
    public struct SkippedKey: Sendable, Hashable, CustomStringConvertible {
        /// The entry's `kid`, if it had a string one.
        public var keyID: String?
        /// A fixed, human-readable reason (e.g. `kty is not RSA`).
        public var reason: String

        /// Records a skipped entry.
        public init(keyID: String?, reason: String) {
            self.keyID = keyID
            self.reason = reason
        }

        public var description: String { "\(keyID ?? "(no kid)"): \(reason)" }
    }

    private let keys: [String: RSAPublicKey]
    /// The usable key IDs, in document order.
    public let keyIDs: [String]
    /// The entries that were not usable.
    public let skipped: [SkippedKey]

    /// Parses a JWKS document (`{"keys":[…]}`); throws only if the document itself is unusable.
    public init(jsonData: Data) throws(NotificationError) {
        guard jsonData.count <= Self.maximumLength else {
            throw .malformed(.tooLarge, "key set over 256 KiB")
        }
        let object = try JSONValue.object(from: jsonData, what: "key set")
        guard case .array(let entries)? = object["keys"] else {
            throw .malformed(.badKeySet, "no keys array")
        }
        var candidates: [(String, RSAPublicKey)] = []
        var skipped: [SkippedKey] = []
        for entry in entries {
            switch Self.parse(entry) {
            case .usable(let kid, let key): candidates.append((kid, key))
            case .skipped(let skip): skipped.append(skip)
            }
        }
        var counts: [String: Int] = [:]
        for (kid, _) in candidates { counts[kid, default: 0] += 1 }
        var keys: [String: RSAPublicKey] = [:]
        var keyIDs: [String] = []
        for (kid, key) in candidates {
            if counts[kid, default: 0] > 1 {
                skipped.append(SkippedKey(keyID: kid, reason: "duplicate kid"))
            } else {
                keys[kid] = key
                keyIDs.append(kid)
            }
        }
        self.keys = keys
        self.keyIDs = keyIDs
        self.skipped = skipped
    }

    /// Creates a set from keys already built (e.g. by a signer in tests).
    public init(keys: [String: RSAPublicKey]) {
        self.keys = keys
        self.keyIDs = keys.keys.sorted()
        self.skipped = []
    }

    /// The usable key with this `kid`, if any.
    public func key(id: String) -> RSAPublicKey? { keys[id] }

    private enum Parsed {
        case usable(String, RSAPublicKey)
        case skipped(SkippedKey)
    }

    private static func parse(_ entry: JSONValue) -> Parsed {
        guard case .object(let jwk) = entry else {
            return .skipped(SkippedKey(keyID: nil, reason: "entry is not an object"))
        }
        let kid = jwk["kid"]?.stringValue
        func skip(_ reason: String) -> Parsed {
            .skipped(SkippedKey(keyID: kid, reason: reason))
        }
        guard let kid, !kid.isEmpty else { return skip("missing kid") }
        guard jwk["kty"]?.stringValue == "RSA" else { return skip("kty is not RSA") }
        if let alg = jwk["alg"], alg.stringValue != "RS256" { return skip("alg is not RS256") }
        if let use = jwk["use"], use.stringValue != "sig" { return skip("use is not sig") }
        guard let n = jwk["n"]?.stringValue, let e = jwk["e"]?.stringValue,
            let modulus = try? Base64URL.decode(n), let exponent = try? Base64URL.decode(e)
        else { return skip("n or e missing or not base64url") }
        guard let key = try? RSAPublicKey(modulus: modulus, exponent: exponent) else {
            return skip("invalid RSA parameters")
        }
        guard key.bits >= 2048 else { return skip("modulus shorter than 2048 bits") }
        return .usable(kid, key)
    }
}
