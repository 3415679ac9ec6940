import Foundation
import HTTPServer
import TestSupport
import Testing

@Suite("StaticHTTPServer (JWKS stand-in)")
struct StaticHTTPServerTests {
    @Test("serves the body at its path as JSON and counts requests")
    func servesBody() throws {
        let server = try JWKSTestServer(body: Data(#"{"keys":[{"kid":"a"}]}"#.utf8))
        defer { server.stop() }

        let response = try TestHTTPClient.get(server.url.absoluteString)

        #expect(server.url.path == "/auth/keys")
        #expect(response.status == 200)
        #expect(response.headers["Content-Type"] == "application/json")
        #expect(response.text == #"{"keys":[{"kid":"a"}]}"#)
        #expect(server.requestCount == 1)
    }

    @Test("a replaced body is served from the next request on")
    func replaceBody() throws {
        let server = try JWKSTestServer()
        defer { server.stop() }

        server.setBody(Data(#"{"keys":[{"kid":"rotated"}]}"#.utf8))

        #expect(try TestHTTPClient.get(server.url.absoluteString).text == #"{"keys":[{"kid":"rotated"}]}"#)
    }

    @Test("injected failures and garbage last until serving normally again")
    func misbehaves() throws {
        let server = try JWKSTestServer()
        defer { server.stop() }
        let url = server.url.absoluteString

        server.fail(status: 503)
        let failed = try TestHTTPClient.get(url)
        server.serveNormally()
        server.serveGarbage()
        let garbage = try TestHTTPClient.get(url)
        server.serveNormally()
        let normal = try TestHTTPClient.get(url)

        #expect(failed.status == 503)
        #expect(garbage.status == 200)
        #expect((try? JSONSerialization.jsonObject(with: garbage.data)) == nil)
        #expect(normal.text == #"{"keys":[]}"#)
        #expect(server.requestCount == 3)
    }

    @Test("a delay holds each answer back")
    func delays() throws {
        let server = try JWKSTestServer()
        defer { server.stop() }
        server.setDelay(.milliseconds(300))
        let clock = ContinuousClock()
        let started = clock.now

        let response = try TestHTTPClient.get(server.url.absoluteString)

        #expect(response.status == 200)
        #expect(clock.now - started >= .milliseconds(300))
    }

    @Test("other paths get 404 and still count; waiting for a count works")
    func otherPaths() throws {
        let server = try JWKSTestServer()
        defer { server.stop() }

        let response = try TestHTTPClient.get("http://127.0.0.1:\(server.port)/elsewhere")

        #expect(response.status == 404)
        #expect(server.waitForRequestCount(atLeast: 1, timeout: .seconds(1)))
        #expect(!server.waitForRequestCount(atLeast: 2, timeout: .milliseconds(50)))
    }

    @Test("after stop, connections are refused")
    func stops() throws {
        let server = try JWKSTestServer()
        let url = server.url.absoluteString

        server.stop()

        #expect(throws: TestHTTPError.self) { try TestHTTPClient.get(url, timeout: .seconds(1)) }
    }
}
