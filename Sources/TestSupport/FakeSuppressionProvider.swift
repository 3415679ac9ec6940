import AppleNotifications
public import Foundation
public import HTTPServer
import ServiceSupport
import Suppressions
import Synchronization

/// A fake ESP suppression API on 127.0.0.1 (port 0), written from each provider's public reference:
/// SendGrid's global suppressions (`POST /v3/asm/suppressions/global` → 201 with the addresses,
/// `GET`/`DELETE …/global/{email}` → the address or `{}`; 204, 404 when absent; `Authorization: Bearer
/// KEY`), Postmark's stream suppressions (`POST /message-streams/{stream}/suppressions` and `…/delete` →
/// 200 with a Status per address, `GET …/suppressions/dump?EmailAddress=`; `X-Postmark-Server-Token`,
/// 401 without) and Mailgun's unsubscribes (`POST /v3/{domain}/unsubscribes` form `address` → 200,
/// `GET`/`DELETE …/{address}` → 200, 404 when absent; basic auth `api:KEY`) and Amazon SES v2's account
/// suppression list (`PUT /v2/email/suppression/addresses` → 200, `GET`/`DELETE …/addresses/{address}` →
/// 200, 404 `NotFoundException` when absent; every request's SigV4 signature recomputed and checked, 403
/// `InvalidSignatureException` when it differs). Its list starts with ``preset`` (what the ESP suppressed itself); ``script`` answers
/// the next requests in its place (a 429 with headers, a 5xx, a hang) before the API answers again.
///
/// TEST ONLY.
public final class FakeSuppressionProvider: Sendable {
    /// Which API it speaks.
    public enum Kind: String, Sendable { case sendgrid, postmark, mailgun, ses }

    /// The access key id the SES fake accepts (its secret is ``credential``), and its region.
    public static let sesAccessKeyID = "AKIDFAKESES"
    public static let sesRegion = "us-east-1"

    /// One SES entry: why it is listed, when it was last updated, the message that caused it (SES's own).
    public struct SESEntry: Sendable, Equatable {
        public var reason: String
        public var lastUpdate: Date
        public var messageID: String?
    }

    /// One request as received (the credential checked, not kept).
    public struct Call: Sendable, Equatable {
        public var method: String
        public var path: String
        /// The address the request was about.
        public var address: String
        /// The status answered.
        public var status: Int
    }

    /// An answer given in the API's place.
    public struct Scripted: Sendable {
        public var status: Int
        public var headers: [(String, String)]
        /// How long to wait before answering (past the client's deadline: a timeout).
        public var delay: Duration
        /// Whether the API does what was asked and answers itself, only `delay` late (``late(_:)``).
        public var applies = false

        public init(status: Int, headers: [(String, String)] = [], delay: Duration = .zero) {
            self.status = status
            self.headers = headers
            self.delay = delay
        }

        /// The API's own answer, having done what was asked, `delay` late (past the deadline: the change
        /// is made, the client never hears of it); `.late(.zero)` lets one request through a script.
        public static func late(_ delay: Duration) -> Scripted {
            var scripted = Scripted(status: 0, delay: delay)
            scripted.applies = true
            return scripted
        }
    }

    private struct State {
        var suppressed: Set<String> = []
        var ses: [String: SESEntry] = [:]
        var calls: [Call] = []
        var script: [Scripted] = []
        var down: Scripted?
        var credential = ""
    }

    private final class Shared: Sendable {
        let state: Mutex<State>
        init(_ state: State) { self.state = Mutex(state) }
    }

    /// The API it speaks.
    public let kind: Kind
    /// The credential it accepts (``rotateCredential(_:)`` changes it).
    public var credential: String { shared.state.withLock { $0.credential } }
    /// The port (127.0.0.1).
    public let port: Int
    private let server: HTTPServer
    private let shared: Shared

    /// Starts a fake of `kind` accepting `credential`, its list holding `preset`.
    public init(_ kind: Kind, credential: String = "test-credential", preset: Set<String> = []) throws {
        self.kind = kind
        var state = State(suppressed: preset)
        state.credential = credential
        for address in preset {
            state.ses[address] = SESEntry(
                reason: "BOUNCE", lastUpdate: Date(), messageID: "preset-\(address)")
        }
        let shared = Shared(state)
        self.shared = shared
        server = HTTPServer(
            configuration: HTTPServer.Configuration(host: "127.0.0.1", port: 0, threadCount: 4)
        ) {
            request in
            Self.answer(request, kind: kind, shared: shared)
        }
        try server.start()
        port = server.port ?? 0
    }

