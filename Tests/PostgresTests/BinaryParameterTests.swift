import Foundation
import Postgres
import Testing

/// Parameters sent in PostgreSQL's binary format (numbers, booleans, timestamps, bytes, UUIDs and
/// arrays of those or of text) arrive as the values they stand for; what stays in text format still
/// works as before.
@Suite("Binary parameters")
struct BinaryParameterTests {
    static let hostile = "O'Brien \\ \"quoted\" {a,b} NULL '; DROP TABLE items; -- 😀 Grüße ✓"

    @Test("text arrays arrive verbatim with their NULLs, including quotes, braces and the word NULL")
    func textArray() throws {
        let connection = try freshConnection()
        let values: [String?] = [Self.hostile, nil, "", "NULL", "{}", "a,b", " padded ", "日本語"]
        let rows = try connection.query(
            "SELECT s, s IS NULL FROM unnest($1::text[]) WITH ORDINALITY AS u(s, n) ORDER BY n",
            [.array(values.map { $0.map { .text($0) } })])
        #expect(try rows.map { try $0[0, as: String?.self] } == values)
        #expect(try rows.map { try $0[1, as: Bool.self] } == values.map { $0 == nil })
    }

    @Test("numbers, booleans, bytes and UUIDs arrive as the server's own values")
    func scalarArrays() throws {
        let connection = try freshConnection()
        let uuid = UUID(uuidString: "00112233-4455-6677-8899-AABBCCDDEEFF")!
        let row = try #require(
            try connection.query(
                """
                SELECT $1::int8[] = ARRAY[-9223372036854775808, 0, NULL, 9223372036854775807]::int8[],
                       $2::float8[]::text[] = ARRAY['-0.25', '1e+300', 'Infinity', '-Infinity', 'NaN', NULL],
                       $3::bool[] = ARRAY[true, NULL, false],
                       $4::bytea[] = ARRAY['\\x'::bytea, '\\x00ff00'::bytea, NULL],
                       $5::uuid[] = ARRAY['00112233-4455-6677-8899-aabbccddeeff'::uuid],
                       array_length($1::int8[], 1), array_lower($1::int8[], 1)
                """,
                [
                    .array([.int(Int64.min), .int(0), nil, .int(Int64.max)]),
                    .array([
                        .double(-0.25), .double(1e300), .double(.infinity), .double(-.infinity),
                        .double(.nan), nil,
                    ]),
                    .array([.bool(true), nil, .bool(false)]),
                    .array([.bytes(Data()), .bytes(Data([0, 0xff, 0])), nil]),
                    .array([.uuid(uuid)]),
                ]
            ).first)
        for column in 0..<5 { #expect(try row[column, as: Bool.self], "column \(column + 1)") }
        #expect(try row[5, as: Int.self] == 4)
        #expect(try row[6, as: Int.self] == 1)
    }

    @Test(
        "timestamps in arrays keep the microsecond, before and after PostgreSQL's epoch",
        arguments: [
            0.0, -86_400.5, 946_684_799.999_999, 946_684_800.0, 1_700_000_000.123_456, 4_102_444_799.999_999,
        ])
    func timestampArray(seconds: Double) throws {
        let connection = try freshConnection()
        let date = Date(timeIntervalSince1970: seconds)
        let row = try #require(
            try connection.query(
                """
                SELECT t[1] = $2::timestamptz, extract(epoch FROM t[1])::text, t[2] IS NULL
                  FROM (SELECT $1::timestamptz[] AS t) x
                """, [.array([.date(date), nil]), .text(Self.isoText(date))]
            ).first)
        let server = try row[1, as: String.self]
        #expect(try row[0, as: Bool.self], "server: \(server)")
        #expect(try row[2, as: Bool.self])
    }

    @Test("a binary text array may be cast by the statement; mixed, empty and all-NULL arrays still go")
    func castsAndTextFallback() throws {
        let connection = try freshConnection(applying: "CREATE TABLE w (s varchar(20), j jsonb)")
        #expect(
            try connection.execute(
                "INSERT INTO w (s) SELECT * FROM unnest($1::varchar[])", [.array([.text("a"), .text("b")])])
                == 2)
        #expect(
            try connection.query(
                "SELECT cardinality($1::text[]), cardinality($2::text[])", [.array([]), .array([nil, nil])]
            )
            .first.map { [try $0[0, as: Int.self], try $0[1, as: Int.self]] } == [0, 2])
        #expect(
            try connection.query("SELECT $1::text[]", [.array([.text("x"), .int(1)])]).first?[
                0, as: String.self]
                == "{x,1}")
        #expect(
            try connection.execute(
                "INSERT INTO w (j) SELECT * FROM unnest($1::jsonb[])",
                [.array([.jsonb(#"{"k": "v"}"#), nil])]) == 2)
        #expect(try connection.query("SELECT count(*) FROM w WHERE j->>'k' = 'v'")[0][0, as: Int.self] == 1)
    }

    @Test("a NUL in a text array's element is refused before anything is sent, naming the parameter only")
    func nulInTextArray() throws {
        let connection = try freshConnection()
        let error = postgresError {
            _ = try connection.query(
                "SELECT $1::int8, $2::text[]", [.int(1), .array([.text("ok"), .text("se\u{0}cret")])])
        }
        #expect(error?.code == .queryFailed)
        #expect(error?.message.contains("$2") == true)
        #expect(error?.message.contains("cret") == false)
        // The connection is still usable, and bytes may hold NUL.
        #expect(
            try connection.query("SELECT length(($1::bytea[])[1])", [.array([.bytes(Data([0, 0]))])])[0][
                0, as: Int.self]
                == 2)
    }

    @Test("the same statement runs with a binary and a text-literal array (empty) on one cached connection")
    func cachedBothWays() throws {
        let connection = try freshConnection()
        for values in [[PostgresData?](), [.int(3), .int(4)], [], [.int(5)]] {
            let sum = try connection.query(
                "SELECT coalesce(sum(x), 0) FROM unnest($1::int8[]) x", [.array(values)])
            let expected = values.reduce(0) { total, value in
                if case .int(let number)? = value { return total + Int(number) }
                return total
            }
            #expect(try sum[0][0, as: Int.self] == expected)
        }
    }

    /// The date as PostgreSQL text input, computed independently of the binary encoder.
    private static func isoText(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime]
        formatter.timeZone = TimeZone(identifier: "UTC")
        let micros = Int64((date.timeIntervalSince1970 * 1_000_000).rounded())
        let seconds = Int64((Double(micros) / 1_000_000).rounded(.down))
        let fraction = micros - seconds * 1_000_000
        let base = formatter.string(from: Date(timeIntervalSince1970: Double(seconds)))
        return String(base.dropLast()) + "." + String(format: "%06lld", fraction) + "Z"
    }
}
