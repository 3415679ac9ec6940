import Postgres
import QueueConsumer
import ServiceSupport

extension WebhookDispatcher {
    /// Lane 0's periodic task that removes the temporary endpoints past their expiry
    /// (`siwa.remove_expired_webhook_endpoints`: a listener that crashed leaves its endpoint behind).
    var expiredEndpointRemoval: PeriodicTask<PostgresConnection> {
        PeriodicTask("expired endpoint removal", every: Self.repairInterval) { [logger] connection in
            let removed = try connection.value(WebhookQueries.removeExpiredEndpoints, as: Int.self)
            if removed > 0 {
                logger.info("webhooks: removed expired temporary endpoints", ["count": .int(removed)])
            }
            return ["endpoints_removed": removed]
        }
    }
}
