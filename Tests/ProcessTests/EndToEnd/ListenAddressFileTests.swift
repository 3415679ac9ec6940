import AppleNotifications
import Foundation
import TestSupport
import Testing

/// Services started on port 0 report the address the kernel chose: in their log and in
/// `--listen-address-file`, which is there once they listen and gone after a clean stop.
@Suite("--listen-address-file")
struct ListenAddressFileTests {
    /// Starts `executable` with `arguments` and the file; returns the process, its listeners and its stderr.
    static func start(_ executable: String, _ arguments: [String], environment: [String: String] = [:])
        throws -> (Subprocess, [String: String], ListenAddresses, () -> String)
    {
        let addresses = ListenAddresses()
        let errors = FileManager.default.temporaryDirectory.appendingPathComponent("listen-\(UUID()).err")
        let log = { (try? String(contentsOf: errors, encoding: .utf8)) ?? "" }
        let process = try Subprocess(
            ExecutableLocator.url(named: executable).path, arguments + addresses.arguments,
            environment: ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }
                .merging(environment) { $1 }, standardError: errors.path)
        return (process, try addresses.wait(for: process, log: log), addresses, log)
    }

    /// SIGTERM, exit 0, and the file removed.
    static func stop(_ process: Subprocess, _ addresses: ListenAddresses) {
        process.send(SIGTERM)
        #expect(process.wait(timeout: .seconds(15)) == .exited(0))
        #expect(!FileManager.default.fileExists(atPath: addresses.url.path), "removed on a clean stop")
        addresses.remove()
    }

    @Test("siwa-worker --metrics-listen 127.0.0.1:0: the metrics address, logged and serving /metrics")
    func worker() throws {
        let database = try TestDatabase()
        let keys = try StaticHTTPServer(body: TestSigning.apple.jwksJSON())
        let (process, listeners, addresses, log) = try Self.start(
            "siwa-worker",
            [
                "--metrics-listen", "127.0.0.1:0", "--database-url",
                try database.url(asMemberOf: "siwa_worker"),
                "--jwks-url", keys.url.absoluteString,
            ])
        defer { process.send(SIGKILL) }
        #expect(Array(listeners.keys) == ["metrics"])
        let address = try ListenAddresses.address("metrics", in: listeners)
        #expect(address.hasPrefix("127.0.0.1:") && address != "127.0.0.1:0", "\(address)")
        #expect(log().contains(#""address":"\#(address)""#), "\(log())")
        let scrape = try TestHTTPClient.get("http://\(address)/metrics")
        #expect(scrape.status == 200 && scrape.text.contains("siwa_build_info"), "\(scrape.text.prefix(300))")
        Self.stop(process, addresses)
    }

    @Test("siwa-worker refuses --listen-address-file without --metrics-listen (usage, exit 2)")
    func workerWithoutListener() throws {
        let result = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwa-worker"),
            arguments: ["--database-url", "postgresql:///nowhere", "--listen-address-file", "/tmp/unused"],
            environment: [:])
        #expect(result.status == 2)
        #expect(result.standardError.contains("--listen-address-file needs --metrics-listen"))
    }

    @Test("siwactl fake-apple --listen 127.0.0.1:0: its address as 'apple', logged, serving /auth/keys")
    func fakeApple() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("fake-apple-\(UUID())")
        defer { try? FileManager.default.removeItem(at: directory) }
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try TestSigning.apple.jwksJSON().write(to: directory.appendingPathComponent("jwks.json"))
        let (process, listeners, addresses, log) = try Self.start(
            "siwactl", ["fake-apple", "--listen", "127.0.0.1:0", "--keys", directory.path])
        defer { process.send(SIGKILL) }
        let address = try ListenAddresses.address("apple", in: listeners)
        #expect(address.hasPrefix("127.0.0.1:") && address != "127.0.0.1:0", "\(address)")
        #expect(log().contains("listening on \(address)"), "\(log())")
        #expect(try TestHTTPClient.get("http://\(address)/auth/keys").status == 200)
        Self.stop(process, addresses)
    }

    @Test("siwactl webhooks listen (port 0 by default): its address as 'webhooks', logged, answering")
    func webhooksListen() throws {
        let (process, listeners, addresses, log) = try Self.start(
            "siwactl", ["webhooks", "listen"],
            environment: ["SIWA_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])
        defer { process.send(SIGKILL) }
        let address = try ListenAddresses.address("webhooks", in: listeners)
        #expect(address.hasPrefix("127.0.0.1:") && address != "127.0.0.1:0", "\(address)")
        #expect(log().contains("listening on http://\(address)/"), "\(log())")
        #expect(try TestHTTPClient.get("http://\(address)/").status == 405)  // POST only
        Self.stop(process, addresses)
    }
}
