import Foundation
import HTTPServer
import Synchronization
import TestSupport
import Testing

/// RFC 9112 framing: requests whose end a proxy in front could place differently from us are
/// answered 400 before their body is read, the connection is closed, and the handler never runs.
@Suite("Ambiguous request framing is refused")
struct FramingTests {
    /// A request line and Host, then `fields`, then `body`; a second request is pipelined behind it
    /// so a server that misreads where the first one ends would serve `/smuggled`.
    static func request(_ fields: [String], body: String = "hello") -> String {
        "POST /upload HTTP/1.1\r\nHost: x\r\n" + fields.map { $0 + "\r\n" }.joined() + "\r\n" + body
            + "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    }

    @Test(
        "conflicting or repeated Content-Length, whitespace before a colon, and TE with CL get 400",
        arguments: [
            ["Content-Length: 5", "Content-Length: 46"],
            ["Content-Length: 5", "Content-Length: 5"],
            ["content-length: 5", "CONTENT-LENGTH: 5"],
            ["Content-Length : 5"],
            ["Content-Length\t: 5"],
            ["X-Other : 1", "Content-Length: 5"],
            ["Content-Length: 5", "Transfer-Encoding: chunked"],
            ["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"],
            ["Transfer-Encoding: gzip, chunked"],
            ["Transfer-Encoding : chunked"],
        ])
    func refused(fields: [String]) throws {
        let handled = Atomic<Int>(0)
        let server = try startServer { _ in
            handled.add(1, ordering: .sequentiallyConsistent)
            return HTTPResponse(status: 200, headers: [:], body: Array("ok".utf8))
        }
        defer { server.shutdown(gracePeriod: .seconds(1)) }
        let connection = try RawHTTPConnection(host: "127.0.0.1", port: server.port!)
        try connection.send(Self.request(fields))
        #expect(try connection.readOutcome() == .answered(status: 400))
        #expect(connection.waitForClose(timeout: .seconds(5)), "the connection stays open after the 400")
        #expect(handled.load(ordering: .sequentiallyConsistent) == 0, "the handler ran")
    }

    @Test("an HTTP/1.0 request with Transfer-Encoding gets 400")
    func transferEncodingInHTTP10() throws {
        let handled = Atomic<Int>(0)
        let server = try startServer { _ in
            handled.add(1, ordering: .sequentiallyConsistent)
            return HTTPResponse(status: 200, headers: [:], body: [])
        }
        defer { server.shutdown(gracePeriod: .seconds(1)) }
        let connection = try RawHTTPConnection(host: "127.0.0.1", port: server.port!)
        try connection.send(
            "POST /upload HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        #expect(try connection.readOutcome() == .answered(status: 400))
        #expect(handled.load(ordering: .sequentiallyConsistent) == 0)
    }

    @Test("a single Content-Length, or chunked alone, is served as before, pipelining included")
    func wellFramed() throws {
        let bodies = Mutex<[String]>([])
        let server = try startServer { request in
            bodies.withLock { $0.append(request.path + ":" + String(decoding: request.body, as: UTF8.self)) }
            return HTTPResponse(status: 200, headers: [:], body: Array("ok".utf8))
        }
        defer { server.shutdown(gracePeriod: .seconds(1)) }
        let connection = try RawHTTPConnection(host: "127.0.0.1", port: server.port!)
        try connection.send(Self.request(["Content-Length: 5"]))
        #expect(try connection.readOutcome() == .answered(status: 200))
        #expect(try connection.readOutcome() == .answered(status: 200))
        let chunked = try RawHTTPConnection(host: "127.0.0.1", port: server.port!)
        try chunked.send(
            "POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\nConnection: close\r\n\r\n"
                + "5\r\nhello\r\n0\r\n\r\n")
        #expect(try chunked.readOutcome() == .answered(status: 200))
        #expect(bodies.withLock { $0 } == ["/upload:hello", "/smuggled:", "/upload:hello"])
    }
}
