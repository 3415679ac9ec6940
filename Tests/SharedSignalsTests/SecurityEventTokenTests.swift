import AppleNotifications
import Foundation
import SharedSignals
import TestSupport
import Testing

/// Every SET, verified by PyJWT against the published JWKS: its header, its claims and the claims it
/// must not have (SSF 1.0 § 4, RFC 8417 § 2.2, CAEP 1.0 § 3.1, RISC 1.0 § 2.2).
@Suite("Security Event Tokens, verified by an independent JOSE implementation")
struct SecurityEventTokenTests {
    static let issuer = "https://ssf.example.test"
    static let audience = "https://receiver.example.test/stream-1"
    static let eventTime = Date(timeIntervalSince1970: 1_767_225_600.250)
    static let issuedAt = Date(timeIntervalSince1970: 1_767_225_700.9)

    static func signals() -> [AccountSignal] {
        AccountSignal.Kind.allCases.map { kind in
            AccountSignal(
                kind: kind, subject: "001234.abcdef.\(kind.rawValue)",
                previousSubject: kind == .subjectTransferred ? "000999.old.sub" : nil, eventTime: eventTime,
                notificationJTI: "apple-jti-\(kind.rawValue)")
        }
    }

    @Test("Each signal becomes one signed SET of its type, with exactly the required claims")
    func everySignal() throws {
        let key = try SETSigningKey.generate()
        let signals = Self.signals()
        let tokens = try signals.enumerated().map { index, signal in
            try SecurityEventToken.sign(
                signal, with: key, issuer: Self.issuer, audience: Self.audience, jti: "set-\(index)",
                issuedAt: Self.issuedAt)
        }
        let outcomes = try IndependentVerifier.verify(
            tokens, jwks: key.jwksJSON(), issuer: Self.issuer, audience: Self.audience)
        try #require(outcomes.count == signals.count)
        for (index, (signal, outcome)) in zip(signals, outcomes).enumerated() {
            #expect(outcome.failure == nil, "\(signal.kind): \(outcome.failure ?? "")")
            #expect(
                outcome.header as? [String: String] == [
                    "alg": "RS256", "kid": key.keyID, "typ": "secevent+jwt",
                ])
            let claims = outcome.claims
            #expect(Set(claims.keys) == ["iss", "aud", "iat", "jti", "txn", "sub_id", "events"])
            #expect(claims["exp"] == nil && claims["sub"] == nil && claims["nbf"] == nil)
            #expect(claims["iss"] as? String == Self.issuer)
            #expect(claims["aud"] as? String == Self.audience)
            #expect(claims["iat"] as? Int == 1_767_225_700)
            #expect(claims["jti"] as? String == "set-\(index)")
            #expect(claims["txn"] as? String == signal.notificationJTI)
            #expect(
                claims["sub_id"] as? [String: String]
                    == ["format": "iss_sub", "iss": "https://appleid.apple.com", "sub": signal.subject])
            let events = try #require(claims["events"] as? [String: [String: Any]])
            #expect(events.count == 1)
            let payload = try #require(events[SecurityEventToken.EventType.of(signal.kind)], "\(signal.kind)")
            switch signal.kind {
            case .consentRevoked:
                #expect(Set(payload.keys) == ["initiating_entity", "reason_admin", "event_timestamp"])
                #expect(payload["initiating_entity"] as? String == "user")
                #expect((payload["reason_admin"] as? [String: String])?["en"]?.isEmpty == false)
                #expect(payload["event_timestamp"] as? Int == 1_767_225_600)
            case .accountDeleted:
                #expect(payload.isEmpty)
            case .subjectTransferred:
                #expect(
                    payload["previous_sub_id"] as? [String: String]
                        == ["format": "iss_sub", "iss": "https://appleid.apple.com", "sub": "000999.old.sub"])
                #expect(payload["event_timestamp"] as? Int == 1_767_225_600)
            case .emailDisabled, .emailEnabled:
                #expect(Set(payload.keys) == ["event_timestamp"])
            }
        }
        #expect(
            Set(signals.map { SecurityEventToken.EventType.of($0.kind) })
                == Set(SecurityEventToken.EventType.all))
    }

    @Test("The event types are CAEP's session-revoked and RISC's account-purged, and ours")
    func eventTypes() {
        #expect(
            SecurityEventToken.EventType.of(.consentRevoked)
                == "https://schemas.openid.net/secevent/caep/event-type/session-revoked")
        #expect(
            SecurityEventToken.EventType.of(.accountDeleted)
                == "https://schemas.openid.net/secevent/risc/event-type/account-purged")
        #expect(
            AccountSignal(
                changeType: "siwa.personal_data_erased", subject: "s", previousSubject: nil,
                eventTime: Date(), notificationJTI: "j") == nil)
    }

    @Test("A signal without Apple's jti (a delayed erasure's) has no txn; the SET is the same every time")
    func noTransactionAndDeterministic() throws {
        let key = try SETSigningKey.generate()
        let signal = AccountSignal(
            kind: .accountDeleted, subject: "001.x", eventTime: Self.eventTime, notificationJTI: "")
        let first = try SecurityEventToken.sign(
            signal, with: key, issuer: Self.issuer, audience: Self.audience, jti: "j", issuedAt: Self.issuedAt
        )
        let again = try SecurityEventToken.sign(
            signal, with: key, issuer: Self.issuer, audience: Self.audience, jti: "j", issuedAt: Self.issuedAt
        )
        #expect(first == again)
        let outcome = try #require(
            IndependentVerifier.verify(
                [first], jwks: key.jwksJSON(), issuer: Self.issuer, audience: Self.audience
            )
            .first)
        #expect(outcome.failure == nil)
        #expect(outcome.claims["txn"] == nil)
    }

    @Test("A key loaded from its PEM is the same key; another key's SET, or another audience, is refused")
    func keyFromFileAndRefusals() throws {
        let key = try SETSigningKey.generate()
        let loaded = try SETSigningKey(privateKeyPEM: key.privateKeyPEM)
        #expect(loaded.keyID == key.keyID && loaded.jwksJSON() == key.jwksJSON())
        let jwks = try #require(
            JSONSerialization.jsonObject(with: key.jwksJSON()) as? [String: [[String: String]]])
        let jwk = try #require(jwks["keys"]?.first)
        #expect(
            jwk["kty"] == "RSA" && jwk["kid"] == key.keyID && jwk["alg"] == "RS256" && jwk["use"] == "sig")
        #expect(jwk["d"] == nil && jwk["p"] == nil)
        let signal = Self.signals()[0]
        let byLoaded = try SecurityEventToken.sign(
            signal, with: loaded, issuer: Self.issuer, audience: Self.audience, jti: "a", issuedAt: Date())
        let byOther = try SecurityEventToken.sign(
            signal, with: SETSigningKey.generate(), issuer: Self.issuer, audience: Self.audience, jti: "b",
            issuedAt: Date())
        let outcomes = try IndependentVerifier.verify(
            [byLoaded, byOther], jwks: key.jwksJSON(), issuer: Self.issuer, audience: Self.audience)
        #expect(outcomes[0].failure == nil)
        #expect(outcomes[1].failure != nil)
        let otherAudience = try IndependentVerifier.verify(
            [byLoaded], jwks: key.jwksJSON(), issuer: Self.issuer, audience: "https://someone.else")
        #expect(otherAudience[0].failure?.contains("Audience") == true)
    }
}
