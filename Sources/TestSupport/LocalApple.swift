public import AppleID
import AppleNotifications
public import FakeApple
public import Foundation
import HTTPServer
import Synchronization

/// A local Apple for one test, on a loopback port: in process by default (``FakeAppleServer`` on the
/// project's HTTP server), or `siwactl fake-apple` as a child process (``Mode/process``) for a test
/// that needs a real process. Apple's RSA key is made in Swift (as `siwactl keygen` makes it), the
/// team `.p8` (P-256) by the openssl CLI.
public final class LocalApple {
    public static let teamID = "TEAM123456"
    public static let keyID = "KEY1234567"
    public static let clientID = "com.example.app"
    public static let otherClientID = "com.example.web"

    /// Where the local Apple runs.
    public enum Mode: Sendable {
        /// In this process, on its own HTTP server.
        case inProcess
        /// `siwactl fake-apple` as a child process.
        case process

        /// In process, unless the environment says `LOCAL_APPLE_MODE=process` (to compare the two, or to
        /// run every test against the real command).
        public static var standard: Mode {
            ProcessInfo.processInfo.environment["LOCAL_APPLE_MODE"] == "process" ? .process : .inProcess
        }
    }

    /// Another team whose client secrets are accepted (the recipient of an app transfer).
    public struct TransferTeam: Sendable {
        public var teamID: String
        public var keyID: String
        /// The team key's public half (PEM).
        public var publicKeyFile: URL

        public init(teamID: String, keyID: String, publicKeyFile: URL) {
            self.teamID = teamID
            self.keyID = keyID
            self.publicKeyFile = publicKeyFile
        }
    }

    public let directory: URL
    /// The child process (``Mode/process`` only).
    public let process: Subprocess?
    /// The server (``Mode/inProcess`` only).
    public let server: FakeAppleServer?
    /// `http://127.0.0.1:PORT`.
    public let baseURL: String
    public let errorLog: URL
    private let inProcessLog = LogLines()

    public var teamKeyFile: URL { directory.appendingPathComponent("AuthKey_\(Self.keyID).p8") }
    public var applePublicKeyFile: URL { directory.appendingPathComponent("apple-public.pem") }
    public var keysDirectory: URL { directory.appendingPathComponent("keys") }

