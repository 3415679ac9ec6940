import Foundation
import Postgres
import Testing

@Suite("Parameters and decoding")
struct ParameterTests {
    static let hostile = "O'Brien \\ \"quoted\" '; DROP TABLE items; -- 😀 Grüße ✓"

    @Test(
        "strings round trip verbatim, including quotes, backslashes and injection attempts",
        arguments: ["", "plain", hostile, "ünïcödé 日本語 🍏", "line\nbreak\ttab"])
    func stringRoundTrip(value: String) throws {
        let connection = try freshConnection(applying: "CREATE TABLE items (name text)")
        try connection.execute("INSERT INTO items (name) VALUES ($1)", [.text(value)])
        let rows = try connection.query("SELECT name FROM items")
        #expect(rows.count == 1)
        #expect(try rows[0][0, as: String.self] == value)
        #expect(
            try connection.query("SELECT count(*) FROM items WHERE name = $1", [.text(value)])[0][
                0, as: Int.self] == 1)
    }

    @Test("array parameters unnest into rows, with NULLs and hostile strings intact")
    func arrayParameters() throws {
        let connection = try freshConnection(applying: "CREATE TABLE a (s text, n int8, t timestamptz)")
        let date = Date(timeIntervalSince1970: 1_700_000_000.5)
        let strings: [PostgresData?] = [.text(Self.hostile), nil, .text(""), .text("NULL"), .text("{a,b}")]
        let numbers: [PostgresData?] = [1, 2, nil, 4, 5]
        let dates: [PostgresData?] = [.date(date), .date(date), .date(date), nil, .date(date)]
        let inserted = try connection.execute(
            "INSERT INTO a SELECT * FROM unnest($1::text[], $2::int8[], $3::timestamptz[])",
            [.array(strings), .array(numbers), .array(dates)])
        #expect(inserted == 5)
        let rows = try connection.query("SELECT s, n, t FROM a ORDER BY n NULLS LAST")
        #expect(try rows.map { try $0[0, as: String?.self] } == [Self.hostile, nil, "NULL", "{a,b}", ""])
        #expect(try rows[0][2, as: Date?.self] == date)
        #expect(try rows[2][2, as: Date?.self] == nil)
    }

    @Test("every parameter type round trips through a typed column")
    func typedRoundTrip() throws {
        let connection = try freshConnection(
            applying: """
                CREATE TABLE v (i int8, i4 int4, d float8, b bool, t timestamptz, by bytea, u uuid, j jsonb, s text)
                """)
        let date = Date(timeIntervalSince1970: 1_700_000_000.123456)
        let bytes = Data([0, 1, 2, 0xfe, 0xff, 0x27, 0x5c])
        let uuid = UUID()
        try connection.execute(
            "INSERT INTO v VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            [
                PostgresData(Int.max), PostgresData(Int32(-7)), PostgresData(-1.5e-7), PostgresData(true),
                PostgresData(date), PostgresData(bytes), PostgresData(uuid), .jsonb(#"{"a": [1, "x'y"]}"#),
                "literal",
            ])
        let row = try #require(try connection.query("SELECT * FROM v").first)
        #expect(try row["i", as: Int.self] == Int.max)
        #expect(try row["i4", as: Int32.self] == -7)
        #expect(try row["d", as: Double.self] == -1.5e-7)
        #expect(try row["b", as: Bool.self] == true)
        let decodedDate = try row["t", as: Date.self]
        #expect(abs(decodedDate.timeIntervalSince1970 - date.timeIntervalSince1970) < 0.000_001)
        #expect(try row["by", as: Data.self] == bytes)
        #expect(try row["u", as: UUID.self] == uuid)
        #expect(try row["j", as: String.self] == #"{"a": [1, "x'y"]}"#)
        #expect(try row["j", as: Data.self] == Data(#"{"a": [1, "x'y"]}"#.utf8))
        #expect(try row["s", as: String.self] == "literal")
    }

    @Test("NULL parameters store NULL and optional decoding returns nil")
    func nulls() throws {
        let connection = try freshConnection(applying: "CREATE TABLE n (a int8, b text, c timestamptz)")
        try connection.execute("INSERT INTO n VALUES ($1, $2, $3)", [nil, nil, PostgresData?(Date?.none)])
        let row = try #require(try connection.query("SELECT a, b, c, a IS NULL AS isnull FROM n").first)
        #expect(try row["a", as: Int?.self] == nil)
        #expect(try row["b", as: String?.self] == nil)
        #expect(try row["c", as: Date?.self] == nil)
        #expect(try row["isnull", as: Bool.self])
        #expect(postgresError { _ = try row["a", as: Int.self] }?.code == .decoding)
    }

    @Test(
        "special doubles and dates far from now round trip",
        arguments: [0.0, -0.25, 1e300, .infinity, -.infinity])
    func doubles(value: Double) throws {
        let connection = try freshConnection()
        let row = try #require(try connection.query("SELECT $1::float8", [.double(value)]).first)
        #expect(try row[0, as: Double.self] == value)
    }

    @Test(
        "dates round trip at microsecond precision",
        arguments: [0.0, -86_400.5, 951_782_400.000_001, 4_102_444_799.999_999, -2_208_988_800.0])
    func dates(seconds: Double) throws {
        let connection = try freshConnection()
        let date = Date(timeIntervalSince1970: seconds)
        let row = try #require(
            try connection.query("SELECT $1::timestamptz, $1::timestamptz::text", [.date(date)]).first)
        let decoded = try row[0, as: Date.self]
        let text = try row[1, as: String.self]
        #expect(abs(decoded.timeIntervalSince1970 - seconds) < 0.000_001, "server text: \(text)")
    }

    @Test("decodes server-side values of several types")
    func serverValues() throws {
        let connection = try freshConnection()
        let row = try #require(
            try connection.query(
                """
                SELECT 42::int2 AS small, 't'::bool AS yes, '\\x00ff'::bytea AS blob,
                       '2024-02-29 12:34:56.5+02'::timestamptz AS moment, '{"k":1}'::json AS doc,
                       3.25::numeric AS num
                """
            ).first)
        #expect(try row["small", as: Int.self] == 42)
        #expect(try row["yes", as: Bool.self])
        #expect(try row["blob", as: Data.self] == Data([0, 255]))
        #expect(try row["moment", as: Date.self] == Date(timeIntervalSince1970: 1_709_202_896.5))
        #expect(try row["doc", as: String.self] == #"{"k":1}"#)
        #expect(try row["num", as: Double.self] == 3.25)
    }

    @Test("a decode mismatch throws a decoding error naming the column, not the value")
    func decodeMismatch() throws {
        let connection = try freshConnection()
        let row = try #require(try connection.query("SELECT 'secret-token-value' AS word").first)
        let error = postgresError { _ = try row["word", as: Int.self] }
        #expect(error?.code == .decoding)
        #expect(error?.message.contains("word") == true)
        #expect(error?.message.contains("secret-token-value") == false)
        #expect(postgresError { _ = try row["missing", as: String.self] }?.code == .decoding)
        #expect(postgresError { _ = try row[5, as: String.self] }?.code == .decoding)
        #expect(postgresError { _ = try row[0, as: Date.self] }?.code == .decoding)
        #expect(postgresError { _ = try row[0, as: UUID.self] }?.code == .decoding)
    }

    @Test("rows iterate in order")
    func iteration() throws {
        let connection = try freshConnection()
        let rows = try connection.query("SELECT g FROM generate_series(1, 5) AS g")
        #expect(rows.count == 5)
        #expect(rows.columns == ["g"])
        var seen: [Int] = []
        for row in rows { seen.append(try row[0, as: Int.self]) }
        #expect(seen == [1, 2, 3, 4, 5])
    }
}
