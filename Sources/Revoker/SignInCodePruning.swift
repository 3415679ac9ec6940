import Postgres
import QueueConsumer
import ServiceSupport

extension Revoker {
    /// How often the revoker forgets old sign-in codes.
    static let signInCodePruneInterval: Duration = .seconds(3600)

    /// The revoker's periodic task that forgets old sign-in codes (``pruneSignInCodes(olderThan:)``).
    var signInCodePruning: PeriodicTask<PostgresConnection> {
        PeriodicTask("sign-in code pruning", every: Self.signInCodePruneInterval) { [self] connection in
            ["sign_in_codes_pruned": try pruneSignInCodes(on: connection)]
        }
    }

    /// Forgets sign-in codes claimed over a day ago (done, or left `exchanging` by a process that died):
    /// Apple's codes expire after five minutes, so none of them can be exchanged again. Returns how many.
    @discardableResult
    public func pruneSignInCodes(olderThan age: Duration = .seconds(86400)) throws -> Int {
        let connection = try PostgresConnection(configuration: configuration.database)
        defer { connection.close() }
        return try pruneSignInCodes(on: connection, olderThan: age)
    }

    func pruneSignInCodes(on connection: PostgresConnection, olderThan age: Duration = .seconds(86400)) throws
        -> Int
    {
        try connection.value(
            RevocationQueries.pruneSignInCodes, [.double(age.inSeconds)], as: Int.self)
    }
}
