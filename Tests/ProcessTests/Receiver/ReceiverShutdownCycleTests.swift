import AppleNotifications
import Foundation
import Postgres
import Synchronization
import TestSupport
import Testing

@Suite("siwa-receiver start → traffic → SIGTERM cycles", .serialized)
struct ReceiverShutdownCycleTests {
    static let cycles = 50

    @Test(
        "50 cycles of start, signed notifications and scrapes over keep-alive connections (a PostgreSQL restart in some), SIGTERM mid-traffic: exit status 0 every time"
    )
    func cyclesExitCleanly() throws {
        let cluster = try PostgresCluster.start()  // its own: it is restarted
        defer { cluster.destroy() }
        let database = try cluster.createSchemaDatabase()
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "siwa-receiver-cycles-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        // Signed once: signing in debug builds is slower than the receiver's verification.
        // One in four is signed with a key Apple does not publish (answered 401 without the database).
        let tokens = (0..<64).map { index in
            let token = TestSigning.token(signer: index % 4 == 3 ? TestSigning.other : TestSigning.apple)
            return Array(#"{"payload":"\#(token)"}"#.utf8)
        }
        let next = TokenCursor()

        var failures: [String] = []
        for cycle in 0..<Self.cycles {
            let log = directory.appendingPathComponent("receiver-\(cycle).log").path
            let addresses = ListenAddresses()
            defer { addresses.remove() }
            let process = try Subprocess(
                ReceiverProcessTests.binary.path,
                [
                    "--listen", "127.0.0.1:0", "--database-url",
                    cluster.url(database: database.database!), "--audience", TestSigning.audience,
                    "--jwks-url", jwks.url.absoluteString, "--threads", "2", "--pool-size", "4",
                ] + addresses.arguments,
                environment: ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") },
                standardError: log)
            let address = try addresses.address("notifications", of: process) {
                (try? String(contentsOf: URL(fileURLWithPath: log), encoding: .utf8)) ?? ""
            }
            let port = try ListenAddresses.port(of: address)
            let url = "http://" + address
            guard
                waitUntil(timeout: .seconds(20), { (try? TestHTTPClient.get(url + "/readyz").status) == 200 })
            else {
                failures.append("cycle \(cycle): never ready")
                continue
            }
            let traffic = KeepAliveTraffic(port: port, clients: 4, idle: .milliseconds(2)) {
                .init(
                    method: "POST", path: "/apple/notifications", body: tokens[next.advance() % tokens.count])
            }
            // Scrapes answered in microseconds: the server is often idle with a request already on its way.
            let scrapes = KeepAliveTraffic(port: port, clients: 2) { .init(method: "GET", path: "/metrics") }
            #expect(waitUntil(timeout: .seconds(20)) { traffic.count(status: 200) >= 5 }, "cycle \(cycle)")
            if cycle % 10 == 5 {
                // The database goes away and comes back under traffic: the receiver answers 503, then 200.
                try cluster.stop(mode: .fast)
                try cluster.start()
                let stored = traffic.count(status: 200)
                #expect(
                    waitUntil(timeout: .seconds(20)) { traffic.count(status: 200) > stored + 3 },
                    "cycle \(cycle): no 200 after the restart")
            }
            // One cycle in four stops under the full load, the others at a lull, when only the scrapes (like a
            // monitoring system's, on keep-alive connections) still arrive.
            if cycle % 4 != 1 { traffic.stop() }
            process.send(SIGTERM)
            let termination = process.wait(timeout: .seconds(30))
            traffic.stop()
            scrapes.stop()
            let output = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
            if termination != .exited(0) || CrashReport.showsCrash(output)
                || !output.contains("siwa-receiver stopped")
            {
                failures.append(
                    "cycle \(cycle): \(termination.map { "\($0)" } ?? "still running"); stderr:\n"
                        + CrashReport.summary(output))
            }
        }
        #expect(
            failures.isEmpty,
            "\(failures.count) of \(Self.cycles) cycles failed:\n\(failures.joined(separator: "\n"))")
    }
}

/// Hands out token indexes to the traffic threads.
private final class TokenCursor: Sendable {
    private let value = Atomic<Int>(0)
    func advance() -> Int { value.add(1, ordering: .relaxed).oldValue }
}
