import Foundation

/// The body Apple POSTs to the notification endpoint: `{"payload": "<JWS>"}`.
public enum NotificationRequestBody {
    /// The token in `body`'s `payload` member; other members are ignored.
    ///
    /// Read with the same strict parser as the token itself: a body with a member named twice (two
    /// `payload`s that two readers could pick differently), a byte-order mark, or nesting deeper than
    /// the parser's bound is refused.
    /// - Throws: ``NotificationError`` `malformed` with code `badBody`.
    public static func payload(from body: some Collection<UInt8>) throws(NotificationError) -> String {
        try payload(from: Array(body))
    }

    /// The `payload` string of a request body `{"payload": "<JWS>"}` (see the generic form).
    public static func payload(from body: [UInt8]) throws(NotificationError) -> String {
        // Read member by member: only the token becomes a String.
        var payload: Payload = .missing
        do {
            try JSONValue.readObject(from: body, what: "the request body") {
                name, parser throws(JSONParser.Failure) in
                guard name.elementsEqual("payload".utf8) else { return false }
                guard case .missing = payload else { throw JSONParser.Failure() }  // named twice
                if try parser.peek() == UInt8(ascii: "\"") {
                    payload = .token(String(decoding: try parser.stringBytes(), as: UTF8.self))
                } else {
                    _ = try parser.value()
                    payload = .notString
                }
                return true
            }
        } catch {
            throw .malformed(.badBody, "the body is not a JSON object")
        }
        switch payload {
        case .missing: throw .malformed(.badBody, "the body has no payload")
        case .notString: throw .malformed(.badBody, "the payload is not a string")
        case .token(let token): return token
        }
    }

    private enum Payload {
        case missing
        case notString
        case token(String)
    }
}
