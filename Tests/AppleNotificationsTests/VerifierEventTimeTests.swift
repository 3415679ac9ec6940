import AppleNotifications
import Foundation
import TestSupport
import Testing

@Suite("The verifier decides the effective event time: never later than iat + leeway")
struct VerifierEventTimeTests {
    private func token(eventTime: Any) -> String {
        var claims = appleClaims()
        claims["events"] = ["type": "consent-revoked", "sub": "001.t", "event_time": eventTime]
        return appleToken(claims: claims)
    }

    @Test(
        "an event_time up to iat + 60 s is kept as signed (milliseconds or seconds)",
        arguments: [-86_400.0, -5, 0, 30, 60])
    func kept(offset: Double) throws {
        let time = fixedNow.addingTimeInterval(offset)
        for wire in [Any](arrayLiteral: Int64(time.timeIntervalSince1970 * 1000), time.timeIntervalSince1970)
        {
            let notification = try verify(token(eventTime: wire))
            #expect(notification.eventTime == time)
            #expect(notification.claimedEventTime == nil)
        }
    }

    @Test(
        "an event_time beyond iat + 60 s is accepted with iat + 60 s, the signed one kept beside it",
        arguments: [61.0, 3600, 2_592_000])
    func notBelieved(offset: Double) throws {
        let time = fixedNow.addingTimeInterval(offset)
        let notification = try verify(token(eventTime: Int64(time.timeIntervalSince1970 * 1000)))
        #expect(notification.eventTime == fixedNow.addingTimeInterval(60))
        #expect(notification.claimedEventTime == time)
        #expect(notification.issuedAt == fixedNow)
    }

    @Test("the leeway is the verifier's own")
    func ownLeeway() throws {
        let verifier = try NotificationVerifier(audiences: [TestSigning.audience], leeway: 5)
        let notification = try verifier.verify(
            token: token(eventTime: fixedNow.timeIntervalSince1970 + 10), keys: TestSigning.appleKeySet,
            now: fixedNow)
        #expect(notification.eventTime == fixedNow.addingTimeInterval(5))
        #expect(notification.claimedEventTime == fixedNow.addingTimeInterval(10))
    }
}
