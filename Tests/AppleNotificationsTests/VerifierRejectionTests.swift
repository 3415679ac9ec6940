import AppleNotifications
import Foundation
import TestSupport
import Testing

@Suite("Verifier rejects what Apple would not send")
struct VerifierRejectionTests {
    @Test(
        "refuses every algorithm but RS256, even with a valid RS256 signature",
        arguments: ["none", "HS256", "ES256", "PS256", "RS384", "RS512", "rs256", "RS256 "])
    func algorithms(alg: String) {
        var header = appleHeader
        header["alg"] = alg
        let error = rejection(appleToken(header: header))
        #expect(error?.kind == .verificationFailed)
        #expect(error?.code == .algorithmNotAllowed)
    }

    @Test("refuses an unsigned alg=none token with an empty signature")
    func unsignedNone() {
        let token =
            Base64URL.encode(json(["alg": "none", "kid": TestSigning.apple.keyID])) + "."
            + Base64URL.encode(json(appleClaims())) + "."
        #expect(rejection(token)?.code == .algorithmNotAllowed)
    }

    @Test("refuses an HS256 token keyed with the RSA public key (algorithm confusion)")
    func hmacConfusion() {
        let token =
            Base64URL.encode(json(["alg": "HS256", "kid": TestSigning.apple.keyID])) + "."
            + Base64URL.encode(json(appleClaims())) + "." + Base64URL.encode(Data(repeating: 7, count: 32))
        let error = rejection(token)
        #expect(error?.kind == .verificationFailed)
        #expect(error?.code == .algorithmNotAllowed)
    }

    @Test("refuses a missing alg")
    func missingAlgorithm() {
        #expect(rejection(appleToken(header: ["kid": TestSigning.apple.keyID]))?.code == .algorithmNotAllowed)
    }

    @Test("refuses a missing kid")
    func missingKid() {
        let error = rejection(appleToken(header: ["alg": "RS256"]))
        #expect(error?.kind == .verificationFailed)
        #expect(error?.code == .missingKeyID)
    }

    @Test("refuses a crit header")
    func crit() {
        var header = appleHeader
        header["crit"] = ["exp"]
        let error = rejection(appleToken(header: header))
        #expect(error?.kind == .verificationFailed)
        #expect(error?.code == .criticalHeader)
    }

    @Test("ignores jku, x5u, x5c and jwk: the key is still chosen by kid from our set")
    func keyHintsIgnoredWhenKidIsOurs() throws {
        var header = appleHeader
        header["jku"] = "https://attacker.example/jwks.json"
        header["x5u"] = "https://attacker.example/cert.pem"
        header["x5c"] = ["MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA"]
        header["jwk"] = TestSigning.other.publicKey().jwk(keyID: TestSigning.apple.keyID)
        let notification = try verify(appleToken(header: header))
        #expect(notification.eventType == .consentRevoked)
    }

    @Test("refuses a token signed by an attacker key embedded in the jwk header")
    func embeddedAttackerKey() throws {
        var header = appleHeader
        header["jwk"] = TestSigning.other.publicKey().jwk(keyID: TestSigning.apple.keyID)
        header["jku"] = "https://attacker.example/jwks.json"
        let token = try TestSigning.other.sign(header: header, claims: appleClaims())
        let error = rejection(token)
        #expect(error?.kind == .verificationFailed)
        #expect(error?.code == .badSignature)
    }

    @Test("refuses a signature by another key that claims our kid")
    func otherKeySameKid() throws {
        let token = try TestSigning.other.sign(header: appleHeader, claims: appleClaims())
        let error = rejection(token)
        #expect(error?.kind == .verificationFailed)
        #expect(error?.code == .badSignature)
    }

    @Test("refuses a tampered payload (bad signature)")
    func badSignature() {
        let parts = appleToken().split(separator: ".").map(String.init)
        var claims = appleClaims()
        claims["aud"] = "com.attacker"
        let forged = parts[0] + "." + Base64URL.encode(json(claims)) + "." + parts[2]
        let error = rejection(forged)
        #expect(error?.kind == .verificationFailed)
        #expect(error?.code == .badSignature)
    }

    @Test("refuses a truncated signature")
    func truncatedSignature() {
        let parts = appleToken().split(separator: ".").map(String.init)
        let truncated = parts[0] + "." + parts[1] + "." + String(parts[2].prefix(40))
        #expect(rejection(truncated)?.code == .badSignature)
    }

    @Test("reports an unknown kid as key-not-available, which is retryable")
    func unknownKid() {
        let error = rejection(TestSigning.token(signer: TestSigning.other))
        #expect(error?.kind == .keyNotAvailable)
        #expect(error?.code == .unknownKeyID)
    }

