import Foundation
import TestSupport
import Testing

@Suite("The siwa-receiver executable")
struct ReceiverProcessTests {
    static var binary: URL { ExecutableLocator.url(named: "siwa-receiver") }

    @Test("refuses to start without an audience, naming what is missing")
    func requiresAudience() throws {
        let result = try ExecutableLocator.run(
            Self.binary, arguments: ["--database-url", "postgresql:///nowhere"], environment: [:])
        #expect(result.status == 2)
        #expect(result.standardError.contains("audience"))
    }

    @Test("refuses a --max-token-age beyond the database's 7-day dedupe window")
    func maxTokenAgeWithinTheDedupeWindow() throws {
        let result = try ExecutableLocator.run(
            Self.binary,
            arguments: [
                "--database-url", "postgresql:///nowhere", "--audience", "com.example.app",
                "--max-token-age", "604800",
            ], environment: [:])
        #expect(result.status == 2)
        #expect(result.standardError.contains("--max-token-age must be at most 518400 seconds"))
    }

    @Test("--help lists every setting with its environment variable")
    func help() throws {
        let result = try ExecutableLocator.run(Self.binary, arguments: ["--help"], environment: [:])
        #expect(result.status == 0)
        for name in [
            "--listen", "SIWA_LISTEN", "--database-url", "SIWA_DATABASE_URL", "--audience", "SIWA_AUDIENCES",
            "--jwks-url", "SIWA_JWKS_URL", "--jwks-cooldown", "--max-body-bytes", "--max-connections",
            "--connection-timeout", "--threads", "--pool-size",
        ] {
            #expect(result.standardOutput.contains(name), "help lacks \(name)")
        }
    }

    @Test("serves notifications and exits 0 on SIGTERM")
    func gracefulShutdown() throws {
        let cluster = try PostgresCluster.shared
        let database = try cluster.createSchemaDatabase()
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let port = try ExecutableLocator.freePort()
        let process = try Subprocess(
            Self.binary.path,
            [
                "--listen", "127.0.0.1:\(port)", "--database-url", cluster.url(database: database.database!),
                "--audience", TestSigning.audience, "--jwks-url", jwks.url.absoluteString,
            ])
        let url = "http://127.0.0.1:\(port)"
        #expect(waitUntil { (try? TestHTTPClient.get(url + "/readyz").status) == 200 })
        let body = Array(#"{"payload":"\#(TestSigning.token())"}"#.utf8)
        #expect(try TestHTTPClient.post(url + "/apple/notifications", body: body).status == 200)
        process.send(SIGTERM)
        #expect(process.wait(timeout: .seconds(15)) == .exited(0))
    }
}
