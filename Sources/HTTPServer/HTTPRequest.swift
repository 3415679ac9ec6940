public import Foundation

/// A complete HTTP request, delivered to the handler once the whole body has arrived.
public struct HTTPRequest: Sendable {
    /// The method as sent, e.g. `GET` or `POST`.
    public var method: String
    /// The path without the query string, percent-decoded by the server.
    public var path: String
    /// The raw query string after `?` (not decoded), or `nil` when there was none.
    public var query: String?
    /// The request header fields; lookup by name is case-insensitive.
    public var headers: HTTPHeaders
    /// The request body (empty when there was none).
    public var body: [UInt8]
    /// The client's numeric IP address, or an empty string when unknown.
    public var remoteAddress: String
    /// A random identifier (16 lowercase hex characters) assigned by the server, for logs.
    public var id: String
    /// When the whole request had arrived (before it waited for a handler thread): deadlines that
    /// bound the client's total wait start here.
    public var receivedAt: ContinuousClock.Instant

    /// Creates a request; the server builds these, tests and other handlers may too.
    public init(
        method: String, path: String, query: String? = nil, headers: HTTPHeaders = [:],
        body: [UInt8] = [], remoteAddress: String = "", id: String = HTTPRequest.makeID(),
        receivedAt: ContinuousClock.Instant = .now
    ) {
        self.receivedAt = receivedAt
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.remoteAddress = remoteAddress
        self.id = id
    }

    /// The body as `Data`.
    public var data: Data { Data(body) }

    /// A fresh random request identifier: 16 lowercase hexadecimal characters.
    public static func makeID() -> String {
        let value = UInt64.random(in: .min ... .max)
        return String(unsafeUninitializedCapacity: 16) { buffer in
            for position in 0..<16 {
                let digit = UInt8(truncatingIfNeeded: value >> UInt64(60 - 4 * position) & 15)
                buffer[position] = digit < 10 ? UInt8(ascii: "0") + digit : UInt8(ascii: "a") + digit - 10
            }
            return 16
        }
    }
}
