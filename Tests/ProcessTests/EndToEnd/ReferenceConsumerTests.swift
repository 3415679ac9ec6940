import Foundation
import Postgres
import TestSupport
import Testing
import Webhooks

/// The reference consumers in examples/ (Python, run with the test venv's interpreter) against the real
/// stack: siwa-worker applying notifications stored as the receiver stores them, delivering to the
/// example endpoint, and the changefeed reader reading siwa.changefeed as a member of siwa_app. Each
/// app's effects are asserted in its own database (another database of the test cluster).
@Suite(
    "Reference consumers (examples/) against siwa-worker and the changefeed", .serialized,
    .enabled(
        if: ReferenceConsumers.ready,
        "the test venv .build/webhooks-venv (standardwebhooks, psycopg) is missing: run make webhooks-venv")
)
struct ReferenceConsumerTests {
    @Test(
        "the webhook endpoint applies each change once in the app's transaction, also when a delivery comes twice; forged and stale ones change nothing"
    )
    func webhookEndpoint() throws {
        let database = try WebhookDatabase()
        let app = try TestDatabase(.empty)
        let secret = StandardWebhooks.Secret.generate()
        let endpoint = try ReferenceConsumers.start(
            "webhook_endpoint.py", ["--port", "0"],
            environment: ["SIWA_WEBHOOK_SECRET": secret.text, "APP_DATABASE_URL": app.url])
        try #require(
            waitUntil(timeout: .seconds(20)) { endpoint.errors.contains("listening on") },
            "\(endpoint.errors)")
        let url = try #require(endpoint.errors.firstMatch(of: /listening on (\S+)/)).1
        try database.addEndpoint(url: String(url), secret: secret)
        let worker = try WorkerProcess(
            [
                "--poll-interval", "0.2", "--webhook-poll-interval", "0.1", "--webhook-retry-base-delay",
                "0.05",
                "--webhook-max-retry-delay", "0.2", "--webhook-timeout", "2", "--log-level", "warning",
            ], databaseURL: try database.url(asMemberOf: "siwa_worker"))

