import AppleID
import AppleNotifications
import Foundation
import HTTPServer
import Postgres
import ServiceSupport
import TokenVault

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
    /// The database (the role needs `siwa_signin`).
    public var database: PostgresConfiguration
    /// Database connections.
    public var poolSize: Int

    /// - Throws: ``ConfigurationError`` for a short bearer token or no client.
    public init(
        http: HTTPServer.Configuration, bearerToken: String, clients: [String: AppleIDClient],
        cipher: TokenCipher, database: PostgresConfiguration, poolSize: Int = 4
    ) throws {
        guard bearerToken.utf8.count >= 32, !bearerToken.contains(where: { $0.isWhitespace }) else {
            throw ConfigurationError("the sign-in API token must be at least 32 characters, without spaces")
        }
        guard !clients.isEmpty else {
            throw ConfigurationError("the sign-in API needs at least one client ID")
        }
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

    /// A service; `keys` maps a `kid` to Apple's key (the receiver's key store).
    public init(
        configuration: SignInConfiguration, logger: Logger,
        keys: @escaping @Sendable (String) throws(NotificationError) -> RSAPublicKey
    ) {
        self.configuration = configuration
        self.logger = logger
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
            ["host": .string(configuration.http.host), "port": .int(server.port ?? configuration.http.port)])
    }

    /// The bound port, once started.
    public var port: Int? { server.port }

    /// Stops accepting, lets calls in flight finish, closes the connections.
    public func shutdown() {
        _ = server.shutdown(gracePeriod: .seconds(10))
        pool.close()
    }

    /// Answers one request.
    public func handle(_ request: HTTPRequest) -> HTTPResponse {
        guard request.path == "/v1/sign-ins" || request.path == "/v1/revocations" else {
            return .error(status: 404, "not_found")
        }
        guard authorized(request) else {
            var response = HTTPResponse.error(status: 401, "unauthorized")
            response.headers.replaceOrAdd(name: "WWW-Authenticate", value: "Bearer")
            return response
        }
        guard request.method == "POST" else { return .error(status: 405, "method_not_allowed") }
        guard let object = try? JSONSerialization.jsonObject(with: request.data) as? [String: Any] else {
            return .error(status: 400, "body_is_not_a_json_object")
        }
        let response = request.path == "/v1/sign-ins" ? signIn(object) : revocation(object)
        logger.info(
            "sign-in API call",
            [
                "path": .string(request.path), "status": .int(response.status),
                "request_id": .string(request.id),
            ])
        return response
    }

    private func authorized(_ request: HTTPRequest) -> Bool {
        guard let header = request.headers["Authorization"], header.hasPrefix("Bearer ") else { return false }
        return constantTimeEqual(String(header.dropFirst("Bearer ".count)), configuration.bearerToken)
    }

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
                try connection.query(
                    "SELECT siwa.begin_sign_in($1, $2, $3)",
                    [.bytes(codeHash), .text(clientID), .text(claims.sub)]
                )[0][0, as: String.self]
            }
            switch state {
            case "new": break
            case "done": return try identity(sub: claims.sub, clientID: clientID)
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
            return try identity(sub: claims.sub, clientID: clientID)
        } catch let error as TokenCipherError {
            logger.error("sign-in: cannot encrypt the refresh token", ["error": .string(error.description)])
            return .error(status: 500, "cannot_store_token")
        } catch {
            logger.error("sign-in: cannot record the sign-in", ["error": .string(databaseErrorCode(error))])
            return .error(status: 503, "database_unavailable")
        }
    }

    private func identity(sub: String, clientID: String) throws -> HTTPResponse {
        let rows = try pool.withConnection { connection in
            try connection.query(
                "SELECT sub, email, is_private_email, email_verified, real_user_status FROM siwa.sign_in_identity($1, $2)",
                [.text(sub), .text(clientID)])
        }
        guard let row = rows.first else { return .error(status: 409, "exchange_in_progress") }
        var answer: [String: Any] = ["sub": try row[0, as: String.self], "client_id": clientID]
        answer["email"] = try row[1, as: String?.self] ?? NSNull()
        answer["is_private_email"] = try row[2, as: Bool?.self] ?? NSNull()
        answer["email_verified"] = try row[3, as: Bool?.self] ?? NSNull()
        answer["real_user_status"] = try row[4, as: Int?.self] ?? NSNull()
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
