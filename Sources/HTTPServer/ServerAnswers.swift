import CHTTPShim

/// The answers the server gives by itself, without calling the handler, closing the connection after
/// each. Their statuses and bodies are decided here; the C shim only queues what it is given.
enum ServerAnswers {
    /// A request whose framing is ambiguous (see ``HTTPFraming``).
    static let badRequest = CannedResponse(status: 400, body: #"{"error":"bad request"}"#)
    /// A body over ``HTTPServer/Configuration/maxBodyBytes``: announced by `Content-Length`, or a chunked
    /// one that went past it.
    static let contentTooLarge = CannedResponse(status: 413, body: #"{"error":"payload too large"}"#)
    /// No memory for a new request's state.
    static let overloaded = CannedResponse(status: 503, body: #"{"error":"server overloaded"}"#)
    /// A request that completed after a shutdown's grace period; Apple retries a 503.
    static let shuttingDown = CannedResponse(status: 503, body: #"{"error":"shutting down"}"#)
}

/// A response in the C shim's form, allocated once and never freed: the process's static constants
/// above, so that the pointers the daemon holds stay valid for as long as any daemon runs.
final class CannedResponse: @unchecked Sendable {  // immutable after init
    let pointer: UnsafeMutablePointer<siwa_http_canned_response>
    /// The status, for Swift callers.
    let status: Int

    init(status: Int, body: StaticString, contentType: StaticString = "application/json") {
        self.status = status
        pointer = .allocate(capacity: 1)
        pointer.initialize(
            to: siwa_http_canned_response(
                status: UInt32(status), content_type: Self.cString(contentType), body: Self.cString(body),
                body_length: body.utf8CodeUnitCount))
    }

    /// A static string's bytes (immortal), as a C string.
    private static func cString(_ text: StaticString) -> UnsafePointer<CChar> {
        UnsafeRawPointer(text.utf8Start).assumingMemoryBound(to: CChar.self)
    }
}
