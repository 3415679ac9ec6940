import Dispatch
import Foundation
import HTTPServer
import Synchronization
import TestSupport
import Testing

@Suite("HTTPServer limits and load")
struct LimitsTests {
    static let limit = 1000

    @Test(
        "a body at exactly the limit is delivered, one byte more is answered 413",
        arguments: [false, true], [0, 1])
    func bodyLimit(chunked: Bool, excess: Int) throws {
        let handled = Atomic<Int>(0)
        let server = try startServer(maxBodyBytes: Self.limit) { request in
            handled.add(1, ordering: .sequentiallyConsistent)
            return .text("\(request.body.count)")
        }
        defer { server.shutdown() }
        let body = [UInt8](repeating: 0x61, count: Self.limit + excess)

        let response = try TestHTTPClient.request(
            method: "POST", url: server.url("/upload"), body: body, chunked: chunked, chunkSize: 300)

        if excess == 0 {
            #expect(response.status == 200)
            #expect(response.text == "\(Self.limit)")
            #expect(handled.load(ordering: .sequentiallyConsistent) == 1)
        } else {
            #expect(response.status == 413)
            #expect(response.text == #"{"error":"payload too large"}"#)
            #expect(response.headers["Content-Type"] == "application/json")
            #expect(handled.load(ordering: .sequentiallyConsistent) == 0)
        }
    }

    @Test("an oversized Content-Length is refused before any of the body is sent")
    func announcedOversize() throws {
        let server = try startServer(maxBodyBytes: Self.limit) { _ in .text("should not run") }
        defer { server.shutdown() }
        let connection = try RawHTTPConnection(host: "127.0.0.1", port: server.port ?? 0)

        try connection.send("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n")
        let response = try connection.readResponse()

        #expect(response.status == 413)
        #expect(response.text == #"{"error":"payload too large"}"#)
        #expect(connection.waitForClose(timeout: .seconds(5)))
    }

    @Test("a chunked body that keeps streaming far past the limit gets the connection closed")
    func endlessChunkedBody() throws {
        let handled = Atomic<Int>(0)
        let server = try startServer(maxBodyBytes: Self.limit) { _ in
            handled.add(1, ordering: .sequentiallyConsistent)
            return .text("should not run")
        }
        defer { server.shutdown() }
        let connection = try RawHTTPConnection(host: "127.0.0.1", port: server.port ?? 0)
        try connection.send("POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")

        let chunk = "100\r\n" + String(repeating: "z", count: 256) + "\r\n"
        for _ in 0..<(3 * Self.limit / 256) {
            do { try connection.send(chunk) } catch { break }  // The server may already have closed.
        }

        #expect(connection.waitForClose(timeout: .seconds(5)))
        #expect(handled.load(ordering: .sequentiallyConsistent) == 0)
        #expect(waitUntil { server.inFlightRequests == 0 })
    }

    @Test("a client that sends half a request is cut off after the connection timeout")
    func slowClientCutOff() throws {
        let handled = Atomic<Int>(0)
        let server = try startServer(connectionTimeout: .seconds(1)) { _ in
            handled.add(1, ordering: .sequentiallyConsistent)
            return .text("ok")
        }
        defer { server.shutdown() }
        let connection = try RawHTTPConnection(host: "127.0.0.1", port: server.port ?? 0)
        let clock = ContinuousClock()
        let started = clock.now

        try connection.send("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nhalf of it")

        #expect(waitUntil { server.inFlightRequests == 1 })
        #expect(connection.waitForClose(timeout: .seconds(5)))
        #expect(clock.now - started >= .milliseconds(900))
        #expect(waitUntil { server.inFlightRequests == 0 })
        #expect(handled.load(ordering: .sequentiallyConsistent) == 0)
    }