    /// Starts a local Apple knowing ``teamID``, ``keyID`` and both client IDs. `notifyURL`: where it POSTs
    /// consent-revoked after a revocation; `codeLifetime`: seconds an authorization code stays valid;
    /// `migrationUsers`: a JSON-lines file {sub, email, is_private_email}; `extra`: more `siwactl
    /// fake-apple` arguments (``Mode/process`` only).
    public init(
        port: Int = 0, mode: Mode = .standard, notifyURL: String? = nil, codeLifetime: Double? = nil,
        transferTeams: [TransferTeam] = [], migrationUsers: URL? = nil, extra: [String] = []
    ) throws {
        precondition(mode == .process || extra.isEmpty, "extra arguments need Mode.process")
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "appleid-tests-\(UUID().uuidString)")
        self.directory = directory
        let keys = directory.appendingPathComponent("keys")
        try FileManager.default.createDirectory(at: keys, withIntermediateDirectories: true)
        let signer = try NotificationSigner.generate(keyID: "apple-test")
        guard
            FileManager.default.createFile(
                atPath: keys.appendingPathComponent("private-key.pem").path,
                contents: Data(signer.privateKeyPEM.utf8), attributes: [.posixPermissions: 0o600])
        else { throw ExecutableError("cannot write Apple's key") }
        try signer.jwksJSON().write(to: keys.appendingPathComponent("jwks.json"), options: .atomic)
        let teamKey = directory.appendingPathComponent("AuthKey_\(Self.keyID).p8")
        try openssl([
            "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", teamKey.path,
        ])
        let teamPublic = directory.appendingPathComponent("team-public.pem")
        try openssl(["pkey", "-in", teamKey.path, "-pubout", "-out", teamPublic.path])
        try openssl([
            "pkey", "-in", keys.appendingPathComponent("private-key.pem").path, "-pubout", "-out",
            directory.appendingPathComponent("apple-public.pem").path,
        ])
        let errorLog = directory.appendingPathComponent("stderr")
        self.errorLog = errorLog
        switch mode {
        case .inProcess:
            var settings = FakeAppleAuthority.Settings(
                teamID: Self.teamID, keyID: Self.keyID, clientIDs: [Self.clientID, Self.otherClientID],
                teamKey: try ClientSecretVerifier(pem: String(contentsOf: teamPublic, encoding: .utf8)),
                notifyURL: notifyURL, codeLifetime: codeLifetime ?? 300)
            for team in transferTeams {
                settings.otherTeams[team.teamID] = (
                    team.keyID,
                    try ClientSecretVerifier(pem: String(contentsOf: team.publicKeyFile, encoding: .utf8))
                )
            }
            if let migrationUsers {
                for line in try String(contentsOf: migrationUsers, encoding: .utf8).split(separator: "\n")
                where !line.isEmpty {
                    let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
                    guard let object, let sub = object["sub"] as? String else {
                        throw ExecutableError("migration users: a line without sub")
                    }
                    settings.migrationUsers[sub] = (
                        object["email"] as? String, (object["is_private_email"] as? Bool) ?? false
                    )
                }
            }
            let log = inProcessLog
            let server = try FakeAppleServer(
                configuration: FakeAppleServer.Configuration(
                    port: port, keysDirectory: keys.path, settings: settings)
            ) { line in log.append("fake-apple: \(line)\n") }
            try server.start()
            self.server = server
            self.process = nil
            baseURL = server.baseURL!
        case .process:
            var arguments = [
                "fake-apple", "--listen", "127.0.0.1:\(port)", "--keys", keys.path, "--team-id", Self.teamID,
                "--key-id", Self.keyID, "--team-key", teamPublic.path, "--client-id", Self.clientID,
                "--client-id", Self.otherClientID,
            ]
            if let notifyURL { arguments += ["--notify-url", notifyURL] }
            if let codeLifetime { arguments += ["--code-lifetime", "\(codeLifetime)"] }
            for team in transferTeams {
                arguments += ["--transfer-team", "\(team.teamID):\(team.keyID):\(team.publicKeyFile.path)"]
            }
            if let migrationUsers { arguments += ["--migration-users", migrationUsers.path] }
            let output = directory.appendingPathComponent("stdout")
            let process = try Subprocess(
                ExecutableLocator.url(named: "siwactl").path, arguments + extra,
                standardOutput: output.path, standardError: errorLog.path)
            self.process = process
            self.server = nil
            var printed: String?
            _ = waitUntil {
                let text = (try? String(contentsOf: output, encoding: .utf8)) ?? ""
                if text.hasSuffix("\n") { printed = text.trimmingCharacters(in: .whitespacesAndNewlines) }
                return printed != nil || !process.isRunning
            }
            guard let printed, printed.hasSuffix("/auth/keys") else {
                throw ExecutableError(
                    "fake-apple printed no URL; stderr: \((try? String(contentsOf: errorLog, encoding: .utf8)) ?? "")"
                )
            }
            baseURL = String(printed.dropLast("/auth/keys".count))
        }
    }

    /// What the local Apple logged (one line per request and per notable event).
    public var log: String {
        if server != nil { return inProcessLog.text }
        return (try? String(contentsOf: errorLog, encoding: .utf8)) ?? ""
    }

    /// A fresh code and id_token for a test user (as `siwactl fake-apple authorize`).
    public func authorize(
        sub: String, email: String? = nil, nonce: String? = nil, clientID: String? = nil,
        redirectURI: String? = nil
    ) throws -> (code: String, idToken: String) {
        if let server {
            var body: [String: Any] = ["sub": sub, "real_user_status": 2]
            if let email { body["email"] = email }
            if let nonce { body["nonce"] = nonce }
            if let clientID { body["client_id"] = clientID }
            if let redirectURI { body["redirect_uri"] = redirectURI }
            let answer = try Self.post(server, "/fake/authorize", body)
            guard answer.status == 200,
                let object = try JSONSerialization.jsonObject(with: Data(answer.body)) as? [String: String],
                let code = object["code"], let idToken = object["id_token"]
            else { throw ExecutableError("authorize: \(answer.status)") }
            return (code, idToken)
        }
        var arguments = ["fake-apple", "authorize", "--url", baseURL, "--sub", sub]
        if let redirectURI { arguments += ["--redirect-uri", redirectURI] }
        if let email { arguments += ["--email", email] }
        if let nonce { arguments += ["--nonce", nonce] }
        if let clientID { arguments += ["--client-id", clientID] }
        let result = try siwactl(arguments)
        guard result.status == 0,
            let object = try JSONSerialization.jsonObject(with: Data(result.standardOutput.utf8))
                as? [String: String],
            let code = object["code"], let idToken = object["id_token"]
        else { throw ExecutableError("authorize: \(result.status) \(result.standardError)") }
        return (code, idToken)
    }

    /// Faults on demand, with the arguments of `siwactl fake-apple fault` (`--fail-with`, `--delay-ms`,
    /// `--times`, `--endpoint`, `--subjects FILE`, `--every`, `--add`).
    public func fault(_ arguments: [String]) throws {
        guard let server else {
            let result = try siwactl(["fake-apple", "fault", "--url", baseURL] + arguments)
            guard result.status == 0 else { throw ExecutableError("fault: \(result.standardError)") }
            return
        }
        var body: [String: Any] = ["endpoint": "both"]
        var index = 0
        while index < arguments.count {
            let name = arguments[index]
            index += 1
            if name == "--add" {
                body["add"] = true
                continue
            }
            guard index < arguments.count else { throw ExecutableError("fault: \(name) needs a value") }
            let value = arguments[index]
            index += 1
            switch name {
            case "--fail-with": body["fail_with"] = value
            case "--endpoint": body["endpoint"] = value
            case "--subjects":
                body["subjects"] = try String(contentsOfFile: value, encoding: .utf8).split(separator: "\n")
                    .map(String.init).filter { !$0.isEmpty }
            case "--delay-ms", "--answer-delay-ms", "--times", "--every":
                guard let number = Int(value) else { throw ExecutableError("fault: \(name) \(value)") }
                body[String(name.dropFirst(2)).replacingOccurrences(of: "-", with: "_")] = number
            default: throw ExecutableError("fault: unknown \(name)")
            }
        }
        let answer = try Self.post(server, "/fake/faults", body)
        guard answer.status == 204 else { throw ExecutableError("fault: \(answer.status)") }
    }

    /// A provider minting secrets with the team's key (or with `signingKey`, a PEM).
    public func provider(
        teamID: String = LocalApple.teamID, keyID: String = LocalApple.keyID,
        clientID: String = LocalApple.clientID, signingKey: String? = nil
    ) throws -> ClientSecretProvider {
        let pem = try signingKey ?? String(contentsOf: teamKeyFile, encoding: .utf8)
        return ClientSecretProvider(
            try .mint(
                signer: ClientSecretSigner(privateKeyPEM: pem), teamID: teamID, keyID: keyID,
                clientID: clientID))
    }

    public func client(_ provider: ClientSecretProvider? = nil, timeout: Duration = .seconds(10)) throws
        -> AppleIDClient
    {
        try AppleIDClient(
            configuration: AppleIDClient.Configuration(baseURL: baseURL, timeout: timeout),
            clientSecret: provider ?? self.provider())
    }

    /// Verifies an RS256 JWS with the openssl CLI and the public half of the local Apple's key; returns
    /// its claims when valid.
    public func verifiedClaims(_ token: String) throws -> [String: Any]? {
        let parts = token.split(separator: ".").map(String.init)
        guard parts.count == 3 else { return nil }
        let input = directory.appendingPathComponent("input-\(UUID().uuidString)")
        let signature = directory.appendingPathComponent("signature-\(UUID().uuidString)")
        try Data((parts[0] + "." + parts[1]).utf8).write(to: input)
        try Base64URL.decode(parts[2]).write(to: signature)
        let result = try Subprocess.run(
            "/usr/bin/openssl",
            ["dgst", "-sha256", "-verify", applePublicKeyFile.path, "-signature", signature.path, input.path])
        guard result.status == 0, result.standardOutput.contains("Verified OK") else { return nil }
        return try JSONSerialization.jsonObject(with: Base64URL.decode(parts[1])) as? [String: Any]
    }

    /// A test-only endpoint's answer, from the in-process authority (as its HTTP server would give it).
    private static func post(_ server: FakeAppleServer, _ path: String, _ body: [String: Any]) throws
        -> HTTPResponse
    {
        let request = HTTPRequest(
            method: "POST", path: path, headers: ["Content-Type": "application/json"],
            body: Array(try JSONSerialization.data(withJSONObject: body)), remoteAddress: "in-process")
        guard let answer = server.authority.handle(request) else {
            throw ExecutableError("\(path): no answer")
        }
        return answer
    }

    deinit {
        server?.shutdown(gracePeriod: .seconds(1))
        if let process {
            process.send(SIGKILL)
            process.wait(timeout: .seconds(5))
        }
        try? FileManager.default.removeItem(at: directory)
    }
}

/// The in-process local Apple's log, shared with its server's threads.
private final class LogLines: Sendable {
    private let lines = Mutex("")

    func append(_ line: String) { lines.withLock { $0 += line } }

    var text: String { lines.withLock { $0 } }
}

/// Runs `body` and returns the AppleIDError it throws, or nil (nil too for any other error).
public func appleError(_ body: () throws -> Void) -> AppleIDError? {
    do {
        try body()
        return nil
    } catch let error as AppleIDError {
        return error
    } catch {
        return nil
    }
}
