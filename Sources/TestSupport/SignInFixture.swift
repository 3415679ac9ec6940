import AppleID
import AppleNotifications
import Foundation
import HTTPServer
public import Postgres
import ServiceSupport
public import SignIn
public import TokenVault

// The sign-in API's fixture, shared by SignInTests and RevokerTests.

/// fake-apple, a receiver storing what fake-apple notifies (same database), and the sign-in API in process.
public final class SignInFixture {
    public static let bearer = SignInCredentials.bearer
    public let apple: LocalApple
    public let receiver: ReceiverHarness
    public let service: SignInService
    public let cipher: TokenCipher
    public let keyFile: String
    public let logs = LogCapture()

    /// `notify: false` leaves fake-apple without --notify-url (Apple's consent-revoked lost).
    public init(clientIDs: [String] = [LocalApple.clientID], notify: Bool = true) throws {
        // The receiver starts first (Apple notifies it) with no keys; it is served Apple's once they exist.
        receiver = try ReceiverHarness(
            keys: .served(Data(#"{"keys":[]}"#.utf8)), audience: LocalApple.clientID,
            cooldown: .milliseconds(50), poolSize: 2, waitForKeys: false)
        apple = try LocalApple(notifyURL: notify ? receiver.notificationURL : nil)
        receiver.jwks?.setBody(try Data(contentsOf: apple.keysDirectory.appendingPathComponent("jwks.json")))
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

    /// The services under test connect as login roles of their group roles (TestSupport's
    /// `PostgresCluster.loginRole`): the sign-in API as a member of siwa_signin, the revoker of
    /// siwa_worker, so that the tests prove the grants suffice.
    public static let groups = ["signin_test_login": "siwa_signin", "worker_test_login": "siwa_worker"]

    /// The fixture's database as the login role `login` (a key of ``groups``) stands for.
    public func login(_ login: String) throws -> PostgresConfiguration {
        try Self.login(login, receiver.database)
    }

    public static func login(_ login: String, _ database: PostgresConfiguration) throws
        -> PostgresConfiguration
    {
        let cluster = try PostgresCluster.shared
        guard let group = groups[login] else { throw ExecutableError("no group role for \(login)") }
        return try PostgresConfiguration(
            "host=\(cluster.socketDirectory) port=\(cluster.port) dbname=\(database.database ?? "") "
                + "user=\(cluster.loginRole(memberOf: group))")
    }

    public var url: String { "http://127.0.0.1:\(service.port ?? 0)" }

    /// POSTs `object` as JSON to `path` with the bearer token (or `authorization`).
    public func post(
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
    public func signInBody(
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

    public func query(_ sql: String, _ parameters: [PostgresData?] = []) throws -> PostgresRows {
        try receiver.query(sql, parameters)
    }

    public func count(_ sql: String, _ parameters: [PostgresData?] = []) throws -> Int {
        try query(sql, parameters)[0][0, as: Int.self]
    }
}
