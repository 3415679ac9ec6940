import AppleNotifications
import Foundation
import HTTPServer
import TestSupport
import Testing

/// `siwactl doctor URL --database-url …` against real receivers and workers: the
/// database's checks, run as a siwa_admin member.
extension DoctorTests {
    /// Runs the doctor on `receiver` with the database checks, as a member of siwa_admin.
    static func doctor(_ receiver: ServiceProcess, database: TestDatabase, audience: String) throws
        -> ExecutableLocator.Result
    {
        try Self.doctor(
            receiver.notificationURL!,
            ["--allow-http-loopback", "--audience", audience, "--slow-after", "30"],
            environment: ["SIWA_DATABASE_URL": try database.url(asMemberOf: "siwa_admin")])
    }

    @Test("with --database-url: a worker alive and a receiver accepting every client ID in use pass, exit 0")
    func databaseHealthy() throws {
        let database = try TestDatabase()
        try database.insert(jti: "doctor-applied", state: "applied", receivedAgo: 86_400)  // com.example.app
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let receiver = try ServiceProcess.receiver(database, audiences: ["com.example.app"], jwks: jwks)
        let worker = try ServiceProcess.worker(database)
        _ = worker
        let result = try Self.doctor(receiver, database: database, audience: "com.example.app")
        #expect(result.status == 0, "\(result.standardOutput)\(result.standardError)")
        for check in ["workers", "receivers", "audiences"] {
            #expect(Self.line(result, check)?.hasPrefix("ok") == true, "\(check): \(result.standardOutput)")
        }
        #expect(
            Self.line(result, "audiences")?.contains("com.example.app") == true, "\(result.standardOutput)")
    }

    @Test("sender_unauthorized relay bounces: FAIL naming each sending domain and the fix; none: ok")
    func senderUnauthorized() throws {
        let database = try TestDatabase()
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let receiver = try ServiceProcess.receiver(database, audiences: [TestSigning.audience], jwks: jwks)
        let worker = try ServiceProcess.worker(database)
        _ = worker
        var result = try Self.doctor(receiver, database: database, audience: TestSigning.audience)
        #expect(Self.line(result, "bounces")?.hasPrefix("ok") == true, "\(result.standardOutput)")
        try database.query(
            """
            INSERT INTO siwa.relay_bounces (received_at, class, recipient_hmac, sending_domain, gate_reason, status,
                                            action)
            SELECT now() - g * interval '1 hour', c, sha256(g::text::bytea), d, 'forwarding_on', '5.1.1', 'failed'
              FROM (VALUES (1, 'sender_unauthorized', 'news.example.com'), (2, 'sender_unauthorized', 'news.example.com'),
                           (3, 'sender_unauthorized', 'billing.example.com'), (4, 'relay_address_dead', 'other.example'),
                           (200, 'sender_unauthorized', 'old.example')) AS v(g, c, d)
            """)
        result = try Self.doctor(receiver, database: database, audience: TestSigning.audience)
        #expect(result.status == 1, "\(result.standardOutput)")
        let line = Self.line(result, "bounces") ?? ""
        #expect(line.hasPrefix("FAIL") && line.contains("2 sending domain(s)"), "\(result.standardOutput)")
        #expect(line.contains("news.example.com (2") && line.contains("billing.example.com (1"), "\(line)")
        #expect(!line.contains("other.example") && !line.contains("old.example"), "\(line)")
        #expect(result.standardOutput.contains("Sign in with Apple for Email"), "\(result.standardOutput)")
    }

    @Test("with --database-url and no worker alive (none, or only a stale heartbeat): FAIL with the fix")
    func noWorker() throws {
        let database = try TestDatabase()
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let receiver = try ServiceProcess.receiver(database, audiences: [TestSigning.audience], jwks: jwks)
        var result = try Self.doctor(receiver, database: database, audience: TestSigning.audience)
        #expect(result.status == 1, "\(result.standardOutput)")
        var workers = Self.line(result, "workers") ?? ""
        #expect(workers.hasPrefix("FAIL") && workers.contains("none has ever"), "\(result.standardOutput)")
        #expect(result.standardOutput.contains("fix: start siwa-worker against this database"))
        // A worker that stopped answering an hour ago (killed: no clean stop deleted its row).
        try database.query(
            """
            INSERT INTO siwa.service_heartbeats (kind, host, pid, version, started_at, last_seen)
            VALUES ('worker', 'gone-host', 42, 'schema 3', now() - interval '2 hours', now() - interval '1 hour')
            """)
        result = try Self.doctor(receiver, database: database, audience: TestSigning.audience)
        #expect(result.status == 1, "\(result.standardOutput)")
        workers = Self.line(result, "workers") ?? ""
        #expect(workers.hasPrefix("FAIL") && workers.contains("gone-host pid 42"), "\(result.standardOutput)")
        #expect(workers.contains("1h 00m old") || workers.contains("59m"), "\(result.standardOutput)")
    }

    @Test(
        "with --database-url, a receiver not accepting the audience of stored notifications: FAIL with the fix"
    )
    func audienceMismatch() throws {
        let database = try TestDatabase()
        try database.insert(jti: "doctor-stored", state: "applied", receivedAgo: 3600)  // com.example.app
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let receiver = try ServiceProcess.receiver(database, audiences: ["com.example.other"], jwks: jwks)
        let worker = try ServiceProcess.worker(database)
        _ = worker
        let result = try Self.doctor(receiver, database: database, audience: "com.example.other")
        #expect(result.status == 1, "\(result.standardOutput)")
        // The endpoint itself is fine; the database shows what it refuses.
        #expect(Self.line(result, "signature")?.hasPrefix("ok") == true, "\(result.standardOutput)")
        #expect(Self.line(result, "workers")?.hasPrefix("ok") == true, "\(result.standardOutput)")
        let audiences = Self.line(result, "audiences") ?? ""
        #expect(
            audiences.hasPrefix("FAIL") && audiences.contains("com.example.app")
                && audiences.contains("no receiver accepts it"), "\(result.standardOutput)")
        #expect(
            result.standardOutput.contains(
                "fix: add com.example.app to SIWA_AUDIENCES (--audience) of every receiver"),
            "\(result.standardOutput)")
    }

    @Test("with --database-url, a receiver storing into another database (no receiver heartbeat here): FAIL")
    func receiverElsewhere() throws {
        let database = try TestDatabase()
        let elsewhere = try TestDatabase()
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let receiver = try ServiceProcess.receiver(elsewhere, audiences: [TestSigning.audience], jwks: jwks)
        let result = try Self.doctor(receiver, database: database, audience: TestSigning.audience)
        #expect(result.status == 1, "\(result.standardOutput)")
        let receivers = Self.line(result, "receivers") ?? ""
        #expect(receivers.hasPrefix("FAIL"), "\(result.standardOutput)")
        #expect(result.standardOutput.contains("stores into another database"), "\(result.standardOutput)")
    }

    @Test("with --database-url as a role that may not read the heartbeats: FAIL naming the grant")
    func deniedRole() throws {
        let database = try TestDatabase()
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let receiver = try ServiceProcess.receiver(database, audiences: [TestSigning.audience], jwks: jwks)
        let result = try Self.doctor(
            receiver.notificationURL!, ["--allow-http-loopback", "--audience", TestSigning.audience],
            environment: ["SIWA_DATABASE_URL": try database.url(asMemberOf: "siwa_app")])
        #expect(result.status == 1, "\(result.standardOutput)")
        #expect(Self.line(result, "database")?.hasPrefix("FAIL") == true, "\(result.standardOutput)")
        #expect(result.standardOutput.contains("member of siwa_admin"), "\(result.standardOutput)")
    }
}
