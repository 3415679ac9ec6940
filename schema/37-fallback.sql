-- The fallback on batches of one (siwa.process_claimed_notifications), failures and the retry schedule (siwa.retry_delay)

-- Applies claimed notifications (rows the caller holds with FOR UPDATE, in claim order; their raw_token
-- NULL: the pass never reads it, and a batch of 64 tokens would be copied with every unnest) and
-- returns one siwa.processing_result per notification, in claim order; the worker's two entry points below claim
-- and call it. All in the caller's transaction: the claim disappears with a crashed worker's connection,
-- and effects commit together with the state change that marks them applied. The user's siwa.accounts
-- row lock (tried, never waited for) keeps two events of one user from being applied concurrently by
-- two workers; such rows are reported busy and put off briefly.
--
-- A sub that a team transfer replaced is applied to the account it became (siwa.current_sub): resolved
-- here, once, for the pass and its fallback. An email event for a replaced sub carries the old team's
-- relay address, which no longer forwards: its status is applied, its address is not (the pass, the
-- change row and the hook get no email; the history keeps what Apple sent).
--
-- First the set-based pass (siwa.apply_claimed_batch) on the whole batch, in one subtransaction. If it
-- raises (an event whose hook raises, a lock wait past lock_timeout, anything), it is rolled back and the
-- fallback runs the same pass on each notification alone, a batch of one, in its own subtransaction (as
-- River's inline completer turns one job into a batch of one): a failure affects only its own
-- notification, recorded by siwa.record_failure (retry with backoff, or dead). A batch of one goes to
-- that form at once. Before the pass, the fallback creates a missing account itself
-- (siwa.create_accounts), so that a wait for a concurrent insert of the same sub (55P03 after 1 ms, or
-- a deadlock) tells that the user is busy, while a lock wait in the effects (e.g. an app transaction
-- holding a session row, past the caller's lock_timeout) is a failure like any other.
--
-- Last, siwa.number_changes inserts the changes the passes wrote, numbered (under the
-- siwa.changes_counter row lock, held until the caller commits: call this in a transaction of its own,
-- as the worker does, and commit right away).
--
-- Errors no EXCEPTION block catches (query_canceled from statement_timeout, assert_failure) abort the
-- caller's transaction; the worker then handles the batch's notifications one per transaction
-- (siwa.process_notification) and records a failure with siwa.record_failure in a transaction of its
-- own.
--
-- At most 64 notifications per call (the entry points claim no more). In the fallback each
-- notification's subtransaction writes (it locks its user's account row, at least), so it gets a
-- subtransaction XID, and these stay with the transaction until it ends (only a rolled-back one gives
-- its XID back, as the failed pass on the whole batch does). PostgreSQL keeps 64 of them per
-- transaction in shared memory (PGPROC_MAX_CACHED_SUBXIDS); beyond that the transaction's cache
-- overflows, and every snapshot any session takes while it is open must look subtransactions up in
-- pg_subtrans, which slows the whole server down. The pass on the whole batch uses one. A hook
-- (siwa.on_event) with BEGIN … EXCEPTION blocks of its own that write uses one more per block entered:
-- the worker's --batch-size must then be lower (docs/operations.md).
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
    -- Aliases exist only once a team transfer ran: without any, every sub is its own current sub and
    -- the batch is applied as claimed (one probe of an empty table instead of one siwa.current_sub per
    -- row). Either way the answer is as of this statement's snapshot, as the resolution itself would be:
    -- a transfer that commits after it is caught by the account lock (siwa.refuse_replaced_sub, 40001:
    -- the attempt is retried and its next claim resolves the alias), as it always was.
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
    'Applies notifications the caller has claimed (FOR UPDATE, in claim order; subs resolved through siwa.sub_aliases) with the set-based pass (siwa.apply_claimed_batch) in one subtransaction; if that fails, runs the pass on each alone in its own subtransaction and records the failure of one that fails (siwa.record_failure), or reports it busy. Inserts the changes numbered last (siwa.number_changes). One row per notification.';

-- Records a failed attempt: back off exponentially with jitter, or give up (dead) after p_max_attempts.
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
    -- A late event of an account whose personal data is already erased (its current sub's: a sub a team
    -- transfer replaced is the account it became): its attempt (which would have erased this row's data)
    -- was rolled back, so erase it here, outside that attempt, whatever follows. A consent-revoked or
    -- account-delete without an address that is retried keeps its token: the next attempt verifies it.
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
        -- base × 2^(attempts−1), capped at one hour, times a random factor in [0.5, 1).
        UPDATE siwa.notification_queue
           SET next_attempt_at = clock_timestamp()
                                 + least(p_retry_base_delay * power(2, least(v_attempts - 1, 30)),
                                         interval '1 hour') * (0.5 + random() / 2)
         WHERE id = p_id;
        RETURN 'retry';
    END IF;
END;
$$;
COMMENT ON FUNCTION siwa.record_failure(bigint, text, integer, interval) IS
    'Records a failed attempt at one pending notification: stores the error redacted (siwa.redact_error), clears busy_since, erases the row''s personal data if its account''s is erased, and schedules a retry with exponential backoff (base × 2^(attempt−1), at most 1 hour) and jitter, or marks it dead after p_max_attempts. Returns retry, dead, or gone (not pending).';
