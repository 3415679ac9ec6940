import Foundation
import HTTPServer
import Postgres
import ServiceSupport
import SharedSignals
import SignalTransmitter
import TestSupport
import Testing

/// A live transmitter API on port 0 over a fresh database, logged in as a member of siwa_ssf, and the
/// calls a receiver makes (written from SSF 1.0, RFC 6749 § 4.4 and RFC 8936).
final class TransmitterFixture: Sendable {
    static let issuer = "https://ssf.example.test"
    let database: TestDatabase
    let key: SETSigningKey
    let transmitter: SignalTransmitter
    let base: String
    let authorizationDirectory: String

    init(
        defaultSubjects: TransmitterConfiguration.DefaultSubjects = .all, minVerificationInterval: Int = 30,
        longPollLimit: Duration = .seconds(10), publishedKeys: [SETSigningKey] = []
    ) throws {
        database = try TestDatabase()
        key = try SETSigningKey.generate()
        authorizationDirectory =
            FileManager.default.temporaryDirectory.appendingPathComponent("ssf-authz-\(UUID().uuidString)")
            .path
        try FileManager.default.createDirectory(
            atPath: authorizationDirectory, withIntermediateDirectories: true)
        transmitter = SignalTransmitter(
            configuration: try TransmitterConfiguration(
                http: HTTPServer.Configuration(host: "127.0.0.1", port: 0, threadCount: 8),
                database: try database.configuration(asMemberOf: "siwa_ssf"), issuer: Self.issuer, key: key,
                defaultSubjects: defaultSubjects, minVerificationInterval: minVerificationInterval,
                longPollLimit: longPollLimit, authorizationDirectory: authorizationDirectory,
                publishedKeys: publishedKeys),
            logger: quietLogger)
        try transmitter.start()
        base = "http://" + (transmitter.address ?? "")
    }

    deinit {
        transmitter.shutdown()
        try? FileManager.default.removeItem(atPath: authorizationDirectory)
    }

    /// Registers a receiver as `siwactl ssf receivers add` does; returns its client id and secret.
    func addReceiver(_ name: String, scopes: [String] = ["ssf.manage", "ssf.read"], audience: String? = nil)
        throws -> (id: String, secret: String)
    {
        let id = ReceiverCredentials.newClientID()
        let secret = ReceiverCredentials.newSecret()
        let salt = ReceiverCredentials.newSalt()
        try database.connection.execute(
            """
            INSERT INTO siwa.ssf_receivers (name, client_id, salt, secret_hash, scopes, audience)
            VALUES ($1, $2, $3, $4, $5::text[], $6)
            """,
            [
                .text(name), .text(id), .bytes(salt),
                .bytes(ReceiverCredentials.secretHash(secret, salt: salt)),
                .array(scopes.map { .text($0) }), .text(audience ?? "https://\(name).example.test"),
            ])
        return (id, secret)
    }

    /// `POST /ssf/token` with client_secret_post (or Basic), the form's fields as given.
    func tokenCall(_ fields: [(String, String)], basic: (String, String)? = nil) throws -> (
        Int, [String: Any]
    ) {
        let body = fields.map { "\(formEncode($0.0))=\(formEncode($0.1))" }.joined(separator: "&")
        var headers = [("Content-Type", "application/x-www-form-urlencoded")]
        if let basic {
            let pair = "\(formEncode(basic.0)):\(formEncode(basic.1))"
            headers.append(("Authorization", "Basic " + Data(pair.utf8).base64EncodedString()))
        }
        let response = try TestHTTPClient.post(base + "/ssf/token", body: Array(body.utf8), headers: headers)
        return (
            response.status, (try? JSONSerialization.jsonObject(with: response.data)) as? [String: Any] ?? [:]
        )
    }

    /// An access token for the receiver (all its scopes unless `scope` names some).
    func token(_ client: (id: String, secret: String), scope: String? = nil) throws -> String {
        var fields = [
            ("grant_type", "client_credentials"), ("client_id", client.id), ("client_secret", client.secret),
        ]
        if let scope { fields.append(("scope", scope)) }
        let (status, object) = try tokenCall(fields)
        guard status == 200, let token = object["access_token"] as? String else {
            throw TestFailure("no token: \(status) \(object)")
        }
        return token
    }

