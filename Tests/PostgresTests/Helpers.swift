import Foundation
import Postgres
import TestSupport

/// A connection to a fresh database of the shared cluster.
func freshConnection(applying sql: String? = nil) throws -> PostgresConnection {
    try PostgresConnection(configuration: PostgresCluster.shared.createDatabase(applying: sql))
}

/// Runs `body` on `count` new threads and waits for all of them (bounded by `timeout`).
/// Returns false if they did not all finish in time.
func onThreads(_ count: Int, timeout: Duration = .seconds(60), _ body: @escaping @Sendable (Int) -> Void)
    -> Bool
{
    let group = DispatchGroup()
    for index in 0..<count {
        group.enter()
        Thread {
            body(index)
            group.leave()
        }.start()
    }
    return group.wait(timeout: .now() + .milliseconds(Int(timeout.components.seconds) * 1000)) == .success
}

/// Captures the error a throwing expression ends with, as a `PostgresError`.
func postgresError(_ body: () throws -> Void) -> PostgresError? {
    do {
        try body()
        return nil
    } catch let error as PostgresError {
        return error
    } catch {
        return PostgresError(code: .queryFailed, message: "unexpected non-Postgres error: \(error)")
    }
}
