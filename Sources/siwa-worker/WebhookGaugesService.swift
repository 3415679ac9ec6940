import Postgres
import ServiceSupport
import WebhookDelivery

/// The webhook endpoints' gauges from the database on the worker's /metrics (read by a thread of their
/// own every few seconds; a scrape never waits for the database), as a service of the group.
func webhookGaugesService(database: PostgresConfiguration, metrics: MetricsRegistry, logger: Logger)
    -> Service
{
    let gauges = WebhookGauges(configuration: WebhookGauges.Configuration(database: database), logger: logger)
    gauges.register(on: metrics)
    return .background("webhook gauges", start: { gauges.start() }, stop: { gauges.stop() })
}
