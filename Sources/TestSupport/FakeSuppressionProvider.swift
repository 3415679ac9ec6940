public import Foundation
public import HTTPServer
import ServiceSupport
import Synchronization

/// A fake ESP suppression API on 127.0.0.1 (port 0), written from each provider's public reference:
/// SendGrid's global suppressions (`POST /v3/asm/suppressions/global` → 201 with the addresses,
/// `GET`/`DELETE …/global/{email}` → the address or `{}`; 204, 404 when absent; `Authorization: Bearer
/// KEY`), Postmark's stream suppressions (`POST /message-streams/{stream}/suppressions` and `…/delete` →
/// 200 with a Status per address, `GET …/suppressions/dump?EmailAddress=`; `X-Postmark-Server-Token`,
/// 401 without) and Mailgun's unsubscribes (`POST /v3/{domain}/unsubscribes` form `address` → 200,
/// `GET`/`DELETE …/{address}` → 200, 404 when absent; basic auth `api:KEY`). Its list starts with ``preset`` (what the ESP suppressed itself); ``script`` answers
/// the next requests in its place (a 429 with headers, a 5xx, a hang) before the API answers again.
///
/// TEST ONLY.
public final class FakeSuppressionProvider: Sendable {
    /// Which API it speaks.
    public enum Kind: String, Sendable { case sendgrid, postmark, mailgun }

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

        public init(status: Int, headers: [(String, String)] = [], delay: Duration = .zero) {
            self.status = status
            self.headers = headers
            self.delay = delay
        }
    }

    private struct State {
        var suppressed: Set<String> = []
        var calls: [Call] = []
        var script: [Scripted] = []
        var down: Scripted?
    }

    private final class Shared: Sendable {
        let state: Mutex<State>
        init(_ state: State) { self.state = Mutex(state) }
    }

    /// The API it speaks.
    public let kind: Kind
    /// The credential it accepts.
    public let credential: String
    /// The port (127.0.0.1).
    public let port: Int
    private let server: HTTPServer
    private let shared: Shared

    /// Starts a fake of `kind` accepting `credential`, its list holding `preset`.
    public init(_ kind: Kind, credential: String = "test-credential", preset: Set<String> = []) throws {
        self.kind = kind
        self.credential = credential
        let shared = Shared(State(suppressed: preset))
        self.shared = shared
        server = HTTPServer(
            configuration: HTTPServer.Configuration(host: "127.0.0.1", port: 0, threadCount: 4)
        ) {
            request in
            Self.answer(request, kind: kind, credential: credential, shared: shared)
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
    /// Answers the next requests with `answers`, in order, in the API's place.
    public func script(_ answers: [Scripted]) { shared.state.withLock { $0.script += answers } }
    /// Answers every request with `answer` (nil: the API again) until told otherwise.
    public func setDown(_ answer: Scripted?) { shared.state.withLock { $0.down = answer } }

    private static func answer(_ request: HTTPRequest, kind: Kind, credential: String, shared: Shared)
        -> HTTPResponse
    {
        let address = Self.address(of: request, kind: kind)
        let scripted: Scripted? = shared.state.withLock { state in
            if let down = state.down { return down }
            return state.script.isEmpty ? nil : state.script.removeFirst()
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
            let result = Self.apply(request, kind: kind, credential: credential, address: address, to: &state)
            state.calls.append(
                Call(method: request.method, path: request.path, address: address ?? "", status: result.0))
            return result
        }
        return HTTPResponse(status: status, headers: ["Content-Type": "application/json"], body: body)
    }

    private static func apply(
        _ request: HTTPRequest, kind: Kind, credential: String, address: String?, to state: inout State
    ) -> (Int, [UInt8]) {
        func json(_ object: Any) -> [UInt8] {
            Array((try? JSONSerialization.data(withJSONObject: object)) ?? Data())
        }
        switch kind {
        case .sendgrid:
            guard request.headers["Authorization"] == "Bearer \(credential)" else {
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
        case .mailgun:
            let basic = "Basic " + Data("api:\(credential)".utf8).base64EncodedString()
            guard request.headers["Authorization"] == basic else { return (401, Array("Forbidden".utf8)) }
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
        case .mailgun:
            let form = String(decoding: request.body, as: UTF8.self).split(separator: "&")
            for pair in form where pair.hasPrefix("address=") {
                return String(pair.dropFirst("address=".count)).removingPercentEncoding
            }
            return nil
        }
    }
}
