import Foundation
public import HTTPServer
import Postgres
public import ServiceSupport
import SharedSignals

/// The Shared Signals transmitter's HTTP API (SSF 1.0): metadata and JWKS, the OAuth 2.0 token endpoint
/// (client credentials), the stream configuration, status, subjects and verification endpoints, and poll
/// delivery (RFC 8936).
///
/// Every management call needs a bearer token of `POST /ssf/token` with `ssf.read` (reads and poll) or
/// `ssf.manage` (changes); a receiver sees only its own streams. Never logs a header, a token or a body.
public final class SignalTransmitter: Sendable {
    /// The settings.
    public let configuration: TransmitterConfiguration
    let logger: Logger
    let pool: PostgresPool
    let waker: PollWaker
    private let server: HTTPServer

    /// The API's paths, below the issuer.
    enum Path {
        static let metadata = "/.well-known/ssf-configuration"
        static let jwks = "/ssf/jwks"
        static let token = "/ssf/token"
        static let streams = "/ssf/streams"
        static let status = "/ssf/status"
        static let addSubject = "/ssf/subjects:add"
        static let removeSubject = "/ssf/subjects:remove"
        static let verify = "/ssf/verify"
        static let pollPrefix = "/ssf/poll/"
    }

    /// The API over `configuration`; nothing listens until ``start()``.
    public init(configuration: TransmitterConfiguration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
        pool = PostgresPool(
            configuration: configuration.database, maxConnections: configuration.poolSize,
            acquireTimeout: .seconds(5))
        waker = PollWaker(database: configuration.database, logger: logger)
        let handler = TransmitterHandler()
        server = HTTPServer(configuration: configuration.http) { request in handler.handle(request) }
        handler.transmitter = self
    }

    /// Starts the poll waker and the listener; returns once the port is bound.
    public func start() throws {
        waker.start()
        do {
            try server.start()
        } catch {
            waker.stop()
            throw error
        }
        logger.info(
            "shared signals API listening",
            ["address": .string(server.address ?? ""), "issuer": .string(configuration.issuer)])
    }

    /// The bound port, once started.
    public var port: Int? { server.port }
    /// The bound address (`HOST:PORT`), once started.
    public var address: String? { server.address }

    /// Polls waiting now for a SET (long polls between two looks, holding no connection).
    public var longPollsWaiting: Int { waker.waiting }

    /// Stops accepting, wakes long polls, lets calls in flight finish, closes the connections.
    public func shutdown() {
        waker.stop()
        _ = server.shutdown(gracePeriod: .seconds(10))
        pool.close()
    }

    /// Answers one request and logs it (endpoint, method, status, request id; a refusal as a warning).
    public func handle(_ request: HTTPRequest) -> HTTPResponse {
        let endpoint = Self.endpoint(of: request.path)
        let response: HTTPResponse
        do {
            response = try answer(request, endpoint: endpoint)
        } catch let error as PostgresError {
            logger.warning(
                "shared signals API: database unavailable",
                ["error": .string(error.sqlState ?? "\(error.code)")])
            response = .ssfError(status: 503, "temporarily_unavailable")
        } catch {
            logger.error("shared signals API: internal error", ["endpoint": .string(endpoint)])
            response = .ssfError(status: 500, "server_error")
        }
        let fields = request.callLogFields(endpoint: endpoint, response: response)
        if (400..<500).contains(response.status) {
            logger.warning("shared signals API refused a call", fields)
        } else {
            logger.info("shared signals API call", fields)
        }
        return response
    }

    static func endpoint(of path: String) -> String {
        switch path {
        case Path.metadata: "metadata"
        case Path.jwks: "jwks"
        case Path.token: "token"
        case Path.streams: "streams"
        case Path.status: "status"
        case Path.addSubject: "subjects-add"
        case Path.removeSubject: "subjects-remove"
        case Path.verify: "verify"
        default: path.hasPrefix(Path.pollPrefix) ? "poll" : "other"
        }
    }

    private func answer(_ request: HTTPRequest, endpoint: String) throws -> HTTPResponse {
        switch endpoint {
        case "metadata":
            guard request.method == "GET" else { return .methodNotAllowed }
            return .jsonObject(200, metadata())
        case "jwks":
            guard request.method == "GET" else { return .methodNotAllowed }
            return .json(
                status: 200, SETSigningKey.jwksJSON([configuration.key] + configuration.publishedKeys))
        case "token":
            guard request.method == "POST" else { return .methodNotAllowed }
            return try issueToken(request)
        case "streams":
            return try streams(request)
        case "status":
            return try status(request)
        case "subjects-add", "subjects-remove":
            guard request.method == "POST" else { return .methodNotAllowed }
            return try subject(request, add: endpoint == "subjects-add")
        case "verify":
            guard request.method == "POST" else { return .methodNotAllowed }
            return try verify(request)
        case "poll":
            guard request.method == "POST" else { return .methodNotAllowed }
            return try poll(request, streamID: String(request.path.dropFirst(Path.pollPrefix.count)))
        default:
            return .ssfError(status: 404, "not_found")
        }
    }

    /// The transmitter configuration metadata (SSF 1.0 § 7.1).
    func metadata() -> [String: Any] {
        let base = configuration.issuer
        return [
            "spec_version": "1_0",
            "issuer": base,
            "jwks_uri": base + Path.jwks,
            "delivery_methods_supported": [DeliveryMethod.push, DeliveryMethod.poll],
            "configuration_endpoint": base + Path.streams,
            "status_endpoint": base + Path.status,
            "add_subject_endpoint": base + Path.addSubject,
            "remove_subject_endpoint": base + Path.removeSubject,
            "verification_endpoint": base + Path.verify,
            "authorization_schemes": [["spec_urn": "urn:ietf:rfc:6749"]],
            "default_subjects": configuration.defaultSubjects.rawValue,
            "token_endpoint": base + Path.token,
        ]
    }
}

/// The delivery methods' URNs.
enum DeliveryMethod {
    static let push = "urn:ietf:rfc:8935"
    static let poll = "urn:ietf:rfc:8936"
}

/// Lets the HTTP handler closure reach the transmitter built after it.
// @unchecked: `transmitter` is set once, before the server starts calling `handle`, and only read after.
private final class TransmitterHandler: @unchecked Sendable {
    weak var transmitter: SignalTransmitter?
    func handle(_ request: HTTPRequest) -> HTTPResponse {
        transmitter?.handle(request) ?? .ssfError(status: 503, "temporarily_unavailable")
    }
}

extension HTTPResponse {
    /// `{"error": word}` (and `error_description` when given), the OAuth and SSF error shape.
    static func ssfError(status: Int, _ word: String, _ description: String? = nil) -> HTTPResponse {
        var object: [String: Any] = ["error": word]
        if let description { object["error_description"] = description }
        return .jsonObject(status, object)
    }

    static var methodNotAllowed: HTTPResponse { .ssfError(status: 405, "method_not_allowed") }

    /// A JSON object or array, keys sorted, slashes unescaped.
    static func jsonObject(_ status: Int, _ value: Any) -> HTTPResponse {
        guard
            let data = try? JSONSerialization.data(
                withJSONObject: value, options: [.sortedKeys, .withoutEscapingSlashes])
        else { return .ssfError(status: 500, "server_error") }
        return .json(status: status, data)
    }
}

/// A C0 or C1 control character, or DEL.
func hasControlCharacters(_ text: String) -> Bool {
    text.unicodeScalars.contains { $0.value < 0x20 || (0x7F...0x9F).contains($0.value) }
}
