public import Foundation

/// A statement parameter, sent with an explicit type where that helps the server infer the right one.
/// Use `nil` (in a `[PostgresData?]`) for SQL NULL.
///
/// Text and JSON go in text format (the server infers the type of `.text` from context); numbers,
/// booleans, timestamps, bytes, UUIDs and arrays of one of those or of text go in PostgreSQL's binary
/// format, which neither side has to format or parse (see ``array(_:)``).
///
/// Literals work too: `try conn.query("SELECT $1, $2", ["text", 42])`.
public enum PostgresData: Sendable, Hashable {
    /// Text; the server infers its type from context (so it also fits `json`, `uuid`, enums …).
    case text(String)
    /// `int8`.
    case int(Int64)
    /// `float8`.
    case double(Double)
    /// `bool`.
    case bool(Bool)
    /// `timestamptz`, sent as ISO 8601 in UTC with microseconds.
    case date(Date)
    /// `bytea`, sent in hex form.
    case bytes(Data)
    /// `uuid`.
    case uuid(UUID)
    /// `jsonb`, given as JSON text.
    case jsonb(String)
    /// A one-dimensional array. Elements may be nil (SQL NULL) but not arrays themselves.
    ///
    /// When every element that is not nil is of the same case among `.text`, `.int`, `.double`,
    /// `.bool`, `.date`, `.bytes` and `.uuid`, the array goes in binary format typed as that element's
    /// array (`text[]`, `int8[]`, `float8[]`, `bool[]`, `timestamptz[]`, `bytea[]`, `uuid[]`): the
    /// statement may cast it (`$1::varchar[]`) but must not expect another element type from
    /// inference. Otherwise (empty, all NULL, mixed, or `.jsonb` elements) it goes as an array literal
    /// whose type the statement gives (`$1::text[]`).
    indirect case array([PostgresData?])

    /// Wraps any encodable value.
    public init(_ value: some PostgresEncodable) { self = value.postgresData }

    /// The type OID sent with the parameter (`0` lets the server infer it).
    var typeOID: UInt32 {
        switch self {
        case .text: 0
        case .int: 20
        case .double: 701
        case .bool: 16
        case .date: 1184
        case .bytes: 17
        case .uuid: 2950
        case .jsonb: 3802
        case .array: 0
        }
    }

    /// The value in PostgreSQL's text input format.
    var textValue: String {
        switch self {
        case .text(let value), .jsonb(let value): value
        case .int(let value): String(value)
        case .double(let value):
            if value.isNaN {
                "NaN"
            } else if value.isInfinite {
                value < 0 ? "-Infinity" : "Infinity"
            } else {
                value.description
            }
        case .bool(let value): value ? "true" : "false"
        case .date(let value): PostgresTimestamp.format(value)
        case .bytes(let value): PostgresHex.encode(value)
        case .uuid(let value): value.uuidString.lowercased()
        case .array(let elements): Self.arrayLiteral(elements)
        }
    }

    /// `{"a","b",NULL}`: every element quoted, with `"` and `\` escaped (built as UTF-8 bytes: the
    /// receiver's group commit sends thousands of elements a second).
    private static func arrayLiteral(_ elements: [PostgresData?]) -> String {
        var literal: [UInt8] = [UInt8(ascii: "{")]
        for (index, element) in elements.enumerated() {
            if index > 0 { literal.append(UInt8(ascii: ",")) }
            guard let element else {
                literal.append(contentsOf: "NULL".utf8)
                continue
            }
            precondition(!element.isArray, "nested arrays are not supported")
            literal.append(UInt8(ascii: "\""))
            for byte in element.textValue.utf8 {
                if byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") {
                    literal.append(UInt8(ascii: "\\"))
                }
                literal.append(byte)
            }
            literal.append(UInt8(ascii: "\""))
        }
        literal.append(UInt8(ascii: "}"))
        return String(decoding: literal, as: UTF8.self)
    }

    private var isArray: Bool {
        if case .array = self { return true }
        return false
    }
}

// MARK: - Wire encoding

/// One parameter as libpq sends it: its type OID and whether its bytes are in binary format.
struct PostgresWireFormat: Equatable {
    var typeOID: UInt32
    var isBinary: Bool
}

/// A parameter that cannot be sent (text holding NUL, which PostgreSQL text cannot hold).
struct PostgresEncodingFailure: Error {}

