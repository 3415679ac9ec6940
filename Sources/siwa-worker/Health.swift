import Foundation
import Postgres
import ServiceHealth
import ServiceSupport
import SiwaSchema

/// The worker's heartbeat in siwa.service_heartbeats (with the revoker's client IDs, for `siwactl doctor
/// --database-url`, which fails when no worker's heartbeat is fresh) and the database's health gauges
/// on its /metrics, as a service of the group.
func healthService(
    _ parsed: ParsedCommand, database: PostgresConfiguration, revokerOn: Bool, metrics: MetricsRegistry,
    logger: Logger
) throws -> Service {
    let clientIDs =
        revokerOn
        ? parsed.values("client-id").flatMap { $0.split(separator: ",").map(String.init) }
            .map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty } : []
    let health = ServiceHealth(
        configuration: try ServiceHealth.Configuration(
            database: database, kind: .worker, audiences: clientIDs, version: SiwaBuild.version,
            commit: SiwaBuild.commit, schemaVersion: SiwaBuild.schemaVersion),
        logger: logger)
    health.register(on: metrics)
    return .background("heartbeat", start: { health.start() }, stop: { health.stop() })
}
