import Foundation
import Postgres
import TestSupport
import Testing

@Suite("siwactl events")
struct EventsTests {
    /// Six notifications of two users, in every state, received over the last three days.
    static func seeded() throws -> TestDatabase {
        let database = try TestDatabase()
        try database.insert(
            jti: "e1", type: "email-disabled", sub: "alice", state: "applied", receivedAgo: 3 * 86400,
            appliedAfter: 1)
        try database.insert(
            jti: "e2", type: "consent-revoked", sub: "bob", state: "dead", attempts: 10,
            receivedAgo: 2 * 86400, lastError: "boom")
        try database.insert(
            jti: "e3", type: "account-delete", sub: "alice", state: "skipped", receivedAgo: 5 * 3600,
            appliedAfter: 1)
        try database.insert(
            jti: "e4", type: "consent-revoked", sub: "alice", state: "pending", receivedAgo: 3600)
        try database.insert(
            jti: "e5", type: "email-enabled", sub: "bob", state: "applied", receivedAgo: 600, appliedAfter: 2)
        try database.insert(
            jti: "e6", type: "consent-revoked", sub: "bob", state: "dead", attempts: 10, receivedAgo: 60)
        return database
    }

    func jtis(_ database: TestDatabase, _ arguments: [String]) throws -> [String] {
        let result = try siwactl(["events", "--database-url", database.url, "--json"] + arguments)
        #expect(result.status == 0, "\(result.standardError)")
        return try jsonLines(result.standardOutput).map { $0["jti"] as? String ?? "?" }
    }

    @Test(
        "filters combine and rows come newest first",
        arguments: [
            ([], ["e6", "e5", "e4", "e3", "e2", "e1"]),
            (["--sub", "alice"], ["e4", "e3", "e1"]),
            (["--type", "consent-revoked"], ["e6", "e4", "e2"]),
            (["--type", "account-deleted"], ["e3"]),
            (["--state", "dead"], ["e6", "e2"]),
            (["--since", "2h"], ["e6", "e5", "e4"]),
            (["--since", "1d", "--sub", "bob"], ["e6", "e5"]),
            (
                ["--state", "dead", "--sub", "bob", "--type", "consent-revoked", "--since", "3d"],
                ["e6", "e2"]
            ),
            (["--limit", "2"], ["e6", "e5"]),
            (["--sub", "alice' OR '1'='1"], []),
        ])
    func filters(arguments: [String], expected: [String]) throws {
        #expect(try jtis(Self.seeded(), arguments) == expected)
    }

    @Test("--since accepts an ISO 8601 instant")
    func sinceISO8601() throws {
        let database = try Self.seeded()
        let instant = ISO8601DateFormatter().string(from: Date().addingTimeInterval(-30 * 3600))
        #expect(try jtis(database, ["--since", instant]) == ["e6", "e5", "e4", "e3"])
    }

    @Test("JSON lines carry every column an operator needs")
    func jsonShape() throws {
        let database = try Self.seeded()
        let result = try siwactl([
            "events", "--database-url", database.url, "--json", "--sub", "bob", "--state", "dead",
        ])
        let rows = try jsonLines(result.standardOutput)
        let old = try #require(rows.last)
        #expect(old["jti"] as? String == "e2")
        #expect(old["attempts"] as? Int == 10)
        #expect(old["last_error"] as? String == "boom")
        #expect(old["event_type"] as? String == "consent-revoked")
        #expect((old["received_at"] as? String)?.hasSuffix("Z") == true)
        #expect(old["applied_at"] is NSNull)
    }

