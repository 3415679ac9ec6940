import Foundation
import HTTPServer
import Postgres
import ServiceSupport
import SharedSignals

/// A stream as the API reads it: one of the caller's rows of `siwa.ssf_streams`.
struct StreamRecord {
    static let select = """
        SELECT id, stream_uid, audience, delivery_method, endpoint_url, authorization_ref,
               array_to_string(events_requested, ' '), events_requested IS NULL, status, status_reason,
               description, min_verification_interval
          FROM siwa.ssf_streams
        """

    var id: Int
    var uid: String
    var audience: String
    var method: String
    var endpointURL: String
    var authorizationReference: String?
    /// Nil: every supported type.
    var events: [String]?
    var status: String
    var reason: String?
    var description: String?
    var minVerificationInterval: Int

    init(row: PostgresRow) throws(PostgresError) {
        id = try row[0, as: Int.self]
        uid = try row[1, as: String.self]
        audience = try row[2, as: String.self]
        method = try row[3, as: String.self]
        endpointURL = try row[4, as: String.self]
        authorizationReference = try row[5, as: String?.self]
        let all = try row[7, as: Bool.self]
        let listed = try row[6, as: String?.self] ?? ""
        events = all ? nil : listed.split(separator: " ").map(String.init)
        status = try row[8, as: String.self]
        reason = try row[9, as: String?.self]
        description = try row[10, as: String?.self]
        minVerificationInterval = try row[11, as: Int.self]
    }
}

/// The body of a create, update or replace, checked.
struct StreamRequest {
    var method: String?
    var endpointURL: String?
    /// `.some(nil)`: not given (keep); `.some(.some(x))`: the new value.
    var authorizationHeader: String??
    var events: [String]??
    var description: String??

    /// Nil and the refusal's text when a member is not of its kind.
    static func parse(_ object: [String: Any]) -> (StreamRequest?, String?) {
        var request = StreamRequest()
        if let delivery = object["delivery"] {
            guard let delivery = delivery as? [String: Any] else { return (nil, "delivery is an object") }
            guard let method = delivery["method"] as? String,
                method == DeliveryMethod.push || method == DeliveryMethod.poll
            else { return (nil, "delivery.method is urn:ietf:rfc:8935 or urn:ietf:rfc:8936") }
            request.method = method
            if method == DeliveryMethod.push {
                let url = delivery["endpoint_url"] as? String ?? ""
                if let problem = pushURLProblem(url) { return (nil, "delivery.endpoint_url: " + problem) }
                request.endpointURL = url
                if let header = delivery["authorization_header"] {
                    guard let header = header as? String, (1...4096).contains(header.utf8.count),
                        !hasControlCharacters(header)
                    else { return (nil, "delivery.authorization_header is a header value") }
                    request.authorizationHeader = .some(header)
                } else {
                    request.authorizationHeader = .some(nil)
                }
            }
        } else {
            request.authorizationHeader = nil
        }
        if let events = object["events_requested"] {
            guard let list = events as? [String], list.count <= 64, list.allSatisfy({ $0.utf8.count <= 300 })
            else {
                return (nil, "events_requested is an array of event type URIs")
            }
            request.events = .some(list)
        }
        if let description = object["description"] {
            guard let text = description as? String, text.count <= 300, !hasControlCharacters(text) else {
                return (nil, "description is text of at most 300 characters")
            }
            request.description = .some(text)
        }
        return (request, nil)
    }
}

/// Why a push URL is refused: https, or http to a loopback literal (for tests); nil when usable.
func pushURLProblem(_ text: String) -> String? {
    guard text.utf8.count <= 2048, let url = URL(string: text), let host = url.host, !host.isEmpty else {
        return "not an absolute URL"
    }
    if url.scheme == "https" { return nil }
    let bare = host.trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
    if url.scheme == "http", bare == "::1" || bare.hasPrefix("127.") { return nil }
    return "https, or http to a loopback address"
}

