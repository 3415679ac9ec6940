import Crypto
public import Foundation
import ServiceSupport

/// AWS Signature Version 4 (`AWS4-HMAC-SHA256`) of one request, as the AWS General Reference describes
/// it: a canonical request, a string to sign over its SHA-256 and the credential scope, a key derived
/// from the secret by four HMACs, the `Authorization` header. SHA-256 and HMAC are Crypto's (OpenSSL's,
/// through `Digest.sha256` and `HMACSHA256`); nothing here is hand-rolled crypto.
public struct SigV4Signer: Sendable {
    /// An access key: its id, its secret, and the session token of temporary credentials.
    public struct Credentials: Sendable {
        public var accessKeyID: String
        public var secretAccessKey: String
        public var sessionToken: String?

        public init(accessKeyID: String, secretAccessKey: String, sessionToken: String? = nil) {
            self.accessKeyID = accessKeyID
            self.secretAccessKey = secretAccessKey
            self.sessionToken = sessionToken
        }

        /// The key in a credentials file's text: `name = value` lines with the names of AWS's shared
        /// credentials file (`aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`); `[section]`
        /// lines, blank lines and `#` comments are skipped.
        /// - Throws: `ConfigurationError` naming what is missing or malformed (never a value).
        public init(fileText text: String) throws {
            var values: [String: String] = [:]
            for line in text.split(whereSeparator: \.isNewline) {
                let trimmed = line.trimmingCharacters(in: .whitespaces)
                if trimmed.isEmpty || trimmed.hasPrefix("#") || trimmed.hasPrefix("[") { continue }
                let pair = trimmed.split(separator: "=", maxSplits: 1)
                guard pair.count == 2 else {
                    throw ConfigurationError("--ses-credentials-file: a line is not name = value")
                }
                values[pair[0].trimmingCharacters(in: .whitespaces).lowercased()] =
                    pair[1].trimmingCharacters(in: .whitespaces)
            }
            guard let id = values["aws_access_key_id"], !id.isEmpty,
                let secret = values["aws_secret_access_key"],
                !secret.isEmpty
            else {
                throw ConfigurationError(
                    "--ses-credentials-file needs aws_access_key_id and aws_secret_access_key")
            }
            self.init(
                accessKeyID: id, secretAccessKey: secret,
                sessionToken: values["aws_session_token"].flatMap { $0.isEmpty ? nil : $0 })
        }
    }

    /// One signature and the steps that made it (the tests compare each with AWS's published ones).
    public struct Signature: Sendable, Equatable {
        public var canonicalRequest: String
        public var stringToSign: String
        /// 64 lower-case hex digits.
        public var signature: String
        /// The signed headers' names, lower case, sorted, `;`-separated.
        public var signedHeaders: String
        /// The `Authorization` header's value.
        public var authorization: String
    }

    public var credentials: Credentials
    /// The region of the scope (`us-east-1`).
    public var region: String
    /// The service of the scope (`ses` for SES v2).
    public var service: String

    public init(credentials: Credentials, region: String, service: String) {
        self.credentials = credentials
        self.region = region
        self.service = service
    }

    /// The headers to send with `method` to `url` (its path and query percent-encoded as sent): `headers`
    /// plus `X-Amz-Date`, `X-Amz-Content-SHA256` when `contentHash`, `X-Amz-Security-Token` with a session
    /// token, and `Authorization`, which signs them all and the `Host` the client derives from `url`.
    public func sign(
        method: String, url: String, headers: [(String, String)], body: [UInt8], date: Date,
        contentHash: Bool = true
    ) -> [(String, String)] {
        let components = URLComponents(string: url)
        let timestamp = Self.timestamp(date)
        var sent = headers
        sent.append(("X-Amz-Date", timestamp))
        let payloadHash = Self.hex(Digest.sha256(Data(body)))
        if contentHash { sent.append(("X-Amz-Content-SHA256", payloadHash)) }
        if let token = credentials.sessionToken { sent.append(("X-Amz-Security-Token", token)) }
        let path = components?.percentEncodedPath ?? "/"
        let signed = signature(
            method: method, path: path.isEmpty ? "/" : path, query: components?.percentEncodedQuery,
            headers: [("Host", Self.hostHeader(components))] + sent, payloadHash: payloadHash,
            timestamp: timestamp)
        return sent + [("Authorization", signed.authorization)]
    }

