/// What released receivers ran, for tests that run them against newer schemas (TEST ONLY).
public enum ReleasedReceiver {
    /// The statement version 4's receiver stored a batch with (its NotificationStore.insertSQL, released
    /// with schema version 4, 192fc65): the dedupe keys, the log rows (without email and token for an
    /// erased account), the queue rows and the NOTIFY; the jtis it stored.
    public static let version4Store = """
        WITH batch AS (
            SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::boolean[],
                                 $7::timestamptz[], $8::timestamptz[], $9::timestamptz[], $10::text[])
                   AS b(jti, event_type, sub, audience, email, is_private_email, event_time, issued_at,
                        expires_at, raw_token)),
        fresh AS (
            INSERT INTO siwa.notification_jtis (jti, issued_at, expires_at)
            SELECT b.jti, b.issued_at, b.expires_at FROM batch b
            ON CONFLICT (jti) DO NOTHING
            RETURNING jti, issued_at),
        stored AS (
            INSERT INTO siwa.notification_log
                (jti, event_type, sub, audience, email, is_private_email, event_time, issued_at, expires_at,
                 raw_token, personal_data_erased_at)
            SELECT b.jti, b.event_type, b.sub, b.audience,
                   CASE WHEN a.sub IS NULL THEN b.email END, b.is_private_email, b.event_time, b.issued_at,
                   b.expires_at, CASE WHEN a.sub IS NULL THEN b.raw_token END,
                   CASE WHEN a.sub IS NOT NULL THEN clock_timestamp() END
              FROM batch b
              JOIN fresh f ON f.jti = b.jti AND f.issued_at = b.issued_at
              LEFT JOIN siwa.accounts a ON a.sub = b.sub AND a.personal_data_erased_at IS NOT NULL
            ON CONFLICT (jti, issued_at) DO NOTHING
            RETURNING id, jti, issued_at),
        queued AS (
            INSERT INTO siwa.notification_queue (id, jti, issued_at)
            SELECT s.id, s.jti, s.issued_at FROM stored s
            RETURNING 1)
        SELECT s.jti FROM stored s
         WHERE (SELECT count(pg_notify('siwa_notifications', '')) FROM (SELECT 1 FROM queued LIMIT 1) AS w) >= 0
        """
}
