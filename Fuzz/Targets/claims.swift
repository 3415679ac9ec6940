import Crypto
import Foundation

// libFuzzer target: claims and `events` parsing (string and object forms) up to a ServerNotification.
//
// The claims parser is private to NotificationVerifier and runs only after the signature check, so the
// harness signs each input with a fixed throwaway 512-bit key (cheap to sign with) and verifies through
// the public `verify(_:now:key:)`. The input is the claims JSON bytes.
@testable import AppleNotifications

private let (signingKey, publicKey) = withoutLeakChecks {
    let signingKey = try! RSA.PrivateKey.generate(bits: 512)
    return (signingKey, RSAPublicKey(try! signingKey.publicKey()))
}
private let encodedHeader = Base64URL.encode(Data(#"{"kid":"fuzz","alg":"RS256"}"#.utf8))
private let verifier = withoutLeakChecks {
    try! NotificationVerifier(audiences: ["com.example.app", "com.example.web"])
}
/// Fixed, so runs are reproducible: just after the captured seed tokens' `iat`.
private let now = Date(timeIntervalSince1970: 1_630_085_500)

@_cdecl("LLVMFuzzerInitialize")
public func initialize(_ argc: UnsafeMutableRawPointer, _ argv: UnsafeMutableRawPointer) -> CInt {
    _ = (publicKey, verifier)
    return 0
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzClaims(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let claims = Data(UnsafeBufferPointer(start: data, count: size))
    let signingInput = encodedHeader + "." + Base64URL.encode(claims)
    let signature = try! signingKey.sha256Signature(for: Data(signingInput.utf8))
    let token = signingInput + "." + Base64URL.encode(signature)
    let notification: ServerNotification
    do {
        let jws = try CompactJWS(token)
        notification = try verifier.verify(jws, now: now) { _ in publicKey }
    } catch {
        guard error.kind == .malformed || error.kind == .verificationFailed else {
            fatalError("unexpected error kind \(error.kind)")
        }
        if error.code == .badSignature { fatalError("a freshly signed token did not verify") }
        return 0
    }
    guard !notification.jti.isEmpty, !notification.subject.isEmpty, !notification.eventType.rawValue.isEmpty,
        notification.eventType.rawValue != "account-deleted",
        verifier.audiences.contains(notification.audience),
        notification.audiences.contains(notification.audience),
        notification.eventTime.timeIntervalSince1970 >= 0,
        notification.eventTime.timeIntervalSince1970 <= 1e11,
        notification.issuedAt.timeIntervalSince(now) <= verifier.leeway
    else { fatalError("an accepted notification breaks an invariant") }
    if let expiresAt = notification.expiresAt, expiresAt.timeIntervalSince(now) <= -verifier.leeway {
        fatalError("an expired token was accepted")
    }
    // What the receiver stores must encode and decode unchanged.
    let encoded = try! JSONEncoder().encode(notification)
    guard try! JSONDecoder().decode(ServerNotification.self, from: encoded) == notification else {
        fatalError("ServerNotification does not survive a JSON round trip")
    }
    return 0
}
