import AppleID
import AppleNotifications
import Foundation

/// A local Apple for one test: `siwactl fake-apple` as a child process on a free loopback port, with
/// Apple's RSA key made by `siwactl keygen` and a team `.p8` (P-256) made by the openssl CLI.
public final class LocalApple {
    public static let teamID = "TEAM123456"
    public static let keyID = "KEY1234567"
    public static let clientID = "com.example.app"
    public static let otherClientID = "com.example.web"

    public let directory: URL
    public let process: Subprocess
    /// `http://127.0.0.1:PORT`.
    public let baseURL: String
    public let errorLog: URL

    public var teamKeyFile: URL { directory.appendingPathComponent("AuthKey_\(Self.keyID).p8") }
    public var applePublicKeyFile: URL { directory.appendingPathComponent("apple-public.pem") }
    public var keysDirectory: URL { directory.appendingPathComponent("keys") }

    public init(port: Int = 0, extra: [String] = []) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "appleid-tests-\(UUID().uuidString)")
        self.directory = directory
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let keygen = try Self.siwactl([
            "keygen", "--out", directory.appendingPathComponent("keys").path, "--kid", "apple-test",
        ])
        guard keygen.status == 0 else { throw ExecutableError("keygen: \(keygen.standardError)") }
        let teamKey = directory.appendingPathComponent("AuthKey_\(Self.keyID).p8")
        try Self.openssl([
            "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", teamKey.path,
        ])
        let teamPublic = directory.appendingPathComponent("team-public.pem")
        try Self.openssl(["pkey", "-in", teamKey.path, "-pubout", "-out", teamPublic.path])
        try Self.openssl([
            "pkey", "-in", directory.appendingPathComponent("keys/private-key.pem").path, "-pubout", "-out",
            directory.appendingPathComponent("apple-public.pem").path,
        ])
        let output = directory.appendingPathComponent("stdout")
        let errorLog = directory.appendingPathComponent("stderr")
        self.errorLog = errorLog
        let process = try Subprocess(
            ExecutableLocator.url(named: "siwactl").path,
            [
                "fake-apple", "--listen", "127.0.0.1:\(port)", "--keys",
                directory.appendingPathComponent("keys").path,
                "--team-id", Self.teamID, "--key-id", Self.keyID, "--team-key", teamPublic.path,
                "--client-id", Self.clientID, "--client-id", Self.otherClientID,
            ] + extra,
            standardOutput: output.path, standardError: errorLog.path)
        self.process = process
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

    public var log: String { (try? String(contentsOf: errorLog, encoding: .utf8)) ?? "" }

    /// `siwactl fake-apple authorize`: a fresh code and id_token for a test user.
    public func authorize(
        sub: String, email: String? = nil, nonce: String? = nil, clientID: String? = nil,
        redirectURI: String? = nil
    ) throws -> (code: String, idToken: String) {
        var arguments = ["fake-apple", "authorize", "--url", baseURL, "--sub", sub]
        if let redirectURI { arguments += ["--redirect-uri", redirectURI] }
        if let email { arguments += ["--email", email] }
        if let nonce { arguments += ["--nonce", nonce] }
        if let clientID { arguments += ["--client-id", clientID] }
        let result = try Self.siwactl(arguments)
        guard result.status == 0,
            let object = try JSONSerialization.jsonObject(with: Data(result.standardOutput.utf8))
                as? [String: String],
            let code = object["code"], let idToken = object["id_token"]
        else { throw ExecutableError("authorize: \(result.status) \(result.standardError)") }
        return (code, idToken)
    }

    /// `siwactl fake-apple fault`.
    public func fault(_ arguments: [String]) throws {
        let result = try Self.siwactl(["fake-apple", "fault", "--url", baseURL] + arguments)
        guard result.status == 0 else { throw ExecutableError("fault: \(result.standardError)") }
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

    /// Verifies an RS256 JWS with the openssl CLI and the public half of fake-apple's key; returns
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

    /// Runs the built `siwactl` with a clean environment (no SIWA_* variables from the caller).
    private static func siwactl(_ arguments: [String]) throws -> ExecutableLocator.Result {
        let environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }
        return try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwactl"), arguments: arguments, environment: environment,
            input: nil,
            timeout: .seconds(60))
    }

    @discardableResult
    private static func openssl(_ arguments: [String]) throws -> ExecutableLocator.Result {
        let result = try Subprocess.run("/usr/bin/openssl", arguments, timeout: .seconds(30))
        guard result.status == 0 else {
            throw ExecutableError("openssl \(arguments[0]): \(result.standardError)")
        }
        return result
    }

    deinit {
        process.send(SIGKILL)
        process.wait(timeout: .seconds(5))
        try? FileManager.default.removeItem(at: directory)
    }
}
