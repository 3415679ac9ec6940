import AppleID
import Foundation
import TestSupport
import Testing

/// The local Apple as the operator runs it: `siwactl fake-apple` as a child process (the other suites
/// use the same authority in process), against the AppleIDClient the worker and the sign-in API use.
@Suite("AppleIDClient against siwactl fake-apple as a child process")
struct LocalAppleProcessTests {
    @Test("the command exchanges a code once, refreshes, and revokes, as the in-process local Apple does")
    func exchangeRefreshRevoke() throws {
        let apple = try LocalApple(mode: .process)
        #expect(apple.process?.isRunning == true)
        #expect(apple.server == nil)
        let client = try apple.client()
        let nonce = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
        let sign = try apple.authorize(sub: "001.process", email: "p@privaterelay.appleid.com", nonce: nonce)
        let tokens = try client.exchange(code: sign.code)
        let claims = try #require(try apple.verifiedClaims(tokens.idToken))
        #expect(claims["sub"] as? String == "001.process")
        #expect(claims["aud"] as? String == LocalApple.clientID)
        #expect(claims["nonce"] as? String == nonce)

        let replay = #expect(throws: AppleIDError.self) { _ = try client.exchange(code: sign.code) }
        #expect(replay?.code == .invalidGrant)
        #expect(apple.log.contains("code already used"))

        let refresh = try #require(tokens.refreshToken)
        #expect(try client.refresh(token: refresh).refreshToken == nil)
        try client.revoke(token: refresh)
        let revoked = #expect(throws: AppleIDError.self) { _ = try client.refresh(token: refresh) }
        #expect(revoked?.code == .invalidGrant)
    }
}
