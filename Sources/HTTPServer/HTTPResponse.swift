public import Foundation

/// An HTTP response produced by a handler.
public struct HTTPResponse: Sendable {
    /// The status code, e.g. 200.
    public var status: Int
    /// Header fields to send. `Content-Length` is computed by the server and must not be set here.
    public var headers: HTTPHeaders
    /// The response body.
    public var body: [UInt8]

    /// Creates a response with the given status, headers and body.
    public init(status: Int, headers: HTTPHeaders = [:], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// A response whose body is already-encoded JSON.
    public static func json(status: Int = 200, _ data: Data) -> HTTPResponse {
        HTTPResponse(
            status: status, headers: ["Content-Type": "application/json"], body: [UInt8](data))
    }

    /// A response whose body is `value` encoded as JSON (keys sorted, so output is stable).
    ///
    /// If encoding fails, the response is a 500 with `{"error":"internal error"}` instead.
    public static func json(status: Int = 200, _ value: some Encodable) -> HTTPResponse {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        guard let data = try? encoder.encode(value) else {
            return .json(status: 500, Data(#"{"error":"internal error"}"#.utf8))
        }
        return .json(status: status, data)
    }

    /// A plain-text (UTF-8) response.
    public static func text(status: Int = 200, _ text: String) -> HTTPResponse {
        HTTPResponse(
            status: status, headers: ["Content-Type": "text/plain; charset=utf-8"],
            body: Array(text.utf8))
    }

    /// A small JSON error body of the form `{"error":"<message>"}`.
    public static func error(status: Int, _ message: String) -> HTTPResponse {
        .json(status: status, ["error": message])
    }

    /// The body as `Data`.
    public var data: Data { Data(body) }
}
