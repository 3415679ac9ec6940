import AppleNotifications
import Foundation
import Postgres
import ServiceSupport
import TestSupport
import Testing

/// `siwactl fake-apple` running as a child process, serving DIR/jwks.json.
final class FakeApple {
    let process: Subprocess
    let url: URL
    let errorLog: URL
    private let directory: URL

    init(keys: URL, extra: [String] = [], environment: [String: String] = [:]) throws {
        let directory = try scratchDirectory()
        let output = directory.appendingPathComponent("stdout")
        let errorLog = directory.appendingPathComponent("stderr")
        let process = try Subprocess(
            ExecutableLocator.url(named: "siwactl").path,
            ["fake-apple", "--listen", "127.0.0.1:0", "--keys", keys.path] + extra,
            environment: ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }
                .merging(environment) { $1 },
            standardOutput: output.path, standardError: errorLog.path)
        var printed: String?
        _ = waitUntil {
            let text = (try? String(contentsOf: output, encoding: .utf8)) ?? ""
            if text.hasSuffix("\n") { printed = text.trimmingCharacters(in: .whitespacesAndNewlines) }
            return printed != nil || !process.isRunning
        }
        guard let printed, let url = URL(string: printed) else {
            let log = (try? String(contentsOf: errorLog, encoding: .utf8)) ?? ""
            throw ExecutableError("fake-apple printed no URL; stderr: \(log)")
        }
        self.directory = directory
        self.errorLog = errorLog
        self.process = process
        self.url = url
    }

    var log: String { (try? String(contentsOf: errorLog, encoding: .utf8)) ?? "" }

    /// Sends SIGTERM and returns how it ended.
    func stop() -> Subprocess.Termination? {
        process.send(SIGTERM)
        return process.wait(timeout: .seconds(10))
    }

    deinit {
        process.send(SIGKILL)
        process.wait(timeout: .seconds(5))
        try? FileManager.default.removeItem(at: directory)
    }
}

/// The client ID the receivers in these tests accept.
let siwactlAudience = "com.example.siwactl"

/// A receiver running in this process, trusting keys from `jwksURL`.
func startReceiver(trusting jwksURL: URL) throws -> ReceiverHarness {
    try ReceiverHarness(
        keys: .url(jwksURL), audience: siwactlAudience, cooldown: .milliseconds(50), poolSize: 2,
        waitForKeys: false)
}

/// A key pair written by `siwactl keygen` into a scratch directory.
struct GeneratedKey {
    let directory: URL
    let kid: String
    let signer: NotificationSigner

    init(kid: String) throws {
        directory = try scratchDirectory()
        let result = try siwactl(["keygen", "--out", directory.path, "--kid", kid])
        guard result.status == 0 else { throw ExecutableError("keygen failed: \(result.standardError)") }
        self.kid = kid
        let pem = try String(contentsOf: directory.appendingPathComponent("private-key.pem"), encoding: .utf8)
        signer = try NotificationSigner(privateKeyPEM: pem, keyID: kid)
    }

    var keyFile: URL { directory.appendingPathComponent("private-key.pem") }
    var jwksFile: URL { directory.appendingPathComponent("jwks.json") }

    func token(sub: String = "001.fake-apple") throws -> String {
        try signer.sign(type: "consent-revoked", subject: sub, audience: siwactlAudience)
    }
}

@Suite("siwactl fake-apple")
struct FakeAppleTests {
    @Test("serves keygen's key set, logs requests, and stops on SIGTERM with status 0")
    func servesAndStops() throws {
        let key = try GeneratedKey(kid: "fake-1")
        defer { try? FileManager.default.removeItem(at: key.directory) }
        let fake = try FakeApple(keys: key.directory)
        #expect(fake.url.path == "/auth/keys")
        let response = try TestHTTPClient.get(fake.url.absoluteString)
        #expect(response.status == 200)
        #expect(response.data == (try Data(contentsOf: key.jwksFile)))
        #expect(try TestHTTPClient.get("http://127.0.0.1:\(fake.url.port!)/other").status == 404)
        #expect(waitUntil { fake.log.contains("GET /auth/keys 200") && fake.log.contains("GET /other 404") })
        #expect(fake.stop() == .exited(0))
    }

