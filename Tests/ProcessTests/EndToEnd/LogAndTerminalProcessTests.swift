import AppleNotifications
import Foundation
import Postgres
import TestSupport
import Testing

/// What the executables write to logs and terminals cannot be steered from outside: the receiver logs
/// its key set's URL without userinfo or query; `siwactl webhooks listen` prints an unauthenticated
/// sender's `webhook-id` escaped; `siwactl fake-apple` logs a request's (percent-decoded) path escaped.
@Suite("Logs and terminals: nothing from outside is written raw")
struct LogAndTerminalProcessTests {
    /// Whether `text` holds a character a terminal obeys (C0 other than newline, DEL, C1).
    static func hasControl(_ text: String) -> Bool {
        text.unicodeScalars.contains { ($0.value < 0x20 && $0 != "\n") || (0x7F...0x9F).contains($0.value) }
    }

    @Test("siwa-receiver logs its JWKS URL as scheme, host and path: no userinfo, no query")
    func jwksURLWithoutCredentials() throws {
        let cluster = try PostgresCluster.shared
        let database = try cluster.createSchemaDatabase()
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let log = FileManager.default.temporaryDirectory.appendingPathComponent(
            "receiver-\(UUID().uuidString).log")
        defer { try? FileManager.default.removeItem(at: log) }
        let url = "http://operator:pa55word@127.0.0.1:\(jwks.port)\(jwks.path)?access_token=t0ken"
        let process = try Subprocess(
            ExecutableLocator.url(named: "siwa-receiver").path,
            [
                "--listen", "127.0.0.1:0", "--database-url", cluster.url(database: database.database!),
                "--audience", TestSigning.audience, "--jwks-url", url,
            ],
            environment: ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") },
            standardError: log.path)
        defer {
            process.send(SIGKILL)
            process.wait()
        }
        let text = { (try? String(contentsOf: log, encoding: .utf8)) ?? "" }
        #expect(waitUntil(timeout: .seconds(20)) { text().contains("fetched Apple's key set") }, "\(text())")
        process.send(SIGTERM)
        #expect(process.wait(timeout: .seconds(15)) == .exited(0))
        let logged = text()
        #expect(!logged.contains("pa55word") && !logged.contains("operator"), "\(logged)")
        #expect(!logged.contains("t0ken") && !logged.contains("access_token"), "\(logged)")
        #expect(logged.contains(#""url":"http://127.0.0.1:\#(jwks.port)\#(jwks.path)""#), "\(logged)")
    }

    @Test("webhooks listen prints a refused sender's webhook-id escaped: no ESC reaches the terminal")
    func listenEscapesTheWebhookID() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "listen-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let errors = directory.appendingPathComponent("stderr")
        let addresses = ListenAddresses()
        defer { addresses.remove() }
        let process = try Subprocess(
            ExecutableLocator.url(named: "siwactl").path,
            ["webhooks", "listen", "--port", "0"] + addresses.arguments,
            environment: ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }
                .merging(["SIWA_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]) { $1 },
            standardError: errors.path)
        defer {
            process.send(SIGKILL)
            process.wait()
        }
        let text = { (try? String(contentsOf: errors, encoding: .utf8)) ?? "" }
        let port = try ListenAddresses.port(of: addresses.address("webhooks", of: process, log: text))
        // An unauthenticated sender: a wrong signature, and ESC sequences (title, clear screen) and a C1
        // CSI in its webhook-id.
        let connection = try RawHTTPConnection(host: "127.0.0.1", port: port)
        var request = Array("POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nwebhook-id: msg_".utf8)
        request +=
            [0x1B] + Array("]0;pwned".utf8) + [0x07, 0x1B] + Array("[2J".utf8) + [0xC2, 0x9B]
            + Array("1A".utf8)
        request += Array(
            "\r\nwebhook-timestamp: \(Int(Date().timeIntervalSince1970))\r\nwebhook-signature: v1,AAAA\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
                .utf8)
        try connection.send(request)
        let response = try connection.readResponse()
        #expect(response.status == 401)
        #expect(waitUntil(timeout: .seconds(10)) { text().contains("refused msg_") }, "\(text())")
        let logged = text()
        #expect(!Self.hasControl(logged), "\(logged)")
        #expect(logged.contains(#"refused msg_\x1b]0;pwned\x07\x1b[2J\u009b1A with 401"#), "\(logged)")
        process.send(SIGTERM)
        #expect(process.wait(timeout: .seconds(10)) == .exited(0))
    }

    @Test("fake-apple logs a percent-decoded path escaped: %0a cannot forge a log line")
    func fakeAppleEscapesThePath() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "fake-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try TestSigning.apple.jwksJSON().write(to: directory.appendingPathComponent("jwks.json"))
        let output = directory.appendingPathComponent("stdout")
        let errors = directory.appendingPathComponent("stderr")
        let addresses = ListenAddresses()
        defer { addresses.remove() }
        let process = try Subprocess(
            ExecutableLocator.url(named: "siwactl").path,
            ["fake-apple", "--listen", "127.0.0.1:0", "--keys", directory.path] + addresses.arguments,
            environment: ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") },
            standardOutput: output.path, standardError: errors.path)
        defer {
            process.send(SIGKILL)
            process.wait()
        }
        let port = try ListenAddresses.port(
            of: addresses.address("apple", of: process) {
                (try? String(contentsOf: errors, encoding: .utf8)) ?? ""
            })
        let forged = "/x%0afake-apple:%20127.0.0.1%20GET%20/auth/keys%20200%1b[2J%c2%9b"
        let connection = try RawHTTPConnection(host: "127.0.0.1", port: port)
        try connection.send("GET \(forged) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        #expect(try connection.readResponse().status == 404)
        let text = { (try? String(contentsOf: errors, encoding: .utf8)) ?? "" }
        #expect(waitUntil(timeout: .seconds(10)) { text().contains(" 404") }, "\(text())")
        let logged = text()
        #expect(!Self.hasControl(logged), "\(logged)")
        #expect(
            !logged.split(separator: "\n").contains { $0.hasPrefix("fake-apple: 127.0.0.1 GET /auth/keys") })
        #expect(
            logged.contains(#"GET /x\nfake-apple: 127.0.0.1 GET /auth/keys 200\x1b[2J\u009b 404"#),
            "\(logged)")
    }
}
