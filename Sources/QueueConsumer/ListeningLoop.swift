public import Postgres
public import ServiceSupport

extension ConsumerLoop where Connection == PostgresConnection {
    /// The loop of a consumer that calls out (the revoker, a webhook lane): a connection of its own that
    /// LISTENs on `channel`, a wait for its NOTIFYs that the stop signal ends at once, and each database
    /// failure logged as the warning `message` with the SQLSTATE (or the library's code), the reason a
    /// connection was refused, the delay before the next try, and `fields`.
    public static func listening(
        on channel: String, database: PostgresConfiguration, state: ConsumerLoopState, stop: StopSignal,
        logger: Logger, failure message: String, fields: [String: Logger.Value] = [:],
        drain: @escaping (PostgresConnection) throws -> Duration?
    ) -> ConsumerLoop {
        ConsumerLoop(
            state: state, stop: stop,
            connect: { try PostgresConnection.listening(on: channel, configuration: database) },
            drain: drain,
            wait: { connection, timeout in
                _ = try connection.waitForNotifications(timeout: timeout, wakeDescriptor: stop.wakeDescriptor)
            },
            close: { $0.close() },
            failed: { error, retry in
                let error = error as? PostgresError
                var logged = fields
                logged["error"] = .string(error.map { $0.sqlState ?? $0.code.description } ?? "unknown")
                logged["retry_in_ms"] = .int(Int(retry.wholeMilliseconds))
                if let reason = error?.connectionFailureReason { logged["reason"] = .string(reason) }
                logger.warning(message, logged)
            })
    }
}
