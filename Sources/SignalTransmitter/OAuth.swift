import Foundation
import HTTPServer
import Postgres
import ServiceSupport
import SharedSignals

/// The OAuth 2.0 scopes of the API: `ssf.read` reads and polls, `ssf.manage` changes streams.
enum Scope {
    static let read = "ssf.read"
    static let manage = "ssf.manage"
}

/// A management call's caller, or the answer refusing it.
enum Authentication {
    case success(Caller)
    case failure(HTTPResponse)
}

/// The receiver behind a valid access token.
struct Caller {
    var receiver: Int
    var scopes: Set<String>
    /// The `aud` of its streams' SETs.
    var audience: String
}

extension SignalTransmitter {
    /// `POST /ssf/token` (RFC 6749 § 4.4): client credentials by `client_secret_basic` or
    /// `client_secret_post`; an opaque bearer token with the requested scopes (default: all the client's).
    func issueToken(_ request: HTTPRequest) throws -> HTTPResponse {
        let form = FormBody(request.data)
        var clientID = form["client_id"]
        var secret = form["client_secret"]
        var usedBasic = false
        if let header = request.headers["Authorization"] {
            guard clientID == nil, secret == nil, let basic = ClientSecretBasic(header: header) else {
                return .tokenError(400, "invalid_request", "one client authentication method")
            }
            (clientID, secret, usedBasic) = (basic.user, basic.password, true)
        }
        guard let clientID, let secret, !clientID.isEmpty, clientID.utf8.count <= 200,
            secret.utf8.count <= 200
        else {
            return .invalidClient(basic: usedBasic)
        }
        let row = try pool.withConnection { connection in
            try connection.query(
                "SELECT id, salt, secret_hash, array_to_string(scopes, ' ') FROM siwa.ssf_receivers WHERE client_id = $1",
                [.text(clientID)]
            ).first.map { row throws(PostgresError) in
                (
                    try row[0, as: Int.self], try row[1, as: Data.self], try row[2, as: Data.self],
                    try row[3, as: String.self]
                )
            }
        }
        // An unknown client costs the same hash as a known one.
        let hash = ReceiverCredentials.secretHash(secret, salt: row?.1 ?? Data(count: 16))
        guard let row, constantTimeEqual([UInt8](hash), [UInt8](row.2)) else {
            return .invalidClient(basic: usedBasic)
        }
        guard let grant = form["grant_type"] else {
            return .tokenError(400, "invalid_request", "grant_type is required")
        }
        guard grant == "client_credentials" else { return .tokenError(400, "unsupported_grant_type") }
        let allowed = Set(row.3.split(separator: " ").map(String.init))
        let requested = form["scope"].map { Set($0.split(separator: " ").map(String.init)) } ?? allowed
        guard !requested.isEmpty, requested.isSubset(of: allowed) else {
            return .tokenError(400, "invalid_scope")
        }
        let token = ReceiverCredentials.newSecret()
        let lifetime = Int(configuration.tokenLifetime.inSeconds)
        let scopes = requested.sorted()
        try pool.withConnection { connection in
            // Expired tokens pruned, then this one's hash stored.
            _ = try connection.query(
                "SELECT siwa.issue_ssf_access_token($1, $2::bigint, $3::text[], $4::integer)",
                [
                    .bytes(ReceiverCredentials.tokenHash(token)), .int(Int64(row.0)),
                    .array(scopes.map { .text($0) }), .int(Int64(lifetime)),
                ])
        }
        var response = HTTPResponse.jsonObject(
            200,
            [
                "access_token": token, "token_type": "Bearer", "expires_in": lifetime,
                "scope": scopes.joined(separator: " "),
            ] as [String: Any])
        response.headers.replaceOrAdd(name: "Cache-Control", value: "no-store")
        response.headers.replaceOrAdd(name: "Pragma", value: "no-cache")
        return response
    }

