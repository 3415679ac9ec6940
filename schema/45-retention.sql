-- Retention: month partitions of the log, token and history pruning, dedupe keys, changes; requeue

-- Month partitions of the log, named notification_log_YYYY_MM (UTC months of issued_at). Created ahead
-- by siwactl migrate (this file) and by the worker's maintenance pass through
-- siwa.create_log_partitions; a month whose rows already went to the DEFAULT partition (none existed
-- yet) gets them moved into its new partition. Runs as the owner (called from the SECURITY DEFINER
-- functions below, or by this file); executable by nobody else.
CREATE OR REPLACE FUNCTION siwa.create_log_partition(p_month date) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_month date := date_trunc('month', p_month)::date;
    v_name  text := 'notification_log_' || to_char(date_trunc('month', p_month), 'YYYY_MM');
    v_from  timestamptz := date_trunc('month', p_month)::timestamp AT TIME ZONE 'UTC';
    v_to    timestamptz := (date_trunc('month', p_month) + interval '1 month')::timestamp AT TIME ZONE 'UTC';
BEGIN
    IF to_regclass('siwa.' || v_name) IS NOT NULL THEN
        RETURN false;
    END IF;
    -- One creator at a time (two workers' maintenance passes), then look again. SHARE UPDATE EXCLUSIVE
    -- conflicts with itself, not with the receiver's inserts or the worker's updates, and only a role
    -- that may write the log can take it (an advisory lock on a guessable key, which any login can
    -- hold, made this wait forever).
    LOCK TABLE siwa.notification_log IN SHARE UPDATE EXCLUSIVE MODE;
    IF to_regclass('siwa.' || v_name) IS NOT NULL THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT 1 FROM siwa.notification_log_default d WHERE d.issued_at >= v_from AND d.issued_at < v_to) THEN
        EXECUTE format('CREATE TABLE siwa.%I (LIKE siwa.notification_log INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                       v_name);
        EXECUTE format('WITH moved AS (DELETE FROM siwa.notification_log_default d
                                        WHERE d.issued_at >= %L AND d.issued_at < %L RETURNING d.*)
                        INSERT INTO siwa.%I SELECT * FROM moved', v_from, v_to, v_name);
        EXECUTE format('ALTER TABLE siwa.notification_log ATTACH PARTITION siwa.%I FOR VALUES FROM (%L) TO (%L)',
                       v_name, v_from, v_to);
    ELSE
        EXECUTE format('CREATE TABLE siwa.%I PARTITION OF siwa.notification_log FOR VALUES FROM (%L) TO (%L)',
                       v_name, v_from, v_to);
    END IF;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION siwa.create_log_partition(date) IS
    'Creates the month partition of siwa.notification_log holding p_month (UTC), moving that month''s rows out of the DEFAULT partition if any. Returns whether it created one. Owner only.';

CREATE OR REPLACE FUNCTION siwa.create_log_partitions(p_months_ahead integer DEFAULT 3) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_month date;
    v_count integer := 0;
BEGIN
    FOR v_month IN
        SELECT g::date
          FROM generate_series(date_trunc('month', clock_timestamp() AT TIME ZONE 'UTC'),
                               date_trunc('month', clock_timestamp() AT TIME ZONE 'UTC')
                               + make_interval(months => least(greatest(coalesce(p_months_ahead, 3), 0), 12)),
                               interval '1 month') AS g
    LOOP
        IF siwa.create_log_partition(v_month) THEN
            v_count := v_count + 1;
        END IF;
    END LOOP;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION siwa.create_log_partitions(integer) IS
    'Maintenance: makes sure siwa.notification_log has a partition for this month and the next p_months_ahead (at most 12). SECURITY DEFINER (the schema''s owner), executable by siwa_worker only. Returns how many it created.';

-- Retention of whole months: a month partition whose range ended before now - p_older_than is detached
-- and dropped, one statement each (no DELETE, no dead rows, no vacuum). What is not done with is kept:
-- its pending rows (still queued) and dead rows (waiting for siwactl replay) move to the DEFAULT
-- partition first, ids, states and errors unchanged; so do rows whose token has not expired yet (exp:
-- the receiver accepts a token until its exp, and its row is what deduplicates a redelivery). Never a
-- month that ended less than 7 days before now, whatever p_older_than says: a token without exp is
-- accepted for --max-token-age (24 h by default) after its iat, so --max-token-age must stay below
-- 7 days. Runs as the owner (only the owner
-- may detach and drop); executable by siwa_worker only.
CREATE OR REPLACE FUNCTION siwa.drop_log_partitions(p_older_than interval) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_cutoff timestamptz;
    v_name   text;
    v_all    bigint;
    v_kept   bigint;
    v_dropped bigint := 0;
BEGIN
    IF p_older_than IS NULL THEN
        RETURN 0;
    END IF;
    v_cutoff := clock_timestamp() - greatest(p_older_than, interval '7 days');
    FOR v_name IN
        SELECT c.relname
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'siwa.notification_log'::regclass
           AND c.relname ~ '^notification_log_[0-9]{4}_[0-9]{2}$'
           AND (to_date(substr(c.relname, 18), 'YYYY_MM') + interval '1 month')::timestamp AT TIME ZONE 'UTC'
               <= v_cutoff
         ORDER BY c.relname
    LOOP
        -- The month's size: the planner's estimate when it has one (reading a month to count it would
        -- cost more than dropping it), else counted.
        v_all := (SELECT CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint END
                    FROM pg_class c WHERE c.oid = ('siwa.' || quote_ident(v_name))::regclass);
        IF v_all IS NULL THEN
            EXECUTE format('SELECT count(*) FROM siwa.%I', v_name) INTO v_all;
        END IF;
        EXECUTE format('ALTER TABLE siwa.notification_log DETACH PARTITION siwa.%I', v_name);
        -- Each kind of row kept is found by an index, not by reading the month: pending ones through the
        -- queue (its rows probe the month's primary key), dead ones by the partial index on rare states,
        -- unexpired tokens by the BRIN index on expires_at. The ids are kept (from PostgreSQL 17 on
        -- the partitions share the log's GENERATED ALWAYS identity).
        EXECUTE format('INSERT INTO siwa.notification_log_default OVERRIDING SYSTEM VALUE
                        SELECT p.* FROM siwa.%1$I p
                          JOIN siwa.notification_queue q ON q.jti = p.jti AND q.issued_at = p.issued_at
                        UNION
                        SELECT p.* FROM siwa.%1$I p WHERE p.state = ''dead''
                        UNION
                        SELECT p.* FROM siwa.%1$I p WHERE p.expires_at > %2$L', v_name,
                       clock_timestamp() - interval '1 minute');
        GET DIAGNOSTICS v_kept = ROW_COUNT;
        EXECUTE format('DROP TABLE siwa.%I', v_name);
        v_dropped := v_dropped + v_all - v_kept;
    END LOOP;
    -- The DEFAULT partition is small (rows kept from dropped months, rows of months that had no
    -- partition): its finished rows past the same cutoff are deleted row by row.
    DELETE FROM siwa.notification_log_default d
     WHERE d.issued_at < v_cutoff AND d.state IN ('applied', 'skipped')
       AND (d.expires_at IS NULL OR d.expires_at <= clock_timestamp() - interval '1 minute');
    GET DIAGNOSTICS v_kept = ROW_COUNT;
    RETURN v_dropped + v_kept;
END;
$$;
COMMENT ON FUNCTION siwa.drop_log_partitions(interval) IS
    'Retention: drops the month partitions of siwa.notification_log that ended before now - p_older_than (never less than 7 days: the dedupe window), keeping their pending and dead rows, and rows whose token has not expired, in the DEFAULT partition. SECURITY DEFINER (the schema''s owner), executable by siwa_worker only. Returns about how many rows were dropped (a month''s size as the planner''s statistics know it).';

-- Where token pruning goes on from: every finished row received before this has no raw token left
-- (a row still pending keeps the mark behind it until it is done).
CREATE TABLE IF NOT EXISTS siwa.retention_state (
    singleton            boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    tokens_pruned_before timestamptz NOT NULL DEFAULT '-infinity'
);
COMMENT ON TABLE siwa.retention_state IS 'Retention''s progress (one row), kept by siwa.prune.';
COMMENT ON COLUMN siwa.retention_state.singleton IS 'Always true: keeps this table to a single row.';
COMMENT ON COLUMN siwa.retention_state.tokens_pruned_before IS
    'Raw tokens of finished notifications received before this are pruned: the token pruner reads only the rows received since (by the received_at index), never the whole log.';
INSERT INTO siwa.retention_state DEFAULT VALUES ON CONFLICT DO NOTHING;

-- Retention, called by the worker's maintenance pass: raw tokens of finished rows (dead ones included:
-- requeueing needs no token) older than p_tokens_older_than, one batch per call, read from where the
-- last call stopped; and whole months of history older than p_rows_older_than
-- (siwa.drop_log_partitions). Pending and dead rows are never dropped.
CREATE OR REPLACE FUNCTION siwa.prune(
    p_tokens_older_than interval, p_rows_older_than interval, p_batch integer DEFAULT 1000)
RETURNS TABLE (tokens_pruned integer, rows_pruned integer)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_from timestamptz;
    v_to   timestamptz;
    v_last timestamptz;
    v_mark timestamptz;
BEGIN
    tokens_pruned := 0;
    rows_pruned := 0;
    IF p_tokens_older_than IS NOT NULL THEN
        SELECT s.tokens_pruned_before INTO v_from FROM siwa.retention_state s FOR UPDATE;
        v_to := clock_timestamp() - p_tokens_older_than;
        WITH batch AS (
            SELECT l.jti, l.issued_at, l.received_at FROM siwa.notification_log l
             WHERE l.received_at >= v_from AND l.received_at < v_to
               AND l.raw_token IS NOT NULL AND l.state <> 'pending'
             ORDER BY l.received_at LIMIT p_batch FOR UPDATE),
        pruned AS (
            UPDATE siwa.notification_log t SET raw_token = NULL
              FROM batch WHERE t.jti = batch.jti AND t.issued_at = batch.issued_at
            RETURNING batch.received_at)
        SELECT count(*), max(p.received_at) INTO tokens_pruned, v_last FROM pruned p;
        v_mark := CASE WHEN tokens_pruned < p_batch THEN v_to ELSE v_last END;
        v_mark := least(v_mark, (SELECT min(q.received_at) FROM siwa.notification_queue q));
        UPDATE siwa.retention_state SET tokens_pruned_before = greatest(v_from, v_mark);
    END IF;
    IF p_rows_older_than IS NOT NULL THEN
        rows_pruned := siwa.drop_log_partitions(p_rows_older_than);
    END IF;
    -- Dedupe keys past the window (7 days after iat, and expired): a token with such a jti is refused
    -- by the receiver for its age. At most ten batches' worth per call.
    DELETE FROM siwa.notification_jtis k
     WHERE k.ctid = ANY (ARRAY(
           SELECT j.ctid FROM siwa.notification_jtis j
            WHERE j.issued_at < clock_timestamp() - interval '7 days'
              AND (j.expires_at IS NULL OR j.expires_at < clock_timestamp() - interval '1 minute')
            LIMIT p_batch * 10));
    -- ESP event ids (siwa.esp_events_seen) past their expiry: a request carrying one is refused by the
    -- bounce listener for its signature's age. At most ten batches' worth per call.
    DELETE FROM siwa.esp_events_seen e
     WHERE e.ctid = ANY (ARRAY(
           SELECT x.ctid FROM siwa.esp_events_seen x
            WHERE x.expires_at < clock_timestamp() - interval '1 minute'
            LIMIT p_batch * 10));
    -- Changes (siwa.changes) applied longer than siwa.settings.changes_retention ago, numbered ones only
    -- (a row without a position has not been readable yet). At most ten batches' worth per call.
    -- A change is never pruned while a webhook delivery of it is pending (its delivered and dead
    -- deliveries and their attempts go with it: ON DELETE CASCADE).
    DELETE FROM siwa.changes c
     WHERE c.ctid = ANY (ARRAY(
           SELECT x.ctid FROM siwa.changes x
            WHERE x.applied_at < clock_timestamp() - (SELECT s.changes_retention FROM siwa.settings s)
              AND x.position IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM siwa.webhook_deliveries d
                               WHERE d.change_id = x.id AND d.state = 'pending')
            LIMIT p_batch * 10));
    RETURN NEXT;
END;
$$;
COMMENT ON FUNCTION siwa.prune(interval, interval, integer) IS
    'Retention: clears raw tokens of finished notifications (applied, skipped or dead) received before now - p_tokens_older_than, up to p_batch per call from where the last call stopped, and drops the months of history that ended before now - p_rows_older_than (siwa.drop_log_partitions; pending and dead rows are kept). NULL: keep. Also deletes dedupe keys past the window, expired ESP event ids and changes (siwa.changes) older than siwa.settings.changes_retention, whatever the arguments. Call until both counts are 0.';

-- Requeues notifications (dead ones, or one by jti) for another round of attempts.
CREATE OR REPLACE FUNCTION siwa.requeue(p_jti text DEFAULT NULL, p_state text DEFAULT NULL,
                                        p_since timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_count integer;
BEGIN
    IF p_jti IS NULL AND p_state IS NULL THEN
        RAISE EXCEPTION 'requeue needs a jti or a state';
    END IF;
    WITH requeued AS (
        UPDATE siwa.notification_log
           SET state = 'pending', attempts = 0, last_error = NULL, applied_at = NULL
         WHERE (p_jti IS NULL OR jti = p_jti)
           AND (p_state IS NULL OR state = p_state)
           AND (p_since IS NULL OR received_at >= p_since)
           AND state <> 'pending'
        RETURNING id, jti, issued_at, received_at)
    INSERT INTO siwa.notification_queue (id, jti, issued_at, received_at, next_attempt_at)
    SELECT r.id, r.jti, r.issued_at, r.received_at, clock_timestamp() FROM requeued r;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        PERFORM pg_notify('siwa_notifications', '');
    END IF;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION siwa.requeue(text, text, timestamptz) IS
    'Puts finished notifications back to pending (attempts reset): one by jti, or all in a state (e.g. dead) received since a time. Returns how many.';
