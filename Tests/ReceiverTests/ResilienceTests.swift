import AppleNotifications
import Foundation
import HTTPServer
import Postgres
import Receiver
import TestSupport
import Testing

@Suite("Deliveries under concurrency, key rotation and outages")
struct ResilienceTests {
    @Test("300 concurrent deliveries become exactly 300 rows")
    func concurrentDeliveries() throws {
        let harness = try ReceiverHarness(poolSize: 8)
        let tokens = (0..<300).map { i in TestSigning.token(subject: "001.concurrent.\(i % 30)") }
        let statuses = ConcurrentResults(count: tokens.count)
        DispatchQueue.concurrentPerform(iterations: 30) { worker in
            for index in stride(from: worker, to: tokens.count, by: 30) {
                statuses.set(index, (try? harness.deliver(tokens[index]).status) ?? -1)
            }
        }
        #expect(statuses.values.allSatisfy { $0 == 200 })
        #expect(try harness.totalRows() == 300)
    }

    @Test("a new kid is accepted after one refetch; junk kids cause at most one more fetch")
    func keyRotation() throws {
        let harness = try ReceiverHarness(cooldown: .seconds(30))
        let jwks = try #require(harness.jwks)
        #expect(try harness.deliver(TestSigning.token()).status == 200)
        let fetchesBefore = jwks.requestCount

        // Apple rotates: the set now publishes the other key too.
        jwks.setBody(TestSigning.keySet(of: [TestSigning.apple, TestSigning.other]))
        #expect(try harness.deliver(TestSigning.token(signer: TestSigning.other)).status == 200)
        #expect(jwks.requestCount == fetchesBefore + 1)

        // A flood of junk kids within the cooldown: refused, and Apple is not hammered.
        let statuses = ConcurrentResults(count: 40)
        DispatchQueue.concurrentPerform(iterations: 40) { i in
            var junk = TestSigning.other
            junk.keyID = "junk-\(i)"
            statuses.set(i, (try? harness.deliver(TestSigning.token(signer: junk)).status) ?? -1)
        }
        #expect(statuses.values.allSatisfy { $0 == 401 })
        #expect(jwks.requestCount <= fetchesBefore + 2)
    }

    @Test("concurrent misses for a new kid share one fetch")
    func coalescedFetch() throws {
        let harness = try ReceiverHarness(cooldown: .milliseconds(1))
        let jwks = try #require(harness.jwks)
        #expect(try harness.deliver(TestSigning.token()).status == 200)
        let fetchesBefore = jwks.requestCount
        jwks.setBody(TestSigning.keySet(of: [TestSigning.apple, TestSigning.other]))
        jwks.setDelay(.milliseconds(300))
        let statuses = ConcurrentResults(count: 10)
        DispatchQueue.concurrentPerform(iterations: 10) { i in
            statuses.set(i, (try? harness.deliver(TestSigning.token(signer: TestSigning.other)).status) ?? -1)
        }
        #expect(statuses.values.allSatisfy { $0 == 200 })
        #expect(jwks.requestCount - fetchesBefore <= 2)
    }

    @Test("with the key endpoint down, known kids still verify and an unknown kid gets 503")
    func keyEndpointDown() throws {
        let harness = try ReceiverHarness(cooldown: .milliseconds(1))
        let jwks = try #require(harness.jwks)
        #expect(try harness.deliver(TestSigning.token()).status == 200)
        jwks.fail(status: 500)
        #expect(try harness.deliver(TestSigning.token()).status == 200)
        let unknown = try harness.deliver(TestSigning.token(signer: TestSigning.other))
        #expect(unknown.status == 503)
        #expect(unknown.headers["Retry-After"] != nil)
        jwks.serveGarbage()
        #expect(try harness.deliver(TestSigning.token(signer: TestSigning.other)).status == 503)
        #expect(try harness.deliver(TestSigning.token()).status == 200)

        // Recovery needs no restart.
        jwks.setBody(TestSigning.keySet(of: [TestSigning.apple, TestSigning.other]))
        jwks.serveNormally()
        #expect(try harness.deliver(TestSigning.token(signer: TestSigning.other)).status == 200)
    }

    @Test("a receiver started while the key endpoint is down is not ready, then recovers")
    func startsWithoutKeys() throws {
        let harness = try ReceiverHarness(
            keys: .served(Data("garbage".utf8)), cooldown: .milliseconds(200), waitForKeys: false)
        let jwks = try #require(harness.jwks)
        #expect(try harness.get("/readyz").status == 503)
        #expect(try harness.deliver(TestSigning.token()).status == 503)
        jwks.setBody(TestSigning.apple.jwksJSON())
        #expect(try waitUntil { try harness.get("/readyz").status == 200 })
        #expect(try harness.deliver(TestSigning.token()).status == 200)
    }
}