extension PostgresData {
    /// Appends this parameter's bytes to `buffer` as libpq sends it, a text value followed by its
    /// terminating NUL, and says how it goes.
    func encode(into buffer: inout [UInt8]) throws(PostgresEncodingFailure) -> PostgresWireFormat {
        switch self {
        case .text(let value), .jsonb(let value):
            try Self.appendText(value, to: &buffer)
            buffer.append(0)
            return PostgresWireFormat(typeOID: typeOID, isBinary: false)
        case .array(let elements):
            guard let element = Self.binaryElementOID(of: elements), let arrayOID = Self.arrayOID[element]
            else {
                try Self.appendText(textValue, to: &buffer)
                buffer.append(0)
                return PostgresWireFormat(typeOID: 0, isBinary: false)
            }
            try Self.appendBinaryArray(elements, elementOID: element, to: &buffer)
            return PostgresWireFormat(typeOID: arrayOID, isBinary: true)
        case .int, .double, .bool, .date, .bytes, .uuid:
            try appendBinary(to: &buffer)
            return PostgresWireFormat(typeOID: typeOID, isBinary: true)
        }
    }

    /// The element type OID when every element that is not nil has the same binary-encodable case.
    private static func binaryElementOID(of elements: [PostgresData?]) -> UInt32? {
        var found: UInt32?
        for case let element? in elements {
            let oid: UInt32
            switch element {
            case .text: oid = 25
            case .int, .double, .bool, .date, .bytes, .uuid: oid = element.typeOID
            case .jsonb, .array: return nil
            }
            if let found, found != oid { return nil }
            found = oid
        }
        return found
    }

    /// The array type of each element type sent in binary.
    private static let arrayOID: [UInt32: UInt32] = [
        25: 1009, 20: 1016, 701: 1022, 16: 1000, 1184: 1185, 17: 1001, 2950: 2951,
    ]

    /// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 00:00:00 UTC).
    private static let postgresEpochMicros: Int64 = 946_684_800_000_000

    /// PostgreSQL's binary array: dimensions (1), a has-NULL flag, the element type, the length and
    /// lower bound (1), then each element as a 32-bit length (-1 for NULL) and its bytes.
    private static func appendBinaryArray(
        _ elements: [PostgresData?], elementOID: UInt32, to buffer: inout [UInt8]
    ) throws(PostgresEncodingFailure) {
        appendInteger(Int32(1), to: &buffer)
        appendInteger(Int32(elements.contains { $0 == nil } ? 1 : 0), to: &buffer)
        appendInteger(elementOID, to: &buffer)
        appendInteger(Int32(elements.count), to: &buffer)
        appendInteger(Int32(1), to: &buffer)
        for element in elements {
            guard let element else {
                appendInteger(Int32(-1), to: &buffer)
                continue
            }
            let lengthAt = buffer.count
            appendInteger(Int32(0), to: &buffer)
            if case .text(let value) = element {
                try appendText(value, to: &buffer)
            } else {
                try element.appendBinary(to: &buffer)
            }
            let length = UInt32(buffer.count - lengthAt - 4)
            buffer[lengthAt] = UInt8(truncatingIfNeeded: length >> 24)
            buffer[lengthAt + 1] = UInt8(truncatingIfNeeded: length >> 16)
            buffer[lengthAt + 2] = UInt8(truncatingIfNeeded: length >> 8)
            buffer[lengthAt + 3] = UInt8(truncatingIfNeeded: length)
        }
    }

    /// The binary form of a scalar other than text (`int8send`, `float8send`, `boolsend`,
    /// `timestamptz_send`, `byteasend`, `uuid_send`).
    private func appendBinary(to buffer: inout [UInt8]) throws(PostgresEncodingFailure) {
        switch self {
        case .int(let value): Self.appendInteger(value, to: &buffer)
        case .double(let value): Self.appendInteger(value.bitPattern, to: &buffer)
        case .bool(let value): buffer.append(value ? 1 : 0)
        case .date(let value):
            // Rounded to the microsecond, as the text form was.
            let micros = Int64((value.timeIntervalSince1970 * 1_000_000).rounded())
            Self.appendInteger(micros - Self.postgresEpochMicros, to: &buffer)
        case .bytes(let value): buffer.append(contentsOf: value)
        case .uuid(let value):
            withUnsafeBytes(of: value.uuid) { buffer.append(contentsOf: $0) }
        case .text, .jsonb, .array:
            preconditionFailure("text, JSON and arrays have no scalar binary form here")
        }
    }

    /// UTF-8 bytes of text, refused when they hold a NUL.
    private static func appendText(_ text: String, to buffer: inout [UInt8]) throws(PostgresEncodingFailure) {
        let start = buffer.count
        buffer.append(contentsOf: text.utf8)
        if buffer[start...].contains(0) { throw PostgresEncodingFailure() }
    }