extension SignalTransmitter {
    /// The configuration endpoint: POST create (201), GET read one or all, PATCH update, PUT replace,
    /// DELETE (204) — SSF 1.0 § 8.1.1.
    func streams(_ request: HTTPRequest) throws -> HTTPResponse {
        let scope = request.method == "GET" ? Scope.read : Scope.manage
        guard ["GET", "POST", "PATCH", "PUT", "DELETE"].contains(request.method) else {
            return .methodNotAllowed
        }
        let caller: Caller
        switch try authenticate(request, scope: scope) {
        case .success(let found): caller = found
        case .failure(let refusal): return refusal
        }
        switch request.method {
        case "GET":
            if let uid = queryItem(request, "stream_id") {
                guard let stream = try stream(uid, of: caller) else { return .streamNotFound }
                return .jsonObject(200, representation(stream))
            }
            let all = try pool.withConnection { connection in
                try connection.query(
                    StreamRecord.select + " WHERE receiver_id = $1 ORDER BY id",
                    [.int(Int64(caller.receiver))]
                )
                .map { row throws(PostgresError) in try StreamRecord(row: row) }
            }
            return .jsonObject(200, all.map(representation))
        case "DELETE":
            guard let uid = queryItem(request, "stream_id") ?? (jsonBody(request)?["stream_id"] as? String)
            else {
                return .ssfError(status: 400, "invalid_request", "stream_id is required")
            }
            guard let stream = try stream(uid, of: caller) else { return .streamNotFound }
            _ = try pool.withConnection { connection in
                try connection.value(
                    "SELECT siwa.remove_ssf_stream($1::bigint)", [.int(Int64(stream.id))], as: Bool.self)
            }
            removeAuthorizationFile(stream.authorizationReference)
            return HTTPResponse(status: 204)
        default:
            guard let object = jsonBody(request) else {
                return .ssfError(status: 400, "invalid_request", "the body is a JSON object")
            }
            let (parsed, problem) = StreamRequest.parse(object)
            guard let parsed else { return .ssfError(status: 400, "invalid_request", problem) }
            if request.method == "POST" { return try create(parsed, caller: caller) }
            guard let uid = object["stream_id"] as? String else {
                return .ssfError(status: 400, "invalid_request", "stream_id is required")
            }
            guard let stream = try stream(uid, of: caller) else { return .streamNotFound }
            if let member = differingTransmitterMember(object, stream) {
                return .ssfError(status: 400, "invalid_request", "\(member) is the transmitter's and differs")
            }
            return try change(stream, with: parsed, replacing: request.method == "PUT")
        }
    }

    private func create(_ request: StreamRequest, caller: Caller) throws -> HTTPResponse {
        // SSF 1.0 § 8.1.1.1: without delivery the receiver polls.
        let method = request.method ?? DeliveryMethod.poll
        let uid = UUID().uuidString.lowercased()
        let endpoint = method == DeliveryMethod.poll ? pollURL(uid) : request.endpointURL ?? ""
        let requested = request.events ?? nil
        let delivered = delivered(requested)
        var reference: String?
        if case .some(.some(let header)) = request.authorizationHeader {
            guard let written = try writeAuthorization(header, stream: uid) else {
                return .ssfError(
                    status: 400, "invalid_request",
                    "this transmitter takes no authorization_header (no --ssf-authorization-dir)")
            }
            reference = written
        }
        do {
            // False (nothing written) for an unknown receiver: the read below answers 404.
            _ = try pool.withConnection { connection in
                try connection.value(
                    "SELECT siwa.create_ssf_stream($1, $2::bigint, $3, $4, $5, $6::text[], $7, $8::integer, $9)",
                    [
                        .text(uid), .int(Int64(caller.receiver)), .text(method), .text(endpoint),
                        reference.map { .text($0) }, delivered.map { .array($0.map { .text($0) }) },
                        .text(configuration.defaultSubjects.rawValue),
                        .int(Int64(configuration.minVerificationInterval)),
                        (request.description ?? nil).map { .text($0) },
                    ], as: Bool.self)
            }
        } catch {
            removeAuthorizationFile(reference)
            throw error
        }
        guard let stream = try stream(uid, of: caller) else { return .streamNotFound }
        var answer = representation(stream)
        answer["events_requested"] = requested ?? SecurityEventToken.EventType.all
        return .jsonObject(201, answer)
    }

