import Foundation
import HTTPServer
import Postgres
import SharedSignals
import TestSupport
import Testing

/// The metadata, the JWKS and OAuth 2.0 client credentials, against the live listener.
@Suite("Shared Signals transmitter: metadata and OAuth")
struct MetadataAndOAuthTests {
    // Conformance plan: OIDSSFTransmitterMetadataTest.
    @Test("the well-known metadata names every endpoint, both delivery methods, OAuth and spec 1_0")
    func metadata() throws {
        let fixture = try TransmitterFixture()
        let answer = try fixture.call("GET", "/.well-known/ssf-configuration", token: nil)
        let object = try #require(answer.body as? [String: Any])
        let issuer = TransmitterFixture.issuer
        #expect(answer.status == 200)
        #expect(object["issuer"] as? String == issuer)
        #expect(object["spec_version"] as? String == "1_0")
        #expect(object["jwks_uri"] as? String == issuer + "/ssf/jwks")
        #expect(
            object["delivery_methods_supported"] as? [String] == ["urn:ietf:rfc:8935", "urn:ietf:rfc:8936"])
        #expect(object["configuration_endpoint"] as? String == issuer + "/ssf/streams")
        #expect(object["status_endpoint"] as? String == issuer + "/ssf/status")
        #expect(object["add_subject_endpoint"] as? String == issuer + "/ssf/subjects:add")
        #expect(object["remove_subject_endpoint"] as? String == issuer + "/ssf/subjects:remove")
        #expect(object["verification_endpoint"] as? String == issuer + "/ssf/verify")
        #expect(object["default_subjects"] as? String == "ALL")
        #expect(
            (object["authorization_schemes"] as? [[String: String]])?.first?["spec_urn"]
                == "urn:ietf:rfc:6749")
        let jwks = try fixture.call("GET", "/ssf/jwks", token: nil)
        let keys = try #require((jwks.body as? [String: Any])?["keys"] as? [[String: Any]])
        #expect(keys.map { $0["kid"] as? String } == [fixture.key.keyID])
        #expect(keys.allSatisfy { $0["d"] == nil && $0["p"] == nil })
    }

    @Test(
        "a rotation: the next key is published beside the signing key, and SETs it signs verify against the JWKS"
    )
    func publishedKeys() throws {
        let next = try SETSigningKey.generate()
        let fixture = try TransmitterFixture(publishedKeys: [next])
        let jwks = try fixture.call("GET", "/ssf/jwks", token: nil)
        let keys = try #require((jwks.body as? [String: Any])?["keys"] as? [[String: Any]])
        #expect(keys.map { $0["kid"] as? String } == [fixture.key.keyID, next.keyID])
        let signal = AccountSignal(
            kind: .accountDeleted, subject: "001.rot", eventTime: Date(), notificationJTI: "apple-1")
        let tokens = try [fixture.key, next].map {
            try SecurityEventToken.sign(
                signal, with: $0, issuer: TransmitterFixture.issuer, audience: "aud", jti: UUID().uuidString,
                issuedAt: Date())
        }
        let outcomes = try fixture.verified(tokens, audience: "aud")
        #expect(outcomes.map { $0.failure == nil } == [true, true])
        #expect(outcomes.map { $0.header["kid"] as? String } == [fixture.key.keyID, next.keyID])
    }

    @Test(
        "client_secret_post and client_secret_basic both get a short-lived bearer token; only hashes are stored"
    )
    func clientCredentials() throws {
        let fixture = try TransmitterFixture()
        let client = try fixture.addReceiver("okta")
        let (status, object) = try fixture.tokenCall([
            ("grant_type", "client_credentials"), ("client_id", client.id), ("client_secret", client.secret),
        ])
        #expect(status == 200)
        #expect(object["token_type"] as? String == "Bearer")
        #expect(object["expires_in"] as? Int == 3600)
        #expect(object["scope"] as? String == "ssf.manage ssf.read")
        let token = try #require(object["access_token"] as? String)
        let (basicStatus, basic) = try fixture.tokenCall(
            [("grant_type", "client_credentials"), ("scope", "ssf.read")], basic: (client.id, client.secret))
        #expect(basicStatus == 200)
        #expect(basic["scope"] as? String == "ssf.read")
        // Neither the secret nor a token is in the database, in any column.
        let dump = try fixture.database.value(
            """
            SELECT (SELECT string_agg(r::text, ' ') FROM siwa.ssf_receivers r) || ' ' ||
                   (SELECT string_agg(t::text, ' ') FROM siwa.ssf_access_tokens t)
            """, as: String.self)
        #expect(!dump.contains(client.secret))
        #expect(!dump.contains(token))
        #expect(
            try fixture.database.value("SELECT count(*)::int FROM siwa.ssf_access_tokens", as: Int.self) == 2)
    }

    @Test("RFC 6749 § 5.2: invalid_client 401, unsupported_grant_type, invalid_scope, invalid_request")
    func tokenErrors() throws {
        let fixture = try TransmitterFixture()
        let client = try fixture.addReceiver("reader", scopes: ["ssf.read"])
        let wrong = try fixture.tokenCall([
            ("grant_type", "client_credentials"), ("client_id", client.id),
            ("client_secret", client.secret + "x"),
        ])
        #expect(wrong.0 == 401)
        #expect(wrong.1["error"] as? String == "invalid_client")
        let unknown = try fixture.tokenCall(
            [("grant_type", "client_credentials")], basic: ("ssf-nobody", client.secret))
        #expect(unknown.0 == 401)
        #expect(unknown.1["error"] as? String == "invalid_client")
        let grant = try fixture.tokenCall([("grant_type", "password")], basic: (client.id, client.secret))
        #expect(grant.0 == 400)
        #expect(grant.1["error"] as? String == "unsupported_grant_type")
        let scope = try fixture.tokenCall(
            [("grant_type", "client_credentials"), ("scope", "ssf.manage")], basic: (client.id, client.secret)
        )
        #expect(scope.0 == 400)
        #expect(scope.1["error"] as? String == "invalid_scope")
        let missing = try fixture.tokenCall([], basic: (client.id, client.secret))
        #expect(missing.0 == 400)
        #expect(missing.1["error"] as? String == "invalid_request")
    }

    // Conformance plan: OIDSSFStreamControlNegativeTest{Create,Read,Update,Replace,Delete}StreamWithInvalid(Access)Token.
    @Test(
        "management calls: 401 without a token, with a bad or expired one; 403 insufficient_scope with ssf.read only"
    )
    func bearerAndScopes() throws {
        let fixture = try TransmitterFixture()
        let client = try fixture.addReceiver("okta")
        let manager = try fixture.token(client)
        let reader = try fixture.token(client, scope: "ssf.read")
        let stream = try fixture.createStream(token: manager)
        let id = try #require(stream["stream_id"] as? String)
        let create: [String: Any] = ["delivery": ["method": "urn:ietf:rfc:8936"]]
        for token in [nil, "not-a-token"] {
            #expect(try fixture.call("POST", "/ssf/streams", token: token, json: create).status == 401)
            #expect(try fixture.call("GET", "/ssf/streams?stream_id=\(id)", token: token).status == 401)
            #expect(
                try fixture.call("PATCH", "/ssf/streams", token: token, json: ["stream_id": id]).status == 401
            )
            #expect(try fixture.call("PUT", "/ssf/streams", token: token, json: create).status == 401)
            #expect(try fixture.call("DELETE", "/ssf/streams?stream_id=\(id)", token: token).status == 401)
        }
        let refused = try fixture.call("POST", "/ssf/streams", token: reader, json: create)
        #expect(refused.status == 403)
        #expect(refused.response.headers["WWW-Authenticate"]?.contains("insufficient_scope") == true)
        #expect(try fixture.call("DELETE", "/ssf/streams?stream_id=\(id)", token: reader).status == 403)
        #expect(try fixture.call("POST", "/ssf/verify", token: reader, json: ["stream_id": id]).status == 403)
        #expect(try fixture.call("GET", "/ssf/streams?stream_id=\(id)", token: reader).status == 200)
        try fixture.database.connection.execute(
            "UPDATE siwa.ssf_access_tokens SET expires_at = now() - interval '1 second'")
        let expired = try fixture.call("GET", "/ssf/streams", token: reader)
        #expect(expired.status == 401)
        #expect(expired.response.headers["WWW-Authenticate"]?.contains("invalid_token") == true)
    }
}
