import Foundation

/// The members of a notification's claims that the verifier judges, read straight from the payload's
/// bytes: no dictionary of the claims, none of the `events` object. Every other member is still
/// parsed, as strictly as ever, and dropped; a member named twice, anywhere, is refused. Reading
/// decides nothing but "is this JSON": the verifier judges the values, in its own order.
struct SignedClaims {
    /// `iss` is a string equal to ``NotificationVerifier/issuer``.
    var issuerIsApple = false
    var audience: JSONValue?
    var issuedAt: JSONValue?
    var expiresAt: JSONValue?
    var jti: JSONValue?
    var events: Events = .missing

    /// The `events` member as it was found.
    enum Events {
        case missing
        /// A JSON string (real traffic): its decoded bytes, read as JSON only when judged.
        case string(ArraySlice<UInt8>)
        /// A plain object (Apple's documentation), read with the claims.
        case object(SignedEvent)
        /// Anything else.
        case other
    }

    /// Reads the claims; a payload that is not one strict JSON object is ``NotificationError/Code/badJSON``.
    init(_ payload: Data) throws(NotificationError) {
        var claims = SignedClaims()
        var seen = SeenMembers()
        try JSONValue.readObject(from: [UInt8](payload), what: "claims") {
            name, parser throws(JSONParser.Failure) in
            switch name.count {
            case 3 where name.elementsEqual("iss".utf8):
                try seen.first(0)
                if try parser.peek() == UInt8(ascii: "\"") {
                    claims.issuerIsApple = try parser.stringBytes().elementsEqual(
                        NotificationVerifier.issuer.utf8)
                } else {
                    _ = try parser.value()
                }
            case 3 where name.elementsEqual("aud".utf8):
                try seen.first(1)
                claims.audience = try parser.value()
            case 3 where name.elementsEqual("iat".utf8):
                try seen.first(2)
                claims.issuedAt = try parser.value()
            case 3 where name.elementsEqual("exp".utf8):
                try seen.first(3)
                claims.expiresAt = try parser.value()
            case 3 where name.elementsEqual("jti".utf8):
                try seen.first(4)
                claims.jti = try parser.value()
            case 6 where name.elementsEqual("events".utf8):
                try seen.first(5)
                switch try parser.peek() {
                case UInt8(ascii: "\""): claims.events = .string(try parser.stringBytes())
                case UInt8(ascii: "{"): claims.events = .object(try SignedEvent(&parser))
                default:
                    _ = try parser.value()
                    claims.events = .other
                }
            default:
                return false
            }
            return true
        }
        self = claims
    }

    private init() {}
}

/// The members of the `events` object that the verifier judges (see ``SignedClaims``).
struct SignedEvent {
    var type: JSONValue?
    var subject: JSONValue?
    var email: JSONValue?
    var isPrivateEmail: JSONValue?
    var eventTime: JSONValue?

    /// Reads the JSON text of an `events` string, which must be one strict JSON object.
    init(json bytes: ArraySlice<UInt8>) throws(NotificationError) {
        var parser = JSONParser(Array(bytes))
        do throws(JSONParser.Failure) {
            parser.skipWhitespace()
            self = try SignedEvent(&parser)
            parser.skipWhitespace()
            guard parser.isAtEnd else { throw JSONParser.Failure() }
        } catch {
            throw .malformed(.badEvents, "events string is not a JSON object")
        }
    }

    /// Reads the object the parser stands at.
    init(_ parser: inout JSONParser) throws(JSONParser.Failure) {
        var event = SignedEvent()
        var seen = SeenMembers()
        try parser.members { name, parser throws(JSONParser.Failure) in
            switch name.count {
            case 4 where name.elementsEqual("type".utf8):
                try seen.first(0)
                event.type = try parser.value()
            case 3 where name.elementsEqual("sub".utf8):
                try seen.first(1)
                event.subject = try parser.value()
            case 5 where name.elementsEqual("email".utf8):
                try seen.first(2)
                event.email = try parser.value()
            case 16 where name.elementsEqual("is_private_email".utf8):
                try seen.first(3)
                event.isPrivateEmail = try parser.value()
            case 10 where name.elementsEqual("event_time".utf8):
                try seen.first(4)
                event.eventTime = try parser.value()
            default:
                return false
            }
            return true
        }
        self = event
    }

    private init() {}
}

/// Which of an object's known members have been read: a second one is a duplicate member.
struct SeenMembers {
    private var bits: UInt32 = 0

    /// Marks member `bit` read; throws when it was already.
    mutating func first(_ bit: Int) throws(JSONParser.Failure) {
        let mask: UInt32 = 1 << UInt32(bit)
        guard bits & mask == 0 else { throw JSONParser.Failure() }
        bits |= mask
    }
}