    private func change(_ stream: StreamRecord, with request: StreamRequest, replacing: Bool) throws
        -> HTTPResponse
    {
        if let method = request.method, method != stream.method {
            return .ssfError(status: 400, "invalid_request", "the delivery method of a stream cannot change")
        }
        if replacing, request.method == nil {
            return .ssfError(status: 400, "invalid_request", "a replacement needs delivery")
        }
        var events: [String]? = stream.events
        var description = stream.description
        var endpoint = stream.endpointURL
        var reference = stream.authorizationReference
        var oldFile: String?
        if replacing {
            events = delivered(request.events ?? nil)
            description = request.description ?? nil
        } else {
            if let requested = request.events { events = delivered(requested) }
            if let given = request.description { description = given }
        }
        if stream.method == DeliveryMethod.push, let url = request.endpointURL { endpoint = url }
        if let header = request.authorizationHeader, replacing || header != nil {
            oldFile = reference
            reference = nil
            if let header {
                guard
                    let written = try writeAuthorization(
                        header, stream: stream.uid + "-" + UUID().uuidString.prefix(8).lowercased())
                else {
                    return .ssfError(
                        status: 400, "invalid_request",
                        "this transmitter takes no authorization_header (no --ssf-authorization-dir)")
                }
                reference = written
            }
        }
        _ = try pool.withConnection { connection in
            try connection.value(
                "SELECT siwa.change_ssf_stream($1::bigint, $2::text[], $3, $4, $5)",
                [
                    .int(Int64(stream.id)), events.map { .array($0.map { .text($0) }) },
                    description.map { .text($0) }, .text(endpoint), reference.map { .text($0) },
                ], as: Bool.self)
        }
        if oldFile != reference { removeAuthorizationFile(oldFile) }
        guard let updated = try self.stream(stream.uid, receiver: nil) else { return .streamNotFound }
        return .jsonObject(200, representation(updated))
    }

    /// The status endpoint (SSF 1.0 § 8.1.2): GET reads (`ssf.read`), POST sets (`ssf.manage`);
    /// a change enqueues a stream-updated SET.
    func status(_ request: HTTPRequest) throws -> HTTPResponse {
        guard request.method == "GET" || request.method == "POST" else { return .methodNotAllowed }
        let caller: Caller
        switch try authenticate(request, scope: request.method == "GET" ? Scope.read : Scope.manage) {
        case .success(let found): caller = found
        case .failure(let refusal): return refusal
        }
        if request.method == "GET" {
            guard let uid = queryItem(request, "stream_id") else {
                return .ssfError(status: 400, "invalid_request", "stream_id is required")
            }
            guard let stream = try stream(uid, of: caller) else { return .streamNotFound }
            return .jsonObject(200, statusRepresentation(stream))
        }
        guard let object = jsonBody(request), let uid = object["stream_id"] as? String else {
            return .ssfError(status: 400, "invalid_request", "stream_id is required")
        }
        guard let status = object["status"] as? String, ["enabled", "paused", "disabled"].contains(status)
        else {
            return .ssfError(status: 400, "invalid_request", "status is enabled, paused or disabled")
        }
        let reason = object["reason"] as? String
        if let reason, reason.count > 300 || hasControlCharacters(reason) {
            return .ssfError(status: 400, "invalid_request", "reason is text of at most 300 characters")
        }
        guard let stream = try stream(uid, of: caller) else { return .streamNotFound }
        _ = try pool.withConnection { connection in
            try connection.value(
                "SELECT siwa.update_ssf_stream_status($1, $2, $3)",
                [.int(Int64(stream.id)), .text(status), reason.map { .text($0) }], as: Bool.self)
        }
        guard let updated = try self.stream(uid, of: caller) else { return .streamNotFound }
        return .jsonObject(200, statusRepresentation(updated))
    }

