/// The statements the webhook lanes, their maintenance and the gauges run that are not a typed row's own
/// (``ClaimedDelivery``), in one place.
enum WebhookQueries {
    /// Seconds until the next delivery is due: of the enabled endpoints, the earliest due queue head not
    /// in flight, or a lease's end, but not before the endpoint's backoff (null: none pending).
    static let nextDue = """
        SELECT extract(epoch FROM min(greatest(h.due, e.backoff_until)) - clock_timestamp())::float8
          FROM siwa.webhook_endpoints e
         CROSS JOIN LATERAL (
               SELECT min(CASE WHEN d.lease_expires_at > clock_timestamp() THEN d.lease_expires_at
                               ELSE d.next_attempt_at END) AS due
                 FROM siwa.webhook_deliveries d
                WHERE d.endpoint_id = e.id AND d.state = 'pending' AND d.ready) h
         WHERE e.enabled
        """

    /// A batch's attempts (and releases) recorded; the ids whose lease was still the caller's.
    static let recordAttempts = """
        SELECT unnest(siwa.record_webhook_attempts($1, $2::bigint[], $3::timestamptz[], $4::integer[],
                                                   $5::integer[], $6::text[], $7::float8[], $8::text[],
                                                   $9::float8, $10::float8))
        """

    /// Temporary endpoints past their expiry removed; how many.
    static let removeExpiredEndpoints = "SELECT siwa.remove_expired_webhook_endpoints()"

    /// The `ready` hints the transitions could not keep, repaired; how many.
    static let repairReady = "SELECT siwa.repair_webhook_ready()"

    /// The gauges' session: its statement ($1) and lock ($2) timeouts.
    static let gaugeSessionTimeouts =
        "SELECT set_config('statement_timeout', $1, false), set_config('lock_timeout', $2, false)"
}