    @Test("never parses claims of a token that fails the signature check")
    func claimsNotParsedBeforeSignature() throws {
        // Garbage claims, signed by the wrong key: the signature error wins over the JSON error.
        let token = try TestSigning.other.sign(
            headerJSON: json(appleHeader), claimsJSON: Data("not json".utf8))
        #expect(rejection(token)?.code == .badSignature)
    }

    @Test("refuses a wrong issuer", arguments: ["https://appleid.apple.com/", "https://evil.example", ""])
    func wrongIssuer(iss: String) {
        var claims = appleClaims()
        claims["iss"] = iss
        let error = rejection(appleToken(claims: claims))
        #expect(error?.kind == .verificationFailed)
        #expect(error?.code == .wrongIssuer)
    }

    @Test("refuses a missing issuer")
    func missingIssuer() {
        var claims = appleClaims()
        claims["iss"] = nil
        #expect(rejection(appleToken(claims: claims))?.code == .wrongIssuer)
    }

    @Test("refuses an audience that is not ours, as a string or an array")
    func wrongAudience() {
        for aud: Any in ["com.someone.else", ["com.a", "com.b"], [String]()] {
            var claims = appleClaims()
            claims["aud"] = aud
            let error = rejection(appleToken(claims: claims))
            #expect(error?.kind == .verificationFailed)
            #expect(error?.code == .wrongAudience)
        }
    }

    @Test("refuses to build a verifier without client IDs")
    func emptyAudienceSet() {
        #expect(throws: NotificationError.self) { try NotificationVerifier(audiences: []) }
        do {
            _ = try NotificationVerifier(audiences: [])
        } catch {
            #expect(error.code == .noAudiences)
        }
    }

    @Test("refuses iat more than 60 seconds in the future")
    func issuedInFuture() {
        var claims = appleClaims()
        claims["iat"] = 1_700_000_061
        let error = rejection(appleToken(claims: claims))
        #expect(error?.kind == .verificationFailed)
        #expect(error?.code == .issuedInFuture)
    }

    @Test("refuses exp more than 60 seconds in the past")
    func expired() {
        var claims = appleClaims()
        claims["exp"] = 1_699_999_940
        let error = rejection(appleToken(claims: claims))
        #expect(error?.kind == .verificationFailed)
        #expect(error?.code == .expired)
    }

    @Test("refuses a token a day old, verified as of now, but accepts it as of its time")
    func oldToken() throws {
        let token = appleToken()
        #expect(rejection(token, now: fixedNow.addingTimeInterval(2 * 86_400))?.code == .expired)
        _ = try verify(token, now: fixedNow.addingTimeInterval(3600))
    }

