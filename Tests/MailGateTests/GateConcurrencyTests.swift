import Foundation
import HTTPServer
import MailGate
import ServiceSupport
import Synchronization
import TestSupport
import Testing

@Suite("siwa-mailgate under 200 concurrent policy connections", .serialized)
struct GateConcurrencyTests {
    @Test(
        "200 connections asking together all get their own answers; decisions/s and p99 reported",
        arguments: [Duration.zero, .seconds(5)])
    func twoHundredConnections(cacheTTL: Duration) throws {
        let fixture = try GateFixture(cacheTTL: cacheTTL)
        let address = fixture.policyAddress
        let connections = 200
        let requests = 25
        let expected: [(String, String)] = [
            (Mailbox.on, "DUNNO"), (Mailbox.off, "550 5.2.1"), (Mailbox.gone, "550 5.1.1"),
            (Mailbox.elsewhere, "DUNNO"),
        ]
        let latencies = Mutex<[Duration]>([])
        let wrong = Mutex<[String]>([])
        let ready = DispatchGroup()
        let start = DispatchSemaphore(value: 0)
        let done = DispatchGroup()
        for index in 0..<connections {
            ready.enter()
            done.enter()
            Thread.detachNewThread {
                defer { done.leave() }
                guard let client = try? PolicyClient(address) else {
                    ready.leave()
                    wrong.withLock { $0.append("connect \(index)") }
                    return
                }
                ready.leave()
                start.wait()
                var mine: [Duration] = []
                for request in 0..<requests {
                    let (recipient, prefix) = expected[(index + request) % expected.count]
                    let began = ContinuousClock.now
                    let action: String?
                    do {
                        action = try client.ask(recipient: recipient)
                    } catch {
                        // A connection whose read failed is out of step: its later answers would be stale.
                        wrong.withLock { $0.append("\(recipient): \(error)") }
                        break
                    }
                    mine.append(ContinuousClock.now - began)
                    if action?.hasPrefix(prefix) != true {
                        wrong.withLock { $0.append("\(recipient): \(action ?? "closed")") }
                    }
                }
                latencies.withLock { $0 += mine }
            }
        }
        ready.wait()
        let began = ContinuousClock.now
        for _ in 0..<connections { start.signal() }
        done.wait()
        let elapsed = (ContinuousClock.now - began).inSeconds
        #expect(wrong.withLock { $0 }.isEmpty, "\(wrong.withLock { $0.prefix(5) })")
        let sorted = latencies.withLock { $0 }.sorted()
        #expect(sorted.count == connections * requests)
        guard !sorted.isEmpty else { return }
        let p50 = sorted[sorted.count / 2].inSeconds * 1000
        let p99 = sorted[sorted.count * 99 / 100].inSeconds * 1000
        print(
            "mailgate policy, 200 connections, cache ttl \(cacheTTL): \(Int(Double(sorted.count) / elapsed)) decisions/s, p50 \(String(format: "%.2f", p50)) ms, p99 \(String(format: "%.2f", p99)) ms"
        )
        let metrics = fixture.metrics
        #expect(metrics.contains("siwa_mailgate_policy_connections_total 200"))
        // Requests arriving together share a database call (one per address in flight, many addresses a call).
        let calls = ServiceProcess.value(of: "siwa_mailgate_database_batch_addresses_count", in: metrics) ?? 0
        let asked = ServiceProcess.value(of: "siwa_mailgate_database_batch_addresses_sum", in: metrics) ?? 0
        let misses = ServiceProcess.value(of: "siwa_mailgate_cache_misses_total", in: metrics) ?? 0
        #expect(calls > 0 && misses / calls > 1.5, "\(misses) lookups in \(calls) calls")
        print("  \(Int(misses)) lookups, \(Int(asked)) addresses asked in \(Int(calls)) database calls")
    }
}
