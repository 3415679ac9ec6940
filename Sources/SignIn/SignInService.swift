public import AppleID
public import AppleNotifications
import Foundation
public import HTTPServer
public import Postgres
public import ServiceSupport
public import TokenVault

/// The sign-in API's settings, built once by the executable.
public struct SignInConfiguration: Sendable {
    /// Where the API listens (its own listener, apart from Apple's notification endpoint) and its limits.
    public var http: HTTPServer.Configuration
    /// The bearer token every call must carry (from a file); at least 32 characters.
    public let bearerToken: String
    /// One client per accepted client ID (bundle ID or Services ID), each with its client secret.
    public let clients: [String: AppleIDClient]
    /// Encrypts refresh tokens at rest.
    public let cipher: TokenCipher
    /// The database, as a login of its own that is a member of `siwa_signin` only (never the receiver's).
    public var database: PostgresConfiguration
    /// Database connections.
    public var poolSize: Int
    /// Whether TLS for the API terminates in front of it (a proxy or sidecar): the API itself speaks plain
    /// HTTP, so without this it listens on a loopback address only.
    public let tlsTerminatedInFront: Bool

    /// - Throws: ``ConfigurationError`` for a short bearer token, no client, or a listen address that is
    ///   not loopback while `tlsTerminatedInFront` is false.
    public init(
        http: HTTPServer.Configuration, bearerToken: String, clients: [String: AppleIDClient],
        cipher: TokenCipher, database: PostgresConfiguration, poolSize: Int = 4,
        tlsTerminatedInFront: Bool = false
    ) throws {
        guard bearerToken.utf8.count >= 32, !bearerToken.contains(where: { $0.isWhitespace }) else {
            throw ConfigurationError("the sign-in API token must be at least 32 characters, without spaces")
        }
        guard !clients.isEmpty else {
            throw ConfigurationError("the sign-in API needs at least one client ID")
        }
        guard tlsTerminatedInFront || isLoopback(host: http.host) else {
            throw ConfigurationError(
                "the sign-in API speaks plain HTTP (its bearer token and users' codes in clear): listen on a loopback address, or terminate TLS in front of it and say so with --signin-tls-terminated-in-front"
            )
        }
        self.tlsTerminatedInFront = tlsTerminatedInFront
        self.http = http
        self.bearerToken = bearerToken
        self.clients = clients
        self.cipher = cipher
        self.database = database
        self.poolSize = poolSize
    }
}

/// The internal sign-in API: `POST /v1/sign-ins` exchanges an app's authorization code at Apple and
/// stores the refresh token encrypted; `POST /v1/revocations` asks siwa-worker to revoke a user's tokens.
///
/// Every call needs `Authorization: Bearer <token>` (compared in constant time). Errors answer
/// `{"error": "<word>"}` and never echo a token, code, email or secret; bad input changes nothing.
public final class SignInService: Sendable {
    /// The settings.
    public let configuration: SignInConfiguration
    private let verifier: IdentityTokenVerifier
    private let keys: @Sendable (String) throws(NotificationError) -> RSAPublicKey
    private let pool: PostgresPool
    private let server: HTTPServer
    private let logger: Logger
    /// Where every answer is counted: `siwa_signin_responses_total{endpoint, status, error}` (the receiver
    /// serves it on its `/metrics`).
    public let metrics: MetricsRegistry

    /// A service; `keys` maps a `kid` to Apple's key (the receiver's key store); answers are counted in
    /// `metrics`.
    public init(
        configuration: SignInConfiguration, logger: Logger, metrics: MetricsRegistry = MetricsRegistry(),
        keys: @escaping @Sendable (String) throws(NotificationError) -> RSAPublicKey
    ) {
        self.configuration = configuration
        self.logger = logger
        self.metrics = metrics
        self.keys = keys
        verifier = IdentityTokenVerifier(audiences: Set(configuration.clients.keys))
        pool = PostgresPool(
            configuration: configuration.database, maxConnections: configuration.poolSize,
            acquireTimeout: .seconds(5))
        let handler = Handler()
        server = HTTPServer(configuration: configuration.http) { request in handler.handle(request) }
        handler.service = self
    }

