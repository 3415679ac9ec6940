import AppleID
import AppleNotifications
import Foundation
import HTTPServer
import Postgres
import ServiceSupport
import SignIn
import TestSupport
import TokenVault

// A copy of Tests/AppleIDTests/Support.swift's LocalApple (test targets cannot share files), then the
// sign-in API's own fixture.

/// Runs the built `siwactl` with a clean environment (no SIWA_* variables from the caller).
func siwactl(_ arguments: [String]) throws -> ExecutableLocator.Result {
    let environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }
    return try ExecutableLocator.run(
        ExecutableLocator.url(named: "siwactl"), arguments: arguments, environment: environment, input: nil,
        timeout: .seconds(60))
}

@discardableResult
func openssl(_ arguments: [String]) throws -> ExecutableLocator.Result {
    let result = try Subprocess.run("/usr/bin/openssl", arguments, timeout: .seconds(30))
    guard result.status == 0 else {
        throw ExecutableError("openssl \(arguments[0]): \(result.standardError)")
    }
    return result
}

/// A local Apple for one test: `siwactl fake-apple` as a child process on a free loopback port, with
/// Apple's RSA key made by `siwactl keygen` and a team `.p8` (P-256) made by the openssl CLI.
final class LocalApple {
    static let teamID = "TEAM123456"
    static let keyID = "KEY1234567"
    static let clientID = "com.example.app"
    static let otherClientID = "com.example.web"

    let directory: URL
    let process: Subprocess
    /// `http://127.0.0.1:PORT`.
    let baseURL: String
    let errorLog: URL

    var teamKeyFile: URL { directory.appendingPathComponent("AuthKey_\(Self.keyID).p8") }
    var applePublicKeyFile: URL { directory.appendingPathComponent("apple-public.pem") }
    var keysDirectory: URL { directory.appendingPathComponent("keys") }

