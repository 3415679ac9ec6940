import Foundation
import Postgres

/// The bulk decision function of the SQL contract, over a pool of `siwa_mail` connections.
public struct PostgresVerdicts: Sendable {
    /// A row of `siwa.relay_mail_decisions`.
    struct Row: PostgresRowDecodable {
        static let statement = """
            SELECT ord, address, decision, reason, since FROM siwa.relay_mail_decisions($1::text[])
            """
        static let columns: PostgresColumns =
            "ord integer, address text, decision text, reason text, since timestamp with time zone"
        var ord: Int
        var verdict: Verdict

        init(row: PostgresRow) throws(PostgresError) {
            ord = try row["ord"]
            let word: String = try row["decision"]
            guard let decision = Verdict.Decision(rawValue: word) else {
                throw PostgresError(code: .decoding, message: "unknown decision word")
            }
            verdict = Verdict(decision: decision, reason: try row["reason"], since: try row["since"])
        }
    }

    private let pool: PostgresPool

    public init(pool: PostgresPool) { self.pool = pool }

    /// One verdict per element of `addresses`, in order (nil and malformed elements answer unknown).
    /// - Throws: `PostgresError`, or ``MailGateError`` when the answer breaks the contract's order.
    public func verdicts(_ addresses: [String?]) throws -> [Verdict] {
        let parameter = PostgresData.array(
            addresses.map { address in address.flatMap { $0.utf8.contains(0) ? nil : PostgresData.text($0) } }
        )
        let rows = try pool.withConnection { connection in
            try connection.rows(Row.self, [parameter])
        }
        guard rows.count == addresses.count, rows.enumerated().allSatisfy({ $0.element.ord == $0.offset + 1 })
        else {
            throw MailGateError(.databaseAnswer, "siwa.relay_mail_decisions answered out of order")
        }
        return rows.map(\.verdict)
    }
}
