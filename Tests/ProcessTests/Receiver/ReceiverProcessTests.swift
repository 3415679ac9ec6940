import AppleNotifications
import Foundation
import Postgres
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

    @Test(
        "on port 0, reports the bound address in its log and --listen-address-file, serves there, exits 0 on SIGTERM"
    )
    func gracefulShutdown() throws {
        let cluster = try PostgresCluster.shared
        let database = try cluster.createSchemaDatabase()
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let addresses = ListenAddresses()
        defer { addresses.remove() }
        let log = FileManager.default.temporaryDirectory.appendingPathComponent("receiver-\(UUID()).log")
        defer { try? FileManager.default.removeItem(at: log) }
        func logged() -> String { (try? String(contentsOf: log, encoding: .utf8)) ?? "" }
        let process = try Subprocess(
            Self.binary.path,
            [
                "--listen", "127.0.0.1:0", "--database-url", cluster.url(database: database.database!),
                "--audience", TestSigning.audience, "--jwks-url", jwks.url.absoluteString,
            ] + addresses.arguments, standardError: log.path)
        let listeners = try addresses.wait(for: process, log: logged)
        #expect(Array(listeners.keys) == ["notifications"])
        let address = try ListenAddresses.address("notifications", in: listeners)
        #expect(address.hasPrefix("127.0.0.1:") && address != "127.0.0.1:0", "\(address)")
        #expect(logged().contains(#""address":"\#(address)""#), "\(logged())")
        let url = "http://" + address
        #expect(waitUntil { (try? TestHTTPClient.get(url + "/readyz").status) == 200 })
        let body = Array(#"{"payload":"\#(TestSigning.token())"}"#.utf8)
        #expect(try TestHTTPClient.post(url + "/apple/notifications", body: body).status == 200)
        process.send(SIGTERM)
        #expect(process.wait(timeout: .seconds(15)) == .exited(0))
        #expect(!FileManager.default.fileExists(atPath: addresses.url.path), "removed on a clean stop")
    }

    @Test("a --listen-address-file it cannot write stops it at start, exit 1, naming the file")
    func unwritableAddressFile() throws {
        let cluster = try PostgresCluster.shared
        let database = try cluster.createSchemaDatabase()
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let path = "/nonexistent-\(UUID())/addresses"
        let result = try ExecutableLocator.run(
            Self.binary,
            arguments: [
                "--listen", "127.0.0.1:0", "--database-url", cluster.url(database: database.database!),
                "--audience", TestSigning.audience, "--jwks-url", jwks.url.absoluteString,
                "--listen-address-file", path,
            ], environment: [:], timeout: .seconds(30))
        #expect(result.status == 1)
        #expect(result.standardError.contains(path), "\(result.standardError)")
    }
}
