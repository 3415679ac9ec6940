import AppleNotifications
import Foundation
import Postgres
import SiwaSchema
import TestSupport
import Testing

/// Errors that say what is wrong: the server's warnings during `siwactl migrate`, the reason of a
/// refused connection in the services' logs, and warnings about unsafe configuration at start.
@Suite("Errors say what is wrong")
struct HonestErrorTests {
    @Test(
        "migrate as an owner without CREATEROLE prints the server's warnings and fails with the fix; with the roles created first it passes"
    )
    func ownerWithoutCreateRole() throws {
        // A cluster of its own: the shared one already has the group roles.
        let cluster = try PostgresCluster.start()
        defer { cluster.destroy() }
        let admin = try PostgresConnection(configuration: try cluster.configuration(database: "postgres"))
        defer { admin.close() }
        let url = try cluster.createDatabase("siwa", ownedBy: "siwa_owner")

        let result = try siwactl(["migrate", "--database-url", url])
        #expect(result.status == 1, "\(result.standardOutput)\(result.standardError)")
        #expect(result.standardOutput.contains("schema version after: \(SiwaSchema.version)"))
        for role in MigrateRoles.all {
            #expect(
                result.standardError.contains(
                    "siwactl migrate: server WARNING: role \(role) does not exist and siwa_owner may not create it"
                ),
                "\(result.standardError)")
            #expect(result.standardError.contains("CREATE ROLE \(role) NOLOGIN;"), "\(result.standardError)")
        }
        #expect(result.standardError.contains("ALTER ROLE siwa_owner CREATEROLE;"), "\(result.standardError)")

