-- What admins read: siwa.event_history, siwa.account_overview, siwa.queue_health, and the changefeed

-- The log, with the queue's columns while a notification is pending. Every filter on a log column
-- (sub, received_at, event_type and event_time, state skipped, dead or rejected, applied_at) reaches the log's
-- indexes in every partition; the queue is joined by its primary key (from the log), or the log by its
-- (from the queue: a filter on next_attempt_at or busy_since, only a pending row has them).
CREATE OR REPLACE VIEW siwa.event_history AS
SELECT l.jti,
       l.event_type,
       l.sub,
       l.audience,
       l.email,
       l.is_private_email,
       l.event_time,
       l.received_at,
       l.state,
       coalesce(q.attempts, l.attempts) AS attempts,
       l.applied_at,
       CASE WHEN q.id IS NOT NULL THEN q.last_error ELSE l.last_error END AS last_error,
       l.issued_at,
       l.expires_at,
       q.next_attempt_at,
       l.personal_data_erased_at,
       l.id,
       l.claimed_event_time
  FROM siwa.notification_log l
  LEFT JOIN siwa.notification_queue q ON q.id = l.id AND q.jti = l.jti AND q.issued_at = l.issued_at;
COMMENT ON VIEW siwa.event_history IS
    'Every verified notification, one row each, newest last by id: the one place to read what Apple told us and what the worker did with it.';
COMMENT ON COLUMN siwa.event_history.jti IS 'The token''s unique identifier.';
COMMENT ON COLUMN siwa.event_history.event_type IS
    'email-disabled, email-enabled, consent-revoked, account-delete, or an unknown type as received.';
COMMENT ON COLUMN siwa.event_history.sub IS 'The user''s team-scoped Apple identifier.';
COMMENT ON COLUMN siwa.event_history.audience IS 'The client ID the notification was for.';
COMMENT ON COLUMN siwa.event_history.email IS 'Email from the event; NULL for other events and once erased.';
COMMENT ON COLUMN siwa.event_history.is_private_email IS 'Whether the email is a private relay address.';
COMMENT ON COLUMN siwa.event_history.event_time IS
    'When the event happened at Apple, at the latest iat + 60 s (the time the worker used); see claimed_event_time.';
COMMENT ON COLUMN siwa.event_history.received_at IS 'When we stored it (the 200 to Apple follows).';
COMMENT ON COLUMN siwa.event_history.state IS 'pending, applied, skipped, dead, or rejected (its stored token did not verify: nothing applied; the reason in last_error) (see siwa.notification_log.state).';
COMMENT ON COLUMN siwa.event_history.attempts IS 'Attempts made to apply it.';
COMMENT ON COLUMN siwa.event_history.applied_at IS 'When it was applied or skipped.';
COMMENT ON COLUMN siwa.event_history.last_error IS 'Last failure, or why it was skipped.';
COMMENT ON COLUMN siwa.event_history.issued_at IS 'The token''s iat.';
COMMENT ON COLUMN siwa.event_history.expires_at IS 'The token''s exp, when present.';
COMMENT ON COLUMN siwa.event_history.next_attempt_at IS 'When a pending notification is next due; NULL once it is no longer pending.';
COMMENT ON COLUMN siwa.event_history.personal_data_erased_at IS 'When its personal data was erased.';
COMMENT ON COLUMN siwa.event_history.id IS 'Arrival order.';
COMMENT ON COLUMN siwa.event_history.claimed_event_time IS
    'The signed event_time when Apple dated the event after it signed the token (later than iat + 60 s): not believed, event_time holds iat + 60 s instead. NULL normally; find the anomalies with WHERE claimed_event_time IS NOT NULL.';

