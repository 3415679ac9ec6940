public import Postgres
import QueueConsumer
public import ServiceSupport

/// siwa-worker's auth adapter lanes kept in step with `siwa.auth_adapters`: an ``AuthAdapterDispatcher``
/// with a lane per enabled adapter, replaced when an adapter is added, removed, enabled or disabled.
///
/// One connection of its own reads the enabled adapters every ``refresh``. A replaced dispatcher is
/// stopped first: its calls in hand finish and are recorded (or left to their leases), so no row is
/// called twice at once; the new lanes claim what is due.
public final class AuthAdapterService: Sendable {
    /// How often the enabled adapters are read.
    public let refresh: Duration
    private let database: PostgresConfiguration
    private let makeDispatcher: @Sendable ([AuthAdapterDispatcher.Adapter]) throws -> AuthAdapterDispatcher
    private let logger: Logger
    private let stopSignal = StopSignal()

    /// A service reading `database` (the role needs `siwa_worker`) every `refresh`; `makeDispatcher`
    /// builds the lanes for a set of adapters.
    public init(
        database: PostgresConfiguration, refresh: Duration = .seconds(5), logger: Logger,
        makeDispatcher: @escaping @Sendable ([AuthAdapterDispatcher.Adapter]) throws -> AuthAdapterDispatcher
    ) {
        self.database = database
        self.refresh = refresh
        self.logger = logger
        self.makeDispatcher = makeDispatcher
    }

    /// Runs the lanes of the enabled adapters until ``stop()``, replacing them when the set changes.
    public func run() {
        var connection: PostgresConnection?
        var serving: [AuthAdapterDispatcher.Adapter]?
        var running: (dispatcher: AuthAdapterDispatcher, thread: JoinableThread)?
        defer {
            running?.dispatcher.stop()
            running?.thread.join()
            connection?.close()
        }
        repeat {
            let adapters: [AuthAdapterDispatcher.Adapter]
            do {
                let open = try connection ?? PostgresConnection(configuration: database)
                connection = open
                adapters = try AuthAdapterDispatcher.adapters(on: open)
            } catch {
                connection?.close()
                connection = nil
                logger.warning(
                    "auth adapters: cannot read siwa.auth_adapters; trying again",
                    ["error": .string((error as? PostgresError)?.sqlState ?? "connection")])
                continue
            }
            guard adapters != serving else { continue }
            running?.dispatcher.stop()
            running?.thread.join()
            running = nil
            serving = adapters
            if adapters.isEmpty {
                logger.warning("auth adapters on, but none is enabled (siwactl adapters add)")
                continue
            }
            do {
                let dispatcher = try makeDispatcher(adapters)
                running = (dispatcher, JoinableThread(name: "siwa-auth-adapters") { dispatcher.run() })
            } catch {
                serving = nil
                logger.error("auth adapters: cannot start the lanes", ["error": .string("\(error)")])
            }
        } while stopSignal.sleep(refresh)
    }

    /// Asks ``run()`` to stop its lanes and return. Safe from any thread.
    public func stop() { stopSignal.stop() }
}