    @Test("a token without exp older than the maximum age (24 h plus 60 s leeway) is refused as too_old")
    func tokenWithoutExpTooOld() throws {
        var claims = appleClaims()
        claims["exp"] = nil
        let token = appleToken(claims: claims)
        let error = rejection(token, now: fixedNow.addingTimeInterval(86_400 + 61))
        #expect(error?.kind == .verificationFailed)
        #expect(error?.code == .tooOld)
        #expect(error?.code.rawValue == "too_old")
        // A shorter maximum age, as `--max-token-age` sets it.
        let strict = try NotificationVerifier(audiences: [TestSigning.audience], maxTokenAge: 600)
        #expect(throws: NotificationError.self) {
            try strict.verify(
                token: token, keys: TestSigning.appleKeySet, now: fixedNow.addingTimeInterval(661))
        }
        #expect(throws: NotificationError.self) {
            try NotificationVerifier(audiences: [TestSigning.audience], maxTokenAge: 0)
        }
    }

    @Test("a token without exp within the maximum age, or one with exp, is judged as before")
    func tokenWithoutExpWithinAge() throws {
        var claims = appleClaims()
        claims["exp"] = nil
        let token = appleToken(claims: claims)
        let fresh = try verify(token, now: fixedNow.addingTimeInterval(86_400 + 59))
        #expect(fresh.expiresAt == nil)
        let strict = try NotificationVerifier(audiences: [TestSigning.audience], maxTokenAge: 600)
        _ = try strict.verify(
            token: token, keys: TestSigning.appleKeySet, now: fixedNow.addingTimeInterval(659))
        // With exp, exp alone decides, whatever the maximum age.
        var long = appleClaims()
        long["exp"] = 1_700_000_000 + 3 * 86_400
        let withExp = appleToken(claims: long)
        _ = try strict.verify(
            token: withExp, keys: TestSigning.appleKeySet, now: fixedNow.addingTimeInterval(2 * 86_400))
        #expect(rejection(withExp, now: fixedNow.addingTimeInterval(3 * 86_400 + 61))?.code == .expired)
    }

    @Test("refuses a missing jti")
    func missingJTI() {
        var claims = appleClaims()
        claims["jti"] = nil
        let error = rejection(appleToken(claims: claims))
        #expect(error?.kind == .malformed)
        #expect(error?.code == .missingClaim)
    }

    @Test("refuses an empty or non-string jti", arguments: [#""""#, "42", "null"])
    func badJTI(jti: String) {
        var claims = appleClaims()
        claims["jti"] = fragment(jti)
        #expect(rejection(appleToken(claims: claims))?.code == .badClaim)
    }

    @Test(
        "refuses absurd NumericDates",
        arguments: ["-1", "1e300", #""1700000000""#, "true", "99999999999999", "null"])
    func absurdTimes(value: String) {
        var claims = appleClaims()
        claims["iat"] = fragment(value)
        let error = rejection(appleToken(claims: claims))
        #expect(error?.kind == .malformed)
        #expect(error?.code == .badClaim)
    }

    @Test("refuses a missing iat")
    func missingIAT() {
        var claims = appleClaims()
        claims["iat"] = nil
        #expect(rejection(appleToken(claims: claims))?.code == .missingClaim)
    }

    @Test(
        "refuses malformed events",
        arguments: [
            "{not json", "[]", #"{"sub":"001.x","event_time":1}"#,
            #"{"type":"consent-revoked","event_time":1}"#,
            #"{"type":"consent-revoked","sub":"001.x"}"#,
            #"{"type":"consent-revoked","sub":"001.x","event_time":"1"}"#,
            #"{"type":"consent-revoked","sub":"001.x","event_time":-5}"#,
            #"{"type":"consent-revoked","sub":"001.x","event_time":1e300}"#,
            #"{"type":"email-enabled","sub":"001.x","event_time":1,"is_private_email":"yes"}"#,
            #"{"type":"email-enabled","sub":"001.x","event_time":1,"email":42}"#,
            #"{"type":42,"sub":"001.x","event_time":1}"#,
        ])
    func malformedEvents(events: String) {
        var claims = appleClaims()
        claims["events"] = events
        let error = rejection(appleToken(claims: claims))
        #expect(error?.kind == .malformed)
        #expect(error?.code == .badEvents)
    }

    @Test("refuses events that are neither a string nor an object")
    func eventsWrongType() {
        var claims = appleClaims()
        claims["events"] = [1, 2]
        #expect(rejection(appleToken(claims: claims))?.code == .badEvents)
    }

    @Test("refuses an empty sub")
    func emptySub() {
        let error = rejection(appleToken(claims: appleClaims(subject: "")))
        #expect(error?.kind == .malformed)
        #expect(error?.code == .badEvents)
    }

    @Test("refuses signed claims that are not JSON")
    func claimsNotJSON() throws {
        let token = try TestSigning.apple.sign(
            headerJSON: json(appleHeader), claimsJSON: Data("{\"iss\":".utf8))
        let error = rejection(token)
        #expect(error?.kind == .malformed)
        #expect(error?.code == .badJSON)
    }

    @Test(
        "refuses 1 MB of input by size, and broken base64 and JSON as malformed, without a crash",
        arguments: [
            (String(repeating: "eyJ", count: 350_000), NotificationError.Code.tooLarge),
            ("!!!.???.***", .badBase64), ("e30.e30", .badSegments),
            ("eyJhbGciOiJSUzI1NiJ9.e30.AAAB.", .badSegments),
            (Base64URL.encode(Data("{\"alg\":".utf8)) + ".e30.AAAA", .badJSON),
        ])
    func garbageInputs(input: String, code: NotificationError.Code) {
        let error = rejection(input)
        #expect(error?.kind == .malformed)
        #expect(error?.code == code)
    }

    @Test("error descriptions are one line and contain no email or token")
    func descriptionsLeakNothing() {
        let email = "secret.person@privaterelay.appleid.com"
        var claims = appleClaims(type: "email-enabled", email: email)
        claims["aud"] = "com.wrong"
        let token = appleToken(claims: claims)
        let text = rejection(token).map { "\($0)" } ?? ""
        #expect(text == "verification_failed: wrong_audience (aud names no configured client ID)")
        #expect(!text.contains(email))
        #expect(!text.contains(String(token.prefix(16))))
    }
}
