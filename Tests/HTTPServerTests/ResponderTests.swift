import Dispatch
import Foundation
import HTTPServer
import Synchronization
import TestSupport
import Testing

/// Holds responders handed over by an asynchronous handler until the test answers them.
final class HeldResponders: Sendable {
    private let held = Mutex<[HTTPResponder]>([])
    func add(_ responder: HTTPResponder) { held.withLock { $0.append(responder) } }
    var count: Int { held.withLock { $0.count } }
    func takeAll() -> [HTTPResponder] {
        held.withLock { responders in
            defer { responders = [] }; return responders
        }
    }
}

@Suite("Asynchronous handlers and their responders")
struct ResponderTests {
    @Test(
        "requests held by an asynchronous handler wait without a thread and are answered later from another one"
    )
    func answeredLater() throws {
        let held = HeldResponders()
        let server = HTTPServer(configuration: .init(host: "127.0.0.1", port: 0, threadCount: 1)) {
            _, responder in held.add(responder)
        }
        try server.start()
        defer { server.shutdown(gracePeriod: .zero) }
        let results = Mutex<[Int]>([])
        let clients = (0..<8).map { _ in
            BackgroundWork {
                let status = (try? TestHTTPClient.get(server.url("/x")).status) ?? -1
                results.withLock { $0.append(status) }
            }
        }
        // All eight are held at once, with a single handler thread that none of them uses.
        #expect(waitUntil { held.count == 8 })
        #expect(results.withLock { $0.isEmpty })
        let responders = held.takeAll()
        DispatchQueue.global().async {
            for responder in responders { responder.respond(.text(status: 201, responder.request.path)) }
        }
        for client in clients { #expect(client.wait()) }
        #expect(results.withLock { $0 } == Array(repeating: 201, count: 8))
    }

    @Test("a second answer is ignored, and a responder dropped unanswered answers 500 itself")
    func exactlyOnce() throws {
        let server = HTTPServer(configuration: .init(host: "127.0.0.1", port: 0, threadCount: 1)) {
            request, responder in
            if request.path == "/twice" {
                responder.respond(.text(status: 200, "first"))
                responder.respond(.text(status: 202, "second"))
            }  // "/dropped": the responder goes away unanswered
        }
        try server.start()
        defer { server.shutdown(gracePeriod: .zero) }
        let twice = try TestHTTPClient.get(server.url("/twice"))
        #expect(twice.status == 200)
        #expect(twice.text == "first")
        #expect(try TestHTTPClient.get(server.url("/dropped")).status == 500)
        #expect(server.shutdown(gracePeriod: .seconds(5)))
    }
}