        try database.connection.storeAsReceiver(ReferenceConsumers.notifications())
        try #require(
            waitUntil(timeout: .seconds(30)) {
                (try? database.count("delivered")) == ReferenceConsumers.expectedTypes.count
            }, "\(endpoint.output)\n\(worker.log.suffix(2000))")
        let changes = try ReferenceConsumers.changes(in: database)
        #expect(changes.map(\.type).sorted() == ReferenceConsumers.expectedTypes.sorted())
        #expect(try ReferenceConsumers.audit(in: app) == changes)
        #expect(try app.value("SELECT count(*)::int FROM processed_webhooks") as Int == changes.count)
        try ReferenceConsumers.expectUsers(in: app)

        // Every delivery again, with the same webhook-ids (as after a timeout or an operator's replay):
        // the endpoint answers 2xx and applies nothing twice.
        func duplicates() -> Int { endpoint.lines.filter { $0.contains(#""what": "duplicate"#) }.count }
        let before = duplicates()  // an attempt that timed out on a loaded machine came twice already
        let replayed = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwactl"),
            arguments: [
                "webhooks", "replay", "--database-url", database.url, "--endpoint", "1", "--since", "1h",
                "--state", "all",
            ])
        #expect(replayed.status == 0, "\(replayed.standardError)")
        #expect(replayed.standardOutput.contains("queued \(changes.count) deliveries"))
        #expect(
            waitUntil(timeout: .seconds(30)) {
                duplicates() >= before + changes.count
            }, "\(endpoint.output)")
        #expect(try ReferenceConsumers.audit(in: app) == changes)

        // A forged signature and a stale timestamp (signed with the right secret, ten minutes old) are
        // refused and change nothing.
        let body = Array(
            #"{"data":{"change_id":999,"sub":"forged","event_time":"2026-01-01T00:00:00Z"},"type":"siwa.account_deleted"}"#
                .utf8)
        func post(_ id: String, at timestamp: Int, signedWith signing: StandardWebhooks.Secret) throws -> Int
        {
            try postDelivery(
                to: String(url), id: id, timestamp: timestamp, body: body,
                signature: StandardWebhooks.signature(
                    id: id, timestamp: timestamp, body: body, secret: signing))
        }
        let now = Int(Date().timeIntervalSince1970)
        #expect(try post("msg_forged", at: now, signedWith: .generate()) == 400)
        #expect(try post("msg_stale", at: now - 600, signedWith: secret) == 400)
        #expect(try ReferenceConsumers.audit(in: app) == changes)
        #expect(try app.value("SELECT count(*)::int FROM processed_webhooks") as Int == changes.count)

        // While the app's database cannot take the write, nothing is acknowledged: the worker's attempt
        // times out (no 2xx before the commit), and once the lock is gone the change is applied once.
        let locker = try app.connect()
        defer { locker.close() }
        try locker.query("BEGIN")
        try locker.query("LOCK TABLE processed_webhooks IN ACCESS EXCLUSIVE MODE")
        try database.connection.storeAsReceiver(
            SeededNotification(jti: UUID().uuidString, type: "consent-revoked", sub: "001.locked.example"))
        try #require(
            waitUntil(timeout: .seconds(30)) {
                ((try? database.value(
                    "SELECT count(*)::int FROM siwa.webhook_attempt_history WHERE sub = '001.locked.example' AND outcome = 'retry'"
                ) as Int) ?? 0) >= 1
            }, "\(worker.log.suffix(2000))")
        #expect(
            try database.value("SELECT count(*)::int FROM siwa.webhook_deliveries WHERE state = 'delivered'")
                as Int == changes.count)
        try locker.query("COMMIT")
        #expect(waitUntil(timeout: .seconds(30)) { (try? database.count("delivered")) == changes.count + 1 })
        #expect(
            try app.value("SELECT count(*)::int FROM app_audit WHERE sub = '001.locked.example'") as Int == 1)

        // Every type, as `siwactl webhooks send --type all` makes them: each applied once.
        let secretFile = FileManager.default.temporaryDirectory.appendingPathComponent(
            "siwa-reference-\(UUID().uuidString).secret")
        try Data(secret.text.utf8).write(to: secretFile)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: secretFile.path)
        defer { try? FileManager.default.removeItem(at: secretFile) }
        let sent = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwactl"),
            arguments: [
                "webhooks", "send", "--url", String(url), "--type", "all", "--secret-file", secretFile.path,
                "--change-id", "900000",
            ])
        #expect(sent.status == 0, "\(sent.standardOutput)\(sent.standardError)")
        #expect(
            try app.connection.query(
                "SELECT type FROM app_audit WHERE change_id >= 900000 ORDER BY change_id"
            ).map { try $0[0, as: String.self] } == WebhookChange.types)
    }

    @Test(
        "the changefeed reader keeps its cursor in the app's database: LISTEN wakes it, the timer catches a missed NOTIFY, it reconnects, resumes after a restart, and stops at a gap"
    )
    func changefeedReader() throws {
        let database = try WebhookDatabase()
        let app = try TestDatabase(.empty)
        let worker = try WorkerProcess(
            ["--poll-interval", "0.2", "--log-level", "warning"],
            databaseURL: try database.url(asMemberOf: "siwa_worker"))
        let environment = [
            "SIWA_DATABASE_URL": try database.url(asMemberOf: "siwa_app"), "APP_DATABASE_URL": app.url,
        ]
        func cursor() -> Int {
            (try? app.value("SELECT position::int FROM changefeed_cursor") as Int) ?? -1
        }
        func lastPosition() -> Int {
            (try? database.value("SELECT coalesce(max(position), 0)::int FROM siwa.changefeed") as Int) ?? -1
        }

        // A long timer: what arrives within seconds was woken by NOTIFY.
        var reader = try ReferenceConsumers.start(
            "changefeed_reader.py", ["--poll-interval", "120"], environment: environment)
        try #require(
            waitUntil(timeout: .seconds(20)) { reader.errors.contains("connected") }, "\(reader.errors)")
        #expect(waitUntil(timeout: .seconds(10)) { cursor() == 0 })
        try database.connection.storeAsReceiver(ReferenceConsumers.notifications())
        try #require(
            waitUntil(timeout: .seconds(30)) { lastPosition() == ReferenceConsumers.expectedTypes.count },
            "\(worker.log.suffix(2000))")
        #expect(waitUntil(timeout: .seconds(20)) { cursor() == lastPosition() }, "\(reader.errors)")
        let changes = try ReferenceConsumers.changes(in: database)
        #expect(try ReferenceConsumers.audit(in: app) == changes)
        try ReferenceConsumers.expectUsers(in: app)

        // Restarted (SIGKILL: no chance to tidy up), while changes commit: it resumes from the stored cursor.
        reader.process.send(SIGKILL)
        reader.process.wait()
        let more = (1...3).map {
            SeededNotification(
                jti: UUID().uuidString, type: "consent-revoked", sub: "001.restart\($0).example")
        }
        try database.connection.storeAsReceiver(more)
        try #require(waitUntil(timeout: .seconds(30)) { lastPosition() == changes.count + 3 })
        reader = try ReferenceConsumers.start(
            "changefeed_reader.py", ["--poll-interval", "0.5"], environment: environment)
        #expect(waitUntil(timeout: .seconds(20)) { cursor() == changes.count + 3 }, "\(reader.errors)")

        // A change numbered without a NOTIFY (one the reader missed): the timer reads it.
        try database.query(
            """
            WITH n AS (UPDATE siwa.changes_counter SET last_position = last_position + 1 RETURNING last_position)
            INSERT INTO siwa.changes (position, type, sub, event_time, applied_at, jti)
            SELECT n.last_position, 'siwa.consent_revoked', '001.silent.example', now(), now(), 'silent' FROM n
            """)
        #expect(waitUntil(timeout: .seconds(20)) { cursor() == changes.count + 4 }, "\(reader.errors)")

        // The database goes away under it (its sessions are terminated): it reconnects and reads on.
        let role = try database.loginRole(memberOf: "siwa_app")
        try database.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", [.text(role)])
        #expect(
            waitUntil(timeout: .seconds(20)) { reader.errors.contains("reconnecting") }, "\(reader.errors)")
        try database.connection.storeAsReceiver(
            SeededNotification(jti: UUID().uuidString, type: "consent-revoked", sub: "001.after.example"))
        #expect(waitUntil(timeout: .seconds(30)) { cursor() == changes.count + 5 }, "\(reader.errors)")
        let everything = try ReferenceConsumers.changes(in: database)
        #expect(everything.count == changes.count + 5)
        #expect(try ReferenceConsumers.audit(in: app) == everything)

        // Away while retention pruned changes it never read: it stops and says so, its cursor kept.
        reader.process.send(SIGTERM)
        #expect(reader.process.wait(timeout: .seconds(20)) == .exited(0))
        let stopped = cursor()
        try database.connection.storeAsReceiver(
            SeededNotification(jti: UUID().uuidString, type: "consent-revoked", sub: "001.pruned.example"))
        try #require(waitUntil(timeout: .seconds(30)) { lastPosition() == stopped + 1 })
        try database.query("UPDATE siwa.settings SET changes_retention = interval '0'")
        try database.query("SELECT * FROM siwa.prune(NULL, NULL)")
        try database.query("UPDATE siwa.settings SET changes_retention = interval '7 days'")
        #expect(try database.value("SELECT count(*)::int FROM siwa.changefeed") as Int == 0)
        try database.connection.storeAsReceiver(
            SeededNotification(jti: UUID().uuidString, type: "consent-revoked", sub: "001.later.example"))
        try #require(waitUntil(timeout: .seconds(30)) { lastPosition() == stopped + 2 })
        let gap = try ReferenceConsumers.start(
            "changefeed_reader.py", ["--poll-interval", "0.5"], environment: environment)
        #expect(gap.process.wait(timeout: .seconds(30)) == .exited(3), "\(gap.errors)")
        #expect(
            gap.errors.contains("positions \(stopped + 1) to \(stopped + 1) were pruned"), "\(gap.errors)")
        #expect(cursor() == stopped)
        #expect(try ReferenceConsumers.audit(in: app) == everything)
    }
}