    /// Starts listening; returns once the port is bound.
    public func start() throws {
        try server.start()
        logger.info(
            "sign-in API listening",
            [
                "host": .string(configuration.http.host),
                "port": .int(server.port ?? configuration.http.port),
                "address": .string(server.address ?? ""),
            ])
    }

    /// The bound port, once started.
    public var port: Int? { server.port }

    /// The bound address (`HOST:PORT`), once started.
    public var address: String? { server.address }

    /// Stops accepting, lets calls in flight finish, closes the connections.
    public func shutdown() {
        _ = server.shutdown(gracePeriod: .seconds(10))
        pool.close()
    }

    /// Answers one request, logs it (a refusal as a warning) and counts it; never logs a token, a code,
    /// an email or a body.
    public func handle(_ request: HTTPRequest) -> HTTPResponse {
        let endpoint =
            switch request.path {
            case "/v1/sign-ins": "sign-ins"
            case "/v1/revocations": "revocations"
            default: "other"
            }
        let response = answer(request, endpoint: endpoint)
        metrics.counter(
            "siwa_signin_responses_total",
            help:
                "Answers of the sign-in API by endpoint (sign-ins, revocations, other), HTTP status and error word (none: success).",
            labels: [
                ("endpoint", endpoint), ("status", String(response.status)), ("error", response.errorWord),
            ]
        ).increment()
        let fields = request.callLogFields(endpoint: endpoint, response: response)
        if (400..<500).contains(response.status) {
            logger.warning("sign-in API refused a call", fields)
        } else {
            logger.info("sign-in API call", fields)
        }
        return response
    }

    private func answer(_ request: HTTPRequest, endpoint: String) -> HTTPResponse {
        guard endpoint != "other" else { return .error(status: 404, "not_found") }
        guard request.carriesBearer(configuration.bearerToken) else { return .bearerRequired }
        guard request.method == "POST" else { return .error(status: 405, "method_not_allowed") }
        guard let object = try? JSONSerialization.jsonObject(with: request.data) as? [String: Any] else {
            return .error(status: 400, "body_is_not_a_json_object")
        }
        // Text the API stores or forwards never holds control characters (PostgreSQL's text cannot hold
        // a NUL; a line break or an escape sequence in a reason would reach logs and terminals).
        for field in textFields[endpoint] ?? [] {
            if let text = object[field] as? String, text.unicodeScalars.contains(where: isControl) {
                return .error(status: 400, "\(field)_has_control_characters")
            }
        }
        return endpoint == "sign-ins" ? signIn(object) : revocation(object)
    }

    /// The request fields of each endpoint that are text.
    private let textFields = [
        "sign-ins": ["authorization_code", "id_token", "nonce", "client_id", "redirect_uri"],
        "revocations": ["sub", "reason"],
    ]