    @Test("the table has a header and one aligned row per event")
    func table() throws {
        let database = try Self.seeded()
        let result = try siwactl(["events", "--database-url", database.url, "--sub", "alice"])
        #expect(result.status == 0)
        let lines = result.standardOutput.split(separator: "\n").map(String.init)
        #expect(lines.count == 4)
        #expect(lines[0].hasPrefix("RECEIVED"))
        let typeColumn = try #require(lines[0].range(of: "TYPE")).lowerBound.utf16Offset(in: lines[0])
        for line in lines.dropFirst() {
            let index = line.index(line.startIndex, offsetBy: typeColumn)
            #expect(
                ["email-disabled", "account-delete", "consent-revoked"].contains {
                    line[index...].hasPrefix($0)
                })
        }
        #expect(lines[1].contains("e4") && lines[3].contains("e1"))
    }

    @Test(
        "bad filters are usage errors",
        arguments: [["--state", "gone"], ["--since", "yesterday"], ["--limit", "0"], ["--limit", "x"]])
    func badFilters(arguments: [String]) throws {
        let result = try siwactl(["events", "--database-url", "postgresql://nobody@/none"] + arguments)
        #expect(result.status == 2)
    }
}

@Suite("siwactl replay")
struct ReplayTests {
    @Test("requeues one notification by jti")
    func byJTI() throws {
        let database = try EventsTests.seeded()
        let result = try siwactl(["replay", "--database-url", database.url, "--jti", "e2"])
        #expect(result.status == 0, "\(result.standardError)")
        #expect(result.standardOutput == "requeued 1 notification\n")
        #expect(try database.state(of: "e2") == "pending")
        #expect(try database.state(of: "e6") == "dead")
        let attempts = try database.query("SELECT attempts FROM siwa.notifications WHERE jti = 'e2'")[0][
            0, as: Int.self]
        #expect(attempts == 0)
    }

    @Test("requeues every dead notification, or only those received since a time")
    func byState() throws {
        let database = try EventsTests.seeded()
        let recent = try siwactl([
            "replay", "--database-url", database.url, "--state", "dead", "--since", "1h",
        ])
        #expect(recent.standardOutput == "requeued 1 notification\n")
        #expect(try database.state(of: "e6") == "pending")
        #expect(try database.state(of: "e2") == "dead")
        let all = try siwactl(["replay", "--database-url", database.url, "--state", "dead"])
        #expect(all.status == 0)
        #expect(all.standardOutput == "requeued 1 notification\n")
        #expect(try database.state(of: "e2") == "pending")
        let none = try siwactl(["replay", "--database-url", database.url, "--state", "dead"])
        #expect(none.status == 0)
        #expect(none.standardOutput == "requeued 0 notifications\n")
    }

    @Test("an unknown or pending jti requeues nothing and fails")
    func unknownJTI() throws {
        let database = try EventsTests.seeded()
        for jti in ["no-such-jti", "e4"] {
            let result = try siwactl(["replay", "--database-url", database.url, "--jti", jti])
            #expect(result.status == 1)
            #expect(result.standardOutput == "requeued 0 notifications\n")
        }
    }

    @Test(
        "needs exactly one of --jti and --state",
        arguments: [
            [], ["--jti", "a", "--state", "dead"], ["--state", "applied"], ["--jti", "a", "--since", "1h"],
        ])
    func usage(arguments: [String]) throws {
        let result = try siwactl(["replay", "--database-url", "postgresql://nobody@/none"] + arguments)
        #expect(result.status == 2)
    }
}

