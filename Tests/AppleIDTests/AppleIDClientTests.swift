import AppleID
import AppleNotifications
import Foundation
import Postgres
import ServiceSupport
import TestSupport
import Testing

@Suite("AppleIDClient against siwactl fake-apple")
struct AppleIDClientTests {
    @Test("exchanges a code for tokens; the id_token verifies with openssl and carries the user and nonce")
    func exchange() throws {
        let apple = try LocalApple()
        let nonce = "5f2b5cd2d4c8a07f3b9fd3a1f6d2e0c1"
        let sign = try apple.authorize(sub: "001.alice", email: "a@privaterelay.appleid.com", nonce: nonce)
        let signInClaims = try #require(try apple.verifiedClaims(sign.idToken))
        #expect(signInClaims["nonce"] as? String == nonce)

        let tokens = try apple.client().exchange(code: sign.code)
        #expect(tokens.tokenType == "Bearer")
        #expect(tokens.expiresIn == 3600)
        let refresh = try #require(tokens.refreshToken)
        #expect(!refresh.isEmpty && !tokens.accessToken.isEmpty)
        let claims = try #require(try apple.verifiedClaims(tokens.idToken))
        #expect(claims["iss"] as? String == "https://appleid.apple.com")
        #expect(claims["aud"] as? String == LocalApple.clientID)
        #expect(claims["sub"] as? String == "001.alice")
        #expect(claims["email"] as? String == "a@privaterelay.appleid.com")
        #expect(claims["is_private_email"] as? Bool == true)
        #expect(claims["email_verified"] as? Bool == true)
        #expect(claims["nonce"] as? String == nonce)
        #expect(claims["nonce_supported"] as? Bool == true)
        #expect(claims["real_user_status"] as? Int == 2)
        let iat = try #require(claims["iat"] as? Int)
        #expect(try #require(claims["exp"] as? Int) > iat)
        #expect(claims["auth_time"] is Int)

        // A tampered token does not verify: the openssl check above can fail.
        #expect(try apple.verifiedClaims(tokens.idToken.dropLast(2) + "AA") == nil)
    }

    @Test("an authorization code works once; the replay is invalid_grant and not retryable")
    func replayedCode() throws {
        let apple = try LocalApple()
        let client = try apple.client()
        let code = try apple.authorize(sub: "001.replay").code
        _ = try client.exchange(code: code)
        let error = try #require(appleError { _ = try client.exchange(code: code) })
        #expect(error.code == .invalidGrant)
        #expect(error.status == 400)
        #expect(error.appleError == "invalid_grant")
        #expect(!error.isRetryable)
        #expect(!error.description.contains(code))
        #expect(apple.log.contains("code already used"))
    }

    @Test("a code older than its lifetime is invalid_grant")
    func expiredCode() throws {
        let apple = try LocalApple(codeLifetime: 0.2)
        let code = try apple.authorize(sub: "001.late").code
        Thread.sleep(forTimeInterval: 0.5)  // the condition is time itself passing
        #expect(appleError { _ = try apple.client().exchange(code: code) }?.code == .invalidGrant)
        #expect(apple.log.contains("code expired"))
    }

    @Test("a code issued to another client ID is invalid_grant")
    func otherClient() throws {
        let apple = try LocalApple()
        let code = try apple.authorize(sub: "001.web", clientID: LocalApple.otherClientID).code
        #expect(appleError { _ = try apple.client().exchange(code: code) }?.code == .invalidGrant)
        // The right client gets it.
        let web = try apple.client(apple.provider(clientID: LocalApple.otherClientID))
        #expect(try web.exchange(code: code).refreshToken != nil)
    }

