import Foundation
import Postgres
import QueueConsumer
import TestSupport
import Testing
import WebhookDelivery
import Webhooks

/// A copy of `delivery` with one byte of its body flipped.
private func flipped(_ delivery: ReceivedDelivery) -> ReceivedDelivery {
    var copy = delivery
    copy.body[copy.body.count / 2] ^= 0x01
    return copy
}

@Suite("Webhook deliveries signed with ed25519 (v1a)", .serialized)
struct Ed25519DeliveryTests {
    @Test(
        "a delivery to an ed25519 endpoint carries one v1a signature pyca cryptography verifies; flipped, it fails"
    )
    func deliveredAndVerified() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver()
        let key = StandardWebhooks.Ed25519SigningKey.generate()
        let endpoint = try database.addEndpoint(url: receiver.url, ed25519: key)
        try database.insertChange(sub: "ed1")
        try database.insertChange(type: "siwa.account_deleted", sub: "ed2")
        let outcomes = try database.dispatcher().drainOnce()
        #expect(outcomes.map(\.state) == [.delivered, .delivered])
        let accepted = receiver.accepted
        #expect(accepted.count == 2)
        for delivery in accepted {
            let signatures = delivery.signature?.split(separator: " ") ?? []
            #expect(signatures.count == 1 && signatures[0].hasPrefix("v1a,"))
        }
        #expect(try ReferenceVerifier.verify(accepted, publicKey: key.publicKey) == ["ok", "ok"])
        #expect(
            try ReferenceVerifier.verify(accepted.map(flipped), publicKey: key.publicKey).allSatisfy {
                $0.hasPrefix("fail")
            })
        // No whsec_ secret can verify it; the admins' view shows the public key and never the private one.
        let rows = try database.connection.query(
            "SELECT scheme, public_key, live FROM siwa.webhook_signing_keys WHERE endpoint_id = $1",
            [.int(Int64(endpoint))])
        #expect(rows.count == 1)
        #expect(try rows[0][0, as: String.self] == "v1a")
        #expect(try rows[0][1, as: String.self] == key.publicKey.text)
        #expect(try rows[0][2, as: Bool.self])
        // siwa_admin reads the public key through the view, and is refused the table with the private key.
        let admin = try database.connect(asMemberOf: "siwa_admin")
        defer { admin.close() }
        #expect(
            try admin.query("SELECT public_key FROM siwa.webhook_signing_keys")[0][0, as: String.self]
                == key.publicKey.text)
        #expect(throws: PostgresError.self) { try admin.query("SELECT secret FROM siwa.webhook_secrets") }
    }

    @Test("rotation from HMAC to ed25519: both v1 and v1a sign during the overlap, then only v1a")
    func rotationAcrossSchemes() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver()
        let old = StandardWebhooks.Secret.generate()
        let key = StandardWebhooks.Ed25519SigningKey.generate()
        let endpoint = try database.addEndpoint(url: receiver.url, secret: old)
        try database.connection.execute(
            "SELECT siwa.rotate_webhook_secret($1, $2, interval '1.5 seconds', $3)",
            [.int(Int64(endpoint)), .text(key.text), .text(key.publicKey.text)])
        let dispatcher = try database.dispatcher()
        try database.insertChange(sub: "rot")
        _ = try dispatcher.drainOnce()
        let during = try #require(receiver.deliveries.last)
        let schemes = (during.signature ?? "").split(separator: " ").map { $0.split(separator: ",")[0] }
        #expect(schemes == ["v1a", "v1"])
        #expect(try ReferenceVerifier.verify([during], secret: old) == ["ok"])
        #expect(try ReferenceVerifier.verify([during], publicKey: key.publicKey) == ["ok"])
        #expect(
            waitUntil(timeout: .seconds(5)) {
                (try? database.value(
                    "SELECT live_secrets::int FROM siwa.webhook_endpoint_overview WHERE id = $1",
                    [.int(Int64(endpoint))]) as Int) == 1
            })
        try database.insertChange(sub: "rot")
        _ = try dispatcher.drainOnce()
        let after = try #require(receiver.deliveries.last)
        #expect(after.signature?.split(separator: " ").count == 1)
        #expect(try ReferenceVerifier.verify([after], publicKey: key.publicKey) == ["ok"])
        #expect(try ReferenceVerifier.verify([after], secret: old).first?.hasPrefix("fail") == true)
    }

    @Test(
        "the schema refuses a whsk_ key without its whpk_ public key, and a public key beside a whsec_ secret"
    )
    func schemaRefusesMismatchedRows() throws {
        let database = try WebhookDatabase()
        let key = StandardWebhooks.Ed25519SigningKey.generate()
        for (secret, publicKey) in [
            (key.text, nil), (StandardWebhooks.Secret.generate().text, key.publicKey.text),
            (key.text, "whpk_short="),
        ] as [(String, String?)] {
            #expect(throws: PostgresError.self) {
                try database.connection.execute(
                    "SELECT siwa.add_webhook_endpoint('https://hooks.example.com/x', $1, NULL, 4, $2)",
                    [.text(secret), publicKey.map { .text($0) }])
            }
        }
    }
}
