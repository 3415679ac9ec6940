import Foundation
import Postgres
import TestSupport
import Testing

/// The receiver wakes the worker after its commit: a worker whose poll interval is minutes applies a
/// POSTed notification in well under a poll.
@Suite("The receiver's wake-up of the worker", .serialized)
struct WakeUpProcessTests {
    @Test("a worker polling every 300 s applies each POSTed notification within seconds")
    func receiverWakesWorker() throws {
        let database = try TestDatabase()
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let receiver = try ServiceProcess.receiver(database, audiences: [TestSigning.audience], jwks: jwks)
        let worker = try WorkerProcess(
            ["--poll-interval", "300", "--jwks-url", jwks.url.absoluteString],
            databaseURL: try database.url(asMemberOf: "siwa_worker"))
        // Listening once it has connected: it logs that line after LISTEN, and drains once (nothing).
        #expect(waitUntil(timeout: .seconds(20)) { worker.log.contains("\"connected\"") })
        for index in 0..<3 {
            let jti = "wake-\(index)-\(UUID().uuidString)"
            let body = Array(
                #"{"payload":"\#(TestSigning.token(subject: "001234.wake.\(index)", jti: jti))"}"#.utf8)
            let started = ContinuousClock.now
            #expect(try TestHTTPClient.post(receiver.notificationURL!, body: body).status == 200)
            #expect(
                try waitUntil(timeout: .seconds(60)) {
                    try database.value(
                        "SELECT count(*) FROM siwa.notifications WHERE jti = $1 AND state = 'applied'",
                        [.text(jti)], as: Int.self) == 1
                })
            let waited = ContinuousClock.now - started
            #expect(waited < .seconds(20), "applied after \(waited), the poll interval is 300 s")
        }
        worker.send(SIGTERM)
        #expect(worker.waitForExit(timeout: .seconds(10)) == 0)
        _ = receiver
    }
}
