import Foundation
import TestSupport
import Testing

/// RFC 9110 § 11.1 at the token and management endpoints: authentication schemes are case-insensitive.
@Suite("Shared Signals transmitter: authentication schemes")
struct AuthenticationSchemeTests {
    @Test(
        "RFC 9110 § 11.1: the Bearer and Basic schemes in any case",
        arguments: ["bearer", "BEARER", "bEaReR"])
    func schemesIgnoreCase(bearer: String) throws {
        let fixture = try TransmitterFixture()
        let client = try fixture.addReceiver("okta")
        let pair = Data("\(client.id):\(client.secret)".utf8).base64EncodedString()
        for basic in ["basic", "BASIC"] {
            let answer = try TestHTTPClient.post(
                fixture.base + "/ssf/token", body: Array("grant_type=client_credentials".utf8),
                headers: [
                    ("Content-Type", "application/x-www-form-urlencoded"),
                    ("Authorization", "\(basic) \(pair)"),
                ])
            #expect(answer.status == 200, "\(basic): \(answer.text)")
        }
        let token = try fixture.token(client)
        let answer = try TestHTTPClient.request(
            method: "GET", url: fixture.base + "/ssf/streams",
            headers: [("Authorization", "\(bearer) \(token)")],
            body: nil, timeout: .seconds(30))
        #expect(answer.status == 200, "\(answer.text)")
    }
}