/// Running the examples with the test venv's python, and what the tests feed them.
enum ReferenceConsumers {
    /// The venv's interpreter has the examples' packages.
    static let ready: Bool = {
        guard FileManager.default.isExecutableFile(atPath: ReferenceVerifier.python) else { return false }
        let checked = try? Subprocess.run(
            ReferenceVerifier.python, ["-c", "import standardwebhooks, psycopg"], timeout: .seconds(60))
        return checked?.status == 0
    }()

    /// A running example; killed when released.
    final class Running: Sendable {
        let process: Subprocess
        let outputPath: String
        let errorPath: String

        init(process: Subprocess, outputPath: String, errorPath: String) {
            self.process = process
            self.outputPath = outputPath
            self.errorPath = errorPath
        }

        deinit {
            process.send(SIGKILL)
            process.wait()
            try? FileManager.default.removeItem(atPath: outputPath)
            try? FileManager.default.removeItem(atPath: errorPath)
        }

        var output: String { (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? "" }
        var errors: String { (try? String(contentsOfFile: errorPath, encoding: .utf8)) ?? "" }
        var lines: [Substring] { output.split(separator: "\n") }
    }

    /// Starts examples/`script` with `arguments` and only `environment` (plus PATH and HOME).
    static func start(_ script: String, _ arguments: [String], environment: [String: String]) throws
        -> Running
    {
        let examples = RepositoryRoot.url.appendingPathComponent("examples")
        let base = FileManager.default.temporaryDirectory.appendingPathComponent(
            "siwa-example-\(UUID().uuidString)"
        ).path
        var variables = environment
        let current = ProcessInfo.processInfo.environment
        variables["PATH"] = current["PATH"] ?? "/usr/bin:/bin"
        variables["HOME"] = current["HOME"] ?? "/tmp"
        variables["PYTHONDONTWRITEBYTECODE"] = "1"  // no __pycache__ in the checkout
        let process = try Subprocess(
            ReferenceVerifier.python, [examples.appendingPathComponent(script).path] + arguments,
            environment: variables, standardOutput: base + ".out", standardError: base + ".err",
            workingDirectory: examples.path)
        return Running(process: process, outputPath: base + ".out", errorPath: base + ".err")
    }

