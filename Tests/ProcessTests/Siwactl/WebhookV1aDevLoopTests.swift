import Foundation
import QueueConsumer
import TestSupport
import Testing
import WebhookDelivery
import Webhooks

/// The executables' environment: this process's, without any SIWA_* setting of the caller.
private let cleanEnvironment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }

private func temporaryPath(_ name: String) -> String {
    FileManager.default.temporaryDirectory.appendingPathComponent("siwa-v1a-\(UUID().uuidString)-\(name)")
        .path
}

private func contents(_ path: String) -> String {
    (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
}

/// A delivery with one byte of its body flipped.
private func flipped(_ delivery: ReceivedDelivery) -> ReceivedDelivery {
    var copy = delivery
    copy.body[copy.body.count / 2] ^= 0x01
    return copy
}

/// The developer loop with ed25519 keys: `send` and the forwarder sign `v1a` with a `whsk_` key, `listen`
/// verifies `v1a` with a `whpk_` public key; each checked by pyca `cryptography` (scripts/webhooks-verify.py).
@Suite("The webhook developer loop with ed25519 (v1a) keys", .serialized)
struct WebhookV1aDevLoopTests {
    @Test(
        "webhooks send with a whsk_ key signs every type v1a: each verified by pyca cryptography with its whpk_, a flipped byte fails"
    )
    func sendSignsV1a() throws {
        let key = StandardWebhooks.Ed25519SigningKey.generate()
        let app = try WebhookReceiver()
        let sent = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwactl"),
            arguments: ["webhooks", "send", "--url", app.url, "--type", "all", "--secret-file", "-"],
            environment: cleanEnvironment, input: Data((key.text + "\n").utf8))
        #expect(sent.status == 0, "\(sent.standardError)")
        let received = app.deliveries
        #expect(received.map { $0.json["type"] as? String ?? "" } == WebhookChange.types)
        #expect(received.allSatisfy { $0.signature?.hasPrefix("v1a,") == true })
        #expect(
            try ReferenceVerifier.verify(received, publicKey: key.publicKey)
                == Array(repeating: "ok", count: WebhookChange.types.count))
        #expect(
            try ReferenceVerifier.verify(received.map(flipped), publicKey: key.publicKey).allSatisfy {
                $0.hasPrefix("fail")
            })
        #expect(
            try ReferenceVerifier.verify(
                received, publicKey: StandardWebhooks.Ed25519SigningKey.generate().publicKey
            ).allSatisfy { $0.hasPrefix("fail") })
        #expect(!sent.standardOutput.contains("whsk_") && !sent.standardError.contains("whsk_"))
    }

    @Test(
        "webhooks listen verifies v1a with a whpk_ public key beside v1 with a whsec_: siwa's deliveries to an ed25519 endpoint are printed verified, other keys' signatures refused 401, a whsk_ refused as a listener's key"
    )
    func listenVerifiesV1a() throws {
        let database = try WebhookDatabase()
        let key = StandardWebhooks.Ed25519SigningKey.generate()
        let secret = StandardWebhooks.Secret.generate()
        let addresses = ListenAddresses()
        defer { addresses.remove() }
        let output = temporaryPath("listen.out")
        let errors = temporaryPath("listen.err")
        let listener = try Subprocess(
            ExecutableLocator.url(named: "siwactl").path,
            ["webhooks", "listen", "--port", "0", "--secret-file", "-"] + addresses.arguments,
            environment: cleanEnvironment,
            standardInput: {
                let path = temporaryPath("keys")
                FileManager.default.createFile(
                    atPath: path, contents: Data((key.publicKey.text + "\n" + secret.text + "\n").utf8))
                return path
            }(), standardOutput: output, standardError: errors)
        defer {
            listener.send(SIGTERM)
            listener.wait()
        }
        let port = try ListenAddresses.port(
            of: addresses.address("webhooks", of: listener) { contents(errors) })
        #expect(contents(errors).contains("2 keys: v1, v1a"))

        try database.addEndpoint(url: "http://127.0.0.1:\(port)/", ed25519: key)
        let change = try database.insertChange(type: "siwa.account_deleted", sub: "001.v1a.dev")
        let outcomes = try database.dispatcher().drainOnce()
        #expect(outcomes.map(\.state) == [.delivered])
        #expect(outcomes.first?.status == 204)
        let line = try #require(contents(output).split(separator: "\n").first)
        let printed = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(printed["webhook_id"] as? String == "msg_\(change)_1")
        #expect(printed["verified"] as? Bool == true)

        let body = Array(#"{"type":"siwa.account_deleted"}"#.utf8)
        func post(_ signing: StandardWebhooks.SigningKey) throws -> Int {
            let now = Int(Date().timeIntervalSince1970)
            return try postDelivery(
                to: "http://127.0.0.1:\(port)/", id: "msg_test", timestamp: now, body: body,
                signature: StandardWebhooks.signature(
                    id: "msg_test", timestamp: now, body: body, key: signing))
        }
        #expect(try post(.ed25519(.generate())) == 401)
        #expect(try post(.hmac(.generate())) == 401)
        #expect(try post(.ed25519(key)) == 204)
        #expect(try post(.hmac(secret)) == 204)
        #expect(contents(output).split(separator: "\n").count == 3)

        let refused = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwactl"), arguments: ["webhooks", "listen", "--secret-file", "-"],
            environment: cleanEnvironment, input: Data(key.text.utf8))
        #expect(refused.status == 2)
        #expect(refused.standardError.contains("whpk_ public key"))
        #expect(!refused.standardError.contains(key.text))
    }

    @Test(
        "webhooks listen --forward-to with a whsk_ key: it prints the public key, and the forwarded delivery is signed v1a, verified by pyca cryptography with it"
    )
    func forwardSignsV1a() throws {
        let database = try WebhookDatabase()
        let key = StandardWebhooks.Ed25519SigningKey.generate()
        let app = try WebhookReceiver()
        let output = temporaryPath("forward.out")
        let errors = temporaryPath("forward.err")
        let listener = try Subprocess(
            ExecutableLocator.url(named: "siwactl").path,
            ["webhooks", "listen", "--forward-to", app.url, "--database-url", database.url],
            environment: cleanEnvironment.merging(["SIWA_WEBHOOK_SECRET": key.text]) { $1 },
            standardOutput: output, standardError: errors)
        defer {
            listener.send(SIGTERM)
            listener.wait()
        }
        try #require(
            waitUntil(timeout: .seconds(20)) { contents(output).contains("public key: ") },
            "\(contents(errors))")
        #expect(contents(output).contains("public key: \(key.publicKey.text)"))
        #expect(!contents(output).contains("secret: ") && !contents(output).contains("whsk_"))
        let change = try database.insertChange(type: "siwa.consent_revoked", sub: "001.v1a.forwarded")
        let outcomes = try database.dispatcher().drainOnce()
        #expect(outcomes.map(\.state) == [.delivered])
        let delivered = try #require(app.accepted.first)
        #expect(delivered.changeID == change)
        #expect(delivered.signature?.hasPrefix("v1a,") == true)
        #expect(try ReferenceVerifier.verify([delivered], publicKey: key.publicKey) == ["ok"])
        #expect(try ReferenceVerifier.verify([flipped(delivered)], publicKey: key.publicKey) != ["ok"])
    }
}