    @Test("a web sign-in's code needs its redirect_uri again; a wrong one does not consume it")
    func redirectURI() throws {
        let apple = try LocalApple()
        let client = try apple.client()
        let code = try apple.authorize(sub: "001.web", redirectURI: "https://example.com/callback").code
        #expect(appleError { _ = try client.exchange(code: code) }?.code == .invalidGrant)
        #expect(
            appleError { _ = try client.exchange(code: code, redirectURI: "https://evil.example/cb") }?.code
                == .invalidGrant)
        #expect(
            try client.exchange(code: code, redirectURI: "https://example.com/callback").refreshToken != nil)
    }

    @Test("refresh works until revoked; revoking sends consent-revoked that a receiver verifies and stores")
    func refreshAndRevoke() throws {
        // The receiver trusts the fake's own /auth/keys, and the fake notifies the receiver.
        // The receiver starts first (Apple notifies it) with no keys; it is served Apple's once they exist.
        let receiver = try ReceiverHarness(
            keys: .served(Data(#"{"keys":[]}"#.utf8)), audience: LocalApple.clientID,
            cooldown: .milliseconds(50), poolSize: 2, waitForKeys: false)
        let notifying = try LocalApple(notifyURL: receiver.notificationURL)
        receiver.jwks?.setBody(
            try Data(contentsOf: notifying.keysDirectory.appendingPathComponent("jwks.json")))
        let client = try notifying.client()
        let tokens = try client.exchange(
            code: notifying.authorize(sub: "001.revoked", email: "r@example.com").code)
        let refresh = try #require(tokens.refreshToken)
        let refreshed = try client.refresh(token: refresh)
        #expect(refreshed.refreshToken == nil)  // as Apple: no new refresh token on a refresh
        #expect(try notifying.verifiedClaims(refreshed.idToken)?["sub"] as? String == "001.revoked")

        // Junk is answered 200 (as Apple does) and sends nothing.
        try client.revoke(token: "not-a-token")
        try client.revoke(token: refresh)
        #expect(appleError { _ = try client.refresh(token: refresh) }?.code == .invalidGrant)
        #expect(appleError { _ = try client.refresh(token: tokens.accessToken) }?.code == .invalidGrant)
        // Revoking again is still 200, and sends no second notification.
        try client.revoke(token: refresh, hint: .refreshToken)

        #expect(
            waitUntil(timeout: .seconds(20)) {
                (try? receiver.query(
                    "SELECT count(*) FROM siwa.event_history WHERE sub = $1 AND event_type = 'consent-revoked'",
                    [.text("001.revoked")])[0][0, as: Int.self]) == 1
            })
        // The local Apple logs the receiver's answer after the receiver has stored the notification.
        #expect(waitUntil(timeout: .seconds(20)) { notifying.log.contains("→ 200") })
        #expect(notifying.log.contains("consent-revoked jti="))
        #expect(
            try receiver.query("SELECT count(*) FROM siwa.notifications")[0][0, as: Int.self] == 1)
    }

    @Test("revoking an access token revokes the consent too")
    func revokeAccessToken() throws {
        let apple = try LocalApple()
        let client = try apple.client()
        let tokens = try client.exchange(code: apple.authorize(sub: "001.access").code)
        try client.revoke(token: tokens.accessToken, hint: .accessToken)
        #expect(appleError { _ = try client.refresh(token: tokens.refreshToken!) }?.code == .invalidGrant)
        #expect(apple.log.contains("no --notify-url"))
    }

    @Test(
        "a client secret Apple would refuse is invalid_client",
        arguments: ["team", "kid", "foreign key", "unknown client", "expired", "too long"])
    func invalidClient(flaw: String) throws {
        let apple = try LocalApple()
        let code = try apple.authorize(sub: "001.client").code
        let otherKey = apple.directory.appendingPathComponent("other.p8")
        try openssl([
            "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", otherKey.path,
        ])
        let teamKey = try String(contentsOf: apple.teamKeyFile, encoding: .utf8)
        let provider: ClientSecretProvider
        switch flaw {
        case "team": provider = try apple.provider(teamID: "OTHERTEAM1")
        case "kid": provider = try apple.provider(keyID: "OTHERKEY12")
        case "foreign key":
            provider = try apple.provider(signingKey: String(contentsOf: otherKey, encoding: .utf8))
        case "unknown client": provider = try apple.provider(clientID: "com.example.unknown")
        case "expired":
            let token = try ClientSecretSigner(privateKeyPEM: teamKey).sign(
                teamID: LocalApple.teamID, keyID: LocalApple.keyID, clientID: LocalApple.clientID,
                issuedAt: Date().addingTimeInterval(-7200), lifetime: 3600)
            provider = ClientSecretProvider(try .fixed(token))
        default:
            // Longer than Apple's six months: made by hand, as the signer refuses to.
            let now = Int(Date().timeIntervalSince1970)
            let header = Base64URL.encode(Data(#"{"alg":"ES256","kid":"KEY1234567"}"#.utf8))
            let claims = Base64URL.encode(
                Data(
                    #"{"aud":"https://appleid.apple.com","exp":\#(now + 15_777_001),"iat":\#(now),"iss":"TEAM123456","sub":"com.example.app"}"#
                        .utf8))
            provider = ClientSecretProvider(
                try .fixed(try es256(header + "." + claims, key: apple.teamKeyFile)))
        }
        let client = try apple.client(provider)
        let error = try #require(appleError { _ = try client.exchange(code: code) })
        #expect(error.code == .invalidClient)
        #expect(!error.isRetryable)
        #expect(appleError { try client.revoke(token: "x") }?.code == .invalidClient)
        // The code was not consumed by the refused calls.
        #expect(try apple.client().exchange(code: code).refreshToken != nil)
    }

    @Test("accepts a client secret signed by the openssl CLI, and checks its claims as Apple does")
    func opensslSecret() throws {
        let apple = try LocalApple()
        let now = Int(Date().timeIntervalSince1970)
        let header = Base64URL.encode(Data(#"{"alg":"ES256","kid":"KEY1234567"}"#.utf8))
        let claims = Base64URL.encode(
            Data(
                #"{"aud":"https://appleid.apple.com","exp":\#(now + 3600),"iat":\#(now),"iss":"TEAM123456","sub":"com.example.app"}"#
                    .utf8))
        let secret = try es256(header + "." + claims, key: apple.teamKeyFile)
        let client = try apple.client(ClientSecretProvider(try .fixed(secret)))
        #expect(try client.exchange(code: apple.authorize(sub: "001.openssl").code).refreshToken != nil)
    }

    @Test("Apple answering 503 then 200: a retryable server_error, then success")
    func serverErrorThenSuccess() throws {
        let apple = try LocalApple()
        let client = try apple.client()
        let tokens = try client.exchange(code: apple.authorize(sub: "001.flaky").code)
        try apple.fault(["--fail-with", "503", "--times", "1", "--endpoint", "revoke"])
        let error = try #require(appleError { try client.revoke(token: tokens.refreshToken!) })
        #expect(error.code == .serverError)
        #expect(error.status == 503)
        #expect(error.isRetryable)
        try client.revoke(token: tokens.refreshToken!)
        #expect(appleError { _ = try client.refresh(token: tokens.refreshToken!) }?.code == .invalidGrant)
    }

    @Test(
        "failures on demand map to typed errors",
        arguments: [
            ("invalid_grant", AppleIDError.Code.invalidGrant), ("invalid_client", .invalidClient),
            ("invalid_request", .invalidRequest), ("unsupported_grant_type", .unsupportedGrantType),
            ("unauthorized_client", .unauthorizedClient), ("429", .rateLimited), ("500", .serverError),
        ])
    func faults(failWith: String, code: AppleIDError.Code) throws {
        let apple = try LocalApple()
        try apple.fault(["--fail-with", failWith, "--endpoint", "token"])
        #expect(appleError { _ = try apple.client().refresh(token: "r") }?.code == code)
        try apple.fault([])  // cleared
        #expect(appleError { _ = try apple.client().refresh(token: "r") }?.code == .invalidGrant)
    }

    @Test("a slow answer ends at the call's deadline with a retryable timeout")
    func deadline() throws {
        let apple = try LocalApple()
        try apple.fault(["--delay-ms", "3000", "--times", "1"])
        let started = ContinuousClock.now
        let error = try #require(
            appleError { _ = try apple.client().refresh(token: "r", timeout: .milliseconds(300)) })
        #expect(error.code == .timeout)
        #expect(error.isRetryable)
        #expect(ContinuousClock.now - started < .seconds(2))
    }

    @Test("errors and token answers never show tokens, codes or the client secret")
    func noSecretsInTexts() throws {
        let apple = try LocalApple()
        let provider = try apple.provider()
        let client = try apple.client(provider)
        let code = try apple.authorize(sub: "001.quiet").code
        let tokens = try client.exchange(code: code)
        let secret = try provider.current()
        var texts = [String(describing: tokens), String(reflecting: tokens)]
        var dumped = ""
        dump(tokens, to: &dumped)
        texts.append(dumped)
        for call: () throws -> Void in [
            { _ = try client.exchange(code: code) }, { _ = try client.refresh(token: tokens.accessToken) },
        ] {
            let error = try #require(appleError(call))
            texts += [error.description, String(reflecting: error)]
        }
        for text in texts {
            for secretText in [code, tokens.accessToken, tokens.refreshToken!, tokens.idToken, secret] {
                #expect(!text.contains(secretText))
            }
        }
    }

    @Test("refuses a base URL that is plain http to a non-loopback host")
    func httpsOnly() throws {
        let provider = ClientSecretProvider(
            try .mint(
                signer: ClientSecretSigner(privateKeyPEM: p256Key()), teamID: "T", keyID: "K", clientID: "C"))
        for url in ["http://appleid.apple.com", "ftp://127.0.0.1", "http://127.attacker.example"] {
            #expect(
                appleError {
                    _ = try AppleIDClient(configuration: .init(baseURL: url), clientSecret: provider)
                }?
                .code == .configuration)
        }
        #expect(throws: Never.self) {
            _ = try AppleIDClient(configuration: .init(), clientSecret: provider)
        }
    }
}

/// A fresh P-256 key made by the openssl CLI, as PEM.
func p256Key() throws -> String {
    try openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]).standardOutput
}