-- One row per account, with the counts an admin asks for first.
CREATE OR REPLACE VIEW siwa.account_overview AS
SELECT a.sub,
       a.email,
       a.is_private_email,
       a.email_status,
       a.email_status_at,
       a.consent_revoked_at,
       a.deleted_at,
       a.personal_data_erased_at,
       s.open_sessions,
       t.open_refresh_tokens,
       last_event.event_type AS last_event_type,
       last_event.event_time AS last_event_time,
       e.last_received_at,
       e.event_count,
       e.pending_events,
       e.dead_events,
       s.last_session_created_at,
       r.revoked_sessions_by_reason,
       CASE WHEN a.deleted_at IS NOT NULL THEN 'deleted' ELSE 'active' END AS account_status
  FROM siwa.accounts a
  CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE ss.revoked_at IS NULL) AS open_sessions,
               max(ss.created_at) AS last_session_created_at
          FROM siwa.sessions ss
         WHERE ss.sub = a.sub) AS s
  CROSS JOIN LATERAL (
        SELECT coalesce(jsonb_object_agg(g.reason, g.sessions), '{}'::jsonb) AS revoked_sessions_by_reason
          FROM (SELECT coalesce(ss.revoke_reason, 'unknown') AS reason, count(*) AS sessions
                  FROM siwa.sessions ss
                 WHERE ss.sub = a.sub AND ss.revoked_at IS NOT NULL
                 GROUP BY 1) AS g) AS r
  CROSS JOIN LATERAL (
        SELECT count(*) AS open_refresh_tokens
          FROM siwa.refresh_tokens rt
         WHERE rt.sub = a.sub AND rt.revoked_at IS NULL) AS t
  CROSS JOIN LATERAL (
        SELECT max(n.received_at) AS last_received_at,
               count(*) AS event_count,
               count(*) FILTER (WHERE n.state = 'pending') AS pending_events,
               count(*) FILTER (WHERE n.state = 'dead') AS dead_events
          FROM siwa.notification_log n
         WHERE n.sub = a.sub) AS e
  LEFT JOIN LATERAL (
        SELECT n.event_type, n.event_time
          FROM siwa.notification_log n
         WHERE n.sub = a.sub
         ORDER BY n.event_time DESC, n.id DESC
         LIMIT 1) AS last_event ON true;
COMMENT ON VIEW siwa.account_overview IS
    'One row per account (siwa.accounts): what Apple last told us about the user, their open sessions and refresh tokens, and a summary of their notifications. A user whose notifications are all still pending has no account row yet: see siwa.event_history.';
COMMENT ON COLUMN siwa.account_overview.sub IS 'The user''s team-scoped Apple identifier.';
COMMENT ON COLUMN siwa.account_overview.email IS 'Latest email address Apple reported; NULL if none or erased.';
COMMENT ON COLUMN siwa.account_overview.is_private_email IS 'Whether email is an Apple private relay address.';
COMMENT ON COLUMN siwa.account_overview.email_status IS
    'enabled or disabled: whether Apple forwards mail to the relay address; NULL until an email event arrives. Frozen once the account is deleted (account_status deleted): a deleted account has no address to mail.';
COMMENT ON COLUMN siwa.account_overview.email_status_at IS 'event_time of the email event that set email_status.';
COMMENT ON COLUMN siwa.account_overview.consent_revoked_at IS 'event_time of the latest consent-revoked event, if any.';
COMMENT ON COLUMN siwa.account_overview.deleted_at IS 'event_time of the account-delete event, if any.';
COMMENT ON COLUMN siwa.account_overview.personal_data_erased_at IS 'When the account''s personal data was erased.';
COMMENT ON COLUMN siwa.account_overview.open_sessions IS 'Sessions of this user not revoked (siwa.sessions.revoked_at IS NULL).';
COMMENT ON COLUMN siwa.account_overview.open_refresh_tokens IS 'Refresh tokens of this user not revoked.';
COMMENT ON COLUMN siwa.account_overview.last_event_type IS 'Type of the user''s latest notification by event_time (any state).';
COMMENT ON COLUMN siwa.account_overview.last_event_time IS 'event_time of that latest notification.';
COMMENT ON COLUMN siwa.account_overview.last_received_at IS 'When we last stored a notification for this user.';
COMMENT ON COLUMN siwa.account_overview.event_count IS 'Notifications stored for this user (pruned rows no longer count).';
COMMENT ON COLUMN siwa.account_overview.pending_events IS 'Of those, still pending (waiting for the worker).';
COMMENT ON COLUMN siwa.account_overview.dead_events IS 'Of those, dead (the worker gave up; see siwa.event_history.last_error).';
COMMENT ON COLUMN siwa.account_overview.last_session_created_at IS
    'When the user last signed in (latest siwa.sessions.created_at, revoked or not); NULL if never.';
