import AppleID
import Foundation
import ServiceSupport
import Testing

@Suite("ClientSecretProvider")
struct ClientSecretProviderTests {
    @Test("mints once, reuses the secret, and renews it within the renewal margin")
    func renewal() throws {
        let signer = try ClientSecretSigner(privateKeyPEM: p256Key())
        let provider = ClientSecretProvider(
            try .mint(
                signer: signer, teamID: "TEAM123456", keyID: "KEY1234567", clientID: "com.example.app",
                lifetime: 3600))
        let start = Date()
        let first = try provider.current(now: start)
        #expect(try provider.current(now: start.addingTimeInterval(1700)) == first)
        let renewed = try provider.current(now: start.addingTimeInterval(1900))
        #expect(renewed != first)
        let claims = try ClientSecretClaims(decoding: renewed)
        #expect(claims.clientID == "com.example.app")
        #expect(claims.expiresAt.timeIntervalSince(claims.issuedAt) == 3600)
        #expect(signer.verifySignature(of: renewed))
        #expect(abs(provider.secondsUntilExpiry(now: start.addingTimeInterval(1900)) - 3600) < 2)
    }

    @Test("a fixed secret's seconds until expiry count down and go negative once it has expired")
    func fixedExpiry() throws {
        let signer = try ClientSecretSigner(privateKeyPEM: p256Key())
        let issued = Date().addingTimeInterval(-100)
        let token = try signer.sign(teamID: "T", keyID: "K", clientID: "C", issuedAt: issued, lifetime: 1000)
        let provider = ClientSecretProvider(try .fixed(token + "\n"))
        #expect(try provider.current() == token)
        #expect(provider.clientID == "C")
        let now = Date()
        let expected = issued.timeIntervalSince1970.rounded(.down) + 1000 - now.timeIntervalSince1970
        #expect(abs(provider.secondsUntilExpiry(now: now) - expected) < 0.001)
        #expect(provider.secondsUntilExpiry(now: now.addingTimeInterval(2000)) < 0)
        #expect(throws: AppleIDError.self) { _ = try ClientSecretProvider.Source.fixed("not a jwt") }
    }

    @Test("registers a gauge with the seconds until the client secret expires")
    func gauge() throws {
        let signer = try ClientSecretSigner(privateKeyPEM: p256Key())
        let token = try signer.sign(teamID: "T", keyID: "K", clientID: "C", lifetime: 86400)
        let registry = MetricsRegistry()
        ClientSecretProvider(try .fixed(token)).registerExpiryGauge(in: registry)
        let line = try #require(
            registry.render().split(separator: "\n").first {
                $0.hasPrefix("siwa_apple_client_secret_expiry_seconds ")
            })
        let value = try #require(Double(line.split(separator: " ")[1]))
        #expect(value > 86300 && value <= 86400)
        #expect(registry.render().contains("# TYPE siwa_apple_client_secret_expiry_seconds gauge"))
    }

    @Test("refuses lifetimes beyond Apple's limit and margins longer than the lifetime")
    func validation() throws {
        let signer = try ClientSecretSigner(privateKeyPEM: p256Key())
        for (lifetime, margin) in [(15_777_001.0, nil), (30.0, nil), (3600.0, 3600.0)] as [(Double, Double?)]
        {
            #expect(throws: AppleIDError.self) {
                _ = try ClientSecretProvider.Source.mint(
                    signer: signer, teamID: "T", keyID: "K", clientID: "C", lifetime: lifetime,
                    renewalMargin: margin)
            }
        }
    }
}
