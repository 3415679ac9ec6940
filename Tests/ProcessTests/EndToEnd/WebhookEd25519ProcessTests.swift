import Foundation
import TestSupport
import Testing
import Webhooks

@Suite("Webhooks signed with ed25519 through the executables", .serialized)
struct WebhookEd25519ProcessTests {
    @Test(
        "siwactl webhooks add --scheme ed25519 prints only the public key; siwa-worker's deliveries verify with it (pyca cryptography), a flipped byte fails; rotate-secret keeps the scheme"
    )
    func ed25519ThroughTheExecutables() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver()
        let siwactl = ExecutableLocator.url(named: "siwactl")
        let added = try ExecutableLocator.run(
            siwactl,
            arguments: [
                "webhooks", "add", "--database-url", database.url, "--url", receiver.url, "--scheme",
                "ed25519",
            ])
        #expect(added.status == 0, "\(added.standardError)")
        #expect(!added.standardOutput.contains("whsk_") && !added.standardError.contains("whsk_"))
        let line = try #require(
            added.standardOutput.split(separator: "\n").first { $0.hasPrefix("public key: ") })
        let publicKey = try StandardWebhooks.Ed25519PublicKey(String(line.dropFirst("public key: ".count)))
        // The private key is stored (for the worker) and is the public key's.
        let stored: String = try database.value("SELECT secret FROM siwa.webhook_secrets")
        #expect(try StandardWebhooks.Ed25519SigningKey(stored).publicKey == publicKey)

        let ids = try database.insertChanges(subs: ["p1", "p2"], count: 2)
        let worker = try Subprocess(
            ExecutableLocator.url(named: "siwa-worker").path,
            ["--database-url", database.url, "--webhook-poll-interval", "0.1", "--log-level", "warning"])
        defer {
            worker.send(SIGTERM)
            worker.wait()
        }
        #expect(waitUntil(timeout: .seconds(30)) { (try? database.count("delivered")) == ids.count })
        let accepted = receiver.accepted
        #expect(Set(accepted.map(\.changeID)) == Set(ids))
        #expect(
            accepted.allSatisfy {
                $0.signature?.hasPrefix("v1a,") == true && $0.signature?.contains(" ") == false
            })
        #expect(try ReferenceVerifier.verify(accepted, publicKey: publicKey).allSatisfy { $0 == "ok" })
        let tampered = accepted.map { delivery -> ReceivedDelivery in
            var copy = delivery
            copy.body[0] ^= 0x20
            return copy
        }
        #expect(
            try ReferenceVerifier.verify(tampered, publicKey: publicKey).allSatisfy { $0.hasPrefix("fail") })

        // Rotation keeps the scheme: a new key pair, its public key printed, the old one still signing.
        let rotated = try ExecutableLocator.run(
            siwactl,
            arguments: [
                "webhooks", "rotate-secret", "--database-url", database.url, "--endpoint", "1", "--overlap",
                "1h",
            ])
        #expect(rotated.status == 0, "\(rotated.standardError)")
        #expect(!rotated.standardOutput.contains("whsk_") && !rotated.standardOutput.contains("whsec_"))
        let newLine = try #require(
            rotated.standardOutput.split(separator: "\n").first { $0.hasPrefix("public key: ") })
        let newKey = try StandardWebhooks.Ed25519PublicKey(String(newLine.dropFirst("public key: ".count)))
        #expect(newKey != publicKey)
        let next = try database.insertChange(sub: "p1")
        #expect(waitUntil(timeout: .seconds(30)) { receiver.accepted.contains { $0.changeID == next } })
        let during = try #require(receiver.accepted.first { $0.changeID == next })
        #expect(during.signature?.split(separator: " ").count == 2)
        #expect(try ReferenceVerifier.verify([during], publicKey: newKey) == ["ok"])
        #expect(try ReferenceVerifier.verify([during], publicKey: publicKey) == ["ok"])

        let refused = try ExecutableLocator.run(
            siwactl,
            arguments: [
                "webhooks", "add", "--database-url", database.url, "--url", receiver.url, "--scheme", "rsa",
            ])
        #expect(refused.status == 2)
    }
}
