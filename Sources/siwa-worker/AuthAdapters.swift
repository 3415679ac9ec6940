import AuthAdapters
import Postgres
import ServiceSupport

/// The auth adapter lanes' settings: off unless --auth-adapters on (docs/adapters.md).
let authAdapterOptions: [CommandOption] = [
    CommandOption(
        "auth-adapters", valueName: "on|off",
        help:
            "Apply Apple's changes in the auth systems of siwa.auth_adapters (siwactl adapters): a lane per adapter enabled at start.",
        environmentVariable: "SIWA_AUTH_ADAPTERS", defaultValue: "off"),
    CommandOption(
        "auth-adapter-timeout", valueName: "SECONDS",
        help: "Deadline of one event in an auth database (its statement and lock timeouts).",
        environmentVariable: "SIWA_AUTH_ADAPTER_TIMEOUT", defaultValue: "10"),
    CommandOption(
        "auth-adapter-max-attempts", valueName: "N",
        help: "Attempts before an adapter's event is dead (retries back off up to 1 h).",
        environmentVariable: "SIWA_AUTH_ADAPTER_MAX_ATTEMPTS", defaultValue: "30"),
]

/// The dispatcher from the command line, or nil with --auth-adapters off. Reads the enabled adapters
/// from siwa.auth_adapters now: one added later is served after a restart.
func makeAuthAdapterDispatcher(
    _ parsed: ParsedCommand, database: PostgresConfiguration, logger: Logger, metrics: MetricsRegistry
) throws -> AuthAdapterDispatcher? {
    switch parsed.value("auth-adapters") ?? "off" {
    case "off":
        return nil
    case "on":
        break
    default:
        throw ConfigurationError("--auth-adapters is on or off")
    }
    var adapterDatabase = database
    adapterDatabase.applicationName = "siwa-worker-auth-adapters"
    let adapters: [AuthAdapterDispatcher.Adapter]
    do {
        adapters = try AuthAdapterDispatcher.adapters(in: adapterDatabase)
    } catch let error as PostgresError {
        throw ConfigurationError(
            "--auth-adapters on: cannot read siwa.auth_adapters (\(error.sqlState ?? error.code.description))"
        )
    }
    if adapters.isEmpty { logger.warning("auth adapters on, but none is enabled (siwactl adapters add)") }
    return AuthAdapterDispatcher(
        configuration: try AuthAdapterDispatcher.Configuration(
            database: adapterDatabase, adapters: adapters,
            timeout: try parsed.seconds("auth-adapter-timeout", positive: true) ?? .seconds(10),
            maxAttempts: try parsed.integer("auth-adapter-max-attempts", in: 1...1000) ?? 30),
        logger: logger, metrics: metrics)
}
