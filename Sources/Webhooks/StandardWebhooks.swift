import Crypto
public import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Standard Webhooks (https://www.standardwebhooks.com, spec version 1): the `whsec_` secrets, the
/// `v1` signature over `webhook-id.webhook-timestamp.body`, and its verification.
///
/// The HMAC-SHA256 is Crypto's (OpenSSL's EVP_MAC); nothing here is hand-rolled crypto.
public enum StandardWebhooks {
    /// The prefix of a secret's text form.
    public static let secretPrefix = "whsec_"
    /// How far a `webhook-timestamp` may be from now, either way, for ``verify(id:timestamp:signature:body:secrets:tolerance:now:)``.
    public static let defaultTolerance: Duration = .seconds(300)

    /// Why a secret, a signature or a message was refused. Never holds a secret or a body.
    public struct Error: Swift.Error, Sendable, Equatable, CustomStringConvertible {
        /// The reason, in a few words.
        public let description: String
        /// An error with this reason.
        public init(_ description: String) { self.description = description }
    }

    /// A signing secret: 24 to 64 random bytes, written `whsec_` + standard base64.
    public struct Secret: Sendable, Equatable, CustomStringConvertible {
        /// The key bytes.
        public let key: [UInt8]

        /// Parses `whsec_<base64>`; the key must be 24 to 64 bytes.
        public init(_ text: String) throws(StandardWebhooks.Error) {
            guard text.hasPrefix(StandardWebhooks.secretPrefix) else {
                throw Error("a webhook secret starts with whsec_")
            }
            let encoded = String(text.dropFirst(StandardWebhooks.secretPrefix.count))
            guard !encoded.isEmpty, encoded.count % 4 == 0,
                encoded.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "+/=".contains($0)) }),
                let data = Data(base64Encoded: encoded)
            else { throw Error("a webhook secret is whsec_ and standard base64 (padded)") }
            guard (24...64).contains(data.count) else {
                throw Error("a webhook secret holds 24 to 64 bytes (this one \(data.count))")
            }
            key = [UInt8](data)
        }

        /// A new secret of 32 random bytes (Crypto's, OpenSSL's RAND_bytes).
        public static func generate() -> Secret {
            guard let bytes = try? SecureRandom.bytes(count: 32) else {
                preconditionFailure("RAND_bytes failed")
            }
            return try! Secret("whsec_" + Data(bytes).base64EncodedString())  // valid by construction
        }

        /// The text form, `whsec_…`: print it once, store it, never log it.
        public var text: String { StandardWebhooks.secretPrefix + Data(key).base64EncodedString() }

        /// Redacted: a secret never appears in logs or errors by accident.
        public var description: String { "whsec_…(redacted)" }
    }

    /// The signed content: `id.timestamp.body`.
    static func signedContent(id: String, timestamp: Int, body: [UInt8]) -> [UInt8] {
        Array("\(id).\(timestamp).".utf8) + body
    }

    /// The signed content of a received message (either scheme) and its signature header, once the
    /// three headers are present and the timestamp is within `tolerance` of `now`.
    static func receivedContent(
        id: String?, timestamp: String?, signature: String?, body: [UInt8], tolerance: Duration, now: Date
    ) throws(StandardWebhooks.Error) -> (content: [UInt8], signature: String) {
        guard let id, !id.isEmpty, let timestamp, let signature else {
            throw Error("missing webhook-id, webhook-timestamp or webhook-signature")
        }
        guard let seconds = Int(timestamp), timestamp.allSatisfy(\.isNumber) else {
            throw Error("webhook-timestamp is not whole seconds")
        }
        let skew = now.timeIntervalSince1970 - Double(seconds)
        let limit = Double(tolerance.components.seconds)
        if skew > limit { throw Error("webhook-timestamp too old") }
        if skew < -limit { throw Error("webhook-timestamp too new") }
        return (signedContent(id: id, timestamp: seconds, body: body), signature)
    }

    /// One `v1,<base64 HMAC-SHA256>` signature.
    public static func signature(id: String, timestamp: Int, body: [UInt8], secret: Secret) -> String {
        "v1,"
            + Data(
                hmacSHA256(key: secret.key, message: signedContent(id: id, timestamp: timestamp, body: body))
            )
            .base64EncodedString()
    }

    /// The `webhook-signature` header value: one signature per secret, space-separated (several during
    /// a rotation's overlap).
    public static func signatureHeader(id: String, timestamp: Int, body: [UInt8], secrets: [Secret]) -> String
    {
        secrets.map { signature(id: id, timestamp: timestamp, body: body, secret: $0) }.joined(separator: " ")
    }

    /// Verifies a received message: the three headers' values and the raw body, against any of
    /// `secrets`; the timestamp must be within `tolerance` of `now`.
    /// - Throws: ``Error`` naming what failed (missing header, timestamp, no matching signature).
    public static func verify(
        id: String?, timestamp: String?, signature: String?, body: [UInt8], secrets: [Secret],
        tolerance: Duration = defaultTolerance, now: Date = Date()
    ) throws(StandardWebhooks.Error) {
        try verify(
            id: id, timestamp: timestamp, signature: signature, body: body, keys: secrets.map { .hmac($0) },
            tolerance: tolerance, now: now)
    }

    /// HMAC-SHA256 of `message` under `key` (Crypto's, over OpenSSL's EVP_MAC).
    public static func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] {
        HMACSHA256.authenticationCode(key: key, message: message)
    }

    /// Why `url` may not be a webhook endpoint, or nil when it may: `https` with a host, or plain `http`
    /// only to a loopback IP literal (127.0.0.0/8, `[::1]`; not the name `localhost`); no
    /// `user:password@`, no whitespace or control characters.
    public static func endpointProblem(_ url: String) -> String? {
        guard url.count <= 2000,
            !url.contains(where: { $0.isWhitespace || $0.asciiValue.map { $0 < 32 || $0 == 127 } ?? false })
        else { return "the URL is too long or holds whitespace or control characters" }
        guard let components = URLComponents(string: url), let scheme = components.scheme?.lowercased(),
            let host = components.host, !host.isEmpty
        else { return "not an absolute URL" }
        if components.user != nil || components.password != nil
            || url.split(separator: "/").dropFirst().first?.contains("@") == true
        {
            return "credentials in the URL are not allowed"
        }
        switch scheme {
        case "https": return nil
        case "http":
            return isLoopbackLiteral(host)
                ? nil : "plain http only to a loopback IP literal (127.0.0.1, [::1]); use https"
        default: return "the scheme must be https"
        }
    }

    /// Whether `host` (IPv6 possibly in brackets) is a loopback IP literal: 127.0.0.0/8 or ::1.
    public static func isLoopbackLiteral(_ host: String) -> Bool {
        var literal = host
        if literal.hasPrefix("["), literal.hasSuffix("]") { literal = String(literal.dropFirst().dropLast()) }
        var v4 = in_addr()
        if inet_pton(AF_INET, literal, &v4) == 1 { return UInt32(bigEndian: v4.s_addr) >> 24 == 127 }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, literal, &v6) == 1 {
            return withUnsafeBytes(of: &v6) { $0.prefix(15).allSatisfy { $0 == 0 } && $0[15] == 1 }
        }
        return false
    }
}
