-- Health: service heartbeats and the gauges behind /metrics

-- Every siwa-receiver and siwa-worker process upserts its row here every few seconds (and deletes rows
-- of its own kind not seen for a day), so that `siwactl doctor --database-url` can tell whether workers
-- are alive and which audiences the receivers accept. Row-level security keeps each role to the rows of
-- its own kind: a receiver cannot fake a live worker; CHECK constraints keep every row to what a real
-- process writes: no heartbeat dated in the future or at infinity (alive forever, or an age that cannot be
-- computed), no control character a terminal would obey. Both objects came new in version 4; the columns
-- product_version and build_commit and the constraints on times and text came in version 5 (numbered
-- change 5).

CREATE TABLE IF NOT EXISTS siwa.service_heartbeats (
    kind       text        NOT NULL,
    host       text        NOT NULL,
    pid        integer     NOT NULL,
    version    text        NOT NULL,
    audiences  text[]      NOT NULL DEFAULT '{}',
    started_at timestamptz NOT NULL,
    last_seen  timestamptz NOT NULL DEFAULT now(),
    product_version text
        CONSTRAINT service_heartbeats_product_version_check CHECK (length(product_version) BETWEEN 1 AND 64),
    build_commit    text
        CONSTRAINT service_heartbeats_build_commit_check CHECK (length(build_commit) BETWEEN 1 AND 64),
    CONSTRAINT service_heartbeats_pkey PRIMARY KEY (kind, host, pid),
    CONSTRAINT service_heartbeats_kind_check CHECK (kind IN ('receiver', 'worker')),
    CONSTRAINT service_heartbeats_host_check CHECK (length(host) BETWEEN 1 AND 255),
    CONSTRAINT service_heartbeats_version_check CHECK (length(version) BETWEEN 1 AND 100),
    CONSTRAINT service_heartbeats_audiences_check CHECK (cardinality(audiences) <= 1000),
    -- What the doctor reads cannot lie (numbered change 5): times finite and not in the future (last_seen
    -- is the database's own now(); started_at comes from the process's clock, which may run a little
    -- ahead), and text without control characters (C0, DEL, C1), each client ID 1 to 255 characters.
    CONSTRAINT service_heartbeats_time_check
        CHECK (isfinite(last_seen) AND isfinite(started_at) AND last_seen <= now() + interval '1 minute'
               AND started_at <= now() + interval '5 minutes'),
    CONSTRAINT service_heartbeats_text_check
        CHECK (host !~ '[\x01-\x1f\x7f-\x9f]' AND version !~ '[\x01-\x1f\x7f-\x9f]'
               AND product_version !~ '[\x01-\x1f\x7f-\x9f]' AND build_commit !~ '[\x01-\x1f\x7f-\x9f]'),
    CONSTRAINT service_heartbeats_audiences_text_check
        CHECK (cardinality(audiences) = 0
               OR array_to_string(audiences, E'\n', '')
                  ~ '^[^\x01-\x1f\x7f-\x9f]{1,255}(\n[^\x01-\x1f\x7f-\x9f]{1,255})*$'
                  AND array_to_string(audiences, ' ', '') !~ '[\x01-\x1f\x7f-\x9f]')
);
COMMENT ON TABLE siwa.service_heartbeats IS
    'One row per running siwa-receiver or siwa-worker process (by kind, host, pid), refreshed every few seconds; rows not seen for a day are deleted by the next process of the same kind. Read by siwactl doctor --database-url.';
COMMENT ON COLUMN siwa.service_heartbeats.kind IS 'receiver or worker.';
COMMENT ON COLUMN siwa.service_heartbeats.host IS 'The host name (a pod''s name under Kubernetes).';
COMMENT ON COLUMN siwa.service_heartbeats.pid IS 'The process ID on that host.';
COMMENT ON COLUMN siwa.service_heartbeats.version IS 'What the process was built as: its schema version, e.g. schema 3.';
COMMENT ON COLUMN siwa.service_heartbeats.audiences IS
    'A receiver''s accepted client IDs (--audience); for a worker, the revoker''s client IDs (--client-id), empty when the revoker is off.';
COMMENT ON COLUMN siwa.service_heartbeats.started_at IS 'When the process started.';
COMMENT ON COLUMN siwa.service_heartbeats.last_seen IS 'Its latest heartbeat.';
COMMENT ON COLUMN siwa.service_heartbeats.product_version IS
    'The product version the process was built as (its --version, e.g. 5.0.0); NULL for a process built before schema version 5.';
COMMENT ON COLUMN siwa.service_heartbeats.build_commit IS
    'The commit the process was built from (unknown when the build did not know it); NULL for a process built before schema version 5.';
ALTER TABLE siwa.service_heartbeats ENABLE ROW LEVEL SECURITY;

