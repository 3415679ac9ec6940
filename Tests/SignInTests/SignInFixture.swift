import AppleID
import AppleNotifications
import Foundation
import HTTPServer
import Postgres
import ServiceSupport
import SignIn
import TestSupport
import TokenVault

// The sign-in API's own fixture (LocalApple, the local Apple, is TestSupport's).

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
        apple = try LocalApple(port: port, notifyURL: notify ? receiver.notificationURL : nil)
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
