import Foundation
import Postgres
import SiwaSchema
import TestSupport
import Testing

@Suite("siwa-mailgate as a process: flags, refusals, listeners, SIGTERM with a request in flight")
struct MailGateProcessTests {
    static let off = "off.p@privaterelay.appleid.com"
    static let token = "process-token-0123456789abcdefghijklmnopqrstuvwxyz"

    var environment: [String: String] {
        ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }
    }

    func run(_ arguments: [String], _ extra: [String: String] = [:]) throws -> ExecutableLocator.Result {
        try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwa-mailgate"), arguments: arguments,
            environment: environment.merging(extra) { $1 })
    }

    /// A file holding `text` with `mode`.
    func file(_ text: String, mode: Int) throws -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent(
            "mailgate-\(UUID().uuidString)")
        try Data(text.utf8).write(to: url)
        try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: url.path)
        return url
    }

    @Test(
        "--help lists every setting with its SIWA_MAILGATE_ twin; --version names version, commit and schema")
    func helpAndVersion() throws {
        let help = try run(["--help"])
        #expect(help.status == 0)
        #expect(help.standardOutput.hasPrefix("usage: siwa-mailgate"))
        for variable in [
            "SIWA_MAILGATE_POLICY_LISTEN", "SIWA_MAILGATE_DECISION_TIMEOUT", "SIWA_MAILGATE_CACHE_TTL",
            "SIWA_MAILGATE_HTTP_TOKEN_FILE", "SIWA_MAILGATE_ON_DATABASE_ERROR", "SIWA_MAILGATE_UNKNOWN_RELAY",
        ] {
            #expect(help.standardOutput.contains("[env: \(variable)]"), "\(variable)")
        }
        let version = try run(["--version"])
        #expect(version.status == 0)
        #expect(version.standardOutput == SiwaBuild.versionLine("siwa-mailgate") + "\n")
    }

    @Test("unusable settings exit 2 naming the setting, never the database password")
    func refusals() throws {
        let url = "postgresql://mail:s3cret-password@127.0.0.1:1/siwa"
        let open = try file(Self.token, mode: 0o644)
        let short = try file("short", mode: 0o600)
        defer { for f in [open, short] { try? FileManager.default.removeItem(at: f) } }
        let cases: [([String], String)] = [
            ([], "--database-url"),
            (["--on-database-error", "reject"], "--on-database-error"),
            (["--unknown-relay", "bounce"], "--unknown-relay"),
            (["--decision-timeout", "3"], "--decision-timeout"),
            (["--http-listen", "127.0.0.1:0"], "--http-token-file"),
            (["--http-listen", "127.0.0.1:0", "--http-token-file", open.path], "chmod 600"),
            (["--http-listen", "127.0.0.1:0", "--http-token-file", short.path], "at least 32"),
            (["--http-listen", "192.0.2.1:0", "--http-token-file", short.path], "loopback"),
            (["--policy-listen", "nowhere"], "--policy-listen"),
        ]
        for (arguments, word) in cases {
            let result = try run(arguments, arguments.isEmpty ? [:] : ["SIWA_MAILGATE_DATABASE_URL": url])
            #expect(result.status == 2, "\(arguments): \(result.standardError)")
            #expect(result.standardError.contains(word), "\(arguments): \(result.standardError)")
            #expect(!result.standardError.contains("s3cret"))
        }
    }

    @Test(
        "serves policy, HTTP check and /metrics on bound ports; SIGTERM answers the request in flight, exits 0"
    )
    func lifecycle() throws {
        let database = try TestDatabase()
        let connection = try database.connect()
        defer { connection.close() }
        for type in ["email-enabled", "email-disabled"] {
            try connection.storeAsReceiver(
                SeededNotification(
                    jti: "\(type)-\(UUID().uuidString)", type: type, sub: "001.p", email: Self.off))
            _ = try connection.query(
                "SELECT * FROM siwa.process_due_notifications(64, 20, interval '1 second')")
        }
        let tokenFile = try file(Self.token + "\n", mode: 0o600)
        defer { try? FileManager.default.removeItem(at: tokenFile) }
        let log = FileManager.default.temporaryDirectory.appendingPathComponent(
            "mailgate-\(UUID().uuidString).log")
        defer { try? FileManager.default.removeItem(at: log) }
        let addresses = ListenAddresses()
        defer { addresses.remove() }
        var environment = self.environment
        environment["SIWA_MAILGATE_DATABASE_URL"] = try database.url(asMemberOf: "siwa_mail")
        environment["SIWA_MAILGATE_CACHE_TTL"] = "0"
        let process = try Subprocess(
            ExecutableLocator.url(named: "siwa-mailgate").path,
            [
                "--policy-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--http-token-file",
                tokenFile.path, "--metrics-listen", "127.0.0.1:0", "--decision-timeout", "1",
            ] + addresses.arguments, environment: environment, standardError: log.path)
        let listeners = try addresses.wait(for: process) {
            (try? String(contentsOf: log, encoding: .utf8)) ?? ""
        }
        let policy = try ListenAddresses.address("policy", in: listeners)
        let http = try ListenAddresses.address("http", in: listeners)
        let metrics = try ListenAddresses.address("metrics", in: listeners)

        let client = try PolicyClient(policy)
        #expect(try client.ask(recipient: Self.off)?.hasPrefix("550 5.2.1 recipient turned off") == true)
        let check = try TestHTTPClient.get(
            "http://\(http)/v1/relay-mail/decision?address=\(Self.off)",
            headers: [("Authorization", "Bearer \(Self.token)")])
        #expect(check.status == 200 && check.text.contains(#""reason":"forwarding_off""#))
        let scraped = try TestHTTPClient.get("http://\(metrics)/metrics").text
        #expect(
            scraped.contains(
                #"siwa_mailgate_decisions_total{source="policy",decision="block",reason="forwarding_off"} 1"#)
        )
        #expect(scraped.contains("siwa_build_info{"))

        // A request waiting on the database (the owner holds the table) when SIGTERM arrives is answered.
        func misses() -> Double? {
            (try? TestHTTPClient.get("http://\(metrics)/metrics").text).flatMap {
                ServiceProcess.value(of: "siwa_mailgate_cache_misses_total", in: $0)
            }
        }
        let before = try #require(misses())
        _ = try connection.simpleQuery("BEGIN; LOCK TABLE siwa.accounts IN ACCESS EXCLUSIVE MODE")
        try client.send(PolicyClient.request(recipient: Self.off))
        #expect(waitUntil { misses() == before + 1 })
        process.send(SIGTERM)
        #expect(try client.answer() == "DUNNO")
        #expect(try client.answer() == nil)
        _ = try connection.simpleQuery("COMMIT")
        #expect(process.wait(timeout: .seconds(20)) == .exited(0))
        #expect(!FileManager.default.fileExists(atPath: addresses.url.path))
        let text = (try? String(contentsOf: log, encoding: .utf8)) ?? ""
        #expect(!text.contains("off.p@"))
    }
}
