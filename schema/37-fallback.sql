-- The fallback on batches of one (siwa.process_claimed_notifications), failures and the retry schedule (siwa.retry_delay)

-- Why one subtransaction per batch, batches of one after a failure, at most 64 per call: docs/architecture.md,
-- "One statement per effect, one subtransaction per batch". p_batch's raw_token is NULL: never read.
CREATE OR REPLACE FUNCTION siwa.process_claimed_notifications(
    p_batch siwa.notifications[], p_max_attempts integer, p_retry_base_delay interval)
RETURNS SETOF siwa.processing_result
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    n             siwa.notifications;
    v_batch       siwa.notifications[];
    v_results     siwa.processing_result[];
    v_changes     siwa.changes[];
    v_one         siwa.processing_result[];
    v_one_changes siwa.changes[];
    r             siwa.processing_result;
    v_locking     boolean;
    v_now         timestamptz;
BEGIN
    IF coalesce(cardinality(p_batch), 0) = 0 THEN
        RETURN;
    END IF;
    -- Without aliases (no team transfer ran) every sub is its own; a transfer committing after this
    -- probe is caught by the account lock (siwa.refuse_replaced_sub, 40001, retried), as always.
    IF EXISTS (SELECT 1 FROM siwa.sub_aliases) THEN
        v_batch := ARRAY(
            SELECT ROW(b.id, b.jti, b.event_type, c.sub, b.audience,
                       CASE WHEN c.sub = b.sub THEN b.email END, CASE WHEN c.sub = b.sub THEN b.is_private_email END,
                       b.event_time, b.issued_at, b.expires_at, b.raw_token,
                       b.received_at, b.state, b.attempts, b.next_attempt_at, b.applied_at, b.last_error,
                       b.personal_data_erased_at, b.busy_since)::siwa.notifications
              FROM unnest(p_batch) WITH ORDINALITY AS b,
                   -- OFFSET 0: resolved once per row (pulled up, the call would be made for each use of c.sub).
                   LATERAL (SELECT siwa.current_sub(b.sub) AS sub OFFSET 0) AS c
             ORDER BY b.ordinality);
    ELSE
        v_batch := p_batch;
    END IF;
    IF cardinality(v_batch) > 1 THEN
        BEGIN
            SELECT p.results, p.changes INTO v_results, v_changes FROM siwa.apply_claimed_batch(v_batch) AS p;
        EXCEPTION WHEN OTHERS THEN
            v_results := NULL;  -- rolled back to the block's start: nothing of the pass is kept
        END;
    END IF;
    IF v_results IS NULL THEN
        v_results := '{}';
        v_changes := '{}';
        FOREACH n IN ARRAY v_batch LOOP
            v_locking := true;
            BEGIN
                IF NOT EXISTS (SELECT 1 FROM siwa.accounts a WHERE a.sub = n.sub) THEN
                    PERFORM siwa.create_accounts(ARRAY[n.sub]);
                END IF;
                v_locking := false;
                SELECT p.results, p.changes INTO v_one, v_one_changes FROM siwa.apply_claimed_batch(ARRAY[n]) AS p;
                v_results := v_results || v_one;
                v_changes := v_changes || v_one_changes;
            EXCEPTION WHEN OTHERS THEN
                -- Rolled back, the account row it created included.
                r := ROW(n.id, n.jti, n.event_type, NULL, NULL, n.attempts + 1, NULL, NULL)::siwa.processing_result;
                IF v_locking AND SQLSTATE IN ('55P03', '40P01') THEN
                    v_now := clock_timestamp();
                    PERFORM siwa.put_off_busy(ARRAY[n.id], v_now);
                    r.outcome := 'busy';
                    r.attempt := n.attempts;
                    r.busy_seconds := extract(epoch FROM v_now - coalesce(n.busy_since, v_now))::double precision;
                ELSE
                    r.error := left(siwa.redact_error(left(SQLSTATE || ': ' || SQLERRM, 10000)), 2000);
                    r.outcome := siwa.record_failure(n.id, r.error, p_max_attempts, p_retry_base_delay);
                END IF;
                r.latency := extract(epoch FROM clock_timestamp() - n.received_at);
                v_results := v_results || r;
            END;
        END LOOP;
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_results);
    PERFORM siwa.number_changes(v_changes);  -- last: see siwa.changes
END;
$$;
COMMENT ON FUNCTION siwa.process_claimed_notifications(siwa.notifications[], integer, interval) IS
    'Applies notifications the caller has claimed (FOR UPDATE, in claim order), in the caller''s transaction: a replaced sub is applied to the account it became (siwa.current_sub; an email event of a replaced sub without its old team''s address), then the set-based pass (siwa.apply_claimed_batch) in one subtransaction; if that fails, the pass on each alone in its own subtransaction, after creating its account (so that a wait for a concurrent insert reads as busy), recording the failure of one that fails (siwa.record_failure). Inserts the changes numbered last (siwa.number_changes, whose counter lock is held to commit: commit at once). Errors no EXCEPTION block catches abort the caller''s transaction. One siwa.processing_result per notification, in claim order.';