        // The second fix: the roles created first (by a role with CREATEROLE), then migrate again.
        try admin.simpleQuery(MigrateRoles.all.map { "CREATE ROLE \($0) NOLOGIN;" }.joined(separator: " "))
        let again = try siwactl(["migrate", "--database-url", url])
        #expect(again.status == 0, "\(again.standardOutput)\(again.standardError)")
        #expect(!again.standardError.contains("WARNING"), "\(again.standardError)")
        // Every group role was granted its rights in the siwa database.
        let owner = try PostgresConnection(configuration: try PostgresConfiguration(url))
        defer { owner.close() }
        #expect(
            try owner.query(
                "SELECT bool_and(has_schema_privilege(r, 'siwa', 'USAGE')) FROM unnest($1::text[]) r",
                [.array(MigrateRoles.all.map { .text($0) })])[0][0, as: Bool.self])
    }

    @Test(
        "an owner with only CREATEROLE migrates, then creates the login roles of operations.md § 3, each with its group's rights"
    )
    func ownerWithCreateRoleMakesTheLoginRoles() throws {
        // From PostgreSQL 16 on, granting a role needs ADMIN OPTION on it, which its creator holds.
        let cluster = try PostgresCluster.start()
        defer { cluster.destroy() }
        _ = try cluster.createDatabase("siwa", ownedBy: "siwa_owner", attributes: "CREATEROLE")
        let url = { (user: String) in cluster.url(database: "siwa", user: user) }
        let migrated = try siwactl(["migrate", "--database-url", url("siwa_owner")])
        #expect(migrated.status == 0, "\(migrated.standardOutput)\(migrated.standardError)")
        #expect(!migrated.standardError.contains("WARNING"), "\(migrated.standardError)")

        let owner = try PostgresConnection(configuration: try PostgresConfiguration(url("siwa_owner")))
        defer { owner.close() }
        for role in MigrateRoles.all {
            try owner.simpleQuery("CREATE ROLE \(role)_login LOGIN IN ROLE \(role)")
            let login = try PostgresConnection(configuration: try PostgresConfiguration(url(role + "_login")))
            defer { login.close() }
            let row = try login.query(
                "SELECT has_schema_privilege('siwa', 'USAGE'), pg_has_role($1, 'USAGE')", [.text(role)])[0]
            let usage = try row[0, as: Bool.self]
            let member = try row[1, as: Bool.self]
            #expect(usage && member, "\(role)")
        }
    }

    @Test(
        "a worker whose password is refused, or whose database does not exist, logs the server's reason without the password"
    )
    func connectionFailureReason() throws {
        let cluster = try PostgresCluster.start(tcp: true)
        defer { cluster.destroy() }
        // Password authentication over TCP for one role.
        let hba = URL(fileURLWithPath: cluster.dataDirectory + "/pg_hba.conf")
        let rules = try String(contentsOf: hba, encoding: .utf8)
        try Data(("host all siwa_pw 127.0.0.1/32 scram-sha-256\n" + rules).utf8).write(to: hba)
        try cluster.stop()
        try cluster.start()
        let admin = try PostgresConnection(configuration: try cluster.configuration(database: "postgres"))
        defer { admin.close() }
        try admin.simpleQuery("CREATE ROLE siwa_pw LOGIN PASSWORD 'the-right-one'")

        let database = try TestDatabase()
        let cases = [
            (
                "postgresql://siwa_pw:Wr0ngS3cret@127.0.0.1:\(cluster.port)/postgres",
                #"password authentication failed for user \"siwa_pw\""#
            ),
            (
                "postgresql://siwa_pw:the-right-one@127.0.0.1:\(cluster.port)/nope",
                #"database \"nope\" does not exist"#
            ),
        ]
        for (url, reason) in cases {
            let worker = try ServiceProcess.worker(database, databaseURL: url)
            #expect(
                waitUntil(timeout: .seconds(30)) {
                    worker.log.split(separator: "\n").contains {
                        $0.contains("database unavailable; reconnecting") && $0.contains(reason)
                    }
                }, "\(worker.log)")
            #expect(
                !worker.log.contains("Wr0ngS3cret") && !worker.log.contains("the-right-one"), "\(worker.log)")
        }
    }

    @Test("a password in libpq's reason is masked, as given and percent-encoded")
    func passwordMasked() throws {
        // A host name made of the password: libpq quotes the host it could not resolve.
        let error = try #require(throws: PostgresError.self) {
            _ = try PostgresConnection(
                configuration: try PostgresConfiguration(
                    "host=Sup3rS3cret.invalid user=u password=Sup3rS3cret dbname=d",
                    connectTimeout: .seconds(2)))
        }
        #expect(error.code == .connectionFailed)
        let reason = try #require(error.connectionFailureReason)
        #expect(!reason.contains("Sup3rS3cret"), "\(reason)")
        #expect(reason.contains("****"), "\(reason)")
        #expect("\(error)".contains("reason: "), "\(error)")
        #expect(!"\(error)".contains("Sup3rS3cret"), "\(error)")
    }

    @Test(
        "without any keys the receiver says so (not 'keeping the last good keys') and logs the reason it answers"
    )
    func noKeysHeld() throws {
        let database = try TestDatabase()
        let nothing = try RefusingPort()  // held until the end of scope
        defer { withExtendedLifetime(nothing) {} }
        let receiver = try ServiceProcess.receiver(
            database, audiences: [TestSigning.audience], jwksURL: "http://127.0.0.1:\(nothing.port)/auth/keys"
        )
        #expect(
            waitUntil(timeout: .seconds(20)) { receiver.log.contains("could not fetch Apple's key set") },
            "\(receiver.log)")
        #expect(receiver.log.contains("no keys held"), "\(receiver.log)")
        #expect(!receiver.log.contains("keeping the last good keys"), "\(receiver.log)")

        let body = Array(#"{"payload":"\#(TestSigning.token())"}"#.utf8)
        let answer = try TestHTTPClient.post(receiver.notificationURL!, body: body)
        #expect(answer.status == 503)
        #expect(answer.text.contains(#""reason":"keys_unavailable""#), "\(answer.text)")
        #expect(
            waitUntil(timeout: .seconds(10)) {
                receiver.log.split(separator: "\n").contains {
                    $0.contains(#""msg":"notification""#) && $0.contains(#""status":503"#)
                        && $0.contains(#""reason":"keys_unavailable""#)
                }
            }, "\(receiver.log)")
    }

    @Test("a worker connected as a superuser, and a receiver trusting a key set not Apple's, warn at start")
    func unsafeConfigurationWarnings() throws {
        let database = try TestDatabase()
        let worker = try ServiceProcess.worker(database, databaseURL: database.url)  // postgres, a superuser
        #expect(
            waitUntil(timeout: .seconds(20)) {
                worker.log.split(separator: "\n").contains {
                    $0.contains(#""level":"warning""#) && $0.contains("connected as a superuser")
                        && $0.contains("siwa_worker")
                }
            }, "\(worker.log)")

        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let receiver = try ServiceProcess.receiver(database, audiences: [TestSigning.audience], jwks: jwks)
        #expect(
            receiver.log.split(separator: "\n").contains {
                $0.contains(#""level":"warning""#) && $0.contains("the key set is not Apple's")
            }, "\(receiver.log)")
        // Its own group role: no role warning.
        #expect(
            waitUntil(timeout: .seconds(10)) {
                (try? database.query("SELECT count(*) FROM siwa.service_heartbeats WHERE kind = 'receiver'")[
                    0][
                        0, as: Int.self]) == 1
            })
        #expect(!receiver.log.contains("connected as a superuser"), "\(receiver.log)")
        #expect(!receiver.log.contains("connected as the owner"), "\(receiver.log)")
    }
}

/// The group roles schema.sql creates and grants to.
enum MigrateRoles {
    static let all = [
        "siwa_admin", "siwa_receiver", "siwa_worker", "siwa_signin", "siwa_app", "siwa_webhook_admin",
        "siwa_mail", "siwa_bounce", "siwa_ssf",
    ]
}