    init(port: Int = 0, extra: [String] = []) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "appleid-tests-\(UUID().uuidString)")
        self.directory = directory
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let keygen = try siwactl([
            "keygen", "--out", directory.appendingPathComponent("keys").path, "--kid", "apple-test",
        ])
        guard keygen.status == 0 else { throw ExecutableError("keygen: \(keygen.standardError)") }
        let teamKey = directory.appendingPathComponent("AuthKey_\(Self.keyID).p8")
        try openssl([
            "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", teamKey.path,
        ])
        let teamPublic = directory.appendingPathComponent("team-public.pem")
        try openssl(["pkey", "-in", teamKey.path, "-pubout", "-out", teamPublic.path])
        try openssl([
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

    var log: String { (try? String(contentsOf: errorLog, encoding: .utf8)) ?? "" }

    /// `siwactl fake-apple authorize`: a fresh code and id_token for a test user.
    func authorize(
        sub: String, email: String? = nil, nonce: String? = nil, clientID: String? = nil,
        redirectURI: String? = nil
    ) throws -> (code: String, idToken: String) {
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

    /// `siwactl fake-apple fault`.
    func fault(_ arguments: [String]) throws {
        let result = try siwactl(["fake-apple", "fault", "--url", baseURL] + arguments)
        guard result.status == 0 else { throw ExecutableError("fault: \(result.standardError)") }
    }

    /// A provider minting secrets with the team's key (or with `signingKey`, a PEM).
    func provider(
        teamID: String = LocalApple.teamID, keyID: String = LocalApple.keyID,
        clientID: String = LocalApple.clientID, signingKey: String? = nil
    ) throws -> ClientSecretProvider {
        let pem = try signingKey ?? String(contentsOf: teamKeyFile, encoding: .utf8)
        return ClientSecretProvider(
            try .mint(
                signer: ClientSecretSigner(privateKeyPEM: pem), teamID: teamID, keyID: keyID,
                clientID: clientID))
    }

    func client(_ provider: ClientSecretProvider? = nil, timeout: Duration = .seconds(10)) throws
        -> AppleIDClient
    {
        try AppleIDClient(
            configuration: AppleIDClient.Configuration(baseURL: baseURL, timeout: timeout),
            clientSecret: provider ?? self.provider())
    }

    /// Verifies an RS256 JWS with the openssl CLI and the public half of fake-apple's key; returns
    /// its claims when valid.
    func verifiedClaims(_ token: String) throws -> [String: Any]? {
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

    deinit {
        process.send(SIGKILL)
        process.wait(timeout: .seconds(5))
        try? FileManager.default.removeItem(at: directory)
    }
}

/// Runs `body` and returns the AppleIDError it throws, or nil.
func appleError(_ body: () throws -> Void) -> AppleIDError? {
    do {
        try body()
        return nil
    } catch let error as AppleIDError {
        return error
    } catch {
        return nil
    }
}

/// A raw nonce and what the app sends Apple (its SHA-256 hex).
struct Nonce {
    let raw = "raw-nonce-\(UUID().uuidString)"
    var hashed: String { IdentityTokenVerifier.nonceHash(raw) }
}

/// A key file with `keys` (id, 32 random bytes), the first encrypting; owner-only.
func writeKeyFile(_ keys: [(String, [UInt8])], in directory: URL) throws -> String {
    let path = directory.appendingPathComponent("token-keys-\(UUID().uuidString)").path
    let text = keys.map { "\($0.0) \(Data($0.1).base64EncodedString())" }.joined(separator: "\n") + "\n"
    FileManager.default.createFile(
        atPath: path, contents: Data(("# test keys\n" + text).utf8), attributes: [.posixPermissions: 0o600])
    return path
}

func randomKey() -> [UInt8] { (0..<32).map { _ in UInt8.random(in: 0...255) } }

/// fake-apple, a receiver storing what fake-apple notifies (same database), and the sign-in API in process.
final class SignInFixture {
    static let bearer = "test-bearer-token-0123456789abcdefghijklmnop"
    let apple: LocalApple
    let receiver: ReceiverHarness
    let service: SignInService
    let cipher: TokenCipher
    let keyFile: String
    let logs = LogCapture()

    /// `notify: false` leaves fake-apple without --notify-url (Apple's consent-revoked lost).
    init(clientIDs: [String] = [LocalApple.clientID], notify: Bool = true) throws {
        let port = try ExecutableLocator.freePort()
        receiver = try ReceiverHarness(
            keys: .url(URL(string: "http://127.0.0.1:\(port)/auth/keys")!), audience: LocalApple.clientID,
            cooldown: .milliseconds(50), poolSize: 2, waitForKeys: false)
        apple = try LocalApple(port: port, extra: notify ? ["--notify-url", receiver.notificationURL] : [])
        try Self.createLogins(receiver.database)
        keyFile = try writeKeyFile([("k1", randomKey())], in: apple.directory)
        cipher = try TokenCipher(keyFile: keyFile)
        var clients: [String: AppleIDClient] = [:]
        for clientID in clientIDs { clients[clientID] = try apple.client(apple.provider(clientID: clientID)) }
        let keySet = try JSONWebKeySet(
            jsonData: Data(contentsOf: apple.keysDirectory.appendingPathComponent("jwks.json")))
        service = SignInService(
            configuration: try SignInConfiguration(
                http: HTTPServer.Configuration(host: "127.0.0.1", port: 0, threadCount: 4),
                bearerToken: Self.bearer,
                clients: clients, cipher: cipher,
                database: try Self.login("signin_test_login", receiver.database),
                poolSize: 2),
            logger: logs.logger(level: .debug)
        ) { kid throws(NotificationError) in
            guard let key = keySet.key(id: kid) else {
                throw NotificationError(.verificationFailed, .unknownKeyID, "unknown kid")
            }
            return key
        }
        try service.start()
    }

    deinit { service.shutdown() }

    /// Login roles for the services under test: the sign-in API as siwa_signin, the revoker as siwa_worker,
    /// so that the tests prove the grants suffice.
    static func createLogins(_ database: PostgresConfiguration) throws {
        let connection = try PostgresConnection(configuration: database)
        defer { connection.close() }
        for (login, group) in [("signin_test_login", "siwa_signin"), ("worker_test_login", "siwa_worker")] {
            _ = try connection.simpleQuery(
                """
                DO $$ BEGIN
                    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '\(login)') THEN
                        CREATE ROLE \(login) LOGIN IN ROLE \(group);
                    END IF;
                EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
                END $$
                """)
        }
    }

    /// The fixture's database as `login`.
    func login(_ login: String) throws -> PostgresConfiguration { try Self.login(login, receiver.database) }

    static func login(_ login: String, _ database: PostgresConfiguration) throws -> PostgresConfiguration {
        let cluster = try PostgresCluster.shared
        return try PostgresConfiguration(
            "host=\(cluster.socketDirectory) port=\(cluster.port) dbname=\(database.database ?? "") user=\(login)"
        )
    }

    var url: String { "http://127.0.0.1:\(service.port ?? 0)" }

    /// POSTs `object` as JSON to `path` with the bearer token (or `authorization`).
    func post(
        _ path: String, _ object: [String: Any], authorization: String? = "Bearer \(SignInFixture.bearer)"
    )
        throws -> (status: Int, json: [String: Any], text: String)
    {
        var headers = [("Content-Type", "application/json")]
        if let authorization { headers.append(("Authorization", authorization)) }
        let response = try TestHTTPClient.post(
            url + path, body: try JSONSerialization.data(withJSONObject: object), headers: headers)
        let json = (try? JSONSerialization.jsonObject(with: response.data) as? [String: Any]) ?? [:]
        return (response.status, json, response.text)
    }

    /// A fresh sign-in's request body for `sub`.
    func signInBody(
        sub: String, email: String? = "u@privaterelay.appleid.com", nonce: Nonce = Nonce(),
        clientID: String = LocalApple.clientID, sentNonce: String? = nil
    ) throws -> [String: Any] {
        let authorization = try apple.authorize(
            sub: sub, email: email, nonce: nonce.hashed, clientID: clientID)
        return [
            "authorization_code": authorization.code, "id_token": authorization.idToken,
            "nonce": sentNonce ?? nonce.raw, "client_id": clientID,
        ]
    }

    func query(_ sql: String, _ parameters: [PostgresData?] = []) throws -> PostgresRows {
        try receiver.query(sql, parameters)
    }

    func count(_ sql: String, _ parameters: [PostgresData?] = []) throws -> Int {
        try query(sql, parameters)[0][0, as: Int.self]
    }
}
