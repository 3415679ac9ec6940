import Foundation
import ServiceSupport
import Testing

@Suite("Authorization header")
struct AuthorizationHeaderTests {
    @Test(
        "the scheme is case-insensitive (RFC 9110 § 11.1)",
        arguments: ["Bearer", "bearer", "BEARER", "bEaReR"])
    func bearer(scheme: String) {
        #expect(AuthorizationHeader.bearerToken("\(scheme) abc.DEF-123_~+/=") == "abc.DEF-123_~+/=")
        #expect(AuthorizationHeader.bearerToken("\(scheme)  two-spaces") == "two-spaces")
        #expect(AuthorizationHeader("\(scheme) x") == AuthorizationHeader("bearer x"))
    }

    @Test(
        "Basic credentials in any case; the password may hold colons (RFC 7617 § 2)",
        arguments: ["Basic", "basic", "BASIC"])
    func basic(scheme: String) throws {
        let encoded = Data("client:pass:word".utf8).base64EncodedString()
        let pair = try #require(AuthorizationHeader.basicCredentials("\(scheme) \(encoded)"))
        #expect(pair.user == "client" && pair.password == "pass:word")
    }

    @Test(
        "malformed or other headers give nothing",
        arguments: [nil, "", "Bearer", "Bearer ", "Bearer  ", " Bearer x", "Bear(er x", "Bearerx", "Basic x"])
    func malformed(value: String?) {
        #expect(AuthorizationHeader.bearerToken(value) == nil)
        #expect(AuthorizationHeader.basicCredentials(value) == nil)
    }

    @Test("a header of another scheme is neither bearer nor Basic")
    func otherScheme() {
        let basic = "Basic " + Data("a:b".utf8).base64EncodedString()
        #expect(AuthorizationHeader.bearerToken(basic) == nil)
        #expect(
            AuthorizationHeader.basicCredentials("Bearer " + Data("a:b".utf8).base64EncodedString()) == nil)
        #expect(
            AuthorizationHeader.basicCredentials("Basic " + Data("no-colon".utf8).base64EncodedString())
                == nil)
    }
}