@Suite("A database outage", .serialized)
struct DatabaseOutageTests {
    @Test(
        "database stopped → 503, restarted → 200 without restarting the receiver",
        arguments: [PostgresCluster.StopMode.fast, .immediate])
    func outage(mode: PostgresCluster.StopMode) throws {
        let cluster = try PostgresCluster.start()
        defer { cluster.destroy() }
        let harness = try ReceiverHarness(cluster: cluster, poolSize: 4)
        #expect(try harness.deliver(TestSigning.token()).status == 200)

        try cluster.stop(mode: mode)
        let down = try harness.deliver(TestSigning.token())
        #expect(down.status == 503)
        #expect(down.headers["Retry-After"] != nil)
        #expect(try harness.get("/readyz").status == 503)

        try cluster.start()
        let jti = UUID().uuidString
        #expect(try waitUntil { try harness.deliver(TestSigning.token(jti: jti)).status == 200 })
        #expect(try harness.rowCount(jti: jti) == 1)
        #expect(try harness.get("/readyz").status == 200)
    }
}

/// Results written by index from many threads.
final class ConcurrentResults: @unchecked Sendable {
    private let lock = NSLock()
    private var storage: [Int]
    init(count: Int) { storage = Array(repeating: 0, count: count) }
    func set(_ index: Int, _ value: Int) { lock.withLock { storage[index] = value } }
    var values: [Int] { lock.withLock { storage } }
}

@Suite("Group commit")
struct GroupCommitTests {
    @Test("the same notification delivered 20 times at once is accepted once and stored once")
    func concurrentDuplicates() throws {
        let harness = try ReceiverHarness()
        let jti = UUID().uuidString
        let token = TestSigning.token(jti: jti)
        let bodies = ConcurrentResults(count: 20)
        let accepted = ConcurrentResults(count: 20)
        DispatchQueue.concurrentPerform(iterations: 20) { i in
            let response = try? harness.deliver(token)
            bodies.set(i, response?.status ?? -1)
            accepted.set(i, response?.text == #"{"status":"accepted"}"# ? 1 : 0)
        }
        #expect(bodies.values.allSatisfy { $0 == 200 })
        #expect(accepted.values.reduce(0, +) == 1)
        #expect(try harness.rowCount(jti: jti) == 1)
    }

    @Test("a row the database refuses fails alone; the rest of its batch is stored")
    func poisonedRowIsIsolated() throws {
        let harness = try ReceiverHarness(poolSize: 4)
        // PostgreSQL text cannot hold U+0000; Apple never sends it, but the batch must not suffer.
        let tokens = (0..<40).map { i in TestSigning.token(subject: i == 7 ? "bad\u{0}sub" : "001.batch.\(i)")
        }
        let statuses = ConcurrentResults(count: tokens.count)
        DispatchQueue.concurrentPerform(iterations: tokens.count) { i in
            statuses.set(i, (try? harness.deliver(tokens[i]).status) ?? -1)
        }
        let values = statuses.values
        #expect(values[7] == 503)
        #expect(values.enumerated().allSatisfy { $0.offset == 7 || $0.element == 200 })
        #expect(try harness.totalRows() == 39)
        let metrics = try harness.get("/metrics").text
        #expect(metrics.contains("siwa_commit_batch_size_count"))
    }
}

@Suite("Storage deadlines")
struct StorageDeadlineTests {
    @Test("a store call gives up at its deadline while the table is locked, and at once when it has passed")
    func deadline() throws {
        let database = try PostgresCluster.shared.createSchemaDatabase()
        let pool = PostgresPool(configuration: database, maxConnections: 2)
        defer { pool.close() }
        let store = NotificationStore(pool: pool, configuration: .init(committers: 2))
        defer { store.close() }
        let locker = try PostgresConnection(configuration: database)
        try locker.simpleQuery("BEGIN; LOCK TABLE siwa.notifications IN ACCESS EXCLUSIVE MODE")
        let notification = try TestSigning.verifier.verify(
            token: TestSigning.token(), keys: TestSigning.appleKeySet)

        let started = ContinuousClock.now
        #expect(throws: NotificationStore.CommitTimeout.self) {
            try store.store(notification, rawToken: "t", deadline: .now + .milliseconds(300))
        }
        let waited = ContinuousClock.now - started
        #expect(waited >= .milliseconds(300) && waited < .seconds(3), "waited \(waited)")
        #expect(throws: NotificationStore.CommitTimeout.self) {
            try store.store(notification, rawToken: "t", deadline: .now - .seconds(1))
        }
        try locker.simpleQuery("ROLLBACK")
        locker.close()
    }
}
