import ServiceSupport
import Testing

@Suite("constantTimeEqual: equal only for the same bytes, whatever the lengths")
struct ConstantTimeTests {
    @Test(
        "unequal for a prefix, an extension, one changed byte, lengths 256 apart and the empty string",
        arguments: [
            ("token", "token", true), ("", "", true), ("toke", "token", false), ("tokenx", "token", false),
            ("tokem", "token", false), ("", "token", false), ("token", "", false),
            (String(repeating: "a", count: 261), "aaaaa", false),
        ])
    func cases(given: String, expected: String, equal: Bool) {
        #expect(constantTimeEqual(given, expected) == equal)
    }
}