    /// One management call: the status, the JSON answer (nil when none) and the raw response.
    @discardableResult
    func call(
        _ method: String, _ path: String, token: String?, json: Any? = nil, timeout: Duration = .seconds(30)
    ) throws -> (status: Int, body: Any?, response: TestHTTPResponse) {
        var headers: [(String, String)] = []
        if let token { headers.append(("Authorization", "Bearer " + token)) }
        var body: [UInt8]?
        if let json {
            body = Array(try JSONSerialization.data(withJSONObject: json))
            headers.append(("Content-Type", "application/json"))
        }
        let response = try TestHTTPClient.request(
            method: method, url: base + path, headers: headers, body: body, timeout: timeout)
        return (response.status, try? JSONSerialization.jsonObject(with: response.data), response)
    }

    /// Creates a stream; returns its configuration as answered (201 expected).
    func createStream(
        token: String, method: String = "urn:ietf:rfc:8936", endpoint: String? = nil,
        events: [String]? = nil, authorization: String? = nil
    ) throws -> [String: Any] {
        var delivery: [String: Any] = ["method": method]
        if let endpoint { delivery["endpoint_url"] = endpoint }
        if let authorization { delivery["authorization_header"] = authorization }
        var body: [String: Any] = ["delivery": delivery]
        if let events { body["events_requested"] = events }
        let answer = try call("POST", "/ssf/streams", token: token, json: body)
        guard answer.status == 201, let object = answer.body as? [String: Any] else {
            throw TestFailure("stream not created: \(answer.status) \(answer.response.text)")
        }
        return object
    }

    /// One RFC 8936 poll of a stream's endpoint; returns the SETs by jti and moreAvailable.
    func poll(_ stream: [String: Any], token: String, body: [String: Any]) throws
        -> (sets: [String: String], more: Bool)
    {
        let delivery = stream["delivery"] as? [String: Any] ?? [:]
        let url = delivery["endpoint_url"] as? String ?? ""
        let answer = try call("POST", String(url.dropFirst(Self.issuer.count)), token: token, json: body)
        guard answer.status == 200, let object = answer.body as? [String: Any] else {
            throw TestFailure("poll failed: \(answer.status) \(answer.response.text)")
        }
        return (object["sets"] as? [String: String] ?? [:], object["moreAvailable"] as? Bool ?? false)
    }

    /// Inserts one change per (type, sub) in one statement, as the worker's batch does.
    func insertChanges(_ changes: [(String, String)]) throws {
        try database.connection.execute(
            """
            INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti)
            SELECT t, s, now() - interval '1 minute', now(), 'apple-' || gen_random_uuid()
              FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(t, s, n) ORDER BY n
            """,
            [.array(changes.map { .text($0.0) }), .array(changes.map { .text($0.1) })])
    }

    /// The SETs verified by PyJWT against the published JWKS, for `audience`.
    func verified(_ tokens: [String], audience: String) throws -> [IndependentVerifier.Outcome] {
        let jwks = try TestHTTPClient.get(base + "/ssf/jwks").data
        return try IndependentVerifier.verify(tokens, jwks: jwks, issuer: Self.issuer, audience: audience)
    }

    private func formEncode(_ text: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
    }
}

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// The one event type of a verified SET's `events`.
func eventType(_ outcome: IndependentVerifier.Outcome) -> String {
    (outcome.claims["events"] as? [String: Any])?.keys.first ?? ""
}

/// The members of a verified SET's one event.
func eventMembers(_ outcome: IndependentVerifier.Outcome) -> [String: Any] {
    (outcome.claims["events"] as? [String: Any])?.values.first as? [String: Any] ?? [:]
}

/// The `sub` of a verified SET's `sub_id` (or the stream id of an opaque one).
func subject(_ outcome: IndependentVerifier.Outcome) -> String {
    let id = outcome.claims["sub_id"] as? [String: Any] ?? [:]
    return id["sub"] as? String ?? id["id"] as? String ?? ""
}