    deinit { _ = server.shutdown(gracePeriod: .zero) }

    /// `http://127.0.0.1:PORT`, the origin an adapter is given.
    public var baseURL: String { "http://127.0.0.1:\(port)" }
    /// The requests received so far, in order.
    public var calls: [Call] { shared.state.withLock { $0.calls } }
    /// The addresses its list holds now.
    public var suppressed: Set<String> { shared.state.withLock { $0.suppressed } }
    /// The SES fake's entries now.
    public var sesEntries: [String: SESEntry] { shared.state.withLock { $0.ses } }
    /// As SES does on a hard bounce or complaint of its own: `address` listed for a message of its own.
    public func suppressAsSES(_ address: String, reason: String = "BOUNCE") {
        shared.state.withLock {
            $0.suppressed.insert(address)
            $0.ses[address] = SESEntry(reason: reason, lastUpdate: Date(), messageID: UUID().uuidString)
        }
    }
    /// Answers the next requests with `answers`, in order, in the API's place.
    public func script(_ answers: [Scripted]) { shared.state.withLock { $0.script += answers } }
    /// Answers every request with `answer` (nil: the API again) until told otherwise.
    public func setDown(_ answer: Scripted?) { shared.state.withLock { $0.down = answer } }

    /// Accepts `credential` from now on, and no longer the one before (a key rotated at the ESP).
    public func rotateCredential(_ credential: String) {
        shared.state.withLock { $0.credential = credential }
    }

    private static func answer(_ request: HTTPRequest, kind: Kind, shared: Shared) -> HTTPResponse {
        let address = Self.address(of: request, kind: kind)
        let scripted: Scripted? = shared.state.withLock { state in
            if let down = state.down { return down }
            return state.script.isEmpty ? nil : state.script.removeFirst()
        }
        if let scripted, scripted.applies {
            let (status, body) = shared.state.withLock { state -> (Int, [UInt8]) in
                let credential = state.credential
                let result = Self.apply(
                    request, kind: kind, credential: credential, address: address, to: &state)
                state.calls.append(
                    Call(method: request.method, path: request.path, address: address ?? "", status: result.0)
                )
                return result
            }
            if scripted.delay > .zero { Thread.sleep(forTimeInterval: scripted.delay.inSeconds) }
            return HTTPResponse(status: status, headers: ["Content-Type": "application/json"], body: body)
        }
        if let scripted {
            if scripted.delay > .zero { Thread.sleep(forTimeInterval: scripted.delay.inSeconds) }
            shared.state.withLock {
                $0.calls.append(
                    Call(
                        method: request.method, path: request.path, address: address ?? "",
                        status: scripted.status))
            }
            return HTTPResponse(status: scripted.status, headers: HTTPHeaders(scripted.headers))
        }
        let (status, body) = shared.state.withLock { state -> (Int, [UInt8]) in
            let credential = state.credential
            let result = Self.apply(request, kind: kind, credential: credential, address: address, to: &state)
            state.calls.append(
                Call(method: request.method, path: request.path, address: address ?? "", status: result.0))
            return result
        }
        var headers = [("Content-Type", "application/json")]
        let sesErrors = [
            400: "BadRequestException", 403: "InvalidSignatureException", 404: "NotFoundException",
        ]
        if kind == .ses, let type = sesErrors[status] { headers.append(("x-amzn-ErrorType", type)) }
        return HTTPResponse(status: status, headers: HTTPHeaders(headers), body: body)
    }