    /// Add (200) or remove (204) an `iss_sub` subject of Apple's (SSF 1.0 §§ 8.1.3.2, 8.1.3.3).
    func subject(_ request: HTTPRequest, add: Bool) throws -> HTTPResponse {
        let caller: Caller
        switch try authenticate(request, scope: Scope.manage) {
        case .success(let found): caller = found
        case .failure(let refusal): return refusal
        }
        guard let object = jsonBody(request), let uid = object["stream_id"] as? String else {
            return .ssfError(status: 400, "invalid_request", "stream_id is required")
        }
        guard let subject = object["subject"] as? [String: Any], subject["format"] as? String == "iss_sub",
            subject["iss"] as? String == SecurityEventToken.subjectIssuer,
            let sub = subject["sub"] as? String,
            (1...255).contains(sub.utf8.count), !hasControlCharacters(sub)
        else {
            return .ssfError(
                status: 400, "invalid_request",
                "subject is an iss_sub identifier of https://appleid.apple.com")
        }
        guard let stream = try stream(uid, of: caller) else { return .streamNotFound }
        _ = try pool.withConnection { connection in
            try connection.query(
                "SELECT siwa.set_ssf_stream_subject($1::bigint, $2, $3::boolean)",
                [.int(Int64(stream.id)), .text(sub), .bool(add)])
        }
        return add ? .jsonObject(200, [String: Any]()) : HTTPResponse(status: 204)
    }

    /// The verification endpoint (SSF 1.0 § 8.1.4.2): a verification SET with the given `state`, 204; 429
    /// with `Retry-After` when sooner than the stream's `min_verification_interval`.
    func verify(_ request: HTTPRequest) throws -> HTTPResponse {
        let caller: Caller
        switch try authenticate(request, scope: Scope.manage) {
        case .success(let found): caller = found
        case .failure(let refusal): return refusal
        }
        guard let object = jsonBody(request), let uid = object["stream_id"] as? String else {
            return .ssfError(status: 400, "invalid_request", "stream_id is required")
        }
        let state = object["state"] as? String
        if let state, state.utf8.count > 1024 || hasControlCharacters(state) {
            return .ssfError(status: 400, "invalid_request", "state is text of at most 1024 bytes")
        }
        guard let stream = try stream(uid, of: caller) else { return .streamNotFound }
        let wait = try pool.withConnection { connection in
            try connection.value(
                "SELECT siwa.request_ssf_verification($1, $2)",
                [.int(Int64(stream.id)), state.map { .text($0) }],
                as: Double?.self)
        }
        guard let wait else { return .streamNotFound }
        guard wait <= 0 else {
            var response = HTTPResponse.ssfError(status: 429, "too_many_requests")
            response.headers.replaceOrAdd(name: "Retry-After", value: String(Int(wait.rounded(.up))))
            return response
        }
        return HTTPResponse(status: 204)
    }

    // MARK: Helpers

    /// The caller's stream with this `stream_id`, or nil (another receiver's stream is not found either).
    func stream(_ uid: String, of caller: Caller) throws -> StreamRecord? {
        try stream(uid, receiver: caller.receiver)
    }

    private func stream(_ uid: String, receiver: Int?) throws -> StreamRecord? {
        guard uid.utf8.count <= 64 else { return nil }
        return try pool.withConnection { connection in
            try connection.query(
                StreamRecord.select + " WHERE stream_uid = $1 AND ($2::bigint IS NULL OR receiver_id = $2)",
                [.text(uid), receiver.map { .int(Int64($0)) }]
            ).first.map { row throws(PostgresError) in try StreamRecord(row: row) }
        }
    }

