import AppleNotifications
import Foundation
import TestSupport
import Testing

@Suite("Verifier accepts what Apple sends")
struct VerifierAcceptanceTests {
    @Test(
        "accepts each documented event type",
        arguments: [EventType.emailDisabled, .emailEnabled, .consentRevoked, .accountDelete])
    func eachType(type: EventType) throws {
        let isEmail = type == .emailDisabled || type == .emailEnabled
        let claims = appleClaims(
            type: type.rawValue, email: isEmail ? "abc@privaterelay.appleid.com" : nil, jti: "jti-\(type)")
        let notification = try verify(appleToken(claims: claims))
        #expect(notification.eventType == type)
        #expect(notification.eventType.isKnown)
        #expect(notification.subject == "001234.abcdef.0001")
        #expect(notification.jti == "jti-\(type)")
        #expect(notification.audience == TestSigning.audience)
        #expect(notification.audiences == [TestSigning.audience])
        #expect(notification.issuedAt == fixedNow)
        #expect(notification.expiresAt == fixedNow.addingTimeInterval(86_400))
        #expect(notification.eventTime == fixedNow.addingTimeInterval(-5))
        if isEmail {
            #expect(notification.email == "abc@privaterelay.appleid.com")
            #expect(notification.isPrivateEmail == true)
        } else {
            #expect(notification.email == nil)
            #expect(notification.isPrivateEmail == nil)
        }
    }

    @Test("accepts events as an object, as Apple's documentation shows it")
    func eventsObject() throws {
        var claims = appleClaims()
        claims["events"] = ["type": "consent-revoked", "sub": "001.x", "event_time": 1_699_999_000]
        let notification = try verify(appleToken(claims: claims))
        #expect(notification.eventType == .consentRevoked)
        #expect(notification.subject == "001.x")
    }

    @Test("reads event_time in milliseconds as captured from real traffic")
    func eventTimeMilliseconds() throws {
        var claims = appleClaims()
        claims["events"] = #"{"type":"consent-revoked","sub":"001.x","event_time":1630085403648}"#
        let notification = try verify(appleToken(claims: claims))
        #expect(notification.eventTime == Date(timeIntervalSince1970: 1_630_085_403.648))
    }

    @Test("reads event_time in seconds as in Apple's documentation example")
    func eventTimeSeconds() throws {
        var claims = appleClaims()
        claims["events"] = #"{"type":"consent-revoked","sub":"001.x","event_time":1630085403}"#
        let notification = try verify(appleToken(claims: claims))
        #expect(notification.eventTime == Date(timeIntervalSince1970: 1_630_085_403))
    }

