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
        let object: [String: JSONValue]
        do {
            object = try JSONValue.object(from: body, what: "the request body")
        } catch {
            throw .malformed(.badBody, "the body is not a JSON object")
        }
        guard let payload = object["payload"] else {
            throw .malformed(.badBody, "the body has no payload")
        }
        guard let token = payload.stringValue else {
            throw .malformed(.badBody, "the payload is not a string")
        }
        return token
    }
}
