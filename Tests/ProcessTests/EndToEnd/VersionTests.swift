import AppleNotifications
import Foundation
import Postgres
import SiwaSchema
import TestSupport
import Testing

/// One version source (VERSION), seen everywhere: `--version`, `siwa_build_info`, heartbeats and
/// `siwactl doctor --database-url`; and the zero series the alerts need from the start.
@Suite("Versions: --version, siwa_build_info, heartbeats, doctor")
struct VersionTests {
    /// The repository's VERSION file, as the binaries embed it.
    static var versionFile: String {
        get throws {
            try String(contentsOf: RepositoryRoot.url.appendingPathComponent("VERSION"), encoding: .utf8)
                .trimmingCharacters(in: .whitespacesAndNewlines)
        }
    }

    @Test("the embedded version is the VERSION file; the commit is git's or unknown")
    func embedded() throws {
        #expect(SiwaBuild.version == (try Self.versionFile))
        #expect(!SiwaBuild.commit.isEmpty)
        #expect(SiwaBuild.schemaVersion == SiwaSchema.version)
    }

    @Test(
        "--version prints the version, the commit and the schema version, exit 0",
        arguments: ["siwa-receiver", "siwa-worker", "siwactl"])
    func versionFlag(name: String) throws {
        let result = try ExecutableLocator.run(
            ExecutableLocator.url(named: name), arguments: ["--version"],
            environment: ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") })
        #expect(result.status == 0, "\(result.standardError)")
        #expect(
            result.standardOutput
                == "\(name) \(try Self.versionFile) (commit \(SiwaBuild.commit), schema \(SiwaSchema.version))\n"
        )
    }

