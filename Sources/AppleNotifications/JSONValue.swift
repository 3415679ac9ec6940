import Foundation

/// A parsed JSON value; internal so callers only ever see typed results.
enum JSONValue: Sendable, Equatable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    /// Parses bytes that must hold a JSON object.
    ///
    /// Strict RFC 8259 with two extra rules that matter for signed tokens: an object with a
    /// duplicated member name is refused (so no two readers can disagree on `alg` or `aud`), and
    /// nesting deeper than ``JSONParser/maximumDepth`` is refused (bounded stack).
    static func object(from data: Data, what: String) throws(NotificationError) -> [String: JSONValue] {
        try object(from: [UInt8](data), what: what)
    }

    static func object(from bytes: [UInt8], what: String) throws(NotificationError) -> [String: JSONValue] {
        let value: JSONValue
        do {
            value = try JSONParser.parse(bytes)
        } catch {
            throw .malformed(.badJSON, "\(what) is not JSON")
        }
        guard case .object(let object) = value else {
            throw .malformed(.badJSON, "\(what) is not a JSON object")
        }
        return object
    }

    /// Reads bytes that must hold a JSON object member by member (``JSONParser/members(_:)``), with
    /// the same strictness and the same errors as ``object(from:what:)``.
    static func readObject(
        from bytes: [UInt8], what: String,
        _ visit: (ArraySlice<UInt8>, inout JSONParser) throws(JSONParser.Failure) -> Bool
    ) throws(NotificationError) {
        do {
            try JSONParser.readObject(bytes, visit)
        } catch {
            // Which message: only on this error path is the input parsed again.
            if let value = try? JSONParser.parse(bytes) {
                if case .object = value {} else { throw .malformed(.badJSON, "\(what) is not a JSON object") }
            }
            throw .malformed(.badJSON, "\(what) is not JSON")
        }
    }

    var stringValue: String? {
        if case .string(let value) = self { value } else { nil }
    }
}

/// A small strict JSON parser over UTF-8 bytes.
struct JSONParser {
    struct Failure: Error {}

    /// Deep enough for any JOSE header, claims set or key set.
    static let maximumDepth = 32

    private let bytes: [UInt8]
    private var index = 0
    private var depth = 0

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    /// Whether every byte has been read.
    var isAtEnd: Bool { index == bytes.count }

    static func parse(_ data: Data) throws(Failure) -> JSONValue {
        try parse([UInt8](data))
    }

    static func parse(_ bytes: [UInt8]) throws(Failure) -> JSONValue {
        var parser = JSONParser(bytes)
        parser.skipWhitespace()
        let value = try parser.value()
        parser.skipWhitespace()
        guard parser.index == parser.bytes.count else { throw Failure() }
        return value
    }

    mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    func peek() throws(Failure) -> UInt8 {
        guard index < bytes.count else { throw Failure() }
        return bytes[index]
    }

