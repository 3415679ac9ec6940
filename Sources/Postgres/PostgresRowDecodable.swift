/// A typed row of one statement's result: the statement, the columns it returns and the decoding, side by
/// side, so that the SQL↔Swift boundary is one type per result and not positions scattered over callers.
///
/// `TypedRowCatalogTests` describes every conforming type's `statement` on a freshly migrated database and
/// compares the columns, names and types, with ``columns``; ``PostgresRows/decode(_:)`` checks the names
/// of each result it decodes, so a binary run against a schema whose result changed fails with the cause.
public protocol PostgresRowDecodable: Sendable {
    /// The statement whose rows this type reads (with `$1…$n` parameters).
    static var statement: String { get }
    /// The columns `statement` returns, in order, as PostgreSQL names their types, e.g.
    /// `"id bigint, jti text, seen_at timestamp with time zone"` (`pg_get_function_result` without TABLE()).
    static var columns: PostgresColumns { get }
    /// Decodes one row, its cells read by position (in the order of ``columns``) or by name.
    init(row: PostgresRow) throws(PostgresError)
}

/// The columns of a result: names and type names (`format_type`), parsed from `"name type, …"`.
public struct PostgresColumns: Sendable, Equatable, CustomStringConvertible, ExpressibleByStringLiteral {
    /// Column names, in order.
    public let names: [String]
    /// Type names as `format_type` prints them (`bigint`, `text`, `timestamp with time zone`, …).
    public let types: [String]

    /// Parses `"name type, name type"`; the first word of each item is the name, the rest its type.
    public init(stringLiteral text: String) {
        var names: [String] = []
        var types: [String] = []
        for item in text.split(separator: ",") {
            let words = item.split(separator: " ", omittingEmptySubsequences: true)
            names.append(words.first.map(String.init) ?? "")
            types.append(words.dropFirst().joined(separator: " "))
        }
        self.names = names
        self.types = types
    }

    /// Columns from parallel lists of names and type names.
    public init(names: [String], types: [String]) {
        self.names = names
        self.types = types
    }

    /// `name type, name type`, as declared.
    public var description: String {
        zip(names, types).map { "\($0) \($1)" }.joined(separator: ", ")
    }
}

extension PostgresRows {
    /// Decodes every row as `T`, after checking that the result's column names are those `T` declares.
    /// - Throws: `.decoding` naming both column lists when they differ, or a cell's decoding error.
    public func decode<T: PostgresRowDecodable>(_ type: T.Type) throws(PostgresError) -> [T] {
        guard columns == T.columns.names else {
            throw PostgresError(
                code: .decoding,
                message:
                    "\(T.self) reads columns (\(T.columns.names.joined(separator: ", "))) but the result has "
                    + "(\(columns.joined(separator: ", "))): is the schema the one this build expects?")
        }
        var decoded: [T] = []
        decoded.reserveCapacity(count)
        for row in self { decoded.append(try T(row: row)) }
        return decoded
    }
}

extension PostgresConnection {
    /// The single value `sql` returns: one row of one column, decoded as `T` (an Optional for NULL).
    /// - Throws: `.decoding` when the result is not one row of one column, or the cell's decoding error.
    public func value<T: PostgresDecodable>(
        _ sql: String, _ parameters: [PostgresData?] = [], as type: T.Type = T.self
    ) throws(PostgresError) -> T {
        let rows = try query(sql, parameters)
        guard rows.count == 1, rows.columns.count == 1 else {
            throw PostgresError(
                code: .decoding,
                message: "expected one value, got \(rows.count) row(s) of \(rows.columns.count) column(s)")
        }
        return try rows[0][0, as: T.self]
    }

    /// The value in the first row of `sql`'s one column, or nil when it returns no row.
    /// - Throws: `.decoding` when the result has more than one column, or the cell's decoding error.
    public func firstValue<T: PostgresDecodable>(
        _ sql: String, _ parameters: [PostgresData?] = [], as type: T.Type = T.self
    ) throws(PostgresError) -> T? {
        let rows = try query(sql, parameters)
        guard rows.columns.count == 1 else {
            throw PostgresError(code: .decoding, message: "expected one column, got \(rows.columns.count)")
        }
        return try rows.first?[0, as: T.self]
    }

    /// Runs `T.statement` with `parameters` and decodes its rows as `T`.
    public func rows<T: PostgresRowDecodable>(
        _ type: T.Type, _ parameters: [PostgresData?] = []
    ) throws(PostgresError) -> [T] {
        try query(T.statement, parameters).decode(T.self)
    }
}