-- The gauges of /metrics that come from the database, one row of aggregates, cheap on a large log:
--   last_received_at: the latest received_at (every receiver's). With p_received_since (what the
--     caller found last time), only block ranges received since then are read (the BRIN index of each
--     partition), and NULL means nothing newer; without it, windows of 1 hour, 6 hours, then 1 day doubling up to 128 days, then 400
--     days are tried in turn and the first with a row answers (NULL: none within 400 days). A window
--     reads about as many rows as arrived between its start and the latest one, so the search is
--     bounded by the silence it measures; the caller runs it once and then passes what it found.
--     Both read only the month partitions of issued_at from 8 days before the bound: a token is
--     accepted at most 6 days after its iat (--max-token-age), or until its exp, which Apple sets a day
--     after iat (a token with a later exp, received more than 8 days after its iat, would be missed here
--     until the next one arrives). Within a partition, BRIN reads the block ranges that may hold rows
--     since the bound, and the ones not summarized yet (autosummarize does each within about a minute
--     of its filling; a month's last, partly filled range stays unsummarized until a manual
--     brin_summarize_new_values, and is read every time).
--   installed_at: when schema version 1 was recorded, the floor for a database that never received one.
--   last_applied_at: the latest applied_at (one descent of the applied_at index per partition).
--   dead: dead notifications (the partial index of skipped and dead rows).
--   oldest_pending_seconds: the age of the first pending notification in arrival order (the queue's
--     primary key); 0 when none is pending.
-- SECURITY DEFINER (the schema's owner) so that siwa_receiver, which may not read these columns, gets
-- the aggregates and nothing else; force_custom_plan so that the BRIN scans are planned for the actual
-- bound, not a generic one.
CREATE OR REPLACE FUNCTION siwa.health_gauges(p_received_since timestamptz DEFAULT NULL)
RETURNS TABLE (last_received_at timestamptz, installed_at timestamptz, last_applied_at timestamptz,
               dead bigint, oldest_pending_seconds double precision)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_window interval;
BEGIN
    IF p_received_since IS NOT NULL AND p_received_since > now() - interval '400 days' THEN
        -- NULL when nothing was received since (the caller keeps its answer): never the windows, which
        -- would read the whole silence on every call.
        last_received_at := (SELECT max(l.received_at) FROM siwa.notification_log l
                              WHERE l.received_at >= p_received_since
                                AND l.issued_at >= p_received_since - interval '8 days');
    ELSE
        FOREACH v_window IN ARRAY ARRAY['1 hour', '6 hours', '1 day', '2 days', '4 days', '8 days', '16 days', '32 days',
                                       '64 days', '128 days', '400 days']::interval[] LOOP
            last_received_at := (SELECT max(l.received_at) FROM siwa.notification_log l
                                  WHERE l.received_at >= now() - v_window
                                    AND l.issued_at >= now() - v_window - interval '8 days');
            EXIT WHEN last_received_at IS NOT NULL;
        END LOOP;
    END IF;
    installed_at := (SELECT min(v.applied_at) FROM siwa.schema_version v);
    last_applied_at := (SELECT max(l.applied_at) FROM siwa.notification_log l);
    dead := (SELECT count(*) FROM siwa.notification_log l WHERE l.state = 'dead');
    oldest_pending_seconds := coalesce(
        (SELECT extract(epoch FROM now() - q.received_at)::double precision
           FROM siwa.notification_queue q ORDER BY q.id LIMIT 1), 0);
    RETURN NEXT;
END;
$$;
COMMENT ON FUNCTION siwa.health_gauges(timestamptz) IS
    'The database''s gauges for /metrics, one row of aggregates (latest received_at, the schema''s installation, latest applied_at, dead count, oldest pending age), by indexed reads only. SECURITY DEFINER; executable by siwa_receiver, siwa_worker and siwa_admin.';

-- The client IDs in use, for siwactl doctor --database-url to compare with the receivers' audiences:
-- the audiences of notifications received since p_since (the BRIN index of received_at, in the
-- partitions an 8-day window of issued_at reaches, as in siwa.health_gauges), and the
-- client IDs of sign-ins and of refresh tokens not revoked. Distinct values only; SECURITY DEFINER so
-- that a siwa_admin member can run the check without reading the tables.
CREATE OR REPLACE FUNCTION siwa.client_ids_in_use(p_since timestamptz)
RETURNS TABLE (source text, client_id text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT DISTINCT 'notifications', l.audience FROM siwa.notification_log l
     WHERE l.received_at >= p_since AND l.issued_at >= p_since - interval '8 days'
    UNION ALL
    SELECT DISTINCT 'sign-ins', s.client_id FROM siwa.sign_ins s
    UNION ALL
    SELECT DISTINCT 'refresh tokens', t.client_id FROM siwa.refresh_tokens t
     WHERE t.client_id IS NOT NULL AND t.revoked_at IS NULL
    ORDER BY 1, 2
$$;
COMMENT ON FUNCTION siwa.client_ids_in_use(timestamptz) IS
    'Distinct client IDs in use: audiences of notifications received since p_since, client IDs of sign-ins and of refresh tokens not revoked. SECURITY DEFINER; executable by siwa_admin (siwactl doctor --database-url).';

-- A service process's heartbeat: upserts its row (version 'schema N', the product version and the
-- commit it was built from) and prunes rows of its kind not seen for p_prune_after. SECURITY INVOKER:
-- the row policy lets each role write only its own kind.
CREATE OR REPLACE FUNCTION siwa.record_heartbeat(p_kind text, p_host text, p_pid integer,
                                                 p_schema_version integer, p_product_version text,
                                                 p_build_commit text, p_audiences text[],
                                                 p_started_at timestamptz, p_prune_after interval) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO siwa.service_heartbeats AS h
           (kind, host, pid, version, product_version, build_commit, audiences, started_at, last_seen)
    VALUES (p_kind, p_host, p_pid, 'schema ' || p_schema_version, p_product_version, p_build_commit,
            p_audiences, p_started_at, pg_catalog.now())
    ON CONFLICT (kind, host, pid) DO UPDATE
       SET version = excluded.version, product_version = excluded.product_version,
           build_commit = excluded.build_commit, audiences = excluded.audiences,
           started_at = excluded.started_at, last_seen = excluded.last_seen;
    DELETE FROM siwa.service_heartbeats h
     WHERE h.kind = p_kind AND h.last_seen < pg_catalog.now() - p_prune_after;
$$;
COMMENT ON FUNCTION siwa.record_heartbeat(text, text, integer, integer, text, text, text[], timestamptz, interval) IS
    'Upserts a service process''s heartbeat row and prunes stale rows of its kind. Executable by siwa_receiver and siwa_worker (each for its own kind).';

-- A stopping process deletes its heartbeat row, so that it does not look alive.
CREATE OR REPLACE FUNCTION siwa.remove_heartbeat(p_kind text, p_host text, p_pid integer) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    DELETE FROM siwa.service_heartbeats h WHERE h.kind = p_kind AND h.host = p_host AND h.pid = p_pid;
$$;
COMMENT ON FUNCTION siwa.remove_heartbeat(text, text, integer) IS
    'Deletes a stopping service process''s heartbeat row. Executable by siwa_receiver and siwa_worker (each for its own kind).';

-- ==== Webhook visibility: per-endpoint gauges (siwa-worker's /metrics, siwactl stats) ====
-- Each endpoint's current run of failed attempts (consecutive_failures, failing_since: the first failure
-- of the run) lives on its row in siwa.webhook_endpoints, kept by siwa.record_webhook_attempts (the one
-- home: auto-disable and the lanes' isolation read it too); a delivered attempt ends the run, and so
-- does enabling the endpoint. The healthy path writes nothing there.

-- The dead deliveries of an endpoint, counted by siwa.webhook_endpoint_gauges every few seconds (without
-- it the count reads every delivery ever kept).
CREATE INDEX IF NOT EXISTS webhook_deliveries_dead_idx
    ON siwa.webhook_deliveries (endpoint_id) WHERE state = 'dead';

-- One row per endpoint for the worker's per-endpoint gauges and siwactl stats: the URL's host (and
-- port) only — the URL's path and query may hold a token, userinfo is refused by the endpoints' CHECK —,
-- whether it is enabled, pending and dead deliveries, the oldest pending delivery's age (0: none), the
-- current run of failures. Endpoints in trouble (disabled, failing, or with dead deliveries) come first,
-- then by id, so that a caller showing only the first N shows the ones that matter, stably. Reads the
-- partial indexes of pending and dead deliveries. SECURITY DEFINER (the owner) so that siwa_admin gets
-- the aggregates without the tables; never a secret or a URL's path.
-- (Where the operations work records why an endpoint was disabled, e.g. automatically after a 410 or
-- continuous failure, add that reason as a column here: the gauges and siwactl stats read by name.)
CREATE OR REPLACE FUNCTION siwa.webhook_endpoint_gauges()
RETURNS TABLE (endpoint_id bigint, host text, enabled boolean, pending bigint, dead bigint,
               oldest_pending_seconds double precision, consecutive_failures integer,
               failing_since timestamptz, backoff_until timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH p AS (SELECT d.endpoint_id, count(*) AS n, min(d.created_at) AS oldest
                 FROM siwa.webhook_deliveries d WHERE d.state = 'pending' GROUP BY d.endpoint_id),
         x AS (SELECT d.endpoint_id, count(*) AS n
                 FROM siwa.webhook_deliveries d WHERE d.state = 'dead' GROUP BY d.endpoint_id)
    SELECT e.id, substring(e.url FROM '^[A-Za-z]+://([^/?#@]+)'), e.enabled, coalesce(p.n, 0), coalesce(x.n, 0),
           coalesce(extract(epoch FROM now() - p.oldest)::double precision, 0),
           e.consecutive_failures, e.failing_since, e.backoff_until
      FROM siwa.webhook_endpoints e
      LEFT JOIN p ON p.endpoint_id = e.id
      LEFT JOIN x ON x.endpoint_id = e.id
     ORDER BY (NOT e.enabled OR e.failing_since IS NOT NULL OR coalesce(x.n, 0) > 0) DESC, e.id
$$;
COMMENT ON FUNCTION siwa.webhook_endpoint_gauges() IS
    'Per webhook endpoint: URL host, enabled, pending, dead, oldest pending age, current run of failures, backed off until; endpoints in trouble first. SECURITY DEFINER; executable by siwa_worker and siwa_admin.';
-- ==== end of webhook visibility ====