    private mutating func expect(_ literal: StaticString) throws(Failure) {
        let expected = UnsafeBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount)
        guard bytes.count - index >= expected.count else { throw Failure() }
        for byte in expected {
            guard bytes[index] == byte else { throw Failure() }
            index += 1
        }
    }

    mutating func value() throws(Failure) -> JSONValue {
        switch try peek() {
        case UInt8(ascii: "{"): return try object()
        case UInt8(ascii: "["): return try array()
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "t"):
            try expect("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try expect("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try expect("null")
            return .null
        default: return .number(try number())
        }
    }

    private mutating func enter() throws(Failure) {
        depth += 1
        guard depth <= Self.maximumDepth else { throw Failure() }
        index += 1
        skipWhitespace()
    }

    private mutating func object() throws(Failure) -> JSONValue {
        var object: [String: JSONValue] = [:]
        try members { name, parser throws(Failure) in
            let member = try parser.value()
            guard object.updateValue(member, forKey: String(decoding: name, as: UTF8.self)) == nil else {
                throw Failure()
            }
            return true
        }
        return .object(object)
    }

    /// Reads the object the parser stands at, member by member, without building it: `visit` is called
    /// with each member's decoded name while the parser stands at the member's value. A `visit` that
    /// knows the name reads the value (``value()``, ``stringBytes()``, ``members(_:)``), refuses a
    /// name it has already seen, and returns `true`; one that does not returns `false`, and the value
    /// is then parsed (so the whole object is checked as strictly as by ``parse(_:)``) and dropped, its
    /// name kept so that a repeat is refused (compared as `String`s, as the dictionary of ``parse(_:)``
    /// compares its keys).
    mutating func members(
        _ visit: (ArraySlice<UInt8>, inout JSONParser) throws(Failure) -> Bool
    ) throws(Failure) {
        guard try peek() == UInt8(ascii: "{") else { throw Failure() }
        try enter()
        defer { depth -= 1 }
        if try peek() == UInt8(ascii: "}") {
            index += 1
            return
        }
        var unknown: Set<String> = []
        while true {
            guard try peek() == UInt8(ascii: "\"") else { throw Failure() }
            let name = try stringBytes()
            skipWhitespace()
            try expect(":")
            skipWhitespace()
            let start = index
            if try !visit(name, &self) {
                index = start
                _ = try value()
                guard unknown.insert(String(decoding: name, as: UTF8.self)).inserted else { throw Failure() }
            } else if index == start {
                throw Failure()  // a visitor that claimed the member must have read its value
            }
            skipWhitespace()
            let next = try peek()
            index += 1
            if next == UInt8(ascii: "}") { return }
            guard next == UInt8(ascii: ",") else { throw Failure() }
            skipWhitespace()
        }
    }

    /// Reads all of `bytes`, which must hold one JSON object (whitespace around it allowed), with
    /// ``members(_:)``.
    static func readObject(
        _ bytes: [UInt8], _ visit: (ArraySlice<UInt8>, inout JSONParser) throws(Failure) -> Bool
    ) throws(Failure) {
        var parser = JSONParser(bytes)
        parser.skipWhitespace()
        try parser.members(visit)
        parser.skipWhitespace()
        guard parser.index == parser.bytes.count else { throw Failure() }
    }

    private mutating func array() throws(Failure) -> JSONValue {
        try enter()
        defer { depth -= 1 }
        var elements: [JSONValue] = []
        if try peek() == UInt8(ascii: "]") {
            index += 1
            return .array(elements)
        }
        while true {
            elements.append(try value())
            skipWhitespace()
            let next = try peek()
            index += 1
            if next == UInt8(ascii: "]") { return .array(elements) }
            guard next == UInt8(ascii: ",") else { throw Failure() }
            skipWhitespace()
        }
    }

    private mutating func string() throws(Failure) -> String {
        String(decoding: try stringBytes(), as: UTF8.self)  // already checked to be UTF-8
    }

    /// The decoded bytes of the string the parser stands at (its opening quote): valid UTF-8, escapes
    /// resolved. A string without escapes is a slice of the input, nothing copied.
    mutating func stringBytes() throws(Failure) -> ArraySlice<UInt8> {
        guard try peek() == UInt8(ascii: "\"") else { throw Failure() }
        index += 1  // opening quote
        // Fast path: no escape before the closing quote, so the text is the bytes as they stand.
        var end = index
        var ascii = true
        while end < bytes.count {
            let byte = bytes[end]
            if byte == UInt8(ascii: "\"") {
                let text = bytes[index..<end]
                guard ascii || String(validating: text, as: UTF8.self) != nil else { throw Failure() }
                index = end + 1
                return text
            }
            if byte == UInt8(ascii: "\\") || byte < 0x20 { break }
            if byte >= 0x80 { ascii = false }
            end += 1
        }
        var scalars = Array(bytes[index..<end])
        index = end
        while true {
            let byte = try peek()
            index += 1
            switch byte {
            case UInt8(ascii: "\""):
                guard ascii || String(validating: scalars, as: UTF8.self) != nil else { throw Failure() }
                return scalars[...]
            case UInt8(ascii: "\\"):
                let escape = try peek()
                index += 1
                switch escape {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): scalars.append(escape)
                case UInt8(ascii: "b"): scalars.append(0x08)
                case UInt8(ascii: "f"): scalars.append(0x0C)
                case UInt8(ascii: "n"): scalars.append(0x0A)
                case UInt8(ascii: "r"): scalars.append(0x0D)
                case UInt8(ascii: "t"): scalars.append(0x09)
                case UInt8(ascii: "u"):
                    var code = try hex4()
                    if (0xD800..<0xDC00).contains(code) {
                        try expect("\\u")
                        let low = try hex4()
                        guard (0xDC00..<0xE000).contains(low) else { throw Failure() }
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00..<0xE000).contains(code) {
                        throw Failure()
                    }
                    guard let scalar = Unicode.Scalar(code) else { throw Failure() }
                    scalars.append(contentsOf: String(Character(scalar)).utf8)
                default: throw Failure()
                }
            case 0..<0x20:
                throw Failure()
            default:
                if byte >= 0x80 { ascii = false }
                scalars.append(byte)
            }
        }
    }

    private mutating func hex4() throws(Failure) -> UInt32 {
        var code: UInt32 = 0
        for _ in 0..<4 {
            let byte = try peek()
            index += 1
            let digit: UInt32
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(byte - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(byte - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(byte - UInt8(ascii: "A") + 10)
            default: throw Failure()
            }
            code = code << 4 | digit
        }
        return code
    }

    /// RFC 8259 number grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    mutating func number() throws(Failure) -> Double {
        let start = index
        func isDigit(_ byte: UInt8) -> Bool { byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") }
        func digits() -> Int {
            let first = index
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
            return index - first
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard index < bytes.count, isDigit(bytes[index]) else { throw Failure() }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else {
            _ = digits()
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            guard digits() > 0 else { throw Failure() }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
                index += 1
            }
            guard digits() > 0 else { throw Failure() }
        }
        guard index - start <= 64,
            let value = Double(String(decoding: bytes[start..<index], as: UTF8.self)), value.isFinite
        else { throw Failure() }
        return value
    }
}
