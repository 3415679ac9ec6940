import Foundation
import Postgres
import SharedSignals
import Synchronization
import TestSupport
import Testing

/// How many SETs the receiver was sent, from any of its threads.
private final class PushCount: Sendable {
    private let value = Atomic<Int>(0)
    func next() -> Int { value.add(1, ordering: .sequentiallyConsistent).oldValue }
    var count: Int { value.load(ordering: .sequentiallyConsistent) }
}

@Suite("Shared Signals push: a worker killed mid-push is taken over, the same SET sent again")
struct SharedSignalsCrashTests {
    @Test("kill -9 of siwa-worker while the receiver holds the POST: delivered at least once, jti unchanged")
    func killedDuringThePush() throws {
        let database = try TestDatabase()
        let key = try SETSigningKey.generate()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "ssf-crash-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let keyFile = directory.appendingPathComponent("ssf-key.pem").path
        try key.privateKeyPEM.write(toFile: keyFile, atomically: true, encoding: .utf8)
        let authorizationFile = directory.appendingPathComponent("authorization").path
        try "Bearer crash-test\n".write(toFile: authorizationFile, atomically: true, encoding: .utf8)
        let issuer = "https://ssf.example.test"
        let audience = "https://receiver.example.test/crash"
        let pushes = PushCount()
        let receiver = try SETReceiver(
            keys: key.keySet(), issuer: issuer, audience: audience, authorization: "Bearer crash-test"
        ) { _, _ in
            if pushes.next() == 0 { Thread.sleep(forTimeInterval: 12) }
            return nil
        }
        _ =
            try database.value(
                "SELECT siwa.add_ssf_stream('crash', $1, $2, $3)",
                [.text(audience), .text(receiver.url), .text("file:" + authorizationFile)]) as Int
        try database.connection.execute(
            """
            INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti)
            VALUES ('siwa.consent_revoked', '001.killed', now(), now(), 'apple-jti-1')
            """)
        let jti: String = try database.value("SELECT jti FROM siwa.ssf_events")
        let arguments = [
            "--ssf-key-file", keyFile, "--ssf-issuer", issuer, "--ssf-timeout", "5", "--webhook-concurrency",
            "0",
            "--log-level", "info",
        ]
        let first = try WorkerProcess(arguments, databaseURL: database.url)
        #expect(
            waitUntil(timeout: .seconds(20)) {
                pushes.count == 1
                    && (try? database.value(
                        "SELECT count(*)::int FROM siwa.ssf_events WHERE lease_owner IS NOT NULL AND attempts = 1"
                    )
                        as Int) == 1
            }, "\(first.log)")
        first.send(SIGKILL)
        #expect(first.waitForExit(timeout: .seconds(10)) == 128 + SIGKILL)
        let killed = ContinuousClock.now
        let second = try WorkerProcess(arguments, databaseURL: database.url)
        defer {
            second.send(SIGTERM)
            _ = second.waitForExit(timeout: .seconds(20))
        }
        let delivered = waitUntil(timeout: .seconds(30)) {
            (try? database.value("SELECT state FROM siwa.ssf_events") as String) == "delivered"
        }
        #expect(delivered, "\(second.log)")
        // Two pushes arrived (the held one is logged only once its hold ends); each the same SET.
        #expect(pushes.count >= 2)
        #expect(!receiver.accepted.isEmpty && receiver.received.allSatisfy { $0.jti == jti })
        #expect(try database.value("SELECT attempts FROM siwa.ssf_events") as Int == 2)
        print("ssf crash: delivered \(ContinuousClock.now - killed) after the kill")
    }
}
