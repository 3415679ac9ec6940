import Postgres

/// Why a transfer run stopped: one line for the operator (never a token or an email; a database
/// failure names what was being done and PostgreSQL's message).
public struct TeamTransferError: Error, CustomStringConvertible, Sendable {
    /// The line to show.
    public var description: String

    /// An error with this line.
    public init(_ description: String) { self.description = description }
}

/// Runs `body`, turning database errors into one line naming what was being done.
func database<T>(_ what: String, _ body: () throws -> T) throws -> T {
    do {
        return try body()
    } catch let error as PostgresError {
        throw TeamTransferError("\(what) failed: \(error.message)")
    }
}

/// Checks that the transfer tables exist (schema.sql applied, version with the transfer section).
func requireTransferSchema(_ connection: PostgresConnection) throws {
    let present: Bool = try database("checking the schema") {
        try connection.query(
            "SELECT to_regclass('siwa.transfer_exports') IS NOT NULL AND to_regclass('siwa.sub_aliases') IS NOT NULL"
        )[0][0]
    }
    guard present else {
        throw TeamTransferError("the database has no siwa.transfer_exports: run 'siwactl migrate' first")
    }
}