    @Test("300 concurrent requests from 30 threads are all answered")
    func manyConcurrentRequests() throws {
        let server = try startServer { request in .text(request.query ?? "") }
        defer { server.shutdown() }
        let correct = Atomic<Int>(0)
        let url = server.url("/echo")

        let workers = (0..<30).map { thread in
            BackgroundWork {
                for index in 0..<10 {
                    let tag = "t\(thread)-\(index)"
                    if let response = try? TestHTTPClient.get("\(url)?\(tag)"),
                        response.status == 200, response.text == tag
                    {
                        correct.add(1, ordering: .sequentiallyConsistent)
                    }
                }
            }
        }

        for worker in workers { #expect(worker.wait(timeout: .seconds(30))) }
        #expect(correct.load(ordering: .sequentiallyConsistent) == 300)
        #expect(waitUntil { server.inFlightRequests == 0 })
    }

    @Test("a handler that blocks does not stop other requests from being served")
    func blockingHandler() throws {
        let entered = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let server = try startServer(threadCount: 4) { request in
            if request.path == "/block" {
                entered.signal()
                _ = release.wait(timeout: .now() + 10)
            }
            return .text(request.path)
        }
        defer { server.shutdown() }
        let blocked = Box<Int?>(nil)
        let blockedClient = BackgroundWork {
            blocked.value = try? TestHTTPClient.get(server.url("/block")).status
        }
        #expect(entered.wait(timeout: .now() + 5) == .success)

        for _ in 0..<20 {
            let response = try TestHTTPClient.get(server.url("/fast"), timeout: .seconds(5))
            #expect(response.text == "/fast")
        }
        #expect(blocked.value == nil)

        release.signal()
        #expect(blockedClient.wait())
        #expect(blocked.value == 200)
    }

    /// libmicrohttpd pins each connection to one I/O thread; if handlers ran there, a request would
    /// wait behind any blocked handler of a connection sharing its thread. They run on the handler
    /// pool instead, so with a single I/O thread every other connection is still answered at once.
    @Test("with one I/O thread, a blocked handler delays no other connection")
    func noHeadOfLineBlocking() throws {
        let entered = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let server = HTTPServer(
            configuration: .init(host: "127.0.0.1", port: 0, threadCount: 4, ioThreadCount: 1)
        ) { request in
            if request.path == "/block" {
                entered.signal()
                _ = release.wait(timeout: .now() + 10)
            }
            return .text(request.path)
        }
        try server.start()
        defer { server.shutdown() }
        let blockedClient = BackgroundWork { _ = try? TestHTTPClient.get(server.url("/block")) }
        #expect(entered.wait(timeout: .now() + 5) == .success)
        for _ in 0..<10 {
            #expect(try TestHTTPClient.get(server.url("/fast"), timeout: .seconds(2)).text == "/fast")
        }
        release.signal()
        #expect(blockedClient.wait())
    }

    @Test("shutdown waits for a request still being handled, which gets its answer")
    func shutdownWaitsForHandlers() throws {
        let entered = DispatchSemaphore(value: 0)
        let server = try startServer(threadCount: 2) { request in
            entered.signal()
            Thread.sleep(forTimeInterval: 0.3)
            return .text("late")
        }
        let answer = Box<String?>(nil)
        let client = BackgroundWork { answer.value = try? TestHTTPClient.get(server.url("/")).text }
        #expect(entered.wait(timeout: .now() + 5) == .success)
        server.shutdown(gracePeriod: .zero)
        #expect(client.wait())
        #expect(answer.value == "late")
    }
}

@Suite("HTTPServer hostile input")
struct HostileInputTests {
    @Test("headers larger than the per-connection memory are refused without calling the handler")
    func oversizedHeaders() throws {
        let handled = Atomic<Int>(0)
        let server = try startServer { _ in
            handled.add(1, ordering: .sequentiallyConsistent)
            return .text("should not run")
        }
        defer { server.shutdown() }
        let connection = try RawHTTPConnection(host: "127.0.0.1", port: server.port ?? 0)
        let huge = String(repeating: "a", count: 64 * 1024)

        try connection.send("GET / HTTP/1.1\r\nHost: x\r\nX-Huge: \(huge)\r\n\r\n")
        let response = try connection.readResponse()

        #expect((400...499).contains(response.status))
        #expect(handled.load(ordering: .sequentiallyConsistent) == 0)
    }

    @Test("a client that disconnects mid-body leaves no request in flight")
    func disconnectMidBody() throws {
        let handled = Atomic<Int>(0)
        let server = try startServer { _ in
            handled.add(1, ordering: .sequentiallyConsistent)
            return .text("should not run")
        }
        defer { server.shutdown() }

        do {
            let connection = try RawHTTPConnection(host: "127.0.0.1", port: server.port ?? 0)
            try connection.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\nsome")
            withExtendedLifetime(connection) {
                #expect(waitUntil { server.inFlightRequests == 1 })
            }
        }  // The connection is closed here.

        #expect(waitUntil { server.inFlightRequests == 0 })
        #expect(handled.load(ordering: .sequentiallyConsistent) == 0)
        #expect(try TestHTTPClient.get(server.url("/")).status == 200)
        #expect(handled.load(ordering: .sequentiallyConsistent) == 1)
    }

    @Test(
        "a malformed or absurd Content-Length is refused without calling the handler",
        arguments: [("12abc", 400), ("-5", 400), ("99999999999999999999999", 413)])
    func badContentLength(value: String, expectedStatus: Int) throws {
        let handled = Atomic<Int>(0)
        let server = try startServer { _ in
            handled.add(1, ordering: .sequentiallyConsistent)
            return .text("should not run")
        }
        defer { server.shutdown() }
        let connection = try RawHTTPConnection(host: "127.0.0.1", port: server.port ?? 0)

        try connection.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: \(value)\r\n\r\n")
        let response = try connection.readResponse()

        #expect(response.status == expectedStatus)
        #expect(handled.load(ordering: .sequentiallyConsistent) == 0)
    }
}
