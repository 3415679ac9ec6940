public import Foundation
public import HTTPServer

/// A failure of the test HTTP client (connect, send, receive, parse or timeout).
public struct TestHTTPError: Error, CustomStringConvertible, Sendable {
    /// What went wrong.
    public let message: String

    public init(_ message: String) { self.message = message }

    public var description: String { "TestHTTPError: \(message)" }
}

/// A response as read off the wire by ``TestHTTPClient``.
public struct TestHTTPResponse: Sendable {
    /// The status code from the status line.
    public var status: Int
    /// The header fields; lookup is case-insensitive.
    public var headers: HTTPHeaders
    /// The body, de-chunked when the server used chunked transfer encoding.
    public var body: [UInt8]

    /// The body decoded as UTF-8.
    public var text: String { String(decoding: body, as: UTF8.self) }
    /// The body as `Data`.
    public var data: Data { Data(body) }
}

/// A blocking HTTP/1.1 client for tests that shares no code with ``HTTPServer``.
///
/// Every call opens a fresh connection with `Connection: close`, so calls from many threads are
/// independent. Only `http://` URLs with numeric hosts or `localhost` are supported.
public enum TestHTTPClient {
    /// Sends a GET request.
    public static func get(
        _ url: String, headers: [(String, String)] = [], timeout: Duration = .seconds(10)
    ) throws -> TestHTTPResponse {
        try request(method: "GET", url: url, headers: headers, body: nil, timeout: timeout)
    }

    /// Sends a POST request with `body` (announced with `Content-Length`).
    public static func post(
        _ url: String, body: [UInt8], headers: [(String, String)] = [], timeout: Duration = .seconds(10)
    ) throws -> TestHTTPResponse {
        try request(method: "POST", url: url, headers: headers, body: body, timeout: timeout)
    }

    /// Sends a POST request with `body`.
    public static func post(
        _ url: String, body: Data, headers: [(String, String)] = [], timeout: Duration = .seconds(10)
    ) throws -> TestHTTPResponse {
        try post(url, body: [UInt8](body), headers: headers, timeout: timeout)
    }

    /// Sends any request. With `chunked`, the body is sent with `Transfer-Encoding: chunked` in
    /// chunks of at most `chunkSize` bytes instead of with `Content-Length`.
    public static func request(
        method: String, url: String, headers: [(String, String)] = [], body: [UInt8]?,
        chunked: Bool = false, chunkSize: Int = 4096, timeout: Duration = .seconds(10)
    ) throws -> TestHTTPResponse {
        let target = try Target(url)
        let connection = try RawHTTPConnection(host: target.host, port: target.port, timeout: timeout)
        var head = "\(method) \(target.pathAndQuery) HTTP/1.1\r\n"
        head += "Host: \(target.hostHeader)\r\nConnection: close\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if let body, chunked {
            head += "Transfer-Encoding: chunked\r\n\r\n"
            try connection.send(head)
            var offset = 0
            while offset < body.count {
                let end = min(offset + max(1, chunkSize), body.count)
                try connection.send(String(end - offset, radix: 16) + "\r\n")
                try connection.send(Array(body[offset..<end]))
                try connection.send("\r\n")
                offset = end
            }
            try connection.send("0\r\n\r\n")
        } else if let body {
            head += "Content-Length: \(body.count)\r\n\r\n"
            try connection.send(Array(head.utf8) + body)
        } else {
            head += "\r\n"
            try connection.send(head)
        }
        return try connection.readResponse()
    }

    private struct Target {
        var host: String
        var port: Int
        var pathAndQuery: String
        var hostHeader: String

        init(_ text: String) throws {
            guard let components = URLComponents(string: text), components.scheme == "http",
                var host = components.host, !host.isEmpty
            else { throw TestHTTPError("unsupported URL \(text)") }
            if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
            self.host = host
            self.port = components.port ?? 80
            let path = components.percentEncodedPath.isEmpty ? "/" : components.percentEncodedPath
            self.pathAndQuery = path + (components.percentEncodedQuery.map { "?" + $0 } ?? "")
            self.hostHeader = (host.contains(":") ? "[\(host)]" : host) + ":\(port)"
        }
    }
}
