import Dispatch
import Foundation
import HTTPServer
import Synchronization
import TestSupport
import Testing

@Suite("HTTPServer round trips")
struct RoundTripTests {
    @Test("a GET reaches the handler with path, query, headers and client address")
    func getRoundTrip() throws {
        let seen = Box<HTTPRequest?>(nil)
        let server = try startServer { request in
            seen.value = request
            return HTTPResponse(status: 200, headers: ["X-Reply": "yes"], body: Array("hello".utf8))
        }
        defer { server.shutdown() }

        let response = try TestHTTPClient.get(
            server.url("/things/42?a=1&b=two"), headers: [("X-Custom", "Value 1")])

        #expect(response.status == 200)
        #expect(response.headers["x-reply"] == "yes")
        #expect(response.text == "hello")
        let request = try #require(seen.value)
        #expect(request.method == "GET")
        #expect(request.path == "/things/42")
        #expect(request.query == "a=1&b=two")
        #expect(request.headers["x-custom"] == "Value 1")
        #expect(request.headers["X-CUSTOM"] == "Value 1")
        #expect(request.body.isEmpty)
        #expect(request.remoteAddress == "127.0.0.1")
    }

    @Test("a POST delivers the whole body and the handler's JSON comes back")
    func postRoundTrip() throws {
        let seen = Box<HTTPRequest?>(nil)
        let server = try startServer { request in
            seen.value = request
            return .json(status: 201, request.data)
        }
        defer { server.shutdown() }
        let payload = Array(#"{"payload":"abc.def.ghi"}"#.utf8)

        let response = try TestHTTPClient.post(
            server.url("/notifications"), body: payload, headers: [("Content-Type", "application/json")])

        #expect(response.status == 201)
        #expect(response.headers["Content-Type"] == "application/json")
        #expect(response.body == payload)
        let request = try #require(seen.value)
        #expect(request.method == "POST")
        #expect(request.headers["content-type"] == "application/json")
        #expect(request.headers["Content-Length"] == String(payload.count))
    }

    @Test("a request without a query has a nil query")
    func noQuery() throws {
        let seen = Box<String?>("unset")
        let server = try startServer { request in
            seen.value = request.query
            return .text("ok")
        }
        defer { server.shutdown() }

        _ = try TestHTTPClient.get(server.url("/plain"))

        #expect(seen.value == nil)
    }

    @Test("each request gets its own 16-hex-character id")
    func requestIDs() throws {
        let ids = Box<[String]>([])
        let server = try startServer { request in
            ids.value.append(request.id)
            return .text("ok")
        }
        defer { server.shutdown() }

        for _ in 0..<3 { _ = try TestHTTPClient.get(server.url("/")) }

        #expect(ids.value.count == 3)
        #expect(Set(ids.value).count == 3)
        for id in ids.value {
            #expect(id.count == 16)
            #expect(id.allSatisfy { $0.isHexDigit && !$0.isUppercase })
        }
    }

    @Test("a 404 chosen by the handler reaches the client")
    func notFoundByHandler() throws {
        let server = try startServer { request in
            request.path == "/known" ? .text("here") : .error(status: 404, "not found")
        }
        defer { server.shutdown() }

        let missing = try TestHTTPClient.get(server.url("/unknown"))
        let known = try TestHTTPClient.get(server.url("/known"))

        #expect(missing.status == 404)
        #expect(missing.text == #"{"error":"not found"}"#)
        #expect(known.status == 200)
    }

    @Test("headers that could split the response are dropped, others are sent")
    func unsafeHeadersDropped() throws {
        let server = try startServer { _ in
            HTTPResponse(
                status: 200, headers: ["X-Good": "fine", "X-Bad": "a\r\nSet-Cookie: evil=1"],
                body: Array("ok".utf8))
        }
        defer { server.shutdown() }

        let response = try TestHTTPClient.get(server.url("/"))

        #expect(response.status == 200)
        #expect(response.headers["X-Good"] == "fine")
        #expect(response.headers["X-Bad"] == nil)
        #expect(response.headers["Set-Cookie"] == nil)
    }
}

@Suite("HTTPServer lifecycle")
struct LifecycleTests {
    @Test("port 0 binds a real ephemeral port, different for each server")
    func ephemeralPort() throws {
        let first = try startServer { _ in .text("one") }
        defer { first.shutdown() }
        let second = try startServer { _ in .text("two") }
        defer { second.shutdown() }

        let firstPort = try #require(first.port)
        let secondPort = try #require(second.port)
        #expect(firstPort > 0)
        #expect(firstPort != secondPort)
        #expect(try TestHTTPClient.get(second.url("/")).text == "two")
    }

