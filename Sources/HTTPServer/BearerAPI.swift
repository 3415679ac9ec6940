import Foundation
public import ServiceSupport

/// What the internal JSON APIs (the sign-in API, the relay-mail check) share: the bearer check, its
/// refusal, and one log line's fields per call.
extension HTTPRequest {
    /// Whether `Authorization` is `Bearer <token>` (the scheme in any case), compared in constant time.
    public func carriesBearer(_ token: String) -> Bool {
        guard let given = AuthorizationHeader.bearerToken(headers["Authorization"]) else { return false }
        return constantTimeEqual(Array(given.utf8), Array(token.utf8))
    }

    /// The fields of a call's log line: endpoint, method, status, request id, peer and a refusal's error
    /// word; never a body, a query or a header's value (they may hold addresses or tokens).
    public func callLogFields(endpoint: String, response: HTTPResponse) -> [String: Logger.Value] {
        var fields: [String: Logger.Value] = [
            "endpoint": .string(endpoint), "method": .string(method), "status": .int(response.status),
            "request_id": .string(id), "remote": .string(remoteAddress),
        ]
        if response.status >= 400 { fields["error"] = .string(response.errorWord) }
        return fields
    }
}

extension HTTPResponse {
    /// 401 `{"error":"unauthorized"}` with `WWW-Authenticate: Bearer`.
    public static var bearerRequired: HTTPResponse {
        var response = HTTPResponse.error(status: 401, "unauthorized")
        response.headers.replaceOrAdd(name: "WWW-Authenticate", value: "Bearer")
        return response
    }

    /// The error word of an ``error(status:_:)`` answer (`{"error": "<word>"}`): "none" below 400,
    /// "unknown" for a body without one.
    public var errorWord: String {
        guard status >= 400 else { return "none" }
        let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
        return object?["error"] as? String ?? "unknown"
    }
}