    static let alice = "001026.ref0a11ce000000000000000000000000.1744"
    static let bob = "001026.ref0b0b0000000000000000000000000.1745"

    /// Apple's notifications for two users: Alice's relay is disabled, she revokes consent and deletes
    /// her account (erased at once); Bob's relay is enabled and he revokes consent.
    static func notifications() -> [SeededNotification] {
        let start = Date().addingTimeInterval(-600)
        func at(_ minutes: Double) -> Date { start.addingTimeInterval(minutes * 60) }
        return [
            SeededNotification(
                jti: UUID().uuidString, type: "email-disabled", sub: alice,
                email: "ref.alice@privaterelay.appleid.com", eventTime: at(0)),
            SeededNotification(
                jti: UUID().uuidString, type: "email-enabled", sub: bob,
                email: "ref.bob@privaterelay.appleid.com",
                eventTime: at(1)),
            SeededNotification(jti: UUID().uuidString, type: "consent-revoked", sub: alice, eventTime: at(2)),
            SeededNotification(jti: UUID().uuidString, type: "consent-revoked", sub: bob, eventTime: at(3)),
            SeededNotification(jti: UUID().uuidString, type: "account-delete", sub: alice, eventTime: at(4)),
        ]
    }

    /// The changes those notifications write.
    static let expectedTypes = [
        "siwa.email_disabled", "siwa.email_enabled", "siwa.consent_revoked", "siwa.consent_revoked",
        "siwa.account_deleted", "siwa.personal_data_erased",
    ]

    struct Change: Equatable, CustomStringConvertible {
        var id: Int
        var type: String
        var sub: String
        var description: String { "\(id) \(type) \(sub)" }
    }

    /// siwa's changes, by id.
    static func changes(in database: TestDatabase) throws -> [Change] {
        try database.connection.query("SELECT id::int, type, sub FROM siwa.changes ORDER BY id").map {
            Change(
                id: try $0[0, as: Int.self], type: try $0[1, as: String.self], sub: try $0[2, as: String.self]
            )
        }
    }

    /// What the app did, by change id (each change once, or it shows twice).
    static func audit(in app: TestDatabase) throws -> [Change] {
        try app.connection.query("SELECT change_id::int, type, sub FROM app_audit ORDER BY change_id, id").map
        {
            Change(
                id: try $0[0, as: Int.self], type: try $0[1, as: String.self], sub: try $0[2, as: String.self]
            )
        }
    }

    /// The app's users after ``notifications()``: Alice signed out, deleted and her email erased; Bob
    /// signed out with his relay address forwarding.
    static func expectUsers(in app: TestDatabase) throws {
        let rows = try app.connection.query(
            """
            SELECT sub, email, email_forwarding, signed_out_before IS NOT NULL, deleted_at IS NOT NULL
              FROM app_users ORDER BY sub
            """)
        let users = try rows.map {
            [
                try $0[0, as: String.self], try $0[1, as: String?.self] ?? "-",
                (try $0[2, as: Bool?.self]).map { String($0) } ?? "-", String(try $0[3, as: Bool.self]),
                String(try $0[4, as: Bool.self]),
            ]
        }
        #expect(
            users == [
                [alice, "-", "-", "true", "true"],
                [bob, "ref.bob@privaterelay.appleid.com", "true", "true", "false"],
            ])
    }
}
