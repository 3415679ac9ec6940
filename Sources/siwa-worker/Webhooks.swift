import Foundation
import Postgres
import ServiceSupport
import WebhookDelivery

/// The worker's webhook lanes by default (the library's own default is for in-process use).
let webhookLanes = 2

/// The webhook dispatcher's settings: on by default; lanes idle while no endpoint exists.
let webhookOptions: [CommandOption] = [
    CommandOption(
        "webhook-concurrency", valueName: "N",
        help: "Webhook attempts in flight at once from this process (0: send no webhooks).",
        environmentVariable: "SIWA_WEBHOOK_CONCURRENCY", defaultValue: String(webhookLanes)),
    CommandOption(
        "webhook-timeout", valueName: "SECONDS",
        help: "Deadline of one webhook attempt (connect to last byte).",
        environmentVariable: "SIWA_WEBHOOK_TIMEOUT",
        defaultValue: WebhookDispatcher.Configuration.defaultTimeout.secondsText),
    CommandOption(
        "webhook-retry-base-delay", valueName: "SECONDS",
        help: "First webhook retry delay; doubles per attempt, with jitter, up to --webhook-max-retry-delay.",
        environmentVariable: "SIWA_WEBHOOK_RETRY_BASE_DELAY",
        defaultValue: WebhookDispatcher.Configuration.defaultRetryBaseDelay.secondsText),
    CommandOption(
        "webhook-max-retry-delay", valueName: "SECONDS", help: "The longest webhook retry delay.",
        environmentVariable: "SIWA_WEBHOOK_MAX_RETRY_DELAY",
        defaultValue: WebhookDispatcher.Configuration.defaultMaxRetryDelay.secondsText),
    CommandOption(
        "webhook-give-up-after", valueName: "SECONDS",
        help: "A delivery still failing this long after its first attempt is dead (default 26 h).",
        environmentVariable: "SIWA_WEBHOOK_GIVE_UP_AFTER",
        defaultValue: WebhookDispatcher.Configuration.defaultGiveUpAfter.secondsText),
    CommandOption(
        "webhook-poll-interval", valueName: "SECONDS",
        help: "Look for due webhook deliveries at least this often (NOTIFY wakes sooner).",
        environmentVariable: "SIWA_WEBHOOK_POLL_INTERVAL",
        defaultValue: WebhookDispatcher.Configuration.defaultPollInterval.secondsText),
]

/// The dispatcher from the command line, or nil with --webhook-concurrency 0.
func makeWebhookDispatcher(
    _ parsed: ParsedCommand, database: PostgresConfiguration, environment: [String: String], logger: Logger,
    metrics: MetricsRegistry
) throws -> WebhookDispatcher? {
    let concurrency = try parsed.integer("webhook-concurrency", in: 0...256) ?? webhookLanes
    guard concurrency > 0 else {
        logger.info("webhooks off: --webhook-concurrency 0")
        return nil
    }
    var webhookDatabase = database
    webhookDatabase.applicationName = "siwa-worker-webhooks"
    return WebhookDispatcher(
        configuration: try WebhookDispatcher.Configuration(
            database: webhookDatabase, concurrency: concurrency,
            timeout: try parsed.seconds("webhook-timeout", positive: true)
                ?? WebhookDispatcher.Configuration.defaultTimeout,
            retryBaseDelay: try parsed.seconds("webhook-retry-base-delay", positive: true)
                ?? WebhookDispatcher.Configuration.defaultRetryBaseDelay,
            maxRetryDelay: try parsed.seconds("webhook-max-retry-delay", positive: true)
                ?? WebhookDispatcher.Configuration.defaultMaxRetryDelay,
            giveUpAfter: try parsed.seconds("webhook-give-up-after", positive: true)
                ?? WebhookDispatcher.Configuration.defaultGiveUpAfter,
            pollInterval: try parsed.seconds("webhook-poll-interval", positive: true)
                ?? WebhookDispatcher.Configuration.defaultPollInterval,
            environment: environment),
        logger: logger, metrics: metrics)
}
