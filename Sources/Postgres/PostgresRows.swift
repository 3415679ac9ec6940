public import Foundation

/// The rows of one statement's result, copied out of libpq (text format) so they outlive the
/// connection and can be passed between threads.
public struct PostgresRows: Sequence, Sendable {
    /// Column names, in order.
    public let columns: [String]
    /// Column type OIDs, in order (e.g. 25 = text, 20 = int8, 1184 = timestamptz).
    public let columnTypes: [UInt32]
    /// Rows affected by INSERT/UPDATE/DELETE/MERGE/… (or returned by SELECT), from the command tag.
    public let affectedRows: Int
    /// The command tag, e.g. `INSERT 0 1`.
    public let commandTag: String
    private let values: [String?]
    private let index: ColumnIndex

    init(columns: [String], columnTypes: [UInt32], values: [String?], affectedRows: Int, commandTag: String) {
        self.columns = columns
        self.columnTypes = columnTypes
        self.values = values
        self.affectedRows = affectedRows
        self.commandTag = commandTag
        self.index = ColumnIndex(columns)
    }

    /// The number of rows.
    public var count: Int { columns.isEmpty ? 0 : values.count / columns.count }

    /// True when there are no rows.
    public var isEmpty: Bool { count == 0 }

    /// The first row, if any.
    public var first: PostgresRow? { isEmpty ? nil : self[0] }

    /// The row at `position` (0-based).
    public subscript(position: Int) -> PostgresRow {
        precondition(position >= 0 && position < count, "row index out of range")
        let width = columns.count
        return PostgresRow(
            values: values[position * width..<(position + 1) * width], columnTypes: columnTypes,
            index: index)
    }

    public func makeIterator() -> Iterator { Iterator(rows: self) }

    /// Iterates the rows in order.
    public struct Iterator: IteratorProtocol {
        let rows: PostgresRows
        var position = 0

        public mutating func next() -> PostgresRow? {
            guard position < rows.count else { return nil }
            defer { position += 1 }
            return rows[position]
        }
    }
}

/// Column name lookup shared by all rows of a result.
final class ColumnIndex: Sendable {
    let names: [String]
    let positions: [String: Int]

    init(_ names: [String]) {
        self.names = names
        var positions: [String: Int] = [:]
        for (position, name) in names.enumerated() where positions[name] == nil { positions[name] = position }
        self.positions = positions
    }
}

/// One result row. Decode cells with `row[0, as: Int.self]` or `row["email", as: String?.self]`.
public struct PostgresRow: Sendable {
    let values: ArraySlice<String?>
    let columnTypes: [UInt32]
    let index: ColumnIndex

    /// Column names, in order.
    public var columns: [String] { index.names }

    /// The raw text of a cell (nil for NULL), by position.
    public func text(at column: Int) throws(PostgresError) -> String? { try cell(at: column).text }

    /// Decodes the cell at `column` (0-based) as `type`.
    /// - Throws: `.decoding` for a NULL into a non-optional type, a malformed value or a bad index.
    public subscript<T: PostgresDecodable>(column: Int, as type: T.Type = T.self) -> T {
        get throws(PostgresError) { try T.decode(from: cell(at: column)) }
    }

    /// Decodes the cell in the column named `name` as `type`.
    /// - Throws: `.decoding` for an unknown column, a NULL into a non-optional type or a malformed value.
    public subscript<T: PostgresDecodable>(name: String, as type: T.Type = T.self) -> T {
        get throws(PostgresError) {
            guard let position = index.positions[name] else {
                throw PostgresError(code: .decoding, message: "no column named \"\(name)\" in the result")
            }
            return try T.decode(from: cell(at: position))
        }
    }

    private func cell(at column: Int) throws(PostgresError) -> PostgresCell {
        guard column >= 0 && column < index.names.count else {
            throw PostgresError(
                code: .decoding, message: "column \(column) out of range (\(index.names.count) columns)")
        }
        return PostgresCell(
            text: values[values.startIndex + column], typeOID: columnTypes[column],
            column: index.names[column])
    }
}

/// One cell as received: its text (nil for NULL), its type OID and its column name.
public struct PostgresCell: Sendable {
    /// The value in the server's text output format, or nil for SQL NULL.
    public let text: String?
    /// The column's type OID.
    public let typeOID: UInt32
    /// The column's name, for error messages.
    public let column: String