    private static func apply(
        _ request: HTTPRequest, kind: Kind, credential: String, address: String?, to state: inout State
    ) -> (Int, [UInt8]) {
        func json(_ object: Any) -> [UInt8] {
            Array((try? JSONSerialization.data(withJSONObject: object)) ?? Data())
        }
        switch kind {
        case .sendgrid:
            guard AuthorizationHeader.bearerToken(request.headers["Authorization"]) == credential else {
                return (401, json(["errors": []]))
            }
            guard let address else { return (400, json(["errors": [["message": "no address"]]])) }
            if request.method == "GET" {
                return (200, json(state.suppressed.contains(address) ? ["recipient_email": address] : [:]))
            }
            if request.method == "POST", request.path == "/v3/asm/suppressions/global" {
                state.suppressed.insert(address)
                return (201, json(["recipient_emails": [address]]))
            }
            if request.method == "DELETE", request.path.hasPrefix("/v3/asm/suppressions/global/") {
                return state.suppressed.remove(address) == nil ? (404, json(["errors": []])) : (204, [])
            }
            return (404, [])
        case .postmark:
            guard request.headers["X-Postmark-Server-Token"] == credential else {
                return (
                    401, json(["ErrorCode": 10, "Message": "No Account or Server API tokens were supplied."])
                )
            }
            guard let address, request.path.hasPrefix("/message-streams/") else {
                return (422, json(["ErrorCode": 300, "Message": "Invalid request"]))
            }
            if request.method == "GET", request.path.hasSuffix("/suppressions/dump") {
                let listed: [[String: Any]] =
                    state.suppressed.contains(address)
                    ? [["EmailAddress": address, "SuppressionReason": "HardBounce", "Origin": "Recipient"]]
                    : []
                return (200, json(["Suppressions": listed]))
            }
            guard request.method == "POST" else {
                return (422, json(["ErrorCode": 300, "Message": "Invalid request"]))
            }
            if request.path.hasSuffix("/suppressions") {
                state.suppressed.insert(address)
                return (
                    200,
                    json([
                        "Suppressions": [
                            ["EmailAddress": address, "Status": "Suppressed", "Message": NSNull()]
                        ]
                    ])
                )
            }
            if request.path.hasSuffix("/suppressions/delete") {
                state.suppressed.remove(address)
                return (
                    200,
                    json([
                        "Suppressions": [["EmailAddress": address, "Status": "Deleted", "Message": NSNull()]]
                    ])
                )
            }
            return (404, [])
        case .ses:
            if let refusal = sesSignatureProblem(request, secret: credential) {
                return (403, json(["message": refusal]))
            }
            guard let address else { return (400, json(["message": "EmailAddress is required"])) }
            let notFound = json([
                "message": "Email address \(address.count) characters long is not on the list"
            ])
            if request.method == "PUT", request.path == "/v2/email/suppression/addresses" {
                let body = try? JSONSerialization.jsonObject(with: request.data) as? [String: Any]
                guard let reason = body?["Reason"] as? String, ["BOUNCE", "COMPLAINT"].contains(reason) else {
                    return (400, json(["message": "Reason must be BOUNCE or COMPLAINT"]))
                }
                state.suppressed.insert(address)
                state.ses[address] = SESEntry(reason: reason, lastUpdate: Date(), messageID: nil)
                return (200, json([:]))
            }
            guard request.path.hasPrefix("/v2/email/suppression/addresses/") else { return (404, notFound) }
            if request.method == "GET" {
                guard let entry = state.ses[address] else { return (404, notFound) }
                var destination: [String: Any] = [
                    "EmailAddress": address, "Reason": entry.reason,
                    "LastUpdateTime": entry.lastUpdate.timeIntervalSince1970,
                ]
                if let message = entry.messageID {
                    destination["Attributes"] = ["MessageId": message, "FeedbackId": UUID().uuidString]
                }
                return (200, json(["SuppressedDestination": destination]))
            }
            if request.method == "DELETE" {
                guard state.ses.removeValue(forKey: address) != nil else { return (404, notFound) }
                state.suppressed.remove(address)
                return (200, json([:]))
            }
            return (404, notFound)
        case .mailgun:
            guard let basic = AuthorizationHeader.basicCredentials(request.headers["Authorization"]),
                basic.user == "api", basic.password == credential
            else { return (401, Array("Forbidden".utf8)) }
            guard let address else { return (400, json(["message": "address is required"])) }
            if request.method == "POST", request.path.hasSuffix("/unsubscribes") {
                state.suppressed.insert(address)
                return (
                    200,
                    json(["message": "Address has been added to the unsubscribes table", "address": address])
                )
            }
            if request.method == "GET" {
                return state.suppressed.contains(address)
                    ? (200, json(["address": address, "tags": ["*"]]))
                    : (404, json(["message": "Address not found in unsubscribers table"]))
            }
            if request.method == "DELETE" {
                return state.suppressed.remove(address) == nil
                    ? (404, json(["message": "Address not found in unsubscribers table"]))
                    : (200, json(["message": "Unsubscribe event has been removed", "address": address]))
            }
            return (404, [])
        }
    }

