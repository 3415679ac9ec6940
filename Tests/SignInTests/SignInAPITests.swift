import AppleID
import AppleNotifications
import Foundation
import Postgres
import SignIn
import TestSupport
import Testing
import TokenVault

@Suite("The sign-in API against siwactl fake-apple and PostgreSQL")
struct SignInAPITests {
    @Test("a sign-in answers the identity, stores the refresh token encrypted, and records the account")
    func happyPath() throws {
        let fixture = try SignInFixture()
        let body = try fixture.signInBody(sub: "001.happy", email: "h@privaterelay.appleid.com")
        let answer = try fixture.post("/v1/sign-ins", body)
        #expect(answer.status == 200)
        #expect(answer.json["sub"] as? String == "001.happy")
        #expect(answer.json["email"] as? String == "h@privaterelay.appleid.com")
        #expect(answer.json["is_private_email"] as? Bool == true)
        #expect(answer.json["email_verified"] as? Bool == true)
        #expect(answer.json["real_user_status"] as? Int == 2)
        #expect(answer.json["client_id"] as? String == LocalApple.clientID)
        for secret in ["refresh_token", "access_token", "id_token"] { #expect(answer.json[secret] == nil) }
        #expect(!answer.text.contains(body["authorization_code"] as! String))

        let row = try #require(
            try fixture.query(
                "SELECT client_id, token_ciphertext, token_sha256 FROM siwa.refresh_tokens WHERE sub = $1",
                [.text("001.happy")]
            ).first)
        #expect(try row[0, as: String.self] == LocalApple.clientID)
        let ciphertext = [UInt8](try row[1, as: Data.self])
        #expect(TokenCipher.keyID(of: ciphertext) == "k1")
        let token = try fixture.cipher.decrypt(
            ciphertext,
            for: TokenCipher.Row(
                clientID: LocalApple.clientID, tokenSHA256: [UInt8](try row[2, as: Data.self])))
        // The ciphertext is not the token, nor contains it; the stored token is the real one (Apple refreshes it).
        #expect(!String(decoding: ciphertext, as: UTF8.self).contains(token))
        #expect(try fixture.apple.client().refresh(token: token).refreshToken == nil)
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.accounts WHERE sub = $1 AND email = $2 AND is_private_email",
                [.text("001.happy"), .text("h@privaterelay.appleid.com")]) == 1)
        #expect(
            try fixture.count(
                "SELECT count(*) FROM siwa.sign_ins WHERE sub = $1 AND real_user_status = 2",
                [.text("001.happy")]) == 1)
        // Neither the code, the tokens nor the email reach the log.
        let log = fixture.logs.all
        #expect(
            !log.contains(token) && !log.contains("h@privaterelay")
                && !log.contains(body["authorization_code"] as! String))
    }

    @Test("a retried code gets the same identity without a second exchange")
    func replayedCode() throws {
        let fixture = try SignInFixture()
        let body = try fixture.signInBody(sub: "001.retry")
        let first = try fixture.post("/v1/sign-ins", body)
        let second = try fixture.post("/v1/sign-ins", body)
        #expect(first.status == 200 && second.status == 200)
        #expect(NSDictionary(dictionary: first.json) == NSDictionary(dictionary: second.json))
        // Apple saw one exchange.
        #expect(waitUntil { fixture.apple.log.components(separatedBy: "POST /auth/token").count - 1 >= 1 })
        #expect(fixture.apple.log.components(separatedBy: "POST /auth/token").count - 1 == 1)
        #expect(!fixture.apple.log.contains("code already used"))
        #expect(try fixture.count("SELECT count(*) FROM siwa.refresh_tokens WHERE sub = '001.retry'") == 1)
        #expect(try fixture.count("SELECT sign_in_count FROM siwa.sign_ins WHERE sub = '001.retry'") == 1)
    }

    @Test("a concurrent retry while Apple is slow gets 409, and the code is exchanged once")
    func concurrentRetry() throws {
        let fixture = try SignInFixture()
        let body = try fixture.signInBody(sub: "001.concurrent")
        try fixture.apple.fault(["--delay-ms", "1500", "--times", "1", "--endpoint", "token"])
        let data = try JSONSerialization.data(withJSONObject: body)
        let url = fixture.url + "/v1/sign-ins"
        let slow = Thread.detachNewThreadWithResult { () -> Int in
            (try? TestHTTPClient.post(
                url, body: data, headers: [("Authorization", "Bearer \(SignInFixture.bearer)")]))?
                .status ?? -1
        }
        #expect(
            waitUntil {
                (try? fixture.count("SELECT count(*) FROM siwa.sign_in_codes WHERE state = 'exchanging'"))
                    == 1
            })
        let concurrent = try fixture.post("/v1/sign-ins", body)
        #expect(concurrent.status == 409)
        #expect(concurrent.json["error"] as? String == "exchange_in_progress")
        #expect(slow.wait() == 200)
        #expect(try fixture.post("/v1/sign-ins", body).status == 200)
        #expect(
            try fixture.count("SELECT count(*) FROM siwa.refresh_tokens WHERE sub = '001.concurrent'") == 1)
    }

    @Test(
        "bad input gets a clear 4xx and changes nothing",
        arguments: [
            "wrong nonce", "wrong audience", "unknown client", "tampered id_token", "no code", "not json",
        ])
    func badInput(flaw: String) throws {
        let fixture = try SignInFixture()
        var body = try fixture.signInBody(sub: "001.bad")
        var expected = ""
        switch flaw {
        case "wrong nonce":
            body["nonce"] = "another-raw-nonce"
            expected = "nonce_mismatch"
        case "wrong audience":
            // An id_token issued to the web client, sent as the app's.
            body = try fixture.signInBody(sub: "001.bad", clientID: LocalApple.otherClientID)
            body["client_id"] = LocalApple.clientID
            expected = "id_token_wrong_audience"
        case "unknown client":
            body = try fixture.signInBody(sub: "001.bad", clientID: LocalApple.otherClientID)
            expected = "client_id_unknown"
        case "tampered id_token":
            body["id_token"] = String((body["id_token"] as! String).dropLast(4)) + "AAAA"
            expected = "id_token_bad_signature"
        case "no code":
            body["authorization_code"] = nil
            expected = "authorization_code_missing"
        default:
            expected = "body_is_not_a_json_object"
        }
        let answer: (status: Int, json: [String: Any], text: String)
        if flaw == "not json" {
            let response = try TestHTTPClient.post(
                fixture.url + "/v1/sign-ins", body: Array("[1,2]".utf8),
                headers: [("Authorization", "Bearer \(SignInFixture.bearer)")])
            answer = (
                response.status,
                (try? JSONSerialization.jsonObject(with: response.data) as? [String: Any]) ?? [:],
                response.text
            )
        } else {
            answer = try fixture.post("/v1/sign-ins", body)
        }
        #expect(answer.status == 400)
        #expect(answer.json["error"] as? String == expected)
        for table in ["sign_in_codes", "sign_ins", "refresh_tokens", "accounts"] {
            #expect(try fixture.count("SELECT count(*) FROM siwa.\(table)") == 0)
        }
        #expect(!fixture.apple.log.contains("POST /auth/token"))  // never reached Apple
    }

    @Test(
        "a missing or wrong bearer token is 401 and changes nothing",
        arguments: [nil, "Bearer wrong", "Basic x"])
    func unauthorized(authorization: String?) throws {
        let fixture = try SignInFixture()
        let body = try fixture.signInBody(sub: "001.unauth")
        let answer = try fixture.post("/v1/sign-ins", body, authorization: authorization)
        #expect(answer.status == 401)
        #expect(answer.json["error"] as? String == "unauthorized")
        let revocation = try fixture.post(
            "/v1/revocations", ["sub": "001.unauth", "reason": "x"], authorization: authorization)
        #expect(revocation.status == 401)
        #expect(try fixture.count("SELECT count(*) FROM siwa.sign_in_codes") == 0)
        #expect(try fixture.count("SELECT count(*) FROM siwa.revocation_requests") == 0)
    }

    @Test("Apple's invalid_grant is 400 and a 5xx is 503; both store nothing, and a retry may succeed")
    func appleFailures() throws {
        let fixture = try SignInFixture()
        let body = try fixture.signInBody(sub: "001.flaky")
        try fixture.apple.fault(["--fail-with", "invalid_grant", "--times", "1", "--endpoint", "token"])
        let refused = try fixture.post("/v1/sign-ins", body)
        #expect(refused.status == 400)
        #expect(refused.json["error"] as? String == "invalid_grant")
        try fixture.apple.fault(["--fail-with", "503", "--times", "1", "--endpoint", "token"])
        let unavailable = try fixture.post("/v1/sign-ins", body)
        #expect(unavailable.status == 503)
        #expect(unavailable.json["error"] as? String == "apple_server_error")
        #expect(try fixture.count("SELECT count(*) FROM siwa.sign_in_codes") == 0)
        #expect(try fixture.count("SELECT count(*) FROM siwa.refresh_tokens") == 0)
        #expect(try fixture.post("/v1/sign-ins", body).status == 200)
        // A code Apple already spent (used elsewhere) is invalid_grant from Apple itself.
        let spent = try fixture.signInBody(sub: "001.spent")
        _ = try fixture.apple.client().exchange(code: spent["authorization_code"] as! String)
        let replay = try fixture.post("/v1/sign-ins", spent)
        #expect(replay.status == 400)
        #expect(replay.json["error"] as? String == "invalid_grant")
    }
}

extension Thread {
    /// Runs `body` on a new thread; `wait()` returns its result.
    static func detachNewThreadWithResult<T: Sendable>(_ body: @escaping @Sendable () -> T) -> ThreadResult<T>
    {
        let result = ThreadResult<T>()
        Thread.detachNewThread { result.set(body()) }
        return result
    }
}

final class ThreadResult<T: Sendable>: @unchecked Sendable {
    private let condition = NSCondition()
    private var value: T?
    private var done = false
    func set(_ value: T) {
        condition.lock()
        self.value = value
        done = true
        condition.broadcast()
        condition.unlock()
    }
    func wait() -> T? {
        condition.lock()
        defer { condition.unlock() }
        while !done { condition.wait() }
        return value
    }
}
