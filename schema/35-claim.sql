-- Claiming notifications: siwa-worker's verified claim and apply, and the unverified entry points (called by siwa-worker and the owner)

-- Result rows of the processing functions: an attribute added later goes at the end (ALTER TYPE … ADD
-- ATTRIBUTE in a numbered change), so callers that name the columns they read keep working.
DO $$
BEGIN
    IF to_regtype('siwa.processing_result') IS NULL THEN
        CREATE TYPE siwa.processing_result AS (
            id           bigint,
            jti          text,
            event_type   text,
            outcome      text,
            error        text,
            attempt      integer,
            latency      double precision,
            busy_seconds double precision
        );
    END IF;
END;
$$;
COMMENT ON TYPE siwa.processing_result IS
    'One handled notification: outcome applied, skipped, retry, dead, gone (no longer pending), busy (its user''s siwa.accounts row is held by another transaction; put off briefly without counting an attempt), rejected (its stored token did not verify: nothing applied) or deferred (the worker had no key at hand to verify it: put off, no attempt); attempt is the attempt number just made; latency is seconds from received_at to now; busy_seconds is, for a busy one, how long it has been busy in a row.';

-- The worker's verified path: in one transaction siwa-worker claims (siwa.claim_notifications), verifies
-- each stored token in Swift (docs/security.md) and applies (siwa.apply_verified_notifications); no
-- network call inside it. The entry points at the end of this part apply without verifying (the owner's
-- repairs, the effects' tests); siwa-worker never calls them.

-- p_skip_subs: a busy user's put-off rows may be due again within the same drain and, being older,
-- would otherwise fill every batch ahead of other users' work. Sequential scans off: a generic plan made
-- while the queue was empty would scan the queue and the log's partition whole for every batch.
CREATE OR REPLACE FUNCTION siwa.claim_notifications(p_limit integer, p_id bigint DEFAULT NULL,
                                                    p_skip_subs text[] DEFAULT NULL)
RETURNS TABLE (id bigint, refused boolean, origin text, raw_token text, jti text, event_type text,
               sub text, audience text, email text, is_private_email boolean, event_time double precision,
               issued_at double precision, expires_at double precision, received_at double precision,
               attempts integer, claimed_event_time double precision)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH claimed AS MATERIALIZED (
        SELECT q.id AS qid, q.jti AS qjti, q.attempts AS qattempts, l.id AS lid, l.state, l.origin,
               l.raw_token, l.event_type, l.sub, l.audience, l.email, l.is_private_email, l.event_time,
               l.issued_at, l.expires_at, l.received_at, l.claimed_event_time
          FROM siwa.notification_queue q
          LEFT JOIN siwa.notification_log l ON l.id = q.id AND l.jti = q.jti AND l.issued_at = q.issued_at
         WHERE q.next_attempt_at <= clock_timestamp() AND (p_id IS NULL OR q.id = p_id)
           AND (l.sub IS NULL OR l.sub <> ALL (coalesce(p_skip_subs, '{}')))
         ORDER BY q.id
         LIMIT least(p_limit, 64)
           FOR UPDATE OF q SKIP LOCKED),
    refused AS (
        DELETE FROM siwa.notification_queue d USING claimed c
         WHERE d.id = c.qid AND (c.lid IS NULL OR c.state <> 'pending')
        RETURNING d.id)
    SELECT c.qid, c.lid IS NULL OR c.state <> 'pending', c.origin,
           CASE WHEN c.state = 'pending' THEN c.raw_token END, c.qjti, c.event_type, c.sub, c.audience,
           c.email, c.is_private_email, extract(epoch FROM c.event_time)::double precision,
           extract(epoch FROM c.issued_at)::double precision, extract(epoch FROM c.expires_at)::double precision,
           extract(epoch FROM c.received_at)::double precision, c.qattempts,
           extract(epoch FROM c.claimed_event_time)::double precision
      FROM claimed c
     WHERE (SELECT count(*) FROM refused) >= 0
     ORDER BY c.qid;
END;
$$;
COMMENT ON FUNCTION siwa.claim_notifications(integer, bigint, text[]) IS
    'siwa-worker''s claim: up to p_limit (at most 64) due notifications, oldest first (or only p_id), none of the subs p_skip_subs (users this drain found busy), FOR UPDATE OF the queue row SKIP LOCKED, with the stored token, origin and the columns the token''s claims must match (times as epoch seconds), for the worker to verify before siwa.apply_verified_notifications; a queue row whose notification is missing or finished is deleted and returned with refused = true and nothing else, so a finished notification is never applied (nor its hook run) twice. Call both in one transaction.';

CREATE OR REPLACE FUNCTION siwa.apply_verified_notifications(
    p_verified bigint[], p_rejected bigint[], p_reasons text[], p_deferred bigint[],
    p_max_attempts integer, p_retry_base_delay interval)
RETURNS SETOF siwa.processing_result
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_batch siwa.notifications[];
    v_enable_seqscan text := current_setting('enable_seqscan');
    v_jit   text := current_setting('jit');
BEGIN
    -- Sequential scans off for its own statements (see siwa.claim_notifications), the session's settings
    -- back before the set-based pass, which runs the hooks with them.
    PERFORM set_config('enable_seqscan', 'off', true);
    PERFORM set_config('jit', 'off', true);
    IF coalesce(cardinality(p_rejected), 0) > 0 THEN
        RETURN QUERY
        WITH r AS (
            SELECT x.id, left(coalesce(x.reason, 'rejected'), 2000) AS reason
              FROM unnest(p_rejected, p_reasons) AS x(id, reason)),
        gone AS (
            DELETE FROM siwa.notification_queue q USING r WHERE q.id = r.id
            RETURNING q.id, q.jti, q.issued_at, q.attempts, q.received_at, r.reason),
        -- A tokenless row of an erased account (siwa.accounts, which the receiver cannot write) is skipped,
        -- not rejected: nothing of it can be verified or would change. Neither keeps a token or email.
        erased AS (
            SELECT l.id, l.raw_token IS NULL AND l.origin = 'apple' AS tokenless FROM gone g
              JOIN siwa.notification_log l ON l.jti = g.jti AND l.issued_at = g.issued_at AND l.id = g.id
             WHERE EXISTS (SELECT 1 FROM siwa.accounts a
                            WHERE a.sub = siwa.current_sub(l.sub) AND a.personal_data_erased_at IS NOT NULL)),
        marked AS (
            UPDATE siwa.notification_log l
               SET state = CASE WHEN e.tokenless THEN 'skipped' ELSE 'rejected' END,
                   applied_at = CASE WHEN e.tokenless THEN clock_timestamp() END,
                   attempts = g.attempts + 1,
                   last_error = CASE WHEN e.tokenless
                                     THEN 'account erased: no stored token to verify, nothing applied'
                                     ELSE g.reason END,
                   email = CASE WHEN e.id IS NULL THEN l.email END,
                   raw_token = CASE WHEN e.id IS NULL THEN l.raw_token END,
                   personal_data_erased_at = CASE WHEN e.id IS NULL THEN l.personal_data_erased_at
                                                  ELSE coalesce(l.personal_data_erased_at, clock_timestamp()) END
              FROM gone g LEFT JOIN erased e ON e.id = g.id
             WHERE l.jti = g.jti AND l.issued_at = g.issued_at AND l.id = g.id AND l.state = 'pending'
            RETURNING l.id, l.event_type, l.state, l.last_error)
        SELECT g.id, g.jti, coalesce(m.event_type, ''), coalesce(m.state, 'rejected'),
               coalesce(m.last_error, g.reason), g.attempts + 1,
               extract(epoch FROM clock_timestamp() - g.received_at)::double precision, NULL::double precision
          FROM gone g LEFT JOIN marked m ON m.id = g.id
         ORDER BY g.id;
    END IF;
    IF coalesce(cardinality(p_deferred), 0) > 0 THEN
        RETURN QUERY
        WITH d AS (
            UPDATE siwa.notification_queue q SET next_attempt_at = clock_timestamp() + interval '5 seconds'
             WHERE q.id = ANY (p_deferred)
            RETURNING q.id, q.jti, q.issued_at, q.attempts)
        SELECT d.id, d.jti, l.event_type, 'deferred'::text, NULL::text, d.attempts, NULL::double precision,
               NULL::double precision
          FROM d JOIN siwa.notification_log l ON l.jti = d.jti AND l.issued_at = d.issued_at
         ORDER BY d.id;
    END IF;
    IF coalesce(cardinality(p_verified), 0) > 0 THEN
        v_batch := ARRAY(
            SELECT ROW(l.id, l.jti, l.event_type, l.sub, l.audience, l.email, l.is_private_email, l.event_time,
                       l.issued_at, l.expires_at, NULL, l.received_at, l.state, q.attempts,
                       q.next_attempt_at, l.applied_at, q.last_error, l.personal_data_erased_at,
                       q.busy_since)::siwa.notifications
              FROM unnest(p_verified) WITH ORDINALITY AS v(id, ord)
              JOIN siwa.notification_queue q ON q.id = v.id
              JOIN siwa.notification_log l ON l.id = q.id AND l.jti = q.jti AND l.issued_at = q.issued_at
             WHERE l.state = 'pending'
             ORDER BY v.ord);
    END IF;
    PERFORM set_config('enable_seqscan', v_enable_seqscan, true);
    PERFORM set_config('jit', v_jit, true);
    IF coalesce(cardinality(v_batch), 0) > 0 THEN
        RETURN QUERY SELECT * FROM siwa.process_claimed_notifications(v_batch, p_max_attempts, p_retry_base_delay);
    END IF;
END;
$$;
COMMENT ON FUNCTION siwa.apply_verified_notifications(bigint[], bigint[], text[], bigint[], integer, interval) IS
    'siwa-worker''s apply, after siwa.claim_notifications in the same transaction: p_verified (in claim order) go through the set-based pass (siwa.process_claimed_notifications); p_rejected are marked rejected with p_reasons (one attempt, out of the queue, nothing applied); p_deferred (key not at hand without a network call) are put off 5 s without an attempt. One siwa.processing_result per notification.';

CREATE OR REPLACE FUNCTION siwa.process_due_notifications(
    p_limit integer, p_max_attempts integer, p_retry_base_delay interval)
RETURNS SETOF siwa.processing_result
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_batch siwa.notifications[];
BEGIN
    -- The claim locks queue rows (in id order: oldest first; the queue's only index), never log rows.
    v_batch := ARRAY(
        SELECT ROW(l.id, l.jti, l.event_type, l.sub, l.audience, l.email, l.is_private_email, l.event_time,
                   l.issued_at, l.expires_at, NULL, l.received_at, l.state, q.attempts,
                   q.next_attempt_at, l.applied_at, q.last_error, l.personal_data_erased_at,
                   q.busy_since)::siwa.notifications
          FROM siwa.notification_queue q
          JOIN siwa.notification_log l ON l.jti = q.jti AND l.issued_at = q.issued_at
         WHERE q.next_attempt_at <= clock_timestamp()
         ORDER BY q.id
         LIMIT least(p_limit, 64)
         FOR UPDATE OF q SKIP LOCKED);
    RETURN QUERY SELECT * FROM siwa.process_claimed_notifications(v_batch, p_max_attempts, p_retry_base_delay);
END;
$$;
COMMENT ON FUNCTION siwa.process_due_notifications(integer, integer, interval) IS
    'Unverified entry point (the owner''s repairs, the effects'' tests): claims up to p_limit (at most 64) due notifications, oldest first (FOR UPDATE SKIP LOCKED), and applies them (siwa.process_claimed_notifications). One row per notification handled.';

CREATE OR REPLACE FUNCTION siwa.process_notification(
    p_id bigint, p_max_attempts integer, p_retry_base_delay interval)
RETURNS SETOF siwa.processing_result
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_batch siwa.notifications[];
BEGIN
    v_batch := ARRAY(
        SELECT ROW(l.id, l.jti, l.event_type, l.sub, l.audience, l.email, l.is_private_email, l.event_time,
                   l.issued_at, l.expires_at, NULL, l.received_at, l.state, q.attempts,
                   q.next_attempt_at, l.applied_at, q.last_error, l.personal_data_erased_at,
                   q.busy_since)::siwa.notifications
          FROM siwa.notification_queue q
          JOIN siwa.notification_log l ON l.jti = q.jti AND l.issued_at = q.issued_at
         WHERE q.id = p_id AND q.next_attempt_at <= clock_timestamp()
           FOR UPDATE OF q SKIP LOCKED);
    RETURN QUERY SELECT * FROM siwa.process_claimed_notifications(v_batch, p_max_attempts, p_retry_base_delay);
END;
$$;
COMMENT ON FUNCTION siwa.process_notification(bigint, integer, interval) IS
    'Like siwa.process_due_notifications for the one notification p_id (a batch of one: the culprit of a batch that failed uncatchably is found and recorded alone), if it is still pending, due and not locked elsewhere. Returns no row otherwise.';