COMMENT ON COLUMN siwa.account_overview.revoked_sessions_by_reason IS
    'Revoked sessions counted by revoke_reason, e.g. {"consent-revoked": 2}; {} if none.';
COMMENT ON COLUMN siwa.account_overview.account_status IS
    'deleted (the user deleted the Apple account: deleted_at is set; email_status no longer changes and means nothing) or active.';

-- The queue at a glance, one row. `siwactl stats` reads these columns by name: add, never rename.
CREATE OR REPLACE VIEW siwa.queue_health AS
SELECT p.pending,
       p.due,
       p.retrying,
       d.dead,
       p.oldest_pending_seconds,
       r.received_last_hour,
       l.applied_last_hour,
       l.apply_latency_p50_seconds,
       l.apply_latency_p99_seconds,
       b.busy,
       b.oldest_busy_seconds
  FROM (SELECT count(*) AS pending,
               count(*) FILTER (WHERE n.next_attempt_at <= now()) AS due,
               count(*) FILTER (WHERE n.attempts > 0) AS retrying,
               extract(epoch FROM now() - min(n.received_at))::double precision AS oldest_pending_seconds
          FROM siwa.notification_queue n) AS p,
       (SELECT count(*) AS dead FROM siwa.notification_log n WHERE n.state = 'dead') AS d,
       (SELECT count(*) AS received_last_hour
          FROM siwa.notification_log n
         WHERE n.received_at > now() - interval '1 hour') AS r,
       (SELECT count(*) AS applied_last_hour,
               percentile_cont(0.5) WITHIN GROUP (
                   ORDER BY extract(epoch FROM n.applied_at - n.received_at)::double precision)
                   AS apply_latency_p50_seconds,
               percentile_cont(0.99) WITHIN GROUP (
                   ORDER BY extract(epoch FROM n.applied_at - n.received_at)::double precision)
                   AS apply_latency_p99_seconds
          FROM siwa.notification_log n
         WHERE n.applied_at > now() - interval '1 hour' AND n.state IN ('applied', 'skipped')) AS l,
       (SELECT count(*) AS busy,
               extract(epoch FROM now() - min(n.busy_since))::double precision AS oldest_busy_seconds
          FROM siwa.notification_queue n
         WHERE n.busy_since IS NOT NULL) AS b;
COMMENT ON VIEW siwa.queue_health IS
    'The worker''s queue right now, one row: backlog, failures, throughput and apply latency over the last hour. Read by siwactl stats.';
COMMENT ON COLUMN siwa.queue_health.pending IS 'Notifications waiting to be applied (state pending).';
COMMENT ON COLUMN siwa.queue_health.due IS 'Pending notifications whose next attempt is due now (next_attempt_at <= now()).';
COMMENT ON COLUMN siwa.queue_health.retrying IS 'Pending notifications that have failed at least once (attempts > 0).';
COMMENT ON COLUMN siwa.queue_health.dead IS 'Notifications the worker gave up on (state dead): look at last_error, requeue with siwactl replay.';
COMMENT ON COLUMN siwa.queue_health.oldest_pending_seconds IS
    'Seconds since the oldest pending notification was received; NULL when nothing is pending.';
COMMENT ON COLUMN siwa.queue_health.received_last_hour IS 'Notifications received in the last hour (still stored).';
COMMENT ON COLUMN siwa.queue_health.applied_last_hour IS
    'Notifications finished in the last hour: applied or skipped, by applied_at.';