    @Test("embed-schema --build takes the commit from its argument, SIWA_BUILD_COMMIT, git, else unknown")
    func commitSources() throws {
        let tool = ExecutableLocator.url(named: "embed-schema")
        let directory = try scratchDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let version = directory.appendingPathComponent("VERSION")
        try Data("1.2.3-rc.1\n".utf8).write(to: version)
        let output = directory.appendingPathComponent("out.swift")
        func generated(_ arguments: [String], _ environment: [String: String] = [:]) throws -> String {
            var base = ProcessInfo.processInfo.environment.filter { $0.key != "SIWA_BUILD_COMMIT" }
            base.merge(environment) { $1 }
            let result = try ExecutableLocator.run(
                tool, arguments: ["--build", version.path] + arguments + [output.path], environment: base)
            #expect(result.status == 0, "\(result.standardError)")
            return try String(contentsOf: output, encoding: .utf8)
        }
        // A directory that is no git checkout, nothing set: unknown.
        let unknown = try generated([directory.path])
        #expect(unknown.contains(#"public static let version: String = "1.2.3-rc.1""#), "\(unknown)")
        #expect(unknown.contains(#"public static let commit: String = "unknown""#), "\(unknown)")
        // The environment, as a tarball or image build sets it.
        let fromEnvironment = try generated([directory.path], ["SIWA_BUILD_COMMIT": "abc123"])
        #expect(fromEnvironment.contains(#"commit: String = "abc123""#), "\(fromEnvironment)")
        // The repository: git's commit.
        let fromGit = try generated([RepositoryRoot.url.path])
        #expect(!fromGit.contains(#"commit: String = "unknown""#), "\(fromGit)")
        // A value that could break the generated source is refused.
        let refused = try ExecutableLocator.run(
            tool, arguments: ["--build", version.path, directory.path, output.path, #"x" + evil"#])
        #expect(refused.status != 0)
    }

    @Test(
        "/metrics of both has siwa_build_info and every refusal reason at 0 from the start; heartbeats record the version; doctor shows it"
    )
    func runningProcesses() throws {
        let database = try TestDatabase()
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let receiver = try ServiceProcess.receiver(database, audiences: [TestSigning.audience], jwks: jwks)
        let worker = try ServiceProcess.worker(database)
        let info =
            #"siwa_build_info{version="\#(SiwaBuild.version)",commit="\#(SiwaBuild.commit)",schema_version="\#(SiwaSchema.version)"} 1"#
        for process in [receiver, worker] {
            let text = try process.scrape()
            #expect(text.contains("# TYPE siwa_build_info gauge\n"), "\(text)")
            #expect(text.contains(info + "\n"), "\(text)")
        }

        // The receiver's labelled counters the alerts use exist at 0 before anything happened.
        let text = try receiver.scrape()
        for reason in [
            "wrong_audience", "bad_signature", "unknown_key_id", "missing_key_id", "algorithm_not_allowed",
            "critical_header", "expired", "too_old", "issued_in_future", "wrong_issuer",
        ] {
            #expect(
                text.contains(#"siwa_verification_failures_total{reason="\#(reason)"} 0"# + "\n"),
                "\(reason): \(text)")
        }
        for outcome in ["accepted", "duplicate", "malformed", "unauthorized", "unavailable"] {
            #expect(text.contains(#"siwa_deliveries_total{outcome="\#(outcome)"} 0"# + "\n"), "\(outcome)")
        }
        #expect(text.contains(#"siwa_jwks_fetches_total{result="failure"} 0"# + "\n"))

        // The first wrong-audience refusal moves its series from 0 to 1, and is logged at warning with
        // the aud it named.
        let body = Array(#"{"payload":"\#(TestSigning.token(audience: "com.example.other"))"}"#.utf8)
        let refused = try TestHTTPClient.post(receiver.notificationURL!, body: body)
        #expect(refused.status == 401)
        #expect(refused.text.contains(#""reason":"wrong_audience""#))
        #expect(
            ServiceProcess.value(
                of: #"siwa_verification_failures_total{reason="wrong_audience"}"#, in: try receiver.scrape())
                == 1)
        #expect(
            waitUntil(timeout: .seconds(10)) {
                receiver.log.split(separator: "\n").contains {
                    $0.contains(#""level":"warning""#) && $0.contains(#""reason":"wrong_audience""#)
                        && $0.contains(#""aud":"com.example.other""#)
                }
            }, "\(receiver.log)")

        // Heartbeats: the product version and commit beside the schema version.
        #expect(
            waitUntil(timeout: .seconds(20)) {
                (try? database.query(
                    "SELECT count(*) FROM siwa.service_heartbeats WHERE product_version IS NOT NULL")[0][
                        0, as: Int.self]) == 2
            })
        let rows = try database.query(
            "SELECT kind, version, product_version, build_commit FROM siwa.service_heartbeats ORDER BY kind")
        for row in rows {
            #expect(try row[1, as: String.self] == "schema \(SiwaSchema.version)")
            #expect(try row[2, as: String.self] == SiwaBuild.version)
            #expect(try row[3, as: String.self] == SiwaBuild.commit)
        }

        // doctor --database-url lists what runs where.
        let result = try DoctorTests.doctor(receiver, database: database, audience: TestSigning.audience)
        let line = DoctorTests.line(result, "versions")
        #expect(line?.hasPrefix("ok") == true, "\(result.standardOutput)")
        #expect(line?.contains("worker ") == true && line?.contains("receiver ") == true, "\(line ?? "")")
        #expect(
            line?.contains("\(SiwaBuild.version) (commit \(SiwaBuild.commit), schema \(SiwaSchema.version))")
                == true, "\(line ?? "")")

        // A process built before version 5 (only version = 'schema 4'): a mixed fleet, warned.
        try database.query(
            """
            INSERT INTO siwa.service_heartbeats (kind, host, pid, version, started_at, last_seen)
            VALUES ('worker', 'old-host', 4, 'schema 4', now(), now())
            """)
        let mixed = try DoctorTests.doctor(receiver, database: database, audience: TestSigning.audience)
        let warned = DoctorTests.line(mixed, "versions")
        #expect(warned?.hasPrefix("warn") == true, "\(mixed.standardOutput)")
        #expect(warned?.contains("old-host pid 4: built before 5.0.0 (schema 4)") == true, "\(warned ?? "")")
    }
}