    @Test("starting on a port that is already in use throws a clear error")
    func portInUse() throws {
        let occupant = try startServer { _ in .text("first") }
        defer { occupant.shutdown() }
        let port = try #require(occupant.port)
        let latecomer = HTTPServer(configuration: .init(host: "127.0.0.1", port: port)) { _ in
            .text("second")
        }

        let error = #expect(throws: HTTPServerError.self) { try latecomer.start() }

        #expect(error?.code == .addressInUse)
        #expect(error?.message.contains("127.0.0.1:\(port)") == true)
        #expect(error?.message.contains("already in use") == true)
        #expect(latecomer.port == nil)
    }

    @Test("starting twice is refused")
    func startTwice() throws {
        let server = try startServer { _ in .text("ok") }
        defer { server.shutdown() }

        let error = #expect(throws: HTTPServerError.self) { try server.start() }

        #expect(error?.code == .invalidState)
    }

    @Test("a host that is not an IP literal or localhost is rejected", arguments: ["example.com", "1.2.3"])
    func badHost(host: String) {
        let server = HTTPServer(configuration: .init(host: host, port: 0)) { _ in .text("ok") }

        let error = #expect(throws: HTTPServerError.self) { try server.start() }

        #expect(error?.code == .invalidConfiguration)
    }

    @Test("localhost and the IPv6 loopback are accepted as hosts", arguments: ["localhost", "::1"])
    func loopbackHosts(host: String) throws {
        let server = HTTPServer(configuration: .init(host: host, port: 0, threadCount: 1)) { request in
            .text(request.remoteAddress)
        }
        do {
            try server.start()
        } catch {
            guard error.code == .listenFailed && host == "::1" else { throw error }
            return  // No IPv6 on this machine: nothing to check.
        }
        defer { server.shutdown() }
        let port = try #require(server.port)
        let urlHost = host == "::1" ? "[::1]" : "127.0.0.1"

        let response = try TestHTTPClient.get("http://\(urlHost):\(port)/")

        #expect(response.status == 200)
        #expect(response.text == (host == "::1" ? "::1" : "127.0.0.1"))
    }

    @Test("graceful shutdown lets the in-flight request finish, then refuses new connections")
    func gracefulShutdown() throws {
        let entered = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let server = try startServer { request in
            if request.path == "/slow" {
                entered.signal()
                _ = release.wait(timeout: .now() + 10)
            }
            return .text("finished \(request.path)")
        }
        let port = try #require(server.port)
        let slowResponse = Box<TestHTTPResponse?>(nil)
        let slowClient = BackgroundWork { slowResponse.value = try? TestHTTPClient.get(server.url("/slow")) }
        #expect(entered.wait(timeout: .now() + 5) == .success)
        #expect(server.inFlightRequests == 1)

        let drained = Box<Bool?>(nil)
        let stopper = BackgroundWork { drained.value = server.shutdown(gracePeriod: .seconds(10)) }

        // New connections are refused while the slow request is still running.
        #expect(
            waitUntil {
                (try? RawHTTPConnection(host: "127.0.0.1", port: port, timeout: .seconds(1))) == nil
            })
        #expect(drained.value == nil)

        release.signal()
        #expect(slowClient.wait())
        #expect(stopper.wait())
        #expect(slowResponse.value?.status == 200)
        #expect(slowResponse.value?.text == "finished /slow")
        #expect(drained.value == true)
        #expect(server.port == nil)
    }

    @Test("shutdown of a server that never started returns at once")
    func shutdownIdle() {
        let server = HTTPServer { _ in .text("ok") }
        #expect(server.shutdown(gracePeriod: .zero))
        #expect(server.inFlightRequests == 0)
    }
}
