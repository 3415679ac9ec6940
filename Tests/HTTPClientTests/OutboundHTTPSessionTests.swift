import Foundation
import HTTPClient
import Synchronization
import TestSupport
import Testing

/// ``OutboundHTTP/Session`` against a real keep-alive server on loopback that counts the connections it
/// accepted (``KeepAliveHTTPServer``): connections are kept between requests, peers that close them are
/// coped with, and every request on a reused connection is held to the policy as on a new one.
@Suite("An outbound session keeps its connections and holds each request to the policy")
struct OutboundHTTPSessionTests {
    static func session(timeout: Duration = .seconds(5), maxBody: Int = 1 << 20) -> OutboundHTTP.Session {
        OutboundHTTP.Session(
            client: OutboundHTTP.Client(
                policy: .init(timeout: timeout, maxResponseBodyBytes: maxBody), environment: [:]))
    }

    static func post(_ url: String, _ index: Int) -> OutboundHTTP.Request {
        OutboundHTTP.Request(
            method: "POST", url: url, headers: [.init("Content-Type", "application/json")],
            body: Array(#"{"n":\#(index)}"#.utf8))
    }

    @Test("consecutive requests to one origin go over one connection; a plain client opens one per request")
    func reusesOneConnection() throws {
        let server = try KeepAliveHTTPServer { exchange in
            (KeepAliveHTTPServer.answer(status: 200, body: exchange.body), .keepOpen)
        }
        let session = Self.session()
        for index in 0..<20 {
            let response = try session.perform(Self.post(server.url(), index))
            #expect(response.status == 200)
            #expect(response.body == Array(#"{"n":\#(index)}"#.utf8))
        }
        #expect(server.connectionsAccepted == 1)
        #expect(session.connectionsOpened == 1)
        #expect(server.exchanges.map(\.request) == Array(0..<20))
        #expect(server.exchanges.allSatisfy { $0.header("Accept-Encoding") == "identity" })

        let client = OutboundHTTP.Client(policy: .init(timeout: .seconds(5)), environment: [:])
        for index in 0..<3 { #expect(try client.perform(Self.post(server.url(), index)).status == 200) }
        #expect(server.connectionsAccepted == 4)
    }

    @Test(
        "a peer that closes after each answer, half-closes, or answers Connection: close gets every request",
        arguments: ["close", "half-close", "Connection: close"])
    func peerClosing(mode: String) throws {
        let server = try KeepAliveHTTPServer { exchange in
            switch mode {
            case "close": (KeepAliveHTTPServer.answer(), .close)
            case "half-close": (KeepAliveHTTPServer.answer(), .halfClose)
            default: (KeepAliveHTTPServer.answer(headers: ["Connection: close"]), .keepOpen)
            }
        }
        let session = Self.session()
        for index in 0..<10 {
            #expect(try session.perform(Self.post(server.url(), index)).status == 204, "request \(index)")
        }
        // Each request on a connection of its own (a request sent on a connection the peer had closed
        // meanwhile is sent again on a new one): every request arrived, each the first on its connection.
        #expect(server.exchanges.map(\.body) == (0..<10).map { Array(#"{"n":\#($0)}"#.utf8) })
        #expect(server.exchanges.allSatisfy { $0.request == 0 })
        #expect(server.connectionsAccepted == session.connectionsOpened)
    }

    @Test(
        "a peer that stops answering on a reused connection fails at the deadline; the next request connects anew"
    )
    func hangingReusedConnection() throws {
        // Every connection's second request is never answered.
        let server = try KeepAliveHTTPServer { exchange in
            (KeepAliveHTTPServer.answer(), exchange.request == 0 ? .keepOpen : .hang)
        }
        let session = Self.session(timeout: .milliseconds(500))
        #expect(try session.perform(Self.post(server.url(), 0)).status == 204)
        let started = ContinuousClock.now
        do {
            let response = try session.perform(Self.post(server.url(), 1))
            Issue.record("expected a timeout, got \(response.status)")
        } catch {
            #expect(error.code == .timeout, "\(error)")
        }
        let elapsed = ContinuousClock.now - started
        #expect(elapsed >= .milliseconds(450) && elapsed < .seconds(2), "\(elapsed)")
        // The hanging request went over the kept connection.
        #expect(server.exchanges.map { [$0.connection, $0.request] } == [[0, 0], [0, 1]])
        #expect(try session.perform(Self.post(server.url(), 2)).status == 204)
        #expect(server.exchanges.last.map { [$0.connection, $0.request] } == [1, 0])
        #expect(server.connectionsAccepted == 2)
    }

    @Test(
        "on a reused connection a redirect is returned, never followed, and an answer past the cap is cut off"
    )
    func policyOnReusedConnection() throws {
        let target = try KeepAliveHTTPServer { _ in (KeepAliveHTTPServer.answer(), .keepOpen) }
        let big = [UInt8](repeating: 0x41, count: 64 << 10)
        let server = try KeepAliveHTTPServer { exchange in
            switch exchange.path {
            case "/redirect":
                (KeepAliveHTTPServer.answer(status: 307, headers: ["Location: \(target.url())"]), .keepOpen)
            case "/big": (KeepAliveHTTPServer.answer(status: 200, body: big), .keepOpen)
            case "/chunked":
                (
                    Array("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000\r\n".utf8) + big
                        + Array("\r\n0\r\n\r\n".utf8), .keepOpen
                )
            default: (KeepAliveHTTPServer.answer(status: 200, body: Array("ok".utf8)), .keepOpen)
            }
        }
        let session = Self.session(maxBody: 1024)
        #expect(try session.perform(Self.post(server.url("/ok"), 0)).body == Array("ok".utf8))
        let redirect = try session.perform(Self.post(server.url("/redirect"), 1))
        #expect(redirect.status == 307)
        #expect(redirect.value(of: "Location") == target.url())
        #expect(target.exchanges.isEmpty)
        #expect(server.connectionsAccepted == 1)
        for (path, expected) in [("/big", "Content-Length"), ("/chunked", "larger than 1024 bytes")] {
            do {
                let response = try session.perform(Self.post(server.url(path), 2))
                Issue.record("expected tooLarge for \(path), got \(response.status)")
            } catch {
                #expect(error.code == .tooLarge, "\(error)")
                #expect(error.description.contains(expected), "\(error)")
            }
            // The connection the refused answer came on is not used again.
            let accepted = server.connectionsAccepted
            #expect(try session.perform(Self.post(server.url("/ok"), 3)).body == Array("ok".utf8))
            #expect(server.connectionsAccepted == accepted + 1)
            #expect(server.exchanges.last?.request == 0)
        }
        // Still only https, or http to loopback, on a session that holds a connection.
        do {
            _ = try session.perform(Self.post("http://10.0.0.1/hook", 4))
            Issue.record("http to a non-loopback host was allowed")
        } catch {
            #expect(error.code == .policy)
        }
        #expect(try session.perform(Self.post(server.url("/ok"), 5)).status == 200)
        #expect(server.connectionsAccepted == 3)
    }

    @Test(
        "two threads using one session at once both get their answers, the second on a connection of its own")
    func concurrentUse() throws {
        let first = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let server = try KeepAliveHTTPServer { exchange in
            if exchange.path == "/slow" {
                first.signal()
                release.wait()
            }
            return (KeepAliveHTTPServer.answer(status: 200), .keepOpen)
        }
        let session = Self.session()
        let slow = Mutex<Int?>(nil)
        let thread = Thread {
            let status = try? session.perform(Self.post(server.url("/slow"), 0)).status
            slow.withLock { $0 = status }
        }
        thread.start()
        #expect(first.wait(timeout: .now() + 10) == .success)
        #expect(try session.perform(Self.post(server.url("/fast"), 1)).status == 200)
        release.signal()
        #expect(waitUntil { slow.withLock { $0 } == 200 })
        #expect(server.connectionsAccepted == 2)
        #expect(session.connectionsOpened == 2)
    }
}
