import Postgres
import Receiver
import ServiceHealth
import ServiceSupport
import SiwaSchema
import Synchronization

/// The receiver's heartbeat in siwa.service_heartbeats (with its audiences, for `siwactl doctor
/// --database-url`) and the database's health gauges on its /metrics, as a service of the group
/// started after the receiver (whose registry it registers on).
func healthService(
    configuration: ReceiverConfiguration, metrics: @escaping @Sendable () -> MetricsRegistry?, logger: Logger
) throws -> Service {
    let health = ServiceHealth(
        configuration: try ServiceHealth.Configuration(
            database: configuration.database, kind: .receiver, audiences: Array(configuration.audiences),
            version: SiwaBuild.version, commit: SiwaBuild.commit, schemaVersion: SiwaBuild.schemaVersion),
        logger: logger)
    return .background(
        "heartbeat",
        start: {
            if let registry = metrics() {
                registry.buildInfo(labels: SiwaBuild.metricLabels)
                health.register(on: registry)
            }
            health.start()
        },
        stop: { health.stop() })
}