    @Test("a receiver accepts tokens signed with its keys, and with new keys after the file is rewritten")
    func rotation() throws {
        let first = try GeneratedKey(kid: "fake-old")
        let second = try GeneratedKey(kid: "fake-new")
        defer {
            try? FileManager.default.removeItem(at: first.directory)
            try? FileManager.default.removeItem(at: second.directory)
        }
        let fake = try FakeApple(keys: first.directory)
        let receiver = try startReceiver(trusting: fake.url)
        #expect(waitUntil { (try? receiver.deliver(first.token()).status) == 200 })

        // Not yet published: the receiver refetches, still finds no such kid, and refuses.
        #expect(try receiver.deliver(second.token()).status == 401)

        // Rotate: replace the file as an operator would (atomically).
        try Data(contentsOf: second.jwksFile).write(to: first.jwksFile, options: .atomic)
        #expect(waitUntil { (try? receiver.deliver(second.token()).status) == 200 })
        #expect(waitUntil { fake.log.contains("kids fake-new") })
        #expect(fake.stop() == .exited(0))
    }

    @Test("refuses to start without a usable key set")
    func missingKeys() throws {
        let directory = try scratchDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let result = try siwactl(["fake-apple", "--listen", "127.0.0.1:0", "--keys", directory.path])
        #expect(result.status == 1)
        #expect(result.standardError.contains("jwks.json"))
    }
}

@Suite("siwactl simulate")
struct SimulateTests {
    @Test("posts N distinct notifications that a receiver stores")
    func stored() throws {
        let key = try GeneratedKey(kid: "simulate-1")
        defer { try? FileManager.default.removeItem(at: key.directory) }
        let jwks = try JWKSTestServer(body: Data(contentsOf: key.jwksFile))
        defer { jwks.stop() }
        let receiver = try startReceiver(trusting: jwks.url)
        let result = try siwactl([
            "simulate", "--to", receiver.notificationURL, "--key", key.keyFile.path, "--kid", key.kid,
            "--audience", siwactlAudience, "--type", "email-disabled", "--sub", "001.simulated",
            "--email", "x@privaterelay.appleid.com", "--count", "3",
        ])
        #expect(result.status == 0, "\(result.standardOutput)\(result.standardError)")
        let lines = result.standardOutput.split(separator: "\n")
        #expect(lines.count == 4)
        #expect(lines.prefix(3).allSatisfy { $0.contains(" 200 ") })
        #expect(lines.last == "sent 3: 3 answered 200, 0 did not")
        let rows = try receiver.query(
            "SELECT count(DISTINCT jti), min(event_type), min(email) FROM siwa.event_history WHERE sub = $1",
            [.text("001.simulated")])
        #expect(try rows[0][0, as: Int.self] == 3)
        #expect(try rows[0][1, as: String.self] == "email-disabled")
        #expect(try rows[0][2, as: String.self] == "x@privaterelay.appleid.com")
    }

    @Test("exits 1 when the receiver refuses (wrong audience)")
    func refused() throws {
        let key = try GeneratedKey(kid: "simulate-2")
        defer { try? FileManager.default.removeItem(at: key.directory) }
        let jwks = try JWKSTestServer(body: Data(contentsOf: key.jwksFile))
        defer { jwks.stop() }
        let receiver = try startReceiver(trusting: jwks.url)
        let result = try siwactl([
            "simulate", "--to", receiver.notificationURL, "--key", key.keyFile.path, "--kid", key.kid,
            "--audience", "com.example.someone-else", "--type", "consent-revoked", "--sub", "001.x",
            "--count", "2",
        ])
        #expect(result.status == 1)
        #expect(result.standardOutput.contains("1/2 jti="))
        #expect(result.standardOutput.contains(" 401 "))
        #expect(result.standardOutput.contains("sent 2: 0 answered 200, 2 did not"))
        #expect(
            try receiver.query("SELECT count(*) FROM siwa.notifications")[0][0, as: Int.self] == 0)
    }

    @Test("an unreachable receiver is reported per notification and fails")
    func unreachable() throws {
        let key = try GeneratedKey(kid: "simulate-3")
        defer { try? FileManager.default.removeItem(at: key.directory) }
        let nothing = try RefusingPort()  // held until the end of scope
        defer { withExtendedLifetime(nothing) {} }
        let result = try siwactl([
            "simulate", "--to", "http://127.0.0.1:\(nothing.port)/apple/notifications", "--key",
            key.keyFile.path,
            "--audience", "a", "--type", "consent-revoked", "--sub", "s",
        ])
        #expect(result.status == 1)
        #expect(result.standardOutput.contains("no answer"))
    }
}