@Suite("The recommended webhook subscription", .serialized)
struct WebhookSubscriptionWarningTests {
    @Test(
        "siwactl webhooks add warns when --types has siwa.account_deleted without siwa.personal_data_erased, and not otherwise"
    )
    func warnsAboutErasure() throws {
        let database = try WebhookDatabase()
        func add(_ extra: [String]) throws -> ExecutableLocator.Result {
            try ExecutableLocator.run(
                ExecutableLocator.url(named: "siwactl"),
                arguments: [
                    "webhooks", "add", "--database-url", database.url, "--url",
                    "https://hooks.example.com/siwa",
                ]
                    + extra, environment: cleanEnvironment)
        }
        let warned = try add(["--types", "siwa.consent_revoked,siwa.account_deleted"])
        #expect(warned.status == 0, "\(warned.standardError)")
        #expect(
            warned.standardError.contains(
                "warning: --types has siwa.account_deleted without siwa.personal_data_erased"))
        #expect(warned.standardError.contains("would keep what it received"))
        // The endpoint is added all the same, with the types asked for.
        #expect(
            try database.value("SELECT array_to_string(types, ',') FROM siwa.webhook_endpoints WHERE id = 1")
                as String == "siwa.consent_revoked,siwa.account_deleted")
        for quiet in [
            [], ["--types", "siwa.account_deleted,siwa.personal_data_erased"],
            ["--types", "siwa.consent_revoked"],
        ] {
            let added = try add(quiet)
            #expect(added.status == 0, "\(added.standardError)")
            #expect(!added.standardError.contains("warning"), "\(quiet): \(added.standardError)")
        }
    }
}