    /// The caller of a management call holding `scope`, or the refusal: 401 without a valid, unexpired
    /// token (RFC 6750 § 3.1 `invalid_token`), 403 `insufficient_scope` with one lacking `scope`.
    func authenticate(_ request: HTTPRequest, scope: String) throws -> Authentication {
        guard let header = request.headers["Authorization"] else { return .failure(.bearerChallenge(nil)) }
        guard header.utf8.count <= 300, let token = AuthorizationHeader.bearerToken(header) else {
            return .failure(.bearerChallenge("invalid_token"))
        }
        let row = try pool.withConnection { connection in
            try connection.query(
                """
                SELECT t.receiver_id, array_to_string(t.scopes, ' '), r.audience
                  FROM siwa.ssf_access_tokens t JOIN siwa.ssf_receivers r ON r.id = t.receiver_id
                 WHERE t.token_hash = $1 AND t.expires_at > now()
                """, [.bytes(ReceiverCredentials.tokenHash(token))]
            ).first.map { row throws(PostgresError) in
                Caller(
                    receiver: try row[0, as: Int.self],
                    scopes: Set(try row[1, as: String.self].split(separator: " ").map(String.init)),
                    audience: try row[2, as: String.self])
            }
        }
        guard let row else { return .failure(.bearerChallenge("invalid_token")) }
        guard row.scopes.contains(scope) else {
            var response = HTTPResponse.ssfError(status: 403, "insufficient_scope")
            response.headers.replaceOrAdd(
                name: "WWW-Authenticate",
                value: #"Bearer realm="ssf", error="insufficient_scope", scope="\#(scope)""#)
            return .failure(response)
        }
        return .success(row)
    }
}

extension HTTPResponse {
    /// 401 with `WWW-Authenticate: Bearer realm="ssf"` (and the RFC 6750 error when there is one).
    static func bearerChallenge(_ error: String?) -> HTTPResponse {
        var response = HTTPResponse.ssfError(status: 401, error ?? "unauthorized")
        response.headers.replaceOrAdd(
            name: "WWW-Authenticate",
            value: #"Bearer realm="ssf""# + (error.map { #", error="\#($0)""# } ?? ""))
        return response
    }

    /// RFC 6749 § 5.2: `invalid_client`, 401 (with a Basic challenge when the client used Basic).
    static func invalidClient(basic: Bool) -> HTTPResponse {
        var response = tokenError(401, "invalid_client")
        response.headers.replaceOrAdd(name: "WWW-Authenticate", value: #"Basic realm="ssf""#)
        return response
    }

    /// An RFC 6749 § 5.2 error answer, never cached.
    static func tokenError(_ status: Int, _ word: String, _ description: String? = nil) -> HTTPResponse {
        var response = ssfError(status: status, word, description)
        response.headers.replaceOrAdd(name: "Cache-Control", value: "no-store")
        return response
    }
}

/// An `application/x-www-form-urlencoded` body: each name's first value.
struct FormBody {
    private var values: [String: String] = [:]

    init(_ data: Data) {
        for pair in String(decoding: data, as: UTF8.self).split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard let name = Self.decode(parts[0]), values[name] == nil else { continue }
            values[name] = parts.count > 1 ? Self.decode(parts[1]) : ""
        }
    }

    subscript(name: String) -> String? { values[name] }

    static func decode(_ text: Substring) -> String? {
        text.replacingOccurrences(of: "+", with: " ").removingPercentEncoding
    }
}

/// RFC 6749 § 2.3.1's `client_secret_basic`: `Basic base64(urlencode(id):urlencode(secret))`.
struct ClientSecretBasic {
    var user: String
    var password: String

    init?(header: String) {
        guard let basic = AuthorizationHeader.basicCredentials(header),
            let user = FormBody.decode(Substring(basic.user)),
            let password = FormBody.decode(Substring(basic.password))
        else { return nil }
        self.user = user
        self.password = password
    }
}
