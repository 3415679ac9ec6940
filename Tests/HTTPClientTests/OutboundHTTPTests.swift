import Foundation
import HTTPClient
import HTTPServer
import Synchronization
import TestSupport
import Testing

/// The outbound HTTP client against real servers on loopback: a libmicrohttpd server for well-formed
/// exchanges, and ``ScriptedHTTPServer`` for answers written by hand (lying lengths, endless bodies,
/// redirects, stalls, a proxy).
@Suite("Outbound HTTP holds every request to its policy")
struct OutboundHTTPTests {
    static let client = OutboundHTTP.Client(policy: .init(timeout: .seconds(5)), environment: [:])

    static func head(_ status: Int, _ headers: [String]) -> [UInt8] {
        Array(
            (["HTTP/1.1 \(status) Whatever", "Connection: close"] + headers).joined(separator: "\r\n")
                .appending("\r\n\r\n").utf8)
    }

    static func expectFailure(
        _ code: OutboundHTTP.Error.Code, _ client: OutboundHTTP.Client = client,
        _ request: OutboundHTTP.Request
    ) -> OutboundHTTP.Error? {
        do {
            let response = try client.perform(request)
            Issue.record("expected \(code), got status \(response.status)")
            return nil
        } catch {
            #expect(error.code == code, "\(error)")
            return error
        }
    }

    @Test("a POST with a body and headers round-trips to a local server")
    func postRoundTrip() throws {
        let seen = Mutex<HTTPRequest?>(nil)
        let server = HTTPServer(configuration: .init(host: "127.0.0.1", port: 0, threadCount: 2)) { request in
            seen.withLock { $0 = request }
            return HTTPResponse(
                status: 201, headers: ["Content-Type": "application/octet-stream", "X-Answer": "42"],
                body: Array(request.body.reversed()))
        }
        try server.start()
        defer { _ = server.shutdown(gracePeriod: .zero) }
        // Binary, with a NUL and more than 1 KiB (no Expect: 100-continue round trip either).
        let body: [UInt8] = [0, 1, 2, 255] + Array(repeating: 0x41, count: 4000)
        let response = try Self.client.perform(
            OutboundHTTP.Request(
                method: "POST", url: "http://127.0.0.1:\(server.port!)/auth/token?x=1",
                headers: [
                    .init("Content-Type", "application/x-www-form-urlencoded"), .init("X-Trace", "abc"),
                ],
                body: body))
        #expect(response.status == 201)
        #expect(response.value(of: "x-answer") == "42")
        #expect(response.body == Array(body.reversed()))
        let request = try #require(seen.withLock { $0 })
        #expect(request.method == "POST")
        #expect(request.path == "/auth/token")
        #expect(request.query == "x=1")
        #expect(request.body == body)
        #expect(request.headers["Content-Type"] == "application/x-www-form-urlencoded")
        #expect(request.headers["X-Trace"] == "abc")
        #expect(request.headers["Accept-Encoding"] == "identity")
        #expect(request.headers["User-Agent"] == "siwa-notifications")
        #expect(request.headers["Expect"] == nil)
    }

