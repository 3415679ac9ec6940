import Foundation
import Postgres
import TestSupport
import Testing

@Suite("The whole loop with the executables: siwa-receiver's sign-in API, siwa-worker's revoker, fake-apple")
struct SignInProcessTests {
    @Test(
        "sign-in, deletion → revocation → echoed consent-revoked → applied, ledger complete; the expiry gauge is served"
    )
    func wholeLoop() throws {
        let database = try PostgresCluster.shared.createSchemaDatabase()
        let cluster = try PostgresCluster.shared
        let databaseURL = cluster.url(database: database.database ?? "")
        // Each credential of its own: the receiver's login is in siwa_receiver only, the sign-in API's in
        // siwa_signin only.
        func loginURL(_ group: String) throws -> String {
            "postgresql://\(try cluster.loginRole(memberOf: group))@/\(database.database ?? "")"
                + "?host=\(cluster.socketDirectory)&port=\(cluster.port)"
        }
        let receiverURL = try loginURL("siwa_receiver")
        let signInURL = try loginURL("siwa_signin")
        // Apple notifies the receiver, which is started with Apple's address: through a relay told the
        // receiver's address once it is bound.
        let relay = try ForwardingHTTPServer()
        let apple = try LocalApple(notifyURL: relay.url("/apple/notifications"))
        let addresses = ListenAddresses()
        defer { addresses.remove() }
        let directory = apple.directory
        let keyFile = try writeKeyFile([("k1", randomKey())], in: directory)
        let tokenFile = directory.appendingPathComponent("bearer").path
        FileManager.default.createFile(
            atPath: tokenFile, contents: Data((SignInCredentials.bearer + "\n").utf8),
            attributes: [.posixPermissions: 0o644])
        // A token file others can read is refused, with the reason and without the token.
        let refused = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwa-receiver"),
            arguments: [
                "--database-url", databaseURL, "--audience", LocalApple.clientID, "--signin-listen",
                "127.0.0.1:0",
                "--signin-token-file", tokenFile, "--token-key-file", keyFile,
            ], environment: [:], input: nil, timeout: .seconds(30))
        #expect(refused.status == 2)
        #expect(
            refused.standardError.contains("owner only")
                && !refused.standardError.contains(SignInCredentials.bearer))
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: tokenFile)
        // The sign-in API needs a credential of its own.
        let noCredential = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwa-receiver"),
            arguments: [
                "--database-url", receiverURL, "--audience", LocalApple.clientID, "--signin-listen",
                "127.0.0.1:0", "--signin-token-file", tokenFile, "--token-key-file", keyFile,
            ], environment: [:], input: nil, timeout: .seconds(30))
        #expect(noCredential.status == 2)
        #expect(noCredential.standardError.contains("--signin-database-url"), "\(noCredential.standardError)")
        let clean = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }
        // The receiver configured through the SIWA_* twins.
        let receiverEnvironment = clean.merging(
            [
                "SIWA_DATABASE_URL": receiverURL, "SIWA_SIGNIN_DATABASE_URL": signInURL,
                "SIWA_LISTEN": "127.0.0.1:0", "SIWA_LISTEN_ADDRESS_FILE": addresses.url.path,
                "SIWA_AUDIENCES": LocalApple.clientID, "SIWA_JWKS_URL": apple.baseURL + "/auth/keys",
                "SIWA_SIGNIN_LISTEN": "127.0.0.1:0", "SIWA_SIGNIN_TOKEN_FILE": tokenFile,
                "SIWA_TOKEN_KEY_FILE": keyFile, "SIWA_APPLE_TEAM_ID": LocalApple.teamID,
                "SIWA_APPLE_KEY_ID": LocalApple.keyID, "SIWA_APPLE_KEY_FILE": apple.teamKeyFile.path,
                "SIWA_APPLE_URL": apple.baseURL,
            ], uniquingKeysWith: { $1 })
        let receiverLog = directory.appendingPathComponent("receiver.log").path
        let receiver = try Subprocess(
            ExecutableLocator.url(named: "siwa-receiver").path, [], environment: receiverEnvironment,
            standardOutput: receiverLog, standardError: receiverLog)
        defer {
            receiver.send(SIGTERM)
            _ = receiver.wait(timeout: .seconds(20))
        }
        // Both listeners, each under its name.
        let listeners = try addresses.wait(for: receiver) {
            (try? String(contentsOfFile: receiverLog, encoding: .utf8)) ?? ""
        }
        #expect(Set(listeners.keys) == ["notifications", "signin"], "\(listeners)")
        let receiverBase = try "http://" + ListenAddresses.address("notifications", in: listeners)
        let signIn = try "http://" + ListenAddresses.address("signin", in: listeners)
        #expect(
            ((try? String(contentsOfFile: receiverLog, encoding: .utf8)) ?? "").contains(
                #""address":"\#(signIn.dropFirst("http://".count))""#))
        relay.forward(to: receiverBase)
        #expect(
            waitUntil(timeout: .seconds(30)) {
                (try? TestHTTPClient.get(receiverBase + "/readyz").status) == 200
                    && (try? TestHTTPClient.get(signIn + "/v1/sign-ins").status) == 401
            }, "\((try? String(contentsOfFile: receiverLog, encoding: .utf8)) ?? "")")
        let metrics = try TestHTTPClient.get(receiverBase + "/metrics").text
        let gauge = try #require(
            metrics.split(separator: "\n").first { $0.hasPrefix("siwa_apple_client_secret_expiry_seconds ") })
        #expect(Double(gauge.split(separator: " ")[1]) ?? 0 > 3600)
        // The readiness probe's call without a bearer token was refused, and counted on /metrics.
        #expect(
            metrics.contains(
                #"siwa_signin_responses_total{endpoint="sign-ins",status="401",error="unauthorized"}"#),
            "\(metrics)")

        // Sign in through the API.
        let nonce = Nonce()
        let authorization = try apple.authorize(sub: "001.loop", email: "l@example.com", nonce: nonce.hashed)
        let body = try JSONSerialization.data(withJSONObject: [
            "authorization_code": authorization.code, "id_token": authorization.idToken, "nonce": nonce.raw,
            "client_id": LocalApple.clientID,
        ])
        let headers = [
            ("Authorization", "Bearer \(SignInCredentials.bearer)"), ("Content-Type", "application/json"),
        ]
        let answer = try TestHTTPClient.post(signIn + "/v1/sign-ins", body: body, headers: headers)
        #expect(answer.status == 200, "\(answer.text)")
        #expect(answer.text.contains("001.loop"))

        // The worker, with the revoker configured by flags.
        let workerLog = directory.appendingPathComponent("worker.log").path
        let worker = try Subprocess(
            ExecutableLocator.url(named: "siwa-worker").path,
            [
                "--database-url", databaseURL, "--poll-interval", "0.2", "--apple-key-file",
                apple.teamKeyFile.path,
                "--apple-team-id", LocalApple.teamID, "--apple-key-id", LocalApple.keyID, "--client-id",
                LocalApple.clientID, "--token-key-file", keyFile, "--apple-url", apple.baseURL,
                "--revocation-poll-interval", "0.2", "--jwks-url", apple.baseURL + "/auth/keys",
            ], environment: clean, standardOutput: workerLog, standardError: workerLog)
        defer {
            worker.send(SIGTERM)
            _ = worker.wait(timeout: .seconds(20))
        }
        // The app deletes the account and requests the revocation in one transaction.
        let connection = try PostgresConnection(configuration: database)
        defer { connection.close() }
        let id = try connection.transaction { connection in
            try connection.execute("UPDATE siwa.sessions SET revoked_at = now() WHERE sub = '001.loop'")
            return try connection.query("SELECT siwa.request_revocation('001.loop', 'deleted in app')")[0][
                0, as: Int.self]
        }
        let complete = waitUntil(timeout: .seconds(30)) {
            let row = try? connection.query(
                "SELECT state, echo_jti FROM siwa.revocation_ledger WHERE id = $1", [.int(Int64(id))]
            ).first
            return (try? row?[0, as: String.self]) == "revoked" && (try? row?[1, as: String?.self]) != nil
        }
        #expect(
            complete,
            "worker: \((try? String(contentsOfFile: workerLog, encoding: .utf8)) ?? "")\napple: \(apple.log)")
        #expect(
            try connection.query(
                "SELECT count(*) FROM siwa.refresh_tokens WHERE sub = '001.loop' AND token_ciphertext IS NOT NULL"
            )[0][0, as: Int.self] == 0)
        #expect(
            try connection.query(
                "SELECT state FROM siwa.event_history WHERE sub = '001.loop' AND event_type = 'consent-revoked'"
            )[0][0, as: String.self] == "applied")
        // No secret reached either log.
        let logs =
            ((try? String(contentsOfFile: receiverLog, encoding: .utf8)) ?? "")
            + ((try? String(contentsOfFile: workerLog, encoding: .utf8)) ?? "")
        #expect(
            !logs.contains(authorization.code) && !logs.contains("l@example.com")
                && !logs.contains(SignInCredentials.bearer))
    }

    @Test(
        "the plain-HTTP sign-in API refuses a non-loopback listen address unless TLS terminates in front",
        arguments: ["0.0.0.0:0", "[::]:0", ":0", "192.0.2.10:0", "example.com:0"])
    func nonLoopbackRefused(listen: String) throws {
        let database = try PostgresCluster.shared.createSchemaDatabase()
        let cluster = try PostgresCluster.shared
        let apple = try LocalApple()
        let keyFile = try writeKeyFile([("k1", randomKey())], in: apple.directory)
        let tokenFile = apple.directory.appendingPathComponent("bearer").path
        FileManager.default.createFile(
            atPath: tokenFile, contents: Data(SignInCredentials.bearer.utf8),
            attributes: [.posixPermissions: 0o600])
        let url = cluster.url(database: database.database ?? "")
        let refused = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwa-receiver"),
            arguments: [
                "--database-url", url, "--signin-database-url", url, "--listen", "127.0.0.1:0",
                "--audience", LocalApple.clientID, "--jwks-url", apple.baseURL + "/auth/keys",
                "--signin-listen", listen, "--signin-token-file", tokenFile, "--token-key-file", keyFile,
                "--apple-team-id", LocalApple.teamID, "--apple-key-id", LocalApple.keyID,
                "--apple-key-file", apple.teamKeyFile.path, "--apple-url", apple.baseURL,
            ], environment: [:], input: nil, timeout: .seconds(30))
        #expect(refused.status == 2, "\(refused.standardError)")
        #expect(
            refused.standardError.contains("plain HTTP")
                && refused.standardError.contains("--signin-tls-terminated-in-front"),
            "\(refused.standardError)")
    }
}
