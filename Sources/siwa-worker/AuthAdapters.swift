import AuthAdapters
import Postgres
import ServiceSupport

/// The auth adapter lanes' settings: off unless --auth-adapters on (docs/adapters.md).
let authAdapterOptions: [CommandOption] = [
    CommandOption(
        "auth-adapters", valueName: "on|off",
        help:
            "Apply Apple's changes in the auth systems of siwa.auth_adapters (siwactl adapters): a lane per enabled adapter, in step with the table.",
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

/// The adapter lanes from the command line, with the adapters enabled now (the lanes follow the table:
/// AuthAdapterService), or nil with --auth-adapters off.
func makeAuthAdapterService(
    _ parsed: ParsedCommand, database: PostgresConfiguration, environment: [String: String], logger: Logger,
    metrics: MetricsRegistry
) throws -> (service: AuthAdapterService, enabled: [AuthAdapterDispatcher.Adapter])? {
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
    let enabled: [AuthAdapterDispatcher.Adapter]
    do {
        enabled = try AuthAdapterDispatcher.adapters(in: adapterDatabase)
    } catch let error as PostgresError {
        throw ConfigurationError(
            "--auth-adapters on: cannot read siwa.auth_adapters (\(error.sqlState ?? error.code.description))"
        )
    }
    let timeout = try parsed.seconds("auth-adapter-timeout", positive: true) ?? .seconds(10)
    let maxAttempts = try parsed.integer("auth-adapter-max-attempts", in: 1...1000) ?? 30
    // The settings are checked now, not at the first replacement of the lanes.
    _ = try AuthAdapterDispatcher.Configuration(
        database: adapterDatabase, adapters: enabled, timeout: timeout, maxAttempts: maxAttempts,
        environment: environment)
    let service = AuthAdapterService(database: adapterDatabase, logger: logger) {
        [adapterDatabase] adapters in
        AuthAdapterDispatcher(
            configuration: try AuthAdapterDispatcher.Configuration(
                database: adapterDatabase, adapters: adapters, timeout: timeout, maxAttempts: maxAttempts,
                environment: environment),
            logger: logger, metrics: metrics)
    }
    return (service, enabled)
}