    private static func appendInteger<T: FixedWidthInteger>(_ value: T, to buffer: inout [UInt8]) {
        withUnsafeBytes(of: value.bigEndian) { buffer.append(contentsOf: $0) }
    }
}

extension PostgresData: ExpressibleByStringInterpolation {
    public init(stringLiteral value: String) { self = .text(value) }
}

extension PostgresData: ExpressibleByIntegerLiteral {
    public init(integerLiteral value: Int64) { self = .int(value) }
}

extension PostgresData: ExpressibleByFloatLiteral {
    public init(floatLiteral value: Double) { self = .double(value) }
}

extension PostgresData: ExpressibleByBooleanLiteral {
    public init(booleanLiteral value: Bool) { self = .bool(value) }
}

/// A Swift value that can be sent as a statement parameter.
public protocol PostgresEncodable {
    /// The parameter representation of this value.
    var postgresData: PostgresData { get }
}

extension Optional where Wrapped == PostgresData {
    /// Wraps an optional value: `nil` becomes SQL NULL.
    public init(_ value: (some PostgresEncodable)?) { self = value.map { $0.postgresData } }
}

extension PostgresData: PostgresEncodable {
    public var postgresData: PostgresData { self }
}

extension String: PostgresEncodable {
    public var postgresData: PostgresData { .text(self) }
}

extension Substring: PostgresEncodable {
    public var postgresData: PostgresData { .text(String(self)) }
}

extension Int: PostgresEncodable {
    public var postgresData: PostgresData { .int(Int64(self)) }
}

extension Int64: PostgresEncodable {
    public var postgresData: PostgresData { .int(self) }
}

extension Int32: PostgresEncodable {
    public var postgresData: PostgresData { .int(Int64(self)) }
}

extension Double: PostgresEncodable {
    public var postgresData: PostgresData { .double(self) }
}

extension Bool: PostgresEncodable {
    public var postgresData: PostgresData { .bool(self) }
}

extension Date: PostgresEncodable {
    public var postgresData: PostgresData { .date(self) }
}

extension Data: PostgresEncodable {
    public var postgresData: PostgresData { .bytes(self) }
}

extension UUID: PostgresEncodable {
    public var postgresData: PostgresData { .uuid(self) }
}

/// bytea hex format: `\x` followed by two lowercase hex digits per byte.
enum PostgresHex {
    private static let digits = Array("0123456789abcdef".utf8)

