import Foundation
import Postgres
import SharedSignals
import TestSupport
import Testing

/// `siwa-worker --print-connections`: the one count of the worker's PostgreSQL connections, which
/// docs/operations.md (*Connections*) quotes. A running worker must not hold more than it prints.
@Suite("siwa-worker --print-connections", .serialized)
struct WorkerConnectionsProcessTests {
    /// The executables' environment: this process's, without any SIWA_* setting of the caller.
    static let clean = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }

    /// Nothing listens there: printing must not connect.
    static let unreachable = "postgresql://siwa@127.0.0.1:1/nowhere?connect_timeout=2"

    static func write(_ text: String, to url: URL) throws {
        try Data(text.utf8).write(to: url)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: url.path)
    }

    /// Runs `siwa-worker --print-connections` with `arguments`; returns the rows by user, the total and
    /// the output.
    static func printed(_ arguments: [String], environment: [String: String] = [:]) throws -> (
        rows: [String: Int], total: Int, text: String
    ) {
        let result = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwa-worker"), arguments: ["--print-connections"] + arguments,
            environment: clean.merging(["SIWA_DATABASE_URL": unreachable], uniquingKeysWith: { $1 })
                .merging(environment, uniquingKeysWith: { $1 }),
            timeout: .seconds(20))
        try #require(result.status == 0, "\(result.standardError)")
        var rows: [String: Int] = [:]
        for line in result.standardOutput.split(separator: "\n") {
            // "<user>  <count>  <note>": the user may have spaces; the count is the first number.
            let words = line.split(separator: " ")
            guard let index = words.firstIndex(where: { Int($0) != nil }) else { continue }
            rows[words[..<index].joined(separator: " ")] = Int(words[index])
        }
        let total = try #require(rows["total"], "no total in:\n\(result.standardOutput)")
        return (rows, total, result.standardOutput)
    }

    /// The worker's connections to `db` now (every one is named siwa-worker…, see Connections.swift).
    static func held(_ db: TestDatabase) throws -> Int {
        try db.value(
            """
            SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name LIKE 'siwa-worker%'
            """, as: Int.self)
    }

    /// Starts a worker with `arguments`, waits until it holds `total` connections, samples for a while
    /// and stops it; returns the most seen.
    static func peak(_ arguments: [String], db: TestDatabase, total: Int, environment: [String: String] = [:])
        throws -> Int
    {
        let worker = try WorkerProcess(arguments, databaseURL: db.url, environment: environment)
        defer {
            worker.send(SIGTERM)
            _ = worker.waitForExit(timeout: .seconds(20))
        }
        var most = 0
        let reached = try waitUntil(timeout: .seconds(20)) {
            most = max(most, try held(db))
            return most >= total
        }
        #expect(reached, "held \(most) of \(total): \(worker.log.suffix(2000))")
        for _ in 0..<10 {
            Thread.sleep(forTimeInterval: 0.2)
            most = max(most, try held(db))
        }
        return most
    }

    @Test(
        "default flags: 6 (a lane, maintenance, heartbeat, webhook gauges, two webhook lanes); a running worker holds no more"
    )
    func defaults() throws {
        let (rows, total, text) = try Self.printed([])
        #expect(total == 6)
        // docs/operations.md quotes this output, not numbers of its own: the quote must be it.
        let root = RepositoryRoot.url
        let operations = try String(
            contentsOf: root.appendingPathComponent("docs/operations.md"), encoding: .utf8)
        let quoted = try #require(
            operations.components(separatedBy: "$ siwa-worker --print-connections          # the defaults\n")
                .dropFirst().first?.components(separatedBy: "```").first,
            "docs/operations.md quotes no siwa-worker --print-connections")
        #expect(quoted == text, "docs/operations.md, Connections: quote siwa-worker --print-connections")
        #expect(rows["notification lanes"] == 1)
        #expect(rows["maintenance"] == 1)
        #expect(rows["heartbeat and gauges"] == 1)
        #expect(rows["webhook gauges"] == 1)
        #expect(rows["webhook lanes"] == 2)
        #expect(rows["Shared Signals lanes"] == 0)
        #expect(rows["suppression lanes"] == 0)
        #expect(rows["revoker"] == 0)
        #expect(rows.filter { $0.key != "total" }.values.reduce(0, +) == total)
        // Settings from the environment count too; --once runs only the lanes.
        #expect(
            try Self.printed(
                [], environment: ["SIWA_WORKER_CONCURRENCY": "4", "SIWA_WEBHOOK_CONCURRENCY": "1"]
            )
            .total == 8)
        #expect(try Self.printed(["--concurrency", "3", "--webhook-concurrency", "0"]).total == 6)
        #expect(try Self.printed(["--concurrency", "3", "--once"]).total == 3)

        let db = try TestDatabase()
        let most = try Self.peak([], db: db, total: total)
        #expect(most <= total, "a default worker held \(most) connections, printed \(total)")
    }

    @Test(
        "webhooks, Shared Signals, suppressions and the revoker on: each adds its lanes; a running worker holds no more"
    )
    func everythingOn() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("connections-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let setKeyFile = directory.appendingPathComponent("ssf-key.pem")
        try Self.write(try SETSigningKey.generate().privateKeyPEM, to: setKeyFile)
        let sendgridKey = directory.appendingPathComponent("sendgrid-key")
        try Self.write("SG.test-only-key", to: sendgridKey)
        let postmarkToken = directory.appendingPathComponent("postmark-token")
        try Self.write("test-only-token", to: postmarkToken)
        let apple = try LocalApple()
        let tokenKeys = try writeKeyFile([("k1", randomKey())], in: directory)
        let arguments = [
            "--concurrency", "2", "--webhook-concurrency", "3", "--ssf-key-file", setKeyFile.path,
            "--ssf-issuer", "https://ssf.example.test", "--ssf-concurrency", "2", "--suppressions",
            "sendgrid,postmark", "--sendgrid-key-file", sendgridKey.path, "--sendgrid-api-url",
            "http://127.0.0.1:1", "--postmark-token-file", postmarkToken.path, "--postmark-api-url",
            "http://127.0.0.1:1", "--apple-key-file", apple.teamKeyFile.path, "--apple-team-id",
            LocalApple.teamID, "--apple-key-id", LocalApple.keyID, "--apple-url", apple.baseURL,
            "--audience", LocalApple.clientID, "--token-key-file", tokenKeys,
        ]
        let (rows, total, _) = try Self.printed(arguments)
        #expect(rows["notification lanes"] == 2)
        #expect(rows["webhook lanes"] == 3)
        #expect(rows["Shared Signals lanes"] == 2)
        #expect(rows["suppression lanes"] == 2)
        #expect(rows["revoker"] == 1)
        // 2 lanes + maintenance + heartbeat + webhook gauges + 3 + 2 + 2 + 1.
        #expect(total == 13)

        let db = try TestDatabase()
        try db.connection.simpleQuery(
            "INSERT INTO siwa.suppression_providers (name, kind) VALUES ('sendgrid', 'sendgrid'), ('postmark', 'postmark')"
        )
        let most = try Self.peak(arguments, db: db, total: total)
        #expect(most <= total, "the worker held \(most) connections, printed \(total)")
    }
}