    /// The signature of a request whose `headers` (`Host` included) are all signed; `path` and `query` as
    /// sent (percent-encoded), `timestamp` its `X-Amz-Date`.
    public func signature(
        method: String, path: String, query: String?, headers: [(String, String)], payloadHash: String,
        timestamp: String
    ) -> Signature {
        // Header names lower case, values trimmed with inner runs of spaces made one, repeats joined by
        // commas, sorted by name.
        var merged: [String: [String]] = [:]
        for (name, value) in headers {
            let squeezed = value.split(separator: " ", omittingEmptySubsequences: true).joined(separator: " ")
            merged[name.lowercased(), default: []].append(squeezed.trimmingCharacters(in: .whitespaces))
        }
        let names = merged.keys.sorted()
        let canonicalHeaders = names.map { "\($0):\(merged[$0]!.joined(separator: ","))\n" }.joined()
        let signedHeaders = names.joined(separator: ";")
        let canonicalRequest = [
            method, Self.canonicalURI(path), Self.canonicalQuery(query), canonicalHeaders, signedHeaders,
            payloadHash,
        ].joined(separator: "\n")
        let day = String(timestamp.prefix(8))
        let scope = "\(day)/\(region)/\(service)/aws4_request"
        let stringToSign = [
            "AWS4-HMAC-SHA256", timestamp, scope, Self.hex(Digest.sha256(Data(canonicalRequest.utf8))),
        ].joined(separator: "\n")
        var key = Array("AWS4\(credentials.secretAccessKey)".utf8)
        for part in [day, region, service, "aws4_request"] {
            key = HMACSHA256.authenticationCode(key: key, message: Array(part.utf8))
        }
        let signature = Self.hex(
            Data(HMACSHA256.authenticationCode(key: key, message: Array(stringToSign.utf8))))
        return Signature(
            canonicalRequest: canonicalRequest, stringToSign: stringToSign, signature: signature,
            signedHeaders: signedHeaders,
            authorization:
                "AWS4-HMAC-SHA256 Credential=\(credentials.accessKeyID)/\(scope), SignedHeaders=\(signedHeaders), Signature=\(signature)"
        )
    }

    /// `date` as `X-Amz-Date` writes it: `yyyyMMdd'T'HHmmss'Z'`, UTC.
    public static func timestamp(_ date: Date) -> String {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        let parts = calendar.dateComponents([.year, .month, .day, .hour, .minute, .second], from: date)
        return String(
            format: "%04d%02d%02dT%02d%02d%02dZ", parts.year ?? 0, parts.month ?? 0, parts.day ?? 0,
            parts.hour ?? 0, parts.minute ?? 0, parts.second ?? 0)
    }

    /// The `Host` header libcurl sends for `components`: the host, and the port unless the scheme's own.
    static func hostHeader(_ components: URLComponents?) -> String {
        guard let components, let host = components.percentEncodedHost else { return "" }
        let standard = components.scheme?.lowercased() == "http" ? 80 : 443
        let name = host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host
        guard let port = components.port, port != standard else { return name }
        return "\(name):\(port)"
    }

    /// Every path segment percent-encoded again (services other than S3 sign the path encoded twice).
    static func canonicalURI(_ path: String) -> String {
        path.split(separator: "/", omittingEmptySubsequences: false).map { encode(String($0)) }
            .joined(separator: "/")
    }

    /// The query's parameters decoded, encoded strictly, sorted by name then value.
    static func canonicalQuery(_ query: String?) -> String {
        guard let query, !query.isEmpty else { return "" }
        let pairs: [(String, String)] = query.split(separator: "&").map { pair -> (String, String) in
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            func part(_ index: Int) -> String {
                guard index < parts.count else { return "" }
                let text = String(parts[index])
                return encode(text.removingPercentEncoding ?? text)
            }
            return (part(0), part(1))
        }
        let sorted = pairs.sorted { (a: (String, String), b: (String, String)) -> Bool in
            a.0 == b.0 ? a.1 < b.1 : a.0 < b.0
        }
        return sorted.map { (name: String, value: String) -> String in name + "=" + value }.joined(
            separator: "&")
    }

    /// Everything but the unreserved characters (`A-Z a-z 0-9 - . _ ~`) as `%XY`, upper-case hex.
    public static func encode(_ text: String) -> String {
        var out = ""
        for byte in text.utf8 {
            if unreserved.contains(byte) {
                out.append(Character(UnicodeScalar(byte)))
            } else {
                out += String(format: "%%%02X", byte)
            }
        }
        return out
    }

    private static let unreserved = Set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~".utf8)

    static func hex(_ data: Data) -> String { data.map { String(format: "%02x", $0) }.joined() }
}
