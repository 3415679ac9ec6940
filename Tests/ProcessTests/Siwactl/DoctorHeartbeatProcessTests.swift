import Foundation
import Postgres
import TestSupport
import Testing

/// `siwactl doctor --database-url` over heartbeats it cannot trust: rows that lie (written where the
/// table's constraints are missing: a database not migrated yet, or an owner who dropped them) neither
/// forge a line of the report nor stop the database checks, and after a clean stop the doctor says what
/// it knows instead of "none has ever recorded a heartbeat".
@Suite("siwactl doctor: heartbeats cannot lie to it")
struct DoctorHeartbeatProcessTests {
    /// The doctor against a closed loopback port (the endpoint checks fail at once; the database checks
    /// follow), as a member of siwa_admin.
    static func doctor(_ database: TestDatabase) throws -> ExecutableLocator.Result {
        let nothing = try RefusingPort()  // held until the end of scope
        defer { withExtendedLifetime(nothing) {} }
        return try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwactl"),
            arguments: [
                "doctor", "http://127.0.0.1:\(nothing.port)/apple/notifications", "--allow-http-loopback",
                "--timeout", "5",
            ],
            environment: ["SIWA_DATABASE_URL": try database.url(asMemberOf: "siwa_admin")])
    }

    /// The lines of the report whose check is `check`.
    static func lines(_ result: ExecutableLocator.Result, _ check: String) -> [Substring] {
        result.standardOutput.split(separator: "\n").filter {
            $0.dropFirst(6).hasPrefix(check + " ") && !$0.hasPrefix(" ")
        }
    }

    @Test("a host with a newline and ESC sequences is printed escaped: one line, no forged verdict")
    func controlCharactersCannotForgeALine() throws {
        let database = try TestDatabase()
        // As the owner, without the constraint that refuses such a host (a database at version 4 has none).
        try database.query(
            "ALTER TABLE siwa.service_heartbeats DROP CONSTRAINT IF EXISTS service_heartbeats_text_check")
        let forged = "evil\nok    workers     2 worker(s) alive: web-1 pid 1\u{1B}[2K\u{9B}1A\r"
        try database.query(
            """
            INSERT INTO siwa.service_heartbeats (kind, host, pid, version, started_at, last_seen)
            VALUES ('worker', $1, 9, 'schema 5', now(), now())
            """, [.text(forged)])
        let result = try Self.doctor(database)
        let output = result.standardOutput
        #expect(
            !output.unicodeScalars.contains { $0.value == 0x1B || $0.value == 0x9B || $0 == "\r" },
            "\(output)")
        let workers = Self.lines(result, "workers")
        #expect(workers.count == 1, "\(output)")
        #expect(workers.first?.hasPrefix("ok") == true, "\(output)")
        #expect(
            workers.first?.contains(
                #"evil\nok    workers     2 worker(s) alive: web-1 pid 1\x1b[2K\u009b1A\r pid 9"#)
                == true, "\(output)")
        // Every line is a verdict, a fix, or the summary.
        for line in output.split(separator: "\n") {
            #expect(
                [
                    "ok ", "warn ", "FAIL ", String(repeating: " ", count: 18) + "fix: ", "healthy",
                    "NOT HEALTHY",
                ]
                .contains { line.hasPrefix($0) }, "\(line)")
        }
    }

    @Test("heartbeats at infinity or years ahead are ignored and reported; the database checks still run")
    func impossibleTimesAreIgnored() throws {
        let database = try TestDatabase()
        try database.query(
            "ALTER TABLE siwa.service_heartbeats DROP CONSTRAINT IF EXISTS service_heartbeats_time_check")
        try database.query(
            """
            INSERT INTO siwa.service_heartbeats (kind, host, pid, version, started_at, last_seen)
            VALUES ('worker', 'forever', 1, 'schema 5', now(), 'infinity'),
                   ('worker', 'ahead', 2, 'schema 5', now(), now() + interval '10 years'),
                   ('receiver', 'ahead', 3, 'schema 5', now(), now() + interval '10 years')
            """)
        let result = try Self.doctor(database)
        let output = result.standardOutput
        #expect(result.status == 1, "\(output)")
        #expect(!output.contains("cannot subtract"), "\(output)")
        #expect(Self.lines(result, "database").isEmpty, "\(output)")
        let workers = Self.lines(result, "workers")
        #expect(workers.count == 1 && workers[0].hasPrefix("FAIL"), "\(output)")
        #expect(workers.first?.contains("no worker is alive") == true, "\(output)")
        let ignored = Self.lines(result, "heartbeats")
        #expect(ignored.count == 1 && ignored[0].hasPrefix("warn"), "\(output)")
        for name in ["worker forever pid 1", "worker ahead pid 2", "receiver ahead pid 3"] {
            #expect(ignored.first?.contains(name) == true, "\(name): \(output)")
        }
        #expect(Self.lines(result, "receivers").first?.hasPrefix("FAIL") == true, "\(output)")
    }

    @Test("after a worker's clean stop: no worker alive, and what is known, not 'none has ever recorded'")
    func afterACleanStop() throws {
        let database = try TestDatabase()
        let worker = try WorkerProcess(
            ["--poll-interval", "0.2"], databaseURL: try database.url(asMemberOf: "siwa_worker"))
        #expect(
            waitUntil(timeout: .seconds(30)) {
                (try? database.value(
                    "SELECT count(*) FROM siwa.service_heartbeats WHERE kind = 'worker'", as: Int.self))
                    == 1
            }, "\(worker.log)")
        let alive = try Self.doctor(database)
        #expect(Self.lines(alive, "workers").first?.hasPrefix("ok") == true, "\(alive.standardOutput)")
        worker.send(SIGTERM)
        #expect(worker.waitForExit(timeout: .seconds(20)) == 0, "\(worker.log)")

        let result = try Self.doctor(database)
        let workers = Self.lines(result, "workers").first ?? ""
        #expect(
            workers.hasPrefix("FAIL") && workers.contains("no worker is alive"), "\(result.standardOutput)")
        #expect(!workers.contains("ever recorded a heartbeat"), "\(result.standardOutput)")
        #expect(workers.contains("deletes its own when it stops cleanly"), "\(result.standardOutput)")
        #expect(workers.contains("none has ever applied a notification"), "\(result.standardOutput)")
    }
}