    /// Why the request's SigV4 signature is not the one AWS would compute for it, or nil when it is:
    /// scope, signed headers, content hash, a date within five minutes, the signature recomputed.
    private static func sesSignatureProblem(_ request: HTTPRequest, secret: String) -> String? {
        guard let authorization = request.headers["Authorization"],
            authorization.hasPrefix("AWS4-HMAC-SHA256 ")
        else { return "Missing Authentication Token" }
        var fields: [String: String] = [:]
        for part in authorization.dropFirst("AWS4-HMAC-SHA256 ".count).split(separator: ",") {
            let pair = part.trimmingCharacters(in: .whitespaces).split(separator: "=", maxSplits: 1)
            if pair.count == 2 { fields[String(pair[0])] = String(pair[1]) }
        }
        guard let credential = fields["Credential"], let signedHeaders = fields["SignedHeaders"],
            let signature = fields["Signature"], let timestamp = request.headers["X-Amz-Date"]
        else { return "Authorization header malformed" }
        let scope = credential.split(separator: "/").map(String.init)
        guard scope.count == 5, scope[0] == sesAccessKeyID, scope[1] == String(timestamp.prefix(8)),
            scope[2] == sesRegion, scope[3] == "ses", scope[4] == "aws4_request"
        else { return "The security token included in the request is invalid (credential scope)" }
        let names = signedHeaders.split(separator: ";").map(String.init)
        guard names.contains("host"), names.contains("x-amz-date"), names.contains("x-amz-content-sha256")
        else { return "host, x-amz-date and x-amz-content-sha256 must be signed" }
        let payloadHash = SHA256Digest.hash(request.data).map { String(format: "%02x", $0) }.joined()
        guard request.headers["X-Amz-Content-SHA256"] == payloadHash else {
            return "The provided x-amz-content-sha256 header does not match what was computed"
        }
        let now = SigV4Signer.timestamp(Date())
        let earliest = SigV4Signer.timestamp(Date().addingTimeInterval(-300))
        let latest = SigV4Signer.timestamp(Date().addingTimeInterval(300))
        guard timestamp.count == now.count, timestamp >= earliest, timestamp <= latest else {
            return "Signature expired"
        }
        var headers: [(String, String)] = []
        for name in names {
            guard let value = request.headers[name] else { return "a signed header is missing" }
            headers.append((name, value))
        }
        // The server decoded the path: encoded once as sent (every segment strictly), twice when signed.
        let path = request.path.split(separator: "/", omittingEmptySubsequences: false)
            .map { SigV4Signer.encode(String($0)) }.joined(separator: "/")
        let expected = SigV4Signer(
            credentials: .init(accessKeyID: sesAccessKeyID, secretAccessKey: secret), region: sesRegion,
            service: "ses"
        ).signature(
            method: request.method, path: path, query: request.query, headers: headers,
            payloadHash: payloadHash,
            timestamp: timestamp)
        guard expected.signature == signature else {
            return "The request signature we calculated does not match the signature you provided."
        }
        return nil
    }

    /// The address a request is about: in its JSON body, its form body, or its path's last segment.
    private static func address(of request: HTTPRequest, kind: Kind) -> String? {
        if request.method == "GET", kind == .postmark {
            for pair in (request.query ?? "").split(separator: "&") where pair.hasPrefix("EmailAddress=") {
                return String(pair.dropFirst("EmailAddress=".count)).removingPercentEncoding
            }
            return nil
        }
        if request.method == "DELETE" || request.method == "GET" {
            return request.path.split(separator: "/").last.flatMap { String($0).removingPercentEncoding }
        }
        switch kind {
        case .sendgrid:
            let body = try? JSONSerialization.jsonObject(with: request.data) as? [String: Any]
            return (body?["recipient_emails"] as? [String])?.first
        case .postmark:
            let body = try? JSONSerialization.jsonObject(with: request.data) as? [String: Any]
            return ((body?["Suppressions"] as? [[String: Any]])?.first?["EmailAddress"]) as? String
        case .ses:
            let body = try? JSONSerialization.jsonObject(with: request.data) as? [String: Any]
            return body?["EmailAddress"] as? String
        case .mailgun:
            let form = String(decoding: request.body, as: UTF8.self).split(separator: "&")
            for pair in form where pair.hasPrefix("address=") {
                return String(pair.dropFirst("address=".count)).removingPercentEncoding
            }
            return nil
        }
    }
}