@Suite("siwactl stats")
struct StatsTests {
    @Test("counts the queue and measures the last hour on seeded data")
    func numbers() throws {
        let database = try TestDatabase()
        // Pending: one due, one retrying and due, one retrying and not yet due (oldest: 30 minutes).
        try database.insert(jti: "p1", state: "pending", receivedAgo: 1800)
        try database.insert(jti: "p2", state: "pending", attempts: 2, receivedAgo: 600)
        try database.insert(jti: "p3", state: "pending", attempts: 1, receivedAgo: 300, dueIn: 3600)
        try database.insert(jti: "d1", state: "dead", attempts: 10, receivedAgo: 7200)
        try database.insert(jti: "d2", state: "dead", attempts: 10, receivedAgo: 120)
        // Applied in the last hour after 1, 2, 3 and 4 seconds; one applied two hours ago is outside.
        for (index, latency) in [1.0, 2.0, 3.0, 4.0].enumerated() {
            try database.insert(jti: "a\(index)", state: "applied", receivedAgo: 900, appliedAfter: latency)
        }
        try database.insert(jti: "old", state: "applied", receivedAgo: 3 * 3600, appliedAfter: 60)

        let result = try siwactl(["stats", "--database-url", database.url, "--json"])
        #expect(result.status == 0, "\(result.standardError)")
        let stats = try #require(try jsonLines(result.standardOutput).first)
        #expect(stats["pending"] as? Int == 3)
        #expect(stats["due"] as? Int == 2)
        #expect(stats["retrying"] as? Int == 2)
        #expect(stats["dead"] as? Int == 2)
        let oldest = try #require(stats["oldest_pending_seconds"] as? Double)
        #expect(oldest >= 1800 && oldest < 1860)
        #expect(stats["received_last_hour"] as? Int == 8)
        #expect(stats["applied_last_hour"] as? Int == 4)
        let p50 = try #require(stats["apply_latency_p50_seconds"] as? Double)
        let p99 = try #require(stats["apply_latency_p99_seconds"] as? Double)
        #expect(abs(p50 - 2.5) < 0.01)
        #expect(p99 > 3.9 && p99 <= 4.0)

        let text = try siwactl(["stats", "--database-url", database.url])
        #expect(text.status == 0)
        #expect(text.standardOutput.contains("pending"))
        #expect(text.standardOutput.contains("3 (due now 2, retrying 2)"))
        #expect(text.standardOutput.contains("2.500 s"))
    }

    @Test("shows what the docs say: busy notifications and webhook deliveries, beside the queue")
    func busyAndWebhooks() throws {
        let database = try TestDatabase()
        try database.insert(jti: "busy-1", state: "pending", receivedAgo: 300)
        try database.query(
            "UPDATE siwa.notification_queue SET busy_since = now() - interval '2 minutes'")
        let result = try siwactl(["stats", "--database-url", database.url, "--json"])
        #expect(result.status == 0, "\(result.standardError)")
        let stats = try #require(try jsonLines(result.standardOutput).first)
        #expect(stats["busy"] as? Int == 1)
        let busyFor = try #require(stats["oldest_busy_seconds"] as? Double)
        #expect(busyFor >= 120 && busyFor < 180)
        #expect(stats["webhook_deliveries_pending"] as? Int == 0)
        #expect(stats["webhook_deliveries_dead"] as? Int == 0)
        #expect(stats["webhook_endpoints_enabled"] as? Int == 0)

        let text = try siwactl(["stats", "--database-url", database.url])
        #expect(text.standardOutput.contains("busy "), "\(text.standardOutput)")
        #expect(text.standardOutput.contains("1 (longest 2m "), "\(text.standardOutput)")
        #expect(
            text.standardOutput.contains("0 pending, 0 dead, 0 endpoint(s) enabled"), "\(text.standardOutput)"
        )
    }

    @Test("a database without the schema is reported with the fix")
    func unmigrated() throws {
        let database = try TestDatabase(.empty)
        let result = try siwactl(["stats", "--database-url", database.url])
        #expect(result.status == 1)
        #expect(result.standardError.contains("siwactl migrate"))
    }

    @Test("an empty queue has no ages or latencies")
    func empty() throws {
        let database = try TestDatabase()
        let result = try siwactl(["stats", "--database-url", database.url, "--json"])
        let stats = try #require(try jsonLines(result.standardOutput).first)
        #expect(stats["pending"] as? Int == 0)
        #expect(stats["oldest_pending_seconds"] is NSNull)
        #expect(stats["apply_latency_p99_seconds"] is NSNull)
    }
}