    @Test(
        "reads is_private_email as a string or a boolean",
        arguments: [
            (#""true""#, true), (#""false""#, false), ("true", true), ("false", false),
        ])
    func privateEmailForms(raw: String, expected: Bool) throws {
        var claims = appleClaims()
        claims["events"] =
            #"{"type":"email-enabled","sub":"001.x","event_time":1630085403648,"email":"a@b.example","is_private_email":\#(raw)}"#
        let notification = try verify(appleToken(claims: claims))
        #expect(notification.isPrivateEmail == expected)
        #expect(notification.email == "a@b.example")
    }

    @Test("normalises account-deleted to account-delete")
    func accountDeleted() throws {
        let notification = try verify(appleToken(claims: appleClaims(type: "account-deleted")))
        #expect(notification.eventType == .accountDelete)
        #expect(notification.eventType.rawValue == "account-delete")
    }

    @Test("accepts Apple's documentation example shape: object events, seconds, no exp, account-deleted")
    func documentationExample() throws {
        let claims: [String: Any] = [
            "iss": "https://appleid.apple.com", "aud": TestSigning.audience, "iat": 1_699_999_990,
            "jti": "doc-example",
            "events": [
                "type": "account-deleted", "sub": "820417.faa325acbc78e1be1668ba852d492d8a.0219",
                "event_time": 1_699_999_900,
            ],
        ]
        let notification = try verify(appleToken(claims: claims))
        #expect(notification.eventType == .accountDelete)
        #expect(notification.expiresAt == nil)
        #expect(notification.eventTime == Date(timeIntervalSince1970: 1_699_999_900))
    }

    @Test("accepts aud as an array and reports the configured client ID it matched")
    func audienceArray() throws {
        var claims = appleClaims()
        claims["aud"] = ["com.someone.else", TestSigning.audience]
        let notification = try verify(appleToken(claims: claims))
        #expect(notification.audience == TestSigning.audience)
        #expect(notification.audiences == ["com.someone.else", TestSigning.audience])
    }

    @Test("matches any of several configured client IDs")
    func severalAudiences() throws {
        let verifier = try NotificationVerifier(audiences: ["com.example.web", TestSigning.audience])
        let notification = try verifier.verify(
            token: appleToken(), keys: TestSigning.appleKeySet, now: fixedNow)
        #expect(notification.audience == TestSigning.audience)
    }

    @Test("keeps an unknown event type with its raw string instead of failing")
    func unknownType() throws {
        let notification = try verify(appleToken(claims: appleClaims(type: "account-frozen")))
        #expect(notification.eventType.rawValue == "account-frozen")
        #expect(!notification.eventType.isKnown)
    }

    @Test("accepts fractional NumericDates for iat and exp")
    func fractionalTimes() throws {
        var claims = appleClaims()
        claims["iat"] = 1_699_999_999.5
        claims["exp"] = 1_700_086_399.5
        let notification = try verify(appleToken(claims: claims))
        #expect(notification.issuedAt == Date(timeIntervalSince1970: 1_699_999_999.5))
    }

    @Test("tolerates 60 seconds of clock skew on iat and exp")
    func leeway() throws {
        var claims = appleClaims()
        claims["iat"] = 1_700_000_059
        claims["exp"] = 1_699_999_941
        _ = try verify(appleToken(claims: claims))
    }

    @Test("verifies through a key lookup closure")
    func closureLookup() throws {
        let jws = try CompactJWS(appleToken())
        var asked: [String] = []
        let notification = try TestSigning.verifier.verify(jws, now: fixedNow) {
            kid throws(NotificationError) in
            asked.append(kid)
            return TestSigning.apple.publicKey()
        }
        #expect(asked == [TestSigning.apple.keyID])
        #expect(notification.eventType == .consentRevoked)
    }

    @Test("encodes and decodes a notification losslessly")
    func codable() throws {
        let notification = try verify(appleToken(claims: appleClaims(type: "account-deleted")))
        let decoded = try JSONDecoder().decode(
            ServerNotification.self, from: JSONEncoder().encode(notification))
        #expect(decoded == notification)
    }

    @Test("signer tokens loaded back from PEM still verify")
    func pemRoundTrip() throws {
        let reloaded = try NotificationSigner(
            privateKeyPEM: TestSigning.apple.privateKeyPEM, keyID: "reloaded")
        #expect(TestSigning.apple.privateKeyPEM.hasPrefix("-----BEGIN PRIVATE KEY-----"))
        let token = try reloaded.sign(
            type: "consent-revoked", subject: "001.x", audience: TestSigning.audience, issuedAt: fixedNow)
        let notification = try verify(token, keys: TestSigning.apple.keySet().merging(id: "reloaded"))
        #expect(notification.subject == "001.x")
    }
}

extension JSONWebKeySet {
    /// The same keys, with the first one also published under `id`.
    fileprivate func merging(id: String) -> JSONWebKeySet {
        var keys: [String: RSAPublicKey] = [:]
        for kid in keyIDs { keys[kid] = key(id: kid) }
        keys[id] = key(id: keyIDs[0])
        return JSONWebKeySet(keys: keys)
    }
}

@Suite("Signer output and key handling")
struct SignerTests {
    @Test("signs in Apple's exact shape: kid-first header, exp = iat + 24 h, events as a JSON string")
    func appleShape() throws {
        let token = try TestSigning.apple.sign(
            type: "email-disabled", subject: "001.x", audience: "com.example.app",
            email: "a@privaterelay.appleid.com",
            eventTime: Date(timeIntervalSince1970: 1_630_085_403.648), issuedAt: fixedNow, jti: "j1")
        let jws = try CompactJWS(token)
        #expect(
            String(decoding: jws.header, as: UTF8.self)
                == #"{"kid":"\#(TestSigning.apple.keyID)","alg":"RS256"}"#)
        let claims = try #require(try JSONSerialization.jsonObject(with: jws.payload) as? [String: Any])
        #expect(Set(claims.keys) == ["iss", "aud", "iat", "exp", "jti", "events"])
        #expect(claims["aud"] as? String == "com.example.app")
        #expect((claims["exp"] as? Int) == (claims["iat"] as? Int).map { $0 + 86_400 })
        let events = try #require(claims["events"] as? String)
        let event = try #require(try JSONSerialization.jsonObject(with: Data(events.utf8)) as? [String: Any])
        #expect(event["event_time"] as? Int == 1_630_085_403_648)
        #expect(event["is_private_email"] as? String == "true")
        #expect(event["email"] as? String == "a@privaterelay.appleid.com")
    }

