import Foundation
public import Postgres
public import RelayMail

/// The bulk decision function of the SQL contract, over a pool of `siwa_mail` connections.
public struct PostgresVerdicts: Sendable {
    private let pool: PostgresPool

    public init(pool: PostgresPool) { self.pool = pool }

    /// One answer per element of `addresses`, in order (nil and malformed elements answer unknown).
    /// - Throws: `PostgresError`, or ``MailGateError`` when the answer breaks the contract's order.
    public func verdicts(_ addresses: [String?]) throws -> [RelayMailAnswer] {
        // PostgreSQL's text holds no NUL: such an element is asked as NULL (malformed).
        let asked = addresses.map { address in address.flatMap { $0.utf8.contains(0) ? nil : $0 } }
        let rows = try pool.withConnection { connection in try RelayMailGate(connection).decisions(asked) }
        guard rows.count == addresses.count, rows.enumerated().allSatisfy({ $0.element.ord == $0.offset + 1 })
        else {
            throw MailGateError(.databaseAnswer, "siwa.relay_mail_decisions answered out of order")
        }
        return rows.map(\.answer)
    }
}
