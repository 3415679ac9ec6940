import AppleNotifications
import Testing

@Suite("The request body Apple posts")
struct RequestBodyTests {
    @Test("the payload string is read from {\"payload\": …}, other members ignored")
    func readsPayload() throws {
        #expect(try NotificationRequestBody.payload(from: Array(#"{"payload":"a.b.c"}"#.utf8)) == "a.b.c")
        #expect(
            try NotificationRequestBody.payload(from: Array(#" {"other":[1,{}],"payload":"x"} "#.utf8)) == "x"
        )
    }

    @Test(
        "anything else is malformed with code bad_body",
        arguments: [
            "", "not json", "[]", "{}", #"{"payload":42}"#, #"{"payload":null}"#, #"{"payload":["a"]}"#,
            #"{"payload":"a","payload":"b"}"#, "\u{FEFF}{\"payload\":\"a\"}", #"{"payload":"a"} trailing"#,
            String(repeating: "[", count: 10_000),
        ])
    func refuses(body: String) {
        #expect {
            try NotificationRequestBody.payload(from: Array(body.utf8))
        } throws: { error in
            (error as? NotificationError).map { $0.kind == .malformed && $0.code == .badBody } ?? false
        }
    }
}