    private func signIn(_ object: [String: Any]) -> HTTPResponse {
        guard let code = object["authorization_code"] as? String, (1...1024).contains(code.utf8.count) else {
            return .error(status: 400, "authorization_code_missing")
        }
        guard let idToken = object["id_token"] as? String,
            (1...CompactJWS.maximumLength).contains(idToken.utf8.count)
        else { return .error(status: 400, "id_token_missing") }
        guard let nonce = object["nonce"] as? String, (1...1024).contains(nonce.utf8.count) else {
            return .error(status: 400, "nonce_missing")
        }
        guard let clientID = object["client_id"] as? String, let client = configuration.clients[clientID]
        else {
            return .error(status: 400, "client_id_unknown")
        }
        let redirectURI = object["redirect_uri"] as? String
        let claims: IdentityClaims
        do {
            claims = try verifier.verify(idToken, rawNonce: nonce, key: keys)
        } catch {
            return .error(status: error.isTemporary ? 503 : 400, error.reason)
        }
        guard claims.audience == clientID else { return .error(status: 400, "id_token_wrong_audience") }
        let codeHash = sha256(code)
        do {
            let state = try pool.withConnection { connection in
                try connection.value(
                    "SELECT siwa.begin_sign_in($1, $2, $3)",
                    [.bytes(codeHash), .text(clientID), .text(claims.sub)], as: String.self
                )
            }
            switch state {
            case "new": break
            case "done": return try answer(codeHash: codeHash, sub: claims.sub, clientID: clientID)
            case "exchanging": return .error(status: 409, "exchange_in_progress")
            default: return .error(status: 409, "authorization_code_already_used")
            }
        } catch {
            logger.warning("sign-in: database unavailable", ["error": .string(databaseErrorCode(error))])
            return .error(status: 503, "database_unavailable")
        }

        let tokens: TokenResponse
        do {
            tokens = try client.exchange(code: code, redirectURI: redirectURI)
        } catch {
            _ = try? pool.withConnection { connection in
                try connection.execute("SELECT siwa.abandon_sign_in($1)", [.bytes(codeHash)])
            }
            logger.warning("sign-in: Apple refused the exchange", ["error": .string(error.code.rawValue)])
            switch error.code {
            case .invalidGrant: return .error(status: 400, "invalid_grant")
            case .invalidClient: return .error(status: 502, "apple_invalid_client")
            default: return .error(status: error.isRetryable ? 503 : 502, "apple_" + error.code.rawValue)
            }
        }
        // The code is spent at Apple from here on: failures keep it claimed (a retry gets 409).
        let returned: IdentityClaims
        do {
            returned = try verifier.verify(tokens.idToken, rawNonce: nil, key: keys)
        } catch {
            logger.warning("sign-in: Apple's id_token does not verify", ["error": .string(error.reason)])
            return .error(status: 502, "apple_id_token_" + error.reason)
        }
        guard returned.sub == claims.sub, returned.audience == clientID,
            returned.nonce == nil || returned.nonce == claims.nonce
        else {
            logger.warning("sign-in: Apple's id_token names another user or client")
            return .error(status: 502, "apple_id_token_mismatch")
        }
        do {
            var ciphertext: PostgresData?
            var tokenHash: PostgresData?
            if let refresh = tokens.refreshToken {
                ciphertext = .bytes(
                    Data(try configuration.cipher.encrypt(refresh, clientID: clientID)))
                tokenHash = .bytes(sha256(refresh))
            }
            let email = returned.email ?? claims.email
            let isPrivate = returned.isPrivateEmail ?? claims.isPrivateEmail
            let verified = returned.emailVerified ?? claims.emailVerified
            let status = returned.realUserStatus ?? claims.realUserStatus
            try pool.withConnection { connection in
                _ = try connection.query(
                    "SELECT siwa.record_sign_in($1::bytea, $2::text, $3::text, $4::text, $5::boolean, $6::boolean, $7::integer, $8::bytea, $9::bytea)",
                    [
                        .bytes(codeHash), .text(clientID), .text(claims.sub), email.map { .text($0) },
                        isPrivate.map { .bool($0) }, verified.map { .bool($0) },
                        status.map { .int(Int64($0)) },
                        tokenHash, ciphertext,
                    ])
            }
            return try answer(codeHash: codeHash, sub: claims.sub, clientID: clientID)
        } catch let error as TokenCipherError {
            logger.error("sign-in: cannot encrypt the refresh token", ["error": .string(error.description)])
            return .error(status: 500, "cannot_store_token")
        } catch let error as PostgresError where error.sqlState == "22023" {
            // The claim is gone or older than siwa.record_sign_in accepts (10 minutes): Apple has spent
            // the code, so a retry cannot help; the app starts a new sign-in.
            logger.warning("sign-in: the code's claim expired before the sign-in was recorded")
            return .error(status: 409, "sign_in_claim_expired")
        } catch {
            logger.error("sign-in: cannot record the sign-in", ["error": .string(databaseErrorCode(error))])
            return .error(status: 503, "database_unavailable")
        }
    }