    @Test("omits email fields for events that have none")
    func noEmailFields() throws {
        let token = try TestSigning.apple.sign(type: "consent-revoked", subject: "001.x", audience: "a")
        let claims = try #require(
            try JSONSerialization.jsonObject(with: CompactJWS(token).payload) as? [String: Any])
        let events = try #require(claims["events"] as? String)
        #expect(!events.contains("email"))
    }

    @Test("derives a stable default kid from the public key, the same after a PEM round trip")
    func stableDefaultKid() throws {
        let signer = try NotificationSigner.generate()
        #expect(signer.keyID == signer.publicKey().thumbprintKeyID)
        #expect(signer.keyID.count == 16)
        let reloaded = try NotificationSigner(privateKeyPEM: signer.privateKeyPEM)
        #expect(reloaded.keyID == signer.keyID)
        #expect(reloaded.publicKey().modulus == signer.publicKey().modulus)
        #expect(signer.keyID != TestSigning.apple.publicKey().thumbprintKeyID)
    }

    @Test("refuses a PEM that is not a private key")
    func refusesBadPEM() throws {
        let publicPEM = try String(
            contentsOf: fixturesDirectory.appendingPathComponent("TEST-ONLY-rsa-2048-public-key.pem"),
            encoding: .utf8)
        #expect(throws: (any Error).self) { try NotificationSigner(privateKeyPEM: publicPEM, keyID: "x") }
        #expect(throws: (any Error).self) { try NotificationSigner(privateKeyPEM: "garbage", keyID: "x") }
        let encrypted = try String(
            contentsOf: fixturesDirectory.appendingPathComponent("TEST-ONLY-encrypted-private-key.pem"),
            encoding: .utf8)
        #expect(throws: (any Error).self) { try NotificationSigner(privateKeyPEM: encrypted, keyID: "x") }
    }

    @Test("one key verifies many tokens concurrently")
    func concurrentVerification() async throws {
        let tokens = (0..<64).map { index in appleToken(claims: appleClaims(jti: "c-\(index)")) }
        let keys = TestSigning.appleKeySet
        let jtis = try await withThrowingTaskGroup(of: String.self) { group in
            for token in tokens {
                group.addTask { try TestSigning.verifier.verify(token: token, keys: keys, now: fixedNow).jti }
            }
            var seen: Set<String> = []
            for try await jti in group { seen.insert(jti) }
            return seen
        }
        #expect(jtis.count == 64)
    }
}