    @Test("requests from many threads at once each get their own answer")
    func concurrentRequests() throws {
        let server = HTTPServer(configuration: .init(host: "127.0.0.1", port: 0, threadCount: 4)) { request in
            HTTPResponse(status: 200, body: Array((request.query ?? "").utf8))
        }
        try server.start()
        defer { _ = server.shutdown(gracePeriod: .zero) }
        let answers = Mutex<[Int: String]>([:])
        DispatchQueue.concurrentPerform(iterations: 32) { index in
            let response = try? Self.client.perform(.init(url: "http://127.0.0.1:\(server.port!)/n?\(index)"))
            answers.withLock { $0[index] = response.map { String(decoding: $0.body, as: UTF8.self) } }
        }
        let all = answers.withLock { $0 }
        #expect(all.count == 32)
        for (index, body) in all { #expect(body == "\(index)") }
    }

    @Test("a server that never answers costs no more than the timeout")
    func timeoutBounded() throws {
        let server = try ScriptedHTTPServer { _, write in
            _ = write(Array("HTTP/1.1 200 OK\r\n".utf8))  // then nothing: a stalled head
            Thread.sleep(forTimeInterval: 5)
        }
        let client = OutboundHTTP.Client(policy: .init(timeout: .milliseconds(500)), environment: [:])
        let started = ContinuousClock.now
        _ = Self.expectFailure(.timeout, client, .init(url: server.url()))
        let elapsed = ContinuousClock.now - started
        #expect(elapsed >= .milliseconds(450) && elapsed < .seconds(2), "\(elapsed)")
    }

    @Test("a chunked body is cut off once past the cap, and so is one delimited by the connection's end")
    func streamingBodiesCapped() throws {
        let chunk = [UInt8](repeating: 0x20, count: 64 << 10)
        let frame = Array("\(String(chunk.count, radix: 16))\r\n".utf8) + chunk + Array("\r\n".utf8)
        let chunked = try ScriptedHTTPServer { _, write in
            guard write(Self.head(200, ["Transfer-Encoding: chunked"])) else { return }
            for _ in 0..<4096 where write(frame) {}  // up to 256 MiB
        }
        let unframed = try ScriptedHTTPServer { _, write in
            guard write(Self.head(200, [])) else { return }
            for _ in 0..<4096 where write(chunk) {}
        }
        let client = OutboundHTTP.Client(
            policy: .init(timeout: .seconds(10), maxResponseBodyBytes: 1 << 20), environment: [:])
        for server in [chunked, unframed] {
            let error = Self.expectFailure(.tooLarge, client, .init(url: server.url()))
            #expect(error?.description.contains("larger than 1048576 bytes") == true)
            #expect(waitUntil { server.requestHeads.count == 1 })
            Thread.sleep(forTimeInterval: 0.3)
            #expect(server.bytesWritten < 32 << 20, "the server wrote \(server.bytesWritten >> 20) MiB")
        }
    }

    @Test("a Content-Length above the cap is refused before the body is read")
    func declaredLengthCapped() throws {
        let server = try ScriptedHTTPServer { _, write in
            _ = write(Self.head(200, ["Content-Length: \(64 << 20)"]))
            Thread.sleep(forTimeInterval: 5)
        }
        let client = OutboundHTTP.Client(
            policy: .init(timeout: .seconds(4), maxResponseBodyBytes: 1 << 20), environment: [:])
        let started = ContinuousClock.now
        let error = Self.expectFailure(.tooLarge, client, .init(url: server.url()))
        #expect(error?.description.contains("Content-Length") == true)
        #expect(ContinuousClock.now - started < .seconds(2))
    }

    @Test("response headers are capped")
    func headersCapped() throws {
        let server = try ScriptedHTTPServer { _, write in
            _ = write(
                Self.head(200, (0..<64).map { "X-Filler-\($0): \(String(repeating: "a", count: 1000))" }))
        }
        let error = Self.expectFailure(.tooLarge, Self.client, .init(url: server.url()))
        #expect(error?.description.contains("headers") == true)
    }

    @Test("a Content-Encoding answer is delivered raw, never inflated, or refused when the policy says so")
    func contentEncodingRaw() throws {
        let gzipped: [UInt8] = [
            0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0xab, 0x56, 0xca, 0x4e, 0xad, 0x2c,
            0x56, 0xb2, 0x8a, 0x8e, 0xad, 0x05, 0x00, 0x8b, 0x4b, 0x8e, 0x44, 0x0b, 0x00, 0x00, 0x00,
        ]  // gzip of {"keys":[]}
        let server = try ScriptedHTTPServer { _, write in
            _ = write(
                Self.head(200, ["Content-Length: \(gzipped.count)", "Content-Encoding: gzip"]) + gzipped)
        }
        let response = try Self.client.perform(.init(url: server.url()))
        #expect(response.status == 200)
        #expect(response.value(of: "Content-Encoding") == "gzip")
        #expect(response.body == gzipped)
        #expect(server.requestHeads.first?.lowercased().contains("accept-encoding: identity\r\n") == true)

        var policy = Self.client.policy
        policy.refusesContentEncoding = true
        let error = Self.expectFailure(
            .contentEncoding, OutboundHTTP.Client(policy: policy, environment: [:]), .init(url: server.url()))
        #expect(error?.description.contains("gzip") == false)
    }

    @Test("a redirect is returned to the caller, and its target is never asked")
    func redirectReturned() throws {
        let target = try StaticHTTPServer(body: Data("{}".utf8))
        defer { target.stop() }
        let redirector = try ScriptedHTTPServer { _, write in
            _ = write(Self.head(302, ["Location: \(target.url.absoluteString)", "Content-Length: 0"]))
        }
        let response = try Self.client.perform(.init(method: "POST", url: redirector.url(), body: [1]))
        #expect(response.status == 302)
        #expect(response.value(of: "location") == target.url.absoluteString)
        #expect(target.requestCount == 0)
    }

    @Test(
        "only https, and http to loopback, are allowed, judged on libcurl's parse of the URL",
        arguments: [
            "ftp://127.0.0.1/k", "file:///etc/passwd", "gopher://127.0.0.1/", "http://10.0.0.1/k",
            "http://127.attacker.example/k", "http://localhost.attacker.example/k", "http://[::2]/k",
            "http://127.0.0.1@10.0.0.1/k", "//127.0.0.1/k", "not a url", "http://127.0.0.1/k\r\nX: y",
        ])
    func schemePolicy(url: String) throws {
        let started = ContinuousClock.now
        _ = Self.expectFailure(.policy, Self.client, .init(url: url))
        #expect(ContinuousClock.now - started < .seconds(1))
    }

    @Test("plain http to loopback can be forbidden too, and nothing is sent then")
    func loopbackHTTPForbidden() throws {
        let server = try ScriptedHTTPServer { _, write in _ = write(Self.head(200, ["Content-Length: 0"])) }
        var policy = Self.client.policy
        policy.allowsPlainHTTPToLoopback = false
        _ = Self.expectFailure(
            .policy, OutboundHTTP.Client(policy: policy, environment: [:]), .init(url: server.url()))
        #expect(try Self.client.perform(.init(url: server.url())).status == 200)
        #expect(server.requestHeads.count == 1)
    }

    @Test("headers that belong to the transport, and CR or LF in a header, are refused before sending")
    func headerInjectionRefused() throws {
        let server = try ScriptedHTTPServer { _, write in _ = write(Self.head(200, ["Content-Length: 0"])) }
        let bad: [OutboundHTTP.Header] = [
            .init("X-Ok", "a\r\nX-Injected: 1"), .init("Bad Name", "x"), .init("Host", "evil.example"),
            .init("Accept-Encoding", "gzip"), .init("Content-Length", "5"),
            .init("Transfer-Encoding", "chunked"),
        ]
        for header in bad {
            _ = Self.expectFailure(.policy, Self.client, .init(url: server.url(), headers: [header]))
        }
        _ = Self.expectFailure(.policy, Self.client, .init(method: "GET /x HTTP/1.1\r\n", url: server.url()))
        #expect(server.requestHeads.isEmpty)
    }

    @Test("errors never show the URL's userinfo or query, or the body")
    func errorsRedacted() throws {
        let server = try ScriptedHTTPServer { _, write in
            _ = write(Self.head(200, ["Transfer-Encoding: chunked"]) + Array("5\r\nSECRE".utf8))
        }
        let url = "http://admin:hunter2@127.0.0.1:\(server.port)/k?token=s3cr3t"
        let error = Self.expectFailure(.transfer, Self.client, .init(url: url))
        let text = error.map { String(describing: $0) } ?? ""
        for secret in ["hunter2", "admin", "s3cr3t", "SECRE"] { #expect(!text.contains(secret), "\(text)") }
    }

    @Test("https_proxy is used for https (through CONNECT), never for loopback")
    func proxyFromEnvironment() throws {
        let proxy = try ScriptedHTTPServer { _, write in _ = write(Self.head(403, ["Content-Length: 0"])) }
        let origin = try ScriptedHTTPServer { _, write in _ = write(Self.head(200, ["Content-Length: 0"])) }
        let environment = [
            "https_proxy": "http://127.0.0.1:\(proxy.port)", "HTTPS_PROXY": "http://bad.invalid:1",
        ]
        let client = OutboundHTTP.Client(policy: .init(timeout: .seconds(5)), environment: environment)
        // A remote https URL goes through the proxy as a tunnel; the proxy's refusal is an error.
        let error = Self.expectFailure(.proxy, client, .init(url: "https://keys.example.invalid/auth/keys"))
        #expect(error != nil)
        #expect(proxy.requestHeads.first?.hasPrefix("CONNECT keys.example.invalid:443 HTTP/1.1\r\n") == true)
        // Loopback is reached directly, over http or https (the latter fails its handshake here).
        #expect(try client.perform(.init(url: origin.url())).status == 200)
        #expect(origin.requestHeads.count == 1)
        var policy = client.policy
        policy.timeout = .seconds(1)
        _ = try? OutboundHTTP.Client(policy: policy, environment: environment).perform(
            .init(url: "https://127.0.0.1:\(origin.port)/k"))
        #expect(proxy.requestHeads.count == 1)
        // Without the policy's consent, no proxy at all.
        policy.usesProxyFromEnvironment = false
        _ = try? OutboundHTTP.Client(policy: policy, environment: environment).perform(
            .init(url: "https://keys.example.invalid/auth/keys"))
        #expect(proxy.requestHeads.count == 1)
    }
}
