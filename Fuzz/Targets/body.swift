// libFuzzer target: the receiver's request-body handling, as `NotificationEndpoint.receive` does it:
// `{"payload": …}` extraction, compact JWS parsing, then verification against the TEST-ONLY fixture key
// (Tests/Fixtures/TEST-ONLY-rsa-2048-public-key.pem), so seed tokens signed with it reach the claims.
import AppleNotifications
import Foundation

@testable import Receiver

private let fixtureKey = withoutLeakChecks {
    try! RSAPublicKey(
        modulus: Base64URL.decode(
            "wQ0w6g2pDy0veIQ6bmZtFOVDbCeNmf_NsEslaO9cqxv2DzAU_Ptn7HfsiNvC6NVhy6-ktICrbXtZJLrVJS0ZzghsXXR3D-i4htj"
                + "VBQo-z5rotJZWz_3iXVxv8-QfNlAs16ocjbWg9I3bClBza4B0WCK4bAVKeCuB5QT5mKdPdNnhxKFAW32MHnPBxLEnJ3TuIrn"
                + "oQe0-UZgsMGYNm147HoLFVhLiNcV9-68YjNvIdAnvZkiRvo_FPz1n1dRt7VjO95Sr-l7L0hu8uEZuakVXqZPe2xz2IHWjXVnq"
                + "seAzMoLZE6U6cFObkiIetyRrJj9e2kTHhQtxQGdTclxSigCpjQ"),
        exponent: Data([1, 0, 1]))
}
private let verifier = withoutLeakChecks { try! NotificationVerifier(audiences: ["com.example.app"]) }
private let now = Date(timeIntervalSince1970: 1_630_085_500)

@_cdecl("LLVMFuzzerInitialize")
public func initialize(_ argc: UnsafeMutableRawPointer, _ argv: UnsafeMutableRawPointer) -> CInt {
    _ = (fixtureKey, verifier)
    return 0
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzBody(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let body = Array(UnsafeBufferPointer(start: data, count: size))
    guard let token = try? NotificationRequestBody.payload(from: body) else { return 0 }
    do {
        let jws = try CompactJWS(token)
        _ = try verifier.verify(jws, now: now) { kid throws(NotificationError) in
            guard kid == "fixture" else {
                throw NotificationError(.keyNotAvailable, .unknownKeyID, "kid not in the key set")
            }
            return fixtureKey
        }
    } catch {
        // Every refusal must map to one of the receiver's answers and never quote the token.
        if token.count >= 16, error.description.contains(token) { fatalError("error text quotes the token") }
    }
    return 0
}
