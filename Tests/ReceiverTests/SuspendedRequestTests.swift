import AppleNotifications
import Foundation
import HTTPServer
import Postgres
import Receiver
import ServiceSupport
import TestSupport
import Testing

/// The notification endpoint answers asynchronously: a delivery waiting for its commit holds no thread,
/// only its suspended connection, and is answered from the commit's completion.
@Suite("Deliveries suspended while their commit is pending")
struct SuspendedRequestTests {
    /// Holds `siwa.notifications` locked (every INSERT waits) until ``release()``.
    final class TableLock {
        private let connection: PostgresConnection

        init(_ database: PostgresConfiguration) throws {
            connection = try PostgresConnection(configuration: database)
            try connection.simpleQuery("BEGIN; LOCK TABLE siwa.notifications IN ACCESS EXCLUSIVE MODE")
        }

        func release() throws {
            try connection.simpleQuery("ROLLBACK")
            connection.close()
        }
    }

    /// A delivery of `token` as raw bytes on a fresh connection (sent, not yet answered).
    static func send(_ token: String, to harness: ReceiverHarness) throws -> RawHTTPConnection {
        let body = #"{"payload":"\#(token)"}"#
        let connection = try harness.rawConnection(timeout: .seconds(60))
        try connection.send(
            "POST /apple/notifications HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                + "Content-Length: \(body.utf8.count)\r\n\r\n\(body)")
        return connection
    }

    /// How many deliveries are waiting for their commit now.
    static func waiting(_ harness: ReceiverHarness) -> Int { harness.metrics?.inFlight.value ?? -1 }

    /// How many deliveries have been answered so far (any outcome).
    static func answered(_ harness: ReceiverHarness) -> Int {
        DeliveryOutcome.allCases.reduce(0) { $0 + (harness.metrics?.delivery($1).value ?? 0) }
    }

    @Test("64 deliveries wait for their commit with only 2 handler threads, and are answered 200 after it")
    func manyConcurrentDeliveries() throws {
        let harness = try ReceiverHarness(poolSize: 4, commitTimeout: .seconds(60), handlerThreads: 2)
        let jtis = (0..<64).map { _ in UUID().uuidString }
        let lock = try TableLock(harness.database)
        let connections = try jtis.map { try Self.send(TestSigning.token(jti: $0), to: harness) }

        // Every one is verified and waiting for the (blocked) commit at once, none answered yet: a
        // thread per waiting request could not do this with two threads.
        #expect(waitUntil(timeout: .seconds(30)) { Self.waiting(harness) == 64 })
        #expect(Self.answered(harness) == 0)

        try lock.release()
        for connection in connections {
            let response = try connection.readResponse()
            #expect(response.status == 200)
            #expect(response.text == #"{"status":"accepted"}"#)
        }
        #expect(try harness.totalRows() == 64)
        #expect(Self.waiting(harness) == 0)
    }

    @Test("a commit that times out answers 503 to exactly the deliveries it held; others are not delayed")
    func commitTimeout() throws {
        let harness = try ReceiverHarness(poolSize: 4, commitTimeout: .seconds(1))
        let jtis = (0..<8).map { _ in UUID().uuidString }
        let lock = try TableLock(harness.database)
        let held = try jtis.map { try Self.send(TestSigning.token(jti: $0), to: harness) }
        // A forged delivery meanwhile is answered at once: it never waits for the database.
        var attacker = TestSigning.other
        attacker.keyID = TestSigning.apple.keyID
        let forged = try harness.deliver(TestSigning.token(signer: attacker))
        #expect(forged.status == 401)

        for connection in held {
            let response = try connection.readResponse()
            #expect(response.status == 503)
            #expect(response.headers["Retry-After"] != nil)
            #expect(response.text.contains("storage_unavailable"))
        }
        try lock.release()
        #expect(try harness.deliver(TestSigning.token()).status == 200)
        // The rows that timed out may still be committed later; Apple's retry is then a duplicate,
        // never a second row.
        #expect(try waitUntil { try harness.rowCount(jti: jtis[0]) == 1 })
        let retry = try harness.deliver(TestSigning.token(jti: jtis[0]))
        #expect(retry.status == 200)
        #expect(retry.text == #"{"status":"duplicate"}"#)
        #expect(try harness.rowCount(jti: jtis[0]) == 1)
    }

    @Test(
        "at shutdown, suspended deliveries are answered 200 once their commit lands, and every row is there")
    func shutdownAnswersAfterCommit() throws {
        let harness = try ReceiverHarness(
            poolSize: 4, commitTimeout: .seconds(60), shutdownGracePeriod: .milliseconds(100))
        let jtis = (0..<16).map { _ in UUID().uuidString }
        let lock = try TableLock(harness.database)
        let connections = try jtis.map { try Self.send(TestSigning.token(jti: $0), to: harness) }
        #expect(waitUntil(timeout: .seconds(30)) { Self.waiting(harness) == 16 })

        let stopped = DispatchSemaphore(value: 0)
        Thread {
            harness.shutdown(); stopped.signal()
        }.start()
        // Shutting down: new connections are refused, the grace period passes, the 16 stay suspended.
        #expect(waitUntil { (try? harness.rawConnection(timeout: .seconds(1))) == nil })
        #expect(Self.answered(harness) == 0)

        try lock.release()
        for connection in connections {
            let response = try connection.readResponse()
            #expect(response.status == 200)
        }
        #expect(stopped.wait(timeout: .now() + 30) == .success)
        for jti in jtis { #expect(try harness.rowCount(jti: jti) == 1) }
    }

    @Test("at shutdown, suspended deliveries whose commit cannot land get 503 at their deadline, never 200")
    func shutdownAnswersUnavailable() throws {
        let harness = try ReceiverHarness(
            poolSize: 4, commitTimeout: .seconds(2), shutdownGracePeriod: .milliseconds(100))
        let jtis = (0..<8).map { _ in UUID().uuidString }
        let lock = try TableLock(harness.database)
        let connections = try jtis.map { try Self.send(TestSigning.token(jti: $0), to: harness) }
        #expect(waitUntil(timeout: .seconds(30)) { Self.waiting(harness) == 8 })

        let stopped = DispatchSemaphore(value: 0)
        Thread {
            harness.shutdown(); stopped.signal()
        }.start()
        for connection in connections {
            #expect(try connection.readResponse().status == 503)
        }
        // The committers still hold the blocked INSERT; shutdown ends once it completes.
        try lock.release()
        #expect(stopped.wait(timeout: .now() + 30) == .success)
    }

    @Test("a client that disconnects while suspended costs nothing: its row is stored, others are served")
    func clientDisconnectsWhileSuspended() throws {
        let harness = try ReceiverHarness(poolSize: 4, commitTimeout: .seconds(60))
        let jti = UUID().uuidString
        let lock = try TableLock(harness.database)
        var leaving: RawHTTPConnection? = try Self.send(TestSigning.token(jti: jti), to: harness)
        #expect(waitUntil(timeout: .seconds(30)) { Self.waiting(harness) == 1 })
        #expect(leaving != nil)
        leaving = nil  // closes the socket

        try lock.release()
        #expect(try waitUntil { try harness.rowCount(jti: jti) == 1 })
        #expect(waitUntil { Self.waiting(harness) == 0 })
        #expect(try harness.deliver(TestSigning.token()).status == 200)
        #expect(harness.shutdown())
    }
}
