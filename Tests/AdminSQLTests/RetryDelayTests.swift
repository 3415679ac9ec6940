import Foundation
import Postgres
import QueueConsumer
import Receiver
import ServiceSupport
import TestSupport
import Testing

/// siwa.retry_delay, the one retry schedule in SQL: base × 2^(attempt − 1), at most cap, times [½, 1).
@Suite("The retry schedule siwa.retry_delay")
struct RetryDelayTests {
    /// min, max and the expected bound least(cap, base × 2^(n − 1)) per attempt n, in seconds, over
    /// `samples` draws each, computed by the schema's function on `connection`.
    func spread(
        _ connection: PostgresConnection, attempts: ClosedRange<Int>, base: String, cap: String,
        samples: Int = 1000
    ) throws -> [(attempt: Int, min: Double, max: Double, bound: Double)] {
        try connection.query(
            """
            SELECT n, min(d), max(d), least(date_part('epoch', $3::interval),
                                          date_part('epoch', $2::interval) * 2 ^ least(n - 1, 1000))
              FROM (SELECT n, date_part('epoch', siwa.retry_delay(n, $2::interval, $3::interval)) AS d
                      FROM generate_series($1::integer, $4::integer) AS n, generate_series(1, $5::integer) AS s) AS x
             GROUP BY n ORDER BY n
            """,
            [
                .text(String(attempts.lowerBound)), .text(base), .text(cap),
                .text(String(attempts.upperBound)),
                .text(String(samples)),
            ]
        ).map { row in
            (
                try row[0, as: Int.self], try row[1, as: Double.self], try row[2, as: Double.self],
                try row[3, as: Double.self]
            )
        }
    }

    @Test(
        "1000 draws per attempt lie in [bound / 2, bound], bound = least(cap, base × 2^(attempt − 1)), jittered"
    )
    func bounds() throws {
        let database = try TestDatabase()
        let worker = try database.connect(asMemberOf: "siwa_worker")  // the role that calls it
        defer { worker.close() }
        // The notifications' schedule (cap 1 hour) and an endpoint's backoff (5 s, cap 3600 s).
        for (base, cap) in [
            ("1 second", "1 hour"), ("5 seconds", "3600 seconds"), ("250 milliseconds", "1 hour"),
        ] {
            let rows = try spread(worker, attempts: 1...16, base: base, cap: cap)
            #expect(rows.count == 16)
            for row in rows {
                let context = "\(base), \(cap), attempt \(row.attempt)"
                #expect(row.min >= row.bound / 2, "\(context): \(row.min)")
                #expect(row.max <= row.bound, "\(context): \(row.max)")
                // Jitter: 1000 draws spread over most of [½, 1).
                #expect(row.min < row.bound * 0.55 && row.max > row.bound * 0.95, "\(context)")
            }
            #expect(rows.last?.bound == 3600)  // capped by attempt 16 in all three
        }
    }

    @Test("an attempt below 1 counts as 1; huge attempts stay at the cap without overflowing")
    func extremes() throws {
        let database = try TestDatabase()
        let owner = try database.connect()
        defer { owner.close() }
        let rows = try spread(
            owner, attempts: 2_147_483_600...2_147_483_647, base: "1 millisecond", cap: "1 hour", samples: 20)
        for row in rows {
            #expect(row.min >= 1800 && row.max <= 3600, "attempt \(row.attempt)")
        }
        // A cap far above base: still base × 2^(attempt − 1) while below it (no early exponent limit).
        let far = try database.query(
            "SELECT date_part('epoch', siwa.retry_delay(41, '1 microsecond', '100 years'))")[0][
                0, as: Double.self]
        #expect(far >= 1e-6 * pow(2, 40) / 2 && far <= 1e-6 * pow(2, 40))
        let capped = try database.query(
            "SELECT date_part('epoch', siwa.retry_delay(2147483647, '1 microsecond', '100 years'))")[0][
                0, as: Double.self]
        let century = try database.query("SELECT date_part('epoch', interval '100 years')")[0][
            0, as: Double.self]
        #expect(capped >= century / 2 && capped <= century)
        for attempt in [0, -1, Int(Int32.min)] {
            let delay = try database.query(
                "SELECT date_part('epoch', siwa.retry_delay($1::integer, '2 seconds', '1 hour'))",
                [.text(String(attempt))])[0][0, as: Double.self]
            #expect(delay >= 1 && delay <= 2, "attempt \(attempt)")
        }
    }

    @Test(
        "Swift's RetrySchedule and siwa.retry_delay are one schedule: every draw of the SQL lies under Swift's ceiling"
    )
    func swiftAgrees() throws {
        let database = try TestDatabase()
        for (base, cap) in [
            (Duration.seconds(1), Duration.seconds(3600)), (.milliseconds(250), .seconds(600)),
        ] {
            let schedule = RetrySchedule(base: base, maximum: cap)
            let rows = try spread(
                database.connection, attempts: 1...70, base: "\(base.inSeconds) seconds",
                cap: "\(cap.inSeconds) seconds", samples: 200)
            for row in rows {
                let ceiling = schedule.ceiling(afterAttempt: row.attempt).inSeconds
                #expect(
                    abs(row.bound - ceiling) <= ceiling * 1e-9,
                    "attempt \(row.attempt): \(row.bound) vs \(ceiling)")
                #expect(row.min >= ceiling / 2 && row.max <= ceiling, "attempt \(row.attempt)")
                let swift = (0..<200).map { _ in schedule.delay(afterAttempt: row.attempt).inSeconds }
                #expect(swift.allSatisfy { $0 >= ceiling / 2 && $0 <= ceiling }, "attempt \(row.attempt)")
            }
        }
    }
}
