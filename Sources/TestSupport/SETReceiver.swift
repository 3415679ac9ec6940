public import AppleNotifications
public import Foundation
import HTTPServer
import Synchronization

/// One SET a ``SETReceiver`` got, with what it answered.
public struct ReceivedSET: Sendable {
    /// The compact JWS as POSTed.
    public var token: String
    /// The `jti`, `sub_id.sub` (an opaque `sub_id`'s `id`: the stream's) and the one event type, read from the claims (empty when unreadable).
    public var jti: String
    public var sub: String
    public var eventType: String
    /// The status answered, and the `err` code when it was an error.
    public var status: Int
    public var error: String?
}

/// An SSF push receiver written from RFC 8935 (§ 2.2–2.4) on 127.0.0.1, port 0: checks the method, the
/// media type, the Authorization header, the SET's `typ`, RS256 signature by `kid` from `keys`, `iss` and
/// `aud`, then answers 202, or 400 with `{"err","description"}` (`invalid_request`, `invalid_key`,
/// `authentication_failed`, `invalid_issuer`, `invalid_audience`). `override`, when it answers, replaces
/// the verdict for a valid SET (a test's scripted failure: a status and optional err code).
public final class SETReceiver: Sendable {
    private let server: HTTPServer
    private final class Log: Sendable {
        let list = Mutex<[ReceivedSET]>([])
    }
    private let log = Log()
    /// The port it listens on.
    public let port: Int
    /// `http://127.0.0.1:PORT/events`.
    public var url: String { "http://127.0.0.1:\(port)/events" }

    public init(
        keys: JSONWebKeySet, issuer: String, audience: String, authorization: String?, threads: Int = 8,
        override:
            @escaping @Sendable (_ set: ReceivedSET, _ seenBefore: Int) -> (status: Int, err: String?)? = {
                _, _ in nil
            }
    ) throws {
        let log = self.log
        server = HTTPServer(
            configuration: HTTPServer.Configuration(host: "127.0.0.1", port: 0, threadCount: threads)
        ) { request in
            var received = ReceivedSET(
                token: String(decoding: request.body, as: UTF8.self), jti: "", sub: "", eventType: "",
                status: 0)
            var verdict: (Int, String?) = (202, nil)
            if request.method != "POST" || request.headers["Content-Type"] != "application/secevent+jwt" {
                verdict = (400, "invalid_request")
            } else if let authorization, request.headers["Authorization"] != authorization {
                verdict = (400, "authentication_failed")
            } else {
                verdict = Self.check(
                    received.token, keys: keys, issuer: issuer, audience: audience, into: &received)
            }
            if verdict.0 == 202 {
                let seen = log.list.withLock { list in list.filter { $0.jti == received.jti }.count }
                if let scripted = override(received, seen) { verdict = scripted }
            }
            received.status = verdict.0
            received.error = verdict.1
            log.list.withLock { $0.append(received) }
            guard let err = verdict.1 else { return HTTPResponse(status: verdict.0) }
            let body = try? JSONSerialization.data(withJSONObject: [
                "err": err, "description": "test receiver: \(err)",
            ])
            return HTTPResponse(
                status: verdict.0, headers: ["Content-Type": "application/json"],
                body: [UInt8](body ?? Data()))
        }
        try server.start()
        port = server.port ?? 0
    }

    deinit { server.shutdown(gracePeriod: .zero) }

    /// Everything received, in arrival order.
    public var received: [ReceivedSET] { log.list.withLock { $0 } }
    /// Those answered 202.
    public var accepted: [ReceivedSET] { received.filter { $0.status == 202 } }

    private static func check(
        _ token: String, keys: JSONWebKeySet, issuer: String, audience: String,
        into received: inout ReceivedSET
    ) -> (Int, String?) {
        guard let jws = try? CompactJWS(token),
            let header = try? JSONSerialization.jsonObject(with: jws.header) as? [String: Any],
            let claims = try? JSONSerialization.jsonObject(with: jws.payload) as? [String: Any],
            header["typ"] as? String == "secevent+jwt", jws.algorithm == "RS256"
        else { return (400, "invalid_request") }
        received.jti = claims["jti"] as? String ?? ""
        let subject = claims["sub_id"] as? [String: Any]
        received.sub = subject?["sub"] as? String ?? subject?["id"] as? String ?? ""
        received.eventType = (claims["events"] as? [String: Any])?.keys.first ?? ""
        guard let kid = jws.keyID, let key = keys.key(id: kid),
            key.verifyRS256(signature: jws.signature, signedData: jws.signingInput)
        else { return (400, "invalid_key") }
        guard claims["iss"] as? String == issuer else { return (400, "invalid_issuer") }
        guard claims["aud"] as? String == audience else { return (400, "invalid_audience") }
        guard (claims["events"] as? [String: Any])?.count == 1, !received.jti.isEmpty, claims["exp"] == nil
        else { return (400, "invalid_request") }
        return (202, nil)
    }
}