    /// What the recorded sign-in of `codeHash` answers now: the identity, or a refusal when the account
    /// is deleted (410) or consent was revoked at or after the sign-in (403).
    private func answer(codeHash: Data, sub: String, clientID: String) throws -> HTTPResponse {
        let rows = try pool.withConnection { connection in
            try connection.rows(SignInAnswer.self, [.bytes(codeHash), .text(clientID), .text(sub)])
        }
        guard let row = rows.first else { return .error(status: 409, "exchange_in_progress") }
        switch row.outcome {
        case .signedIn: break
        case .accountDeleted: return .error(status: 410, "account_deleted")
        case .consentRevoked: return .error(status: 403, "consent_revoked")
        }
        var answer: [String: Any] = ["sub": row.sub, "client_id": clientID]
        answer["email"] = row.email ?? NSNull()
        answer["is_private_email"] = row.isPrivateEmail ?? NSNull()
        answer["email_verified"] = row.emailVerified ?? NSNull()
        answer["real_user_status"] = row.realUserStatus ?? NSNull()
        let data = try JSONSerialization.data(withJSONObject: answer, options: [.sortedKeys])
        return .json(status: 200, data)
    }

    private func revocation(_ object: [String: Any]) -> HTTPResponse {
        guard let sub = object["sub"] as? String, (1...255).contains(sub.count) else {
            return .error(status: 400, "sub_missing")
        }
        guard let reason = object["reason"] as? String, (1...200).contains(reason.count) else {
            return .error(status: 400, "reason_missing")
        }
        do {
            let id = try pool.withConnection { connection in
                try connection.query("SELECT siwa.request_revocation($1, $2)", [.text(sub), .text(reason)])[
                    0][
                        0, as: Int.self]
            }
            return .json(status: 202, Data(#"{"id":\#(id),"state":"pending"}"#.utf8))
        } catch let error as PostgresError where error.sqlState == "22023" {
            return .error(status: 400, "invalid_sub_or_reason")
        } catch {
            logger.warning("revocation: database unavailable", ["error": .string(databaseErrorCode(error))])
            return .error(status: 503, "database_unavailable")
        }
    }
}

/// Lets the HTTP handler closure reach the service built after it.
// @unchecked: `service` is set once, before the HTTP server starts calling `handle`, and only read after.
private final class Handler: @unchecked Sendable {
    weak var service: SignInService?
    func handle(_ request: HTTPRequest) -> HTTPResponse {
        service?.handle(request) ?? .error(status: 503, "stopping")
    }
}

/// A database error's SQLSTATE or kind, never its message (which may quote values).
private func databaseErrorCode(_ error: any Error) -> String {
    if let error = error as? PostgresError { return error.sqlState ?? error.code.description }
    return "unknown"
}

/// A C0 or C1 control character, or DEL.
private func isControl(_ scalar: Unicode.Scalar) -> Bool {
    scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value)
}

/// Whether `host` names this machine's loopback interface only: `localhost`, 127.0.0.0/8 or `::1`.
func isLoopback(host: String) -> Bool { ListenAddress(host: host, port: 0).isLoopback }

/// What `siwa.sign_in_answer` says of a recorded sign-in: the identity and whether it still stands.
struct SignInAnswer: PostgresRowDecodable {
    static let statement = """
        SELECT outcome, sub, email, is_private_email, email_verified, real_user_status
          FROM siwa.sign_in_answer($1, $2, $3)
        """
    static let columns: PostgresColumns = """
        outcome text, sub text, email text, is_private_email boolean, email_verified boolean, \
        real_user_status integer
        """

    /// Whether the sign-in stands; any other word than the first two refuses, as consent revoked does.
    enum Outcome {
        case signedIn, accountDeleted, consentRevoked
    }

    var outcome: Outcome
    var sub: String
    var email: String?
    var isPrivateEmail: Bool?
    var emailVerified: Bool?
    var realUserStatus: Int?

    init(row: PostgresRow) throws(PostgresError) {
        switch try row[0, as: String.self] {
        case "signed_in": outcome = .signedIn
        case "account_deleted": outcome = .accountDeleted
        default: outcome = .consentRevoked
        }
        sub = try row[1, as: String.self]
        email = try row[2, as: String?.self]
        isPrivateEmail = try row[3, as: Bool?.self]
        emailVerified = try row[4, as: Bool?.self]
        realUserStatus = try row[5, as: Int?.self]
    }
}