COMMENT ON COLUMN siwa.queue_health.apply_latency_p50_seconds IS
    'Median seconds from received_at to applied_at over the notifications finished in the last hour; NULL if none.';
COMMENT ON COLUMN siwa.queue_health.apply_latency_p99_seconds IS
    '99th percentile (interpolated) of the same latency; NULL if none.';
COMMENT ON COLUMN siwa.queue_health.busy IS
    'Pending notifications put off because their user''s account row is held by another transaction (busy_since set); no attempt is counted for that.';
COMMENT ON COLUMN siwa.queue_health.oldest_busy_seconds IS
    'Seconds the longest-busy pending notification has been waiting for its user; NULL when none is busy. Growing: a transaction (the app''s, or a stuck worker''s) holds that siwa.accounts row.';

-- The changefeed for apps (siwa_app) and admins: the numbered changes, in position order. Read it with
-- a cursor: SELECT … FROM siwa.changefeed WHERE position > $last ORDER BY position LIMIT n (the position's
-- unique index), and LISTEN siwa_changes to hear when more become readable (payload: the last position).
-- security_barrier: a caller's own function in a WHERE clause never sees a row not numbered yet.
CREATE OR REPLACE VIEW siwa.changefeed WITH (security_barrier) AS
SELECT c.position,
       c.type,
       c.sub,
       c.event_time,
       c.applied_at,
       c.jti,
       c.audience,
       c.sessions_revoked,
       c.refresh_tokens_revoked,
       c.email,
       c.is_private_email,
       c.id,
       c.old_sub
  FROM siwa.changes c
 WHERE c.position IS NOT NULL;
COMMENT ON VIEW siwa.changefeed IS
    'The changefeed: every change the worker applied (siwa.changes) once numbered. Poll with WHERE position > $last ORDER BY position LIMIT n: a reader never misses a change, whatever order the workers commit in. LISTEN siwa_changes for a wake-up (payload: the last position). Kept for siwa.settings.changes_retention.';
COMMENT ON COLUMN siwa.changefeed.position IS 'The cursor: remember the last one read, ask for the ones above it.';
COMMENT ON COLUMN siwa.changefeed.type IS
    'siwa.email_disabled, siwa.email_enabled, siwa.consent_revoked, siwa.account_deleted, siwa.personal_data_erased or siwa.sub_transferred (a team transfer moved the user from old_sub to sub).';
COMMENT ON COLUMN siwa.changefeed.sub IS 'The user''s team-scoped Apple identifier.';
COMMENT ON COLUMN siwa.changefeed.event_time IS 'Apple''s event_time of the notification that caused it.';
COMMENT ON COLUMN siwa.changefeed.applied_at IS 'When the worker applied it.';
COMMENT ON COLUMN siwa.changefeed.jti IS 'The notification''s jti (see siwa.event_history).';
COMMENT ON COLUMN siwa.changefeed.audience IS 'The client ID the notification was for.';
COMMENT ON COLUMN siwa.changefeed.sessions_revoked IS 'Sessions this change revoked.';
COMMENT ON COLUMN siwa.changefeed.refresh_tokens_revoked IS 'Refresh tokens this change revoked.';
COMMENT ON COLUMN siwa.changefeed.email IS
    'For email events of accounts not erased: the email Apple sent. NULL otherwise, and once erased.';
COMMENT ON COLUMN siwa.changefeed.is_private_email IS 'Whether that email is a private relay address.';
COMMENT ON COLUMN siwa.changefeed.id IS 'The change''s stable identity (per sub, in the order applied).';
COMMENT ON COLUMN siwa.changefeed.old_sub IS
    'For siwa.sub_transferred: the sub the user had before the team transfer (sessions and tokens the app keeps under it now belong to sub). NULL otherwise.';

-- Indexes for these views (the others they use are above): every session of one user.
CREATE INDEX IF NOT EXISTS sessions_sub_created_idx ON siwa.sessions (sub, created_at);
