import Foundation
public import Postgres

/// What tests do on a connection that the services never do, built on `PostgresConnection`'s public
/// statements (so the library carries no test-only API).
extension PostgresConnection {
    /// Sends a notification with `SELECT pg_notify($1, $2)`; delivered when the current transaction
    /// (if any) commits.
    public func notify(_ channel: String, payload: String = "") throws {
        try query("SELECT pg_notify($1, $2)", [.text(channel), .text(payload)])
    }

    /// Stops listening on `channel` (quoted as an identifier).
    public func unlisten(_ channel: String) throws {
        try simpleQuery("UNLISTEN \"" + channel.replacingOccurrences(of: "\"", with: "\"\"") + "\"")
    }

    /// Whether the session is inside a transaction block (including one aborted by an error), asked of
    /// the server: two statements see the same transaction ID only inside one transaction.
    public var isInTransaction: Bool {
        get throws {
            do {
                let first = try query("SELECT pg_current_xact_id()::text")[0][0, as: String.self]
                let second = try query("SELECT pg_current_xact_id()::text")[0][0, as: String.self]
                return first == second
            } catch let error where error.sqlState == "25P02" {
                return true  // in failed SQL transaction: commands ignored until end of block
            }
        }
    }
}