    /// A decoding error naming the column and the expected type, not the value.
    public func mismatch(_ expected: String) -> PostgresError {
        if text == nil {
            return PostgresError(
                code: .decoding,
                message: "column \"\(column)\" is NULL; decode it as an Optional to accept NULL")
        }
        return PostgresError(
            code: .decoding,
            message: "column \"\(column)\" (type oid \(typeOID)) cannot be decoded as \(expected)")
    }

    /// The text of a non-NULL cell, or a decoding error.
    public func requireText(as expected: String) throws(PostgresError) -> String {
        guard let text else { throw mismatch(expected) }
        return text
    }
}

/// A Swift type that can be decoded from a result cell in text format.
public protocol PostgresDecodable {
    /// Decodes `cell`; throws `.decoding` when the value does not fit.
    static func decode(from cell: PostgresCell) throws(PostgresError) -> Self
}

extension Optional: PostgresDecodable where Wrapped: PostgresDecodable {
    /// NULL decodes as `nil`; anything else as `Wrapped`.
    public static func decode(from cell: PostgresCell) throws(PostgresError) -> Wrapped? {
        guard cell.text != nil else { return nil }
        return try Wrapped.decode(from: cell)
    }
}

extension String: PostgresDecodable {
    /// Any non-NULL value as its text (including `json`, `uuid`, numerics).
    public static func decode(from cell: PostgresCell) throws(PostgresError) -> String {
        try cell.requireText(as: "String")
    }
}

extension Int: PostgresDecodable {
    public static func decode(from cell: PostgresCell) throws(PostgresError) -> Int {
        guard let value = Int(try cell.requireText(as: "Int")) else { throw cell.mismatch("Int") }
        return value
    }
}

extension Int64: PostgresDecodable {
    public static func decode(from cell: PostgresCell) throws(PostgresError) -> Int64 {
        guard let value = Int64(try cell.requireText(as: "Int64")) else { throw cell.mismatch("Int64") }
        return value
    }
}

extension Int32: PostgresDecodable {
    public static func decode(from cell: PostgresCell) throws(PostgresError) -> Int32 {
        guard let value = Int32(try cell.requireText(as: "Int32")) else { throw cell.mismatch("Int32") }
        return value
    }
}

extension Double: PostgresDecodable {
    public static func decode(from cell: PostgresCell) throws(PostgresError) -> Double {
        let text = try cell.requireText(as: "Double")
        switch text {
        case "NaN": return .nan
        case "Infinity": return .infinity
        case "-Infinity": return -.infinity
        default:
            guard let value = Double(text) else { throw cell.mismatch("Double") }
            return value
        }
    }
}

extension Bool: PostgresDecodable {
    public static func decode(from cell: PostgresCell) throws(PostgresError) -> Bool {
        switch try cell.requireText(as: "Bool") {
        case "t", "true": return true
        case "f", "false": return false
        default: throw cell.mismatch("Bool")
        }
    }
}

extension Date: PostgresDecodable {
    /// `timestamptz`, `timestamp` (taken as UTC) or `date`, in ISO output style.
    public static func decode(from cell: PostgresCell) throws(PostgresError) -> Date {
        guard let date = PostgresTimestamp.parse(try cell.requireText(as: "Date")) else {
            throw cell.mismatch("Date")
        }
        return date
    }
}

extension Data: PostgresDecodable {
    /// `bytea` (hex output) as its bytes; any other type (e.g. `json`, `text`) as its UTF-8 text.
    public static func decode(from cell: PostgresCell) throws(PostgresError) -> Data {
        let text = try cell.requireText(as: "Data")
        guard cell.typeOID == 17 else { return Data(text.utf8) }
        guard let data = PostgresHex.decode(text) else { throw cell.mismatch("Data") }
        return data
    }
}

extension UUID: PostgresDecodable {
    public static func decode(from cell: PostgresCell) throws(PostgresError) -> UUID {
        guard let value = UUID(uuidString: try cell.requireText(as: "UUID")) else {
            throw cell.mismatch("UUID")
        }
        return value
    }
}