    static func encode(_ data: Data) -> String {
        var bytes: [UInt8] = [UInt8(ascii: "\\"), UInt8(ascii: "x")]
        bytes.reserveCapacity(2 + data.count * 2)
        for byte in data {
            bytes.append(digits[Int(byte >> 4)])
            bytes.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Decodes `\x…` hex output; returns nil for anything else (e.g. the legacy escape format).
    static func decode(_ text: String) -> Data? {
        let utf8 = Array(text.utf8)
        guard utf8.count >= 2, utf8[0] == UInt8(ascii: "\\"), utf8[1] == UInt8(ascii: "x"),
            utf8.count % 2 == 0
        else { return nil }
        var data = Data(capacity: (utf8.count - 2) / 2)
        var index = 2
        while index < utf8.count {
            guard let high = nibble(utf8[index]), let low = nibble(utf8[index + 1]) else { return nil }
            data.append(high << 4 | low)
            index += 2
        }
        return data
    }

    private static func nibble(_ character: UInt8) -> UInt8? {
        switch character {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): character - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): character - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): character - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

/// Timestamps in PostgreSQL's ISO text form, computed with integer calendar arithmetic (proleptic
/// Gregorian, UTC) so no formatter or locale is involved.
enum PostgresTimestamp {
    /// `2024-05-06T07:08:09.123456Z`, rounded to the microsecond.
    static func format(_ date: Date) -> String {
        let micros = Int64((date.timeIntervalSince1970 * 1_000_000).rounded())
        let (seconds, fraction) = floorDivide(micros, 1_000_000)
        let (days, secondOfDay) = floorDivide(seconds, 86_400)
        let (year, month, day) = civil(fromDays: days)
        let yearText = year < 0 ? String(year) : pad(year, 4)
        return "\(yearText)-\(pad(month, 2))-\(pad(day, 2))T\(pad(secondOfDay / 3600, 2)):"
            + "\(pad(secondOfDay / 60 % 60, 2)):\(pad(secondOfDay % 60, 2)).\(pad(fraction, 6))Z"
    }

    /// Parses `YYYY-MM-DD[ HH:MM:SS[.ffffff]][±HH[:MM[:SS]]]` (also with `T`); no offset means UTC.
    static func parse(_ text: String) -> Date? {
        var scanner = Scanner(Array(text.utf8))
        guard let year = scanner.number(minDigits: 4, maxDigits: 7), scanner.skip("-"),
            let month = scanner.number(minDigits: 2, maxDigits: 2), scanner.skip("-"),
            let day = scanner.number(minDigits: 2, maxDigits: 2), (1...12).contains(month),
            (1...31).contains(day)
        else { return nil }
        var seconds = days(fromYear: year, month: month, day: day) * 86_400
        var micros: Int64 = 0
        if scanner.skip(" ") || scanner.skip("T") {
            guard let hour = scanner.number(minDigits: 2, maxDigits: 2), scanner.skip(":"),
                let minute = scanner.number(minDigits: 2, maxDigits: 2), scanner.skip(":"),
                let second = scanner.number(minDigits: 2, maxDigits: 2), hour <= 24, minute < 60,
                second <= 60
            else { return nil }
            seconds += hour * 3600 + minute * 60 + second
            if scanner.skip(".") {
                let start = scanner.position
                guard let fraction = scanner.number(minDigits: 1, maxDigits: 9) else { return nil }
                var digits = scanner.position - start
                var value = fraction
                while digits < 6 {
                    value *= 10
                    digits += 1
                }
                while digits > 6 {
                    value /= 10
                    digits -= 1
                }
                micros = value
            }
            if scanner.peek == UInt8(ascii: "+") || scanner.peek == UInt8(ascii: "-") {
                let sign: Int64 = scanner.skip("-") ? -1 : 1
                _ = scanner.skip("+")
                guard let offsetHours = scanner.number(minDigits: 2, maxDigits: 2) else { return nil }
                var offset = offsetHours * 3600
                if scanner.skip(":") {
                    guard let offsetMinutes = scanner.number(minDigits: 2, maxDigits: 2) else { return nil }
                    offset += offsetMinutes * 60
                    if scanner.skip(":") {
                        guard let offsetSeconds = scanner.number(minDigits: 2, maxDigits: 2) else {
                            return nil
                        }
                        offset += offsetSeconds
                    }
                }
                seconds -= sign * offset
            } else if scanner.skip("Z") {
                // UTC.
            }
        }
        guard scanner.atEnd else { return nil }
        return Date(timeIntervalSince1970: Double(seconds) + Double(micros) / 1_000_000)
    }

    private static func pad(_ value: Int64, _ width: Int) -> String {
        let digits = String(value)
        return digits.count >= width ? digits : String(repeating: "0", count: width - digits.count) + digits
    }

    private static func floorDivide(_ value: Int64, _ divisor: Int64) -> (Int64, Int64) {
        let quotient = value >= 0 ? value / divisor : -((-value + divisor - 1) / divisor)
        return (quotient, value - quotient * divisor)
    }

    /// Days since 1970-01-01 for a civil date (era-based algorithm, 400-year cycles).
    private static func days(fromYear year: Int64, month: Int64, day: Int64) -> Int64 {
        let y = month <= 2 ? year - 1 : year
        let era = floorDivide(y, 400).0
        let yearOfEra = y - era * 400
        let monthIndex = month > 2 ? month - 3 : month + 9
        let dayOfYear = (153 * monthIndex + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }

    /// The inverse of `days(fromYear:month:day:)`.
    private static func civil(fromDays count: Int64) -> (Int64, Int64, Int64) {
        let shifted = count + 719_468
        let era = floorDivide(shifted, 146_097).0
        let dayOfEra = shifted - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthIndex = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthIndex + 2) / 5 + 1
        let month = monthIndex < 10 ? monthIndex + 3 : monthIndex - 9
        return (yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }

    private struct Scanner {
        let bytes: [UInt8]
        var position = 0

        init(_ bytes: [UInt8]) { self.bytes = bytes }

        var atEnd: Bool { position == bytes.count }
        var peek: UInt8? { position < bytes.count ? bytes[position] : nil }

        mutating func skip(_ character: Unicode.Scalar) -> Bool {
            guard peek == UInt8(ascii: character) else { return false }
            position += 1
            return true
        }

        mutating func number(minDigits: Int, maxDigits: Int) -> Int64? {
            var value: Int64 = 0
            var count = 0
            while count < maxDigits, let byte = peek, byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") {
                value = value * 10 + Int64(byte - UInt8(ascii: "0"))
                position += 1
                count += 1
            }
            return count >= minDigits ? value : nil
        }
    }
}
