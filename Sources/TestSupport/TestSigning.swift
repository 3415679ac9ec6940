public import AppleNotifications
public import Foundation

/// Signers and key sets shared by test suites, generated once per process (RSA generation is slow).
///
/// TEST ONLY: these keys are created at run time and never leave the test process.
public enum TestSigning {
    /// The client ID the test signers put in `aud` by default.
    public static let audience = "com.example.siwa.tests"

    /// The signer standing in for Apple.
    public static let apple: NotificationSigner = makeSigner(keyID: "test-apple-key-1")

    /// A second, unrelated signer (an attacker, or Apple's next key after rotation).
    public static let other: NotificationSigner = makeSigner(keyID: "test-other-key-1")

    /// A verifier accepting ``audience``.
    public static let verifier: NotificationVerifier = {
        do { return try NotificationVerifier(audiences: [audience]) } catch {
            fatalError("test verifier: \(error)")
        }
    }()

    /// The key set publishing only ``apple``'s public key.
    public static var appleKeySet: JSONWebKeySet { apple.keySet() }

    /// A signed token from ``apple`` with sensible defaults for every field.
    public static func token(
        type: String = "consent-revoked", subject: String = "001234.test.subject",
        audience: String = audience,
        email: String? = nil, isPrivateEmail: Bool? = nil, eventTime: Date = Date(), issuedAt: Date = Date(),
        jti: String = UUID().uuidString.lowercased(), signer: NotificationSigner = apple
    ) -> String {
        do {
            return try signer.sign(
                type: type, subject: subject, audience: audience, email: email,
                isPrivateEmail: isPrivateEmail,
                eventTime: eventTime, issuedAt: issuedAt, jti: jti)
        } catch {
            fatalError("test signing failed: \(error)")
        }
    }

    private static func makeSigner(keyID: String) -> NotificationSigner {
        do { return try NotificationSigner.generate(keyID: keyID) } catch {
            fatalError("test key generation failed: \(error)")
        }
    }
}

extension TestSigning {
    /// A JWKS document publishing the public keys of all `signers`.
    public static func keySet(of signers: [NotificationSigner]) -> Data {
        var keys: [Any] = []
        for signer in signers {
            let document = try! JSONSerialization.jsonObject(with: signer.jwksJSON()) as! [String: Any]
            keys += document["keys"] as! [Any]
        }
        return try! JSONSerialization.data(withJSONObject: ["keys": keys])
    }
}