    /// The first Transmitter-Supplied member of an update or replace that differs from the stream's (SSF 1.0
    /// § 8.1.1.3), or nil; receivers echo the configuration back, so equal ones (lists in any order) pass.
    func differingTransmitterMember(_ object: [String: Any], _ stream: StreamRecord) -> String? {
        let current = representation(stream)
        if let iss = object["iss"], iss as? String != configuration.issuer { return "iss" }
        if let aud = object["aud"], aud as? String != stream.audience, aud as? [String] != [stream.audience] {
            return "aud"
        }
        for member in ["events_supported", "events_delivered"] {
            guard let given = object[member] else { continue }
            guard let list = given as? [String], Set(list) == Set(current[member] as? [String] ?? []) else {
                return member
            }
        }
        return nil
    }

    /// `events_delivered`: the requested types this transmitter supports (nil requested: all).
    func delivered(_ requested: [String]?) -> [String]? {
        guard let requested else { return nil }
        return SecurityEventToken.EventType.all.filter(requested.contains)
    }

    func pollURL(_ uid: String) -> String { configuration.issuer + Path.pollPrefix + uid }

    /// A stream as SSF 1.0 § 8.1.1 shows it. The authorization header is never shown: `delivery` says
    /// only the method and endpoint.
    func representation(_ stream: StreamRecord) -> [String: Any] {
        let delivered = stream.events ?? SecurityEventToken.EventType.all
        var object: [String: Any] = [
            "stream_id": stream.uid, "iss": configuration.issuer, "aud": stream.audience,
            "events_supported": SecurityEventToken.EventType.all, "events_requested": delivered,
            "events_delivered": delivered,
            "delivery": ["method": stream.method, "endpoint_url": stream.endpointURL],
            "min_verification_interval": stream.minVerificationInterval,
        ]
        if let description = stream.description { object["description"] = description }
        return object
    }

    private func statusRepresentation(_ stream: StreamRecord) -> [String: Any] {
        var object: [String: Any] = ["stream_id": stream.uid, "status": stream.status]
        if let reason = stream.reason { object["reason"] = reason }
        return object
    }

    func jsonBody(_ request: HTTPRequest) -> [String: Any]? {
        try? JSONSerialization.jsonObject(with: request.data) as? [String: Any]
    }

    func queryItem(_ request: HTTPRequest, _ name: String) -> String? {
        guard let query = request.query else { return nil }
        return FormBody(Data(query.utf8))[name]
    }

    /// Writes `header` to a new file of the authorization directory (mode 0600); its `file:PATH`
    /// reference, or nil when there is no directory.
    private func writeAuthorization(_ header: String, stream: String) throws -> String? {
        guard let directory = configuration.authorizationDirectory else { return nil }
        let path = directory + "/ssf-" + stream + ".authorization"
        let temporary = path + ".tmp"
        guard
            FileManager.default.createFile(
                atPath: temporary, contents: Data((header + "\n").utf8),
                attributes: [.posixPermissions: 0o600]),
            rename(temporary, path) == 0
        else {
            unlink(temporary)
            throw AuthorizationFileError()
        }
        return "file:" + path
    }

    /// Removes a file this API wrote (never another: only inside the authorization directory).
    private func removeAuthorizationFile(_ reference: String?) {
        guard let reference, let directory = configuration.authorizationDirectory,
            reference.hasPrefix("file:" + directory + "/ssf-")
        else { return }
        unlink(String(reference.dropFirst(5)))
    }
}

/// The authorization header's file could not be written.
struct AuthorizationFileError: Error {}

extension HTTPResponse {
    static var streamNotFound: HTTPResponse { .ssfError(status: 404, "not_found", "no such stream") }
}