CREATE OR REPLACE FUNCTION siwa.retry_delay(p_attempt integer, p_base interval, p_cap interval)
RETURNS interval
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    SELECT make_interval(secs => least(date_part('epoch', p_cap),
                                       date_part('epoch', p_base) * 2 ^ least(greatest(p_attempt, 1) - 1, 80))
                                 * (0.5 + random() / 2))
$$;
COMMENT ON FUNCTION siwa.retry_delay(integer, interval, interval) IS
    'The one retry schedule: base doubled per attempt, at most cap, times a jitter in [1/2, 1). Exactly, in seconds (date_part(''epoch'', …) of base and cap): least(cap, base × 2^(least(greatest(attempt, 1) − 1, 80))) × (0.5 + random() / 2), as an interval (make_interval(secs => …)); the exponent stops at 80 (any cap is reached by then), so no attempt overflows. Used by siwa.record_failure (cap 1 hour) and siwa.record_webhook_attempts (an endpoint''s backoff); Swift''s RetrySchedule computes the same.';

CREATE OR REPLACE FUNCTION siwa.record_failure(
    p_id bigint, p_error text, p_max_attempts integer, p_retry_base_delay interval)
RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_attempts  integer;
    v_sub       text;
    v_jti       text;
    v_issued_at timestamptz;
    v_error     text;
BEGIN
    -- A real attempt: the row is no longer busy, and a dead row always says why it died (the CHECK
    -- constraints on siwa.notification_log).
    UPDATE siwa.notification_queue
       SET attempts = attempts + 1,
           last_error = coalesce(left(siwa.redact_error(left(nullif(p_error, ''), 10000)), 2000), '(no error text)'),
           busy_since = NULL
     WHERE id = p_id
    RETURNING attempts, jti, issued_at, last_error INTO v_attempts, v_jti, v_issued_at, v_error;
    IF v_attempts IS NULL THEN
        RETURN 'gone';
    END IF;
    v_sub := siwa.current_sub(
        (SELECT l.sub FROM siwa.notification_log l WHERE l.jti = v_jti AND l.issued_at = v_issued_at));
    -- The rolled-back attempt of a late event of an erased account would have erased this row: erase it
    -- here; a retried consent-revoked or account-delete without an address keeps its token to verify.
    IF EXISTS (SELECT 1 FROM siwa.accounts a WHERE a.sub = v_sub AND a.personal_data_erased_at IS NOT NULL) THEN
        v_error := siwa.erased_error(v_error, 'pending');
        UPDATE siwa.notification_queue SET last_error = v_error WHERE id = p_id;
        UPDATE siwa.notification_log
           SET email = NULL,
               raw_token = CASE WHEN v_attempts < p_max_attempts AND email IS NULL
                                     AND event_type IN ('consent-revoked', 'account-delete') THEN raw_token END,
               last_error = CASE WHEN last_error IS NOT NULL THEN siwa.erased_error(last_error, state) END,
               personal_data_erased_at =
                   CASE WHEN v_attempts < p_max_attempts AND email IS NULL AND raw_token IS NOT NULL
                             AND event_type IN ('consent-revoked', 'account-delete')
                        THEN personal_data_erased_at
                        ELSE coalesce(personal_data_erased_at, clock_timestamp()) END
         WHERE jti = v_jti AND issued_at = v_issued_at;
    END IF;
    IF v_attempts >= p_max_attempts THEN
        DELETE FROM siwa.notification_queue WHERE id = p_id;
        UPDATE siwa.notification_log SET state = 'dead', attempts = v_attempts, last_error = v_error
         WHERE jti = v_jti AND issued_at = v_issued_at;
        RETURN 'dead';
    ELSE
        UPDATE siwa.notification_queue
           SET next_attempt_at = clock_timestamp() + siwa.retry_delay(v_attempts, p_retry_base_delay, interval '1 hour')
         WHERE id = p_id;
        RETURN 'retry';
    END IF;
END;
$$;
COMMENT ON FUNCTION siwa.record_failure(bigint, text, integer, interval) IS
    'Records a failed attempt at one pending notification: stores the error redacted (siwa.redact_error), clears busy_since, erases the row''s personal data if its account''s is erased, and schedules a retry (siwa.retry_delay: base p_retry_base_delay, cap 1 hour), or marks it dead after p_max_attempts. Returns retry, dead, or gone (not pending).';
