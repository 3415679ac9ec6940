-- Auth adapters: Apple's changes applied in the auth system where the sessions live (siwa.auth_adapters), and their outbox

-- Every change in siwa.changes (consent revoked, account deleted, forwarding off/on, sub transferred,
-- personal data erased) is applied by siwa-worker in each configured auth system (Supabase Auth, Better
-- Auth, Auth.js, Django, …: issue 47), one transaction on that system's database per row, under the lease
-- rule (schema/54-leases.sql).
--  - siwa.auth_adapters: one row per configured adapter: its platform, the platform's name for Apple
--    (provider), the reference of its connection (file:PATH; the URL or credentials are read by the
--    worker from that file, never stored, logged or shown), options (table naming and the like) and one
--    policy per event, with safe defaults. A policy the platform cannot express is refused when it is
--    written (SQLSTATE 22023, the trigger siwa.check_auth_adapter), not discovered at the first event.
--  - siwa.auth_adapter_events: the outbox, one row per change and enabled adapter, written by the AFTER
--    INSERT statement trigger on siwa.changes in the change's transaction. It copies what the call
--    needs (type, sub, old sub, event time): no email, so a pending row of an erased account is
--    unchanged and still applied. pending → done (applied), no_user (finished: the sub links no user in
--    that system) or dead (the retry schedule ran out; siwa.retry_auth_adapter_events makes it pending).
-- Order, per adapter and user: a row is not claimed while an earlier pending row (in flight, or waiting
-- for its retry) of its adapter concerns the same user: one whose sub or old_sub is this row's sub or
-- old_sub. So a transfer (sub new, old_sub old) waits for the old sub's earlier rows, and the rows after
-- it (sub new) wait for it. The row ids follow the applying order per user: the worker applies a user's
-- notifications under the user's siwa.accounts row lock, and the fan-out writes in change order. A dead
-- row no longer holds the user's later rows (as a dead webhook delivery); replayed, it goes before the
-- later ones still pending.
-- The sub a row holds is the one the auth system knows at that point of the user's queue: a team
-- transfer keeps it (siwa.sub_columns, below); the transfer's own row moves the identity. Erasure
-- (siwa.erase_personal_data_of) takes the sub and old_sub out of the user's finished rows (done and
-- no_user at once; dead ones, which an operator may retry, once they finished longer ago than
-- siwa.settings.changes_retention); siwa.prune_auth_adapter_events deletes finished rows.
-- Same database or not, the adapter's call runs after the change committed, never inside the applying
-- transaction: one code path per adapter, and an auth system that is slow, down or refuses never holds
-- the notification queue.
CREATE TABLE IF NOT EXISTS siwa.auth_adapters (
    id                          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                        text        NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9-]{1,40}$'),
    platform                    text        NOT NULL CHECK (platform IN ('supabase', 'better-auth', 'authjs',
                                            'authjs-prisma', 'django-allauth', 'django-social-auth', 'firebase',
                                            'auth0', 'clerk', 'keycloak')),
    provider                    text        NOT NULL CHECK (provider ~ '^[A-Za-z0-9._:-]{1,64}$'),
    connection_ref              text        NOT NULL CHECK (connection_ref ~ '^file:[^[:space:][:cntrl:]]+$'
                                                            AND length(connection_ref) <= 1000),
    options                     jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(options) = 'object'
                                                                         AND length(options::text) <= 4000),
    on_consent_revoked          text        NOT NULL DEFAULT 'end-sessions'
                                            CHECK (on_consent_revoked IN ('end-sessions', 'none')),
    on_account_deleted          text        NOT NULL DEFAULT 'unlink'
                                            CHECK (on_account_deleted IN ('unlink', 'delete', 'disable', 'sessions-only')),
    when_unlink_leaves_no_login text        NOT NULL DEFAULT 'disable'
                                            CHECK (when_unlink_leaves_no_login IN ('disable', 'keep')),
    on_forwarding_change        text        NOT NULL DEFAULT 'ignore'
                                            CHECK (on_forwarding_change IN ('ignore', 'record')),
    on_sub_transferred          text        NOT NULL DEFAULT 'move' CHECK (on_sub_transferred IN ('move', 'ignore')),
    enabled                     boolean     NOT NULL DEFAULT true,
    created_at                  timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE siwa.auth_adapters IS
    'Auth systems where siwa-worker applies Apple''s changes (siwactl adapters): platform, the platform''s provider name for Apple, the connection''s file reference (never the URL or a credential), options, one policy per event.';
COMMENT ON COLUMN siwa.auth_adapters.provider IS
    'The platform''s name for Apple in its identity tables (apple; apple-id for python-social-auth): the caller picks the platform''s default.';
COMMENT ON COLUMN siwa.auth_adapters.connection_ref IS
    'file:PATH of a file holding the auth database''s connection URL or credentials, read by the worker at connect time; the value is never stored here.';
COMMENT ON COLUMN siwa.auth_adapters.options IS
    'Platform options: table and column naming, whether Better Auth''s admin plugin (ban) is installed ({"ban": true}), and the like.';
COMMENT ON COLUMN siwa.auth_adapters.on_consent_revoked IS
    'end-sessions (default): the linked user''s sessions and refresh tokens end; none.';
COMMENT ON COLUMN siwa.auth_adapters.on_account_deleted IS
    'unlink (default): the Apple identity unlinked and the sessions ended; delete: the user deleted with every row the platform keeps of them; disable: the user disabled; sessions-only.';
COMMENT ON COLUMN siwa.auth_adapters.when_unlink_leaves_no_login IS
    'When unlink leaves the user no way to sign in: disable (default) the user, or keep them as they are.';
COMMENT ON COLUMN siwa.auth_adapters.on_forwarding_change IS
    'ignore (default), or record email forwarding off/on where the platform keeps app metadata.';
COMMENT ON COLUMN siwa.auth_adapters.on_sub_transferred IS
    'move (default): the linked identity moved from the old sub to the new one; ignore.';
COMMENT ON COLUMN siwa.auth_adapters.enabled IS 'Whether its rows are claimed (siwactl adapters enable|disable): a disabled adapter is paused, its changes queue as pending rows until it is enabled again.';

-- The policies a platform cannot express, refused at every write of an adapter (SQLSTATE 22023, naming
-- the policy): Auth.js (both adapters) has no disable flag, and Better Auth has one only with its admin
-- plugin (options {"ban": true}).
CREATE OR REPLACE FUNCTION siwa.check_auth_adapter() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.platform IN ('authjs', 'authjs-prisma')
       OR (NEW.platform = 'better-auth' AND (NEW.options ->> 'ban') IS DISTINCT FROM 'true') THEN
        IF NEW.on_account_deleted = 'disable' THEN
            RAISE EXCEPTION 'on_account_deleted disable: % cannot disable a user', NEW.platform
                USING ERRCODE = '22023',
                      HINT = CASE WHEN NEW.platform = 'better-auth'
                                  THEN 'install the admin plugin and set options {"ban": true}, or choose unlink, delete or sessions-only'
                                  ELSE 'choose unlink, delete or sessions-only' END;
        END IF;
        IF NEW.when_unlink_leaves_no_login = 'disable' THEN
            RAISE EXCEPTION 'when_unlink_leaves_no_login disable: % cannot disable a user', NEW.platform
                USING ERRCODE = '22023',
                      HINT = CASE WHEN NEW.platform = 'better-auth'
                                  THEN 'install the admin plugin and set options {"ban": true}, or choose keep'
                                  ELSE 'choose keep' END;
        END IF;
    END IF;
    RETURN NEW;
END;
$$;
COMMENT ON FUNCTION siwa.check_auth_adapter() IS
    'Trigger before INSERT or UPDATE of siwa.auth_adapters: refuses (22023, naming the policy) a disable policy on a platform without a disable flag (authjs, authjs-prisma; better-auth unless options {"ban": true}). Executable by siwa_admin (through its writes).';
DROP TRIGGER IF EXISTS auth_adapters_check ON siwa.auth_adapters;
CREATE TRIGGER auth_adapters_check
    BEFORE INSERT OR UPDATE ON siwa.auth_adapters
    FOR EACH ROW EXECUTE FUNCTION siwa.check_auth_adapter();

CREATE TABLE IF NOT EXISTS siwa.auth_adapter_events (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    change_id        bigint      NOT NULL,
    adapter_id       bigint      NOT NULL REFERENCES siwa.auth_adapters (id) ON DELETE CASCADE,
    type             text        NOT NULL CHECK (type IN ('siwa.consent_revoked', 'siwa.account_deleted',
                                 'siwa.email_disabled', 'siwa.email_enabled', 'siwa.sub_transferred',
                                 'siwa.personal_data_erased')),
    sub              text,
    old_sub          text,
    event_time       timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    state            text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done', 'no_user', 'dead')),
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_attempt_at  timestamptz,
    lease_owner      text,
    lease_expires_at timestamptz,
    last_error       text        CHECK (length(last_error) <= 300),
    result           jsonb       CHECK (jsonb_typeof(result) = 'object' AND length(result::text) <= 2000),
    finished_at      timestamptz,
    CONSTRAINT auth_adapter_events_lease_check CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CONSTRAINT auth_adapter_events_finished_check CHECK ((state = 'pending') = (finished_at IS NULL)),
    CONSTRAINT auth_adapter_events_sub_check CHECK (sub IS NOT NULL OR state <> 'pending'),
    UNIQUE (change_id, adapter_id)
);
COMMENT ON TABLE siwa.auth_adapter_events IS
    'The auth adapters'' outbox: one row per change and adapter, what the call needs copied at fan-out (no email); pending, done, no_user (the sub links no user there) or dead.';
COMMENT ON COLUMN siwa.auth_adapter_events.change_id IS 'The siwa.changes row it applies (no foreign key: the row outlives the change''s retention while pending).';
COMMENT ON COLUMN siwa.auth_adapter_events.sub IS
    'The sub the auth system knows at this point of the user''s queue (a team transfer keeps it); NULL once finished and erased.';
COMMENT ON COLUMN siwa.auth_adapter_events.old_sub IS 'For siwa.sub_transferred: the sub the identity moves from; NULL otherwise, and once finished and erased.';
COMMENT ON COLUMN siwa.auth_adapter_events.attempts IS 'Attempts made (since the last retry), each counted when a lane claimed it; a release uncounts it.';
COMMENT ON COLUMN siwa.auth_adapter_events.last_error IS
    'Our own bounded words (the table or grant missing, the platform unreachable); never a URL, an address, a token or a password.';
COMMENT ON COLUMN siwa.auth_adapter_events.result IS
    'What the call changed, counts only ({"sessions_ended": 2, "identities_unlinked": 1}).';
CREATE INDEX IF NOT EXISTS auth_adapter_events_due_idx ON siwa.auth_adapter_events (adapter_id, id) WHERE state = 'pending';
-- The per-user order: an earlier pending row of the adapter by sub, and by old sub (a transfer's).
CREATE INDEX IF NOT EXISTS auth_adapter_events_order_idx
    ON siwa.auth_adapter_events (adapter_id, sub, id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS auth_adapter_events_order_old_idx
    ON siwa.auth_adapter_events (adapter_id, old_sub, id) WHERE state = 'pending' AND old_sub IS NOT NULL;
-- The erasure finds a user's rows by either sub; the dead ones and the retention's by when they finished.
CREATE INDEX IF NOT EXISTS auth_adapter_events_sub_idx ON siwa.auth_adapter_events (sub) WHERE sub IS NOT NULL;
CREATE INDEX IF NOT EXISTS auth_adapter_events_old_sub_idx ON siwa.auth_adapter_events (old_sub) WHERE old_sub IS NOT NULL;
CREATE INDEX IF NOT EXISTS auth_adapter_events_dead_idx ON siwa.auth_adapter_events (adapter_id, id) WHERE state = 'dead';
CREATE INDEX IF NOT EXISTS auth_adapter_events_finished_idx
    ON siwa.auth_adapter_events (finished_at) WHERE state <> 'pending';

-- The fan-out: once per INSERT statement on siwa.changes, one row per new change and adapter (a disabled one
-- is paused: its rows wait), in
-- change order; one NOTIFY siwa_auth_adapters (at commit) when there is any. It runs as the role that
-- inserts the changes (siwa_worker; the owner for a transfer or an erasure it runs itself).
CREATE OR REPLACE FUNCTION siwa.auth_adapter_fan_out() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM siwa.auth_adapters) THEN
        RETURN NULL;
    END IF;
    INSERT INTO siwa.auth_adapter_events (change_id, adapter_id, type, sub, old_sub, event_time)
    SELECT c.id, a.id, c.type, c.sub, c.old_sub, c.event_time
      FROM new_changes c
      CROSS JOIN siwa.auth_adapters a
     WHERE c.type IN ('siwa.consent_revoked', 'siwa.account_deleted', 'siwa.email_disabled', 'siwa.email_enabled',
                      'siwa.sub_transferred', 'siwa.personal_data_erased')
     ORDER BY c.id, a.id
    ON CONFLICT (change_id, adapter_id) DO NOTHING;
    IF FOUND THEN
        PERFORM pg_catalog.pg_notify('siwa_auth_adapters', '');
    END IF;
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION siwa.auth_adapter_fan_out() IS
    'Statement trigger after INSERT on siwa.changes: one siwa.auth_adapter_events row per new change and adapter (disabled ones too: they are paused), NOTIFY siwa_auth_adapters. Executable by siwa_worker (through its inserts into siwa.changes).';
DROP TRIGGER IF EXISTS changes_auth_adapter_fan_out ON siwa.changes;
CREATE TRIGGER changes_auth_adapter_fan_out
    AFTER INSERT ON siwa.changes REFERENCING NEW TABLE AS new_changes
    FOR EACH STATEMENT EXECUTE FUNCTION siwa.auth_adapter_fan_out();

-- The claim of one adapter's lane (schema/54-leases.sql). Each probe is an index probe by its shape: the
-- due rows in the due index's two-column order with row bounds (ordered by id alone, stale statistics
-- let the planner walk the primary key from its start, where the finished rows gather: see
-- siwa.claim_ssf_events), and the order checks on the two partial order indexes, which hold pending
-- rows only.
DROP FUNCTION IF EXISTS siwa.claim_auth_adapter_events(text, interval, integer, bigint);
CREATE OR REPLACE FUNCTION siwa.claim_auth_adapter_events(p_owner text, p_lease interval, p_limit integer,
                                                          p_adapter bigint, p_due_by timestamptz DEFAULT NULL)
RETURNS TABLE (id bigint, change_id bigint, type text, sub text, old_sub text, event_time timestamptz,
               attempts integer, adapter_id bigint, platform text, provider text, connection_ref text,
               options jsonb, on_consent_revoked text, on_account_deleted text, when_unlink_leaves_no_login text,
               on_forwarding_change text, on_sub_transferred text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_owner IS NULL OR p_owner = '' OR p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION 'a claim needs an owner and a positive lease' USING ERRCODE = '22023';
    END IF;
    IF coalesce(p_limit, 0) <= 0
       OR NOT EXISTS (SELECT 1 FROM siwa.auth_adapters a WHERE a.id = p_adapter AND a.enabled) THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH heads AS (
        SELECT e.id FROM siwa.auth_adapter_events e
         WHERE (e.adapter_id, e.id) BETWEEN (p_adapter, 0) AND (p_adapter, 9223372036854775807)
           AND e.state = 'pending' AND e.next_attempt_at <= coalesce(p_due_by, now())
           AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= clock_timestamp())
           -- an earlier pending row of the same user: one equality probe of an order index each
           AND NOT EXISTS (SELECT 1 FROM siwa.auth_adapter_events q
                            WHERE q.adapter_id = e.adapter_id AND q.sub = e.sub AND q.id < e.id
                              AND q.state = 'pending')
           AND NOT EXISTS (SELECT 1 FROM siwa.auth_adapter_events q
                            WHERE q.adapter_id = e.adapter_id AND q.old_sub = e.sub AND q.id < e.id
                              AND q.state = 'pending' AND q.old_sub IS NOT NULL)
           AND (e.old_sub IS NULL
                OR (NOT EXISTS (SELECT 1 FROM siwa.auth_adapter_events q
                                 WHERE q.adapter_id = e.adapter_id AND q.sub = e.old_sub AND q.id < e.id
                                   AND q.state = 'pending')
                    AND NOT EXISTS (SELECT 1 FROM siwa.auth_adapter_events q
                                     WHERE q.adapter_id = e.adapter_id AND q.old_sub = e.old_sub AND q.id < e.id
                                       AND q.state = 'pending' AND q.old_sub IS NOT NULL)))
         ORDER BY e.adapter_id, e.id
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED),
    leased AS (
        UPDATE siwa.auth_adapter_events e
           SET lease_owner = p_owner, lease_expires_at = clock_timestamp() + p_lease,
               attempts = e.attempts + 1, last_attempt_at = clock_timestamp()
          FROM heads h WHERE e.id = h.id
        RETURNING e.*)
    SELECT l.id, l.change_id, l.type, l.sub, l.old_sub, l.event_time, l.attempts, a.id, a.platform, a.provider,
           a.connection_ref, a.options, a.on_consent_revoked, a.on_account_deleted, a.when_unlink_leaves_no_login,
           a.on_forwarding_change, a.on_sub_transferred
      FROM leased l JOIN siwa.auth_adapters a ON a.id = l.adapter_id
     ORDER BY l.id;
END;
$$;
COMMENT ON FUNCTION siwa.claim_auth_adapter_events(text, interval, integer, bigint, timestamptz) IS
    'An auth adapter lane''s claim (schema/54-leases.sql): leases to p_owner, for p_lease, up to p_limit rows of the enabled adapter p_adapter that are pending, due by p_due_by (a drain passes its start, so it never retries what it just tried; default: the transaction''s start), not leased or their lease expired (taken over: FOR UPDATE SKIP LOCKED makes one claimer take it), and with no earlier pending row of the adapter concerning the same user (its sub or old_sub equal to this row''s sub or old_sub): at most one row per user, in id order. Each attempt is counted (attempts, last_attempt_at) as it is leased. Returns the rows with their adapter''s platform, provider, connection file reference, options and policies; none when the adapter is unknown or disabled. 22023 without an owner or a positive lease. Executable by siwa_worker.';

-- Records a lane's batch in one statement, each row only while its lease is p_owner's (and it is pending).
CREATE OR REPLACE FUNCTION siwa.record_auth_adapter_events(p_owner text, p_ids bigint[], p_outcomes text[],
                                                           p_errors text[], p_results jsonb[],
                                                           p_max_attempts integer, p_retry_base interval,
                                                           p_retry_max interval)
RETURNS SETOF bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF pg_catalog.cardinality(p_ids) IS DISTINCT FROM pg_catalog.cardinality(p_outcomes)
       OR pg_catalog.cardinality(coalesce(p_errors, '{}')) NOT IN (0, pg_catalog.cardinality(p_ids))
       OR pg_catalog.cardinality(coalesce(p_results, '{}')) NOT IN (0, pg_catalog.cardinality(p_ids)) THEN
        RAISE EXCEPTION 'one outcome per id, and errors and results empty or one per id' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.unnest(p_outcomes) AS o(outcome)
                WHERE o.outcome IS NULL OR o.outcome NOT IN ('done', 'no_user', 'retry', 'released')) THEN
        RAISE EXCEPTION 'the outcome is done, no_user, retry or released' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.unnest(p_ids) AS i(id) GROUP BY i.id HAVING count(*) > 1 OR i.id IS NULL) THEN
        RAISE EXCEPTION 'an id given twice, or NULL' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.unnest(p_results) AS r(result)
                WHERE r.result IS NOT NULL
                  AND (pg_catalog.jsonb_typeof(r.result) <> 'object'
                       OR EXISTS (SELECT 1 FROM pg_catalog.jsonb_each(r.result) AS x
                                   WHERE pg_catalog.jsonb_typeof(x.value) <> 'number'
                                      OR x.key !~ '^[a-z][a-z0-9_]{0,63}$'))) THEN
        RAISE EXCEPTION 'a result holds counts only: {"name": number, …}' USING ERRCODE = '22023';
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts < 1 THEN
        RAISE EXCEPTION 'p_max_attempts is at least 1' USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    UPDATE siwa.auth_adapter_events e
       SET state = CASE WHEN o.outcome IN ('done', 'no_user') THEN o.outcome
                        WHEN o.outcome = 'retry' AND e.attempts >= p_max_attempts THEN 'dead'
                        ELSE 'pending' END,
           attempts = CASE WHEN o.outcome = 'released' THEN greatest(e.attempts - 1, 0) ELSE e.attempts END,
           next_attempt_at = CASE WHEN o.outcome = 'retry' AND e.attempts < p_max_attempts
                                  THEN clock_timestamp() + siwa.retry_delay(e.attempts, p_retry_base, p_retry_max)
                                  ELSE e.next_attempt_at END,
           last_error = CASE WHEN o.outcome = 'released' THEN e.last_error ELSE pg_catalog.left(o.error, 300) END,
           result = CASE WHEN o.outcome IN ('done', 'no_user') THEN o.result ELSE e.result END,
           finished_at = CASE WHEN o.outcome IN ('done', 'no_user')
                                   OR (o.outcome = 'retry' AND e.attempts >= p_max_attempts)
                              THEN clock_timestamp() END,
           lease_owner = NULL, lease_expires_at = NULL
      FROM unnest(p_ids, p_outcomes, p_errors, p_results) AS o(id, outcome, error, result)
     WHERE e.id = o.id AND e.lease_owner = p_owner AND e.state = 'pending'
    RETURNING e.id;
END;
$$;
COMMENT ON FUNCTION siwa.record_auth_adapter_events(text, bigint[], text[], text[], jsonb[], integer, interval, interval) IS
    'Records an auth adapter lane''s batch in one statement: for each p_ids[i] still leased to p_owner and pending, p_outcomes[i] done (applied) or no_user (the sub links no user there), both finished with p_results[i] (counts only: {"name": number}; NULL allowed); retry: due again after siwa.retry_delay(attempts, p_retry_base, p_retry_max), dead (finished) once attempts reached p_max_attempts; released: given back uncalled, its attempt uncounted. p_errors[i] (our own words, cut to 300 characters) is stored as last_error but for a release; p_errors and p_results may be empty. The lease is cleared. Returns the ids recorded; an id missing from them lost its lease (taken over) and nothing of it was written. 22023 for an unknown outcome, arrays of other lengths, an id twice, a result that is not counts. Executable by siwa_worker.';

-- The operator's calls (siwactl adapters, as siwa_admin): add, remove, retry the dead, prune.
CREATE OR REPLACE FUNCTION siwa.add_auth_adapter(
    p_name text, p_platform text, p_provider text, p_connection_ref text, p_options jsonb DEFAULT '{}',
    p_on_consent_revoked text DEFAULT 'end-sessions', p_on_account_deleted text DEFAULT 'unlink',
    p_when_unlink_leaves_no_login text DEFAULT 'disable', p_on_forwarding_change text DEFAULT 'ignore',
    p_on_sub_transferred text DEFAULT 'move', p_enabled boolean DEFAULT true)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_name IS NULL OR p_name !~ '^[a-z0-9-]{1,40}$' THEN
        RAISE EXCEPTION 'an adapter''s name is 1 to 40 of a-z, 0-9 and -' USING ERRCODE = '22023';
    END IF;
    IF p_platform IS NULL OR p_platform NOT IN ('supabase', 'better-auth', 'authjs', 'authjs-prisma', 'django-allauth',
                                                'django-social-auth', 'firebase', 'auth0', 'clerk', 'keycloak') THEN
        RAISE EXCEPTION 'unknown platform %', coalesce(p_platform, 'NULL') USING ERRCODE = '22023';
    END IF;
    IF p_provider IS NULL OR p_provider !~ '^[A-Za-z0-9._:-]{1,64}$' THEN
        RAISE EXCEPTION 'the provider is the platform''s name for Apple (apple, apple-id)' USING ERRCODE = '22023';
    END IF;
    IF p_connection_ref IS NULL OR p_connection_ref !~ '^file:[^[:space:][:cntrl:]]+$' OR length(p_connection_ref) > 1000 THEN
        RAISE EXCEPTION 'the connection is a file: reference (file:PATH of a file holding the URL), never the URL itself'
            USING ERRCODE = '22023';
    END IF;
    IF p_options IS NULL OR pg_catalog.jsonb_typeof(p_options) <> 'object' THEN
        RAISE EXCEPTION 'the options are a JSON object' USING ERRCODE = '22023';
    END IF;
    IF p_on_consent_revoked IS NULL OR p_on_consent_revoked NOT IN ('end-sessions', 'none') THEN
        RAISE EXCEPTION 'on_consent_revoked is end-sessions or none' USING ERRCODE = '22023';
    END IF;
    IF p_on_account_deleted IS NULL OR p_on_account_deleted NOT IN ('unlink', 'delete', 'disable', 'sessions-only') THEN
        RAISE EXCEPTION 'on_account_deleted is unlink, delete, disable or sessions-only' USING ERRCODE = '22023';
    END IF;
    IF p_when_unlink_leaves_no_login IS NULL OR p_when_unlink_leaves_no_login NOT IN ('disable', 'keep') THEN
        RAISE EXCEPTION 'when_unlink_leaves_no_login is disable or keep' USING ERRCODE = '22023';
    END IF;
    IF p_on_forwarding_change IS NULL OR p_on_forwarding_change NOT IN ('ignore', 'record') THEN
        RAISE EXCEPTION 'on_forwarding_change is ignore or record' USING ERRCODE = '22023';
    END IF;
    IF p_on_sub_transferred IS NULL OR p_on_sub_transferred NOT IN ('move', 'ignore') THEN
        RAISE EXCEPTION 'on_sub_transferred is move or ignore' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM siwa.auth_adapters a WHERE a.name = p_name) THEN
        RAISE EXCEPTION 'an adapter named % exists', p_name USING ERRCODE = '23505';
    END IF;
    -- The platform's refusals: siwa.check_auth_adapter (22023, naming the policy).
    INSERT INTO siwa.auth_adapters AS a (name, platform, provider, connection_ref, options, on_consent_revoked,
        on_account_deleted, when_unlink_leaves_no_login, on_forwarding_change, on_sub_transferred, enabled)
    VALUES (p_name, p_platform, p_provider, p_connection_ref, p_options, p_on_consent_revoked, p_on_account_deleted,
            p_when_unlink_leaves_no_login, p_on_forwarding_change, p_on_sub_transferred, coalesce(p_enabled, true))
    RETURNING a.id INTO v_id;
    RETURN v_id;
END;
$$;
COMMENT ON FUNCTION siwa.add_auth_adapter(text, text, text, text, jsonb, text, text, text, text, text, boolean) IS
    'Adds an auth adapter (siwactl adapters add) and returns its id; it receives the changes committed from then on. Every argument is checked (22023 naming it): the name ([a-z0-9-]{1,40}; 23505 when taken), the platform, the provider (the platform''s name for Apple, chosen by the caller), the connection as a file: reference (never the URL), the options (an object) and each policy; a policy the platform cannot express is refused (22023 naming it: disable on authjs and authjs-prisma, and on better-auth unless options {"ban": true}). Executable by siwa_admin.';

CREATE OR REPLACE FUNCTION siwa.remove_auth_adapter(p_name text)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM siwa.auth_adapters a WHERE a.name = p_name;
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION siwa.remove_auth_adapter(text) IS
    'Removes an auth adapter and, by cascade, its outbox rows, pending ones included (siwactl adapters remove). False for an unknown name. Executable by siwa_admin.';

-- Pause or resume an adapter: its lanes stop or start claiming (the worker follows within seconds), its
-- changes keep queueing.
CREATE OR REPLACE FUNCTION siwa.set_auth_adapter_enabled(p_name text, p_enabled boolean)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_enabled IS NULL THEN
        RAISE EXCEPTION 'p_enabled is true or false' USING ERRCODE = '22023';
    END IF;
    UPDATE siwa.auth_adapters a SET enabled = p_enabled WHERE a.name = p_name;
    IF FOUND AND p_enabled THEN
        PERFORM pg_catalog.pg_notify('siwa_auth_adapters', '');
    END IF;
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION siwa.set_auth_adapter_enabled(text, boolean) IS
    'Enables (resumes) or disables (pauses) an auth adapter (siwactl adapters enable|disable): a disabled adapter''s rows are not claimed and its new changes queue as pending rows. False for an unknown name; 22023 for a NULL p_enabled. Executable by siwa_admin.';

-- Dead rows pending again, due now, their attempts reset: one row (p_id), or every dead row of an adapter
-- (p_adapter), or both. A row whose sub an erasure took is left (nothing to apply it to).
CREATE OR REPLACE FUNCTION siwa.retry_auth_adapter_events(p_adapter bigint DEFAULT NULL, p_id bigint DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_count integer;
BEGIN
    IF num_nonnulls(p_adapter, p_id) = 0 THEN
        RAISE EXCEPTION 'give an adapter, a row, or both' USING ERRCODE = '22023';
    END IF;
    UPDATE siwa.auth_adapter_events e
       SET state = 'pending', attempts = 0, next_attempt_at = now(), finished_at = NULL, result = NULL,
           lease_owner = NULL, lease_expires_at = NULL
     WHERE e.state = 'dead' AND e.sub IS NOT NULL
       AND (p_adapter IS NULL OR e.adapter_id = p_adapter) AND (p_id IS NULL OR e.id = p_id);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        PERFORM pg_catalog.pg_notify('siwa_auth_adapters', '');
    END IF;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION siwa.retry_auth_adapter_events(bigint, bigint) IS
    'Makes dead auth adapter rows pending and due now, attempts reset (siwactl adapters retry): one row (p_id), an adapter''s (p_adapter), or that row only if it is the adapter''s; a row erased of its sub is left. Each goes before the user''s later rows still pending. Returns how many; wakes the lanes. Executable by siwa_admin.';

-- Retention: finished rows (done, no_user, dead) that finished longer ago than p_older_than, at most
-- p_limit a call, oldest first.
CREATE OR REPLACE FUNCTION siwa.prune_auth_adapter_events(p_older_than interval, p_limit integer DEFAULT 10000)
RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH doomed AS (
        SELECT e.id FROM siwa.auth_adapter_events e
         WHERE e.state <> 'pending' AND e.finished_at < pg_catalog.clock_timestamp() - p_older_than
         ORDER BY e.finished_at
         LIMIT greatest(p_limit, 1)
           FOR UPDATE SKIP LOCKED),
    pruned AS (DELETE FROM siwa.auth_adapter_events e USING doomed d WHERE e.id = d.id RETURNING 1)
    SELECT pg_catalog.count(*)::integer FROM pruned
$$;
COMMENT ON FUNCTION siwa.prune_auth_adapter_events(interval, integer) IS
    'Deletes up to p_limit finished auth adapter rows (done, no_user, dead) that finished longer ago than p_older_than, oldest first; returns how many (call until 0). Executable by siwa_worker and siwa_admin.';

-- What admins read: per adapter its policies and outbox, never the connection's file content.
CREATE OR REPLACE VIEW siwa.auth_adapter_overview AS
SELECT a.id, a.name, a.platform, a.provider, a.enabled, a.on_consent_revoked, a.on_account_deleted,
       a.when_unlink_leaves_no_login, a.on_forwarding_change, a.on_sub_transferred, a.created_at,
       (SELECT count(*) FROM siwa.auth_adapter_events e WHERE e.adapter_id = a.id AND e.state = 'pending') AS pending,
       (SELECT min(e.next_attempt_at) FROM siwa.auth_adapter_events e
         WHERE e.adapter_id = a.id AND e.state = 'pending') AS oldest_due_at,
       (SELECT count(*) FROM siwa.auth_adapter_events e WHERE e.adapter_id = a.id AND e.state = 'dead') AS dead,
       (SELECT count(*) FROM siwa.auth_adapter_events e WHERE e.adapter_id = a.id AND e.state = 'no_user') AS no_user,
       l.last_error, l.last_error_at
  FROM siwa.auth_adapters a
  LEFT JOIN LATERAL (SELECT e.last_error, e.last_attempt_at AS last_error_at FROM siwa.auth_adapter_events e
                      WHERE e.adapter_id = a.id AND e.last_error IS NOT NULL
                      ORDER BY e.last_attempt_at DESC NULLS LAST, e.id DESC LIMIT 1) AS l ON true;
COMMENT ON VIEW siwa.auth_adapter_overview IS
    'Auth adapters with their policies and outbox counts (siwactl adapters list); never a connection URL or credential.';
COMMENT ON COLUMN siwa.auth_adapter_overview.id IS 'The adapter''s id (siwactl adapters retry --adapter ID).';
COMMENT ON COLUMN siwa.auth_adapter_overview.name IS 'The adapter''s name (siwactl adapters remove NAME).';
COMMENT ON COLUMN siwa.auth_adapter_overview.platform IS 'supabase, better-auth, authjs, authjs-prisma, django-allauth, django-social-auth, firebase, auth0, clerk or keycloak.';
COMMENT ON COLUMN siwa.auth_adapter_overview.provider IS 'The platform''s name for Apple in its identity tables.';
COMMENT ON COLUMN siwa.auth_adapter_overview.enabled IS 'Whether new changes fan out to it and its rows are claimed.';
COMMENT ON COLUMN siwa.auth_adapter_overview.on_consent_revoked IS 'end-sessions or none.';
COMMENT ON COLUMN siwa.auth_adapter_overview.on_account_deleted IS 'unlink, delete, disable or sessions-only.';
COMMENT ON COLUMN siwa.auth_adapter_overview.when_unlink_leaves_no_login IS 'disable or keep the user an unlink leaves without a way to sign in.';
COMMENT ON COLUMN siwa.auth_adapter_overview.on_forwarding_change IS 'ignore or record email forwarding off/on.';
COMMENT ON COLUMN siwa.auth_adapter_overview.on_sub_transferred IS 'move the identity to the new sub, or ignore.';
COMMENT ON COLUMN siwa.auth_adapter_overview.created_at IS 'When it was added.';
COMMENT ON COLUMN siwa.auth_adapter_overview.pending IS 'Rows waiting, in flight or waiting for a retry.';
COMMENT ON COLUMN siwa.auth_adapter_overview.oldest_due_at IS 'When the earliest pending row is (was) due; NULL: none pending.';
COMMENT ON COLUMN siwa.auth_adapter_overview.dead IS 'Rows given up after the retry schedule (siwactl adapters retry).';
COMMENT ON COLUMN siwa.auth_adapter_overview.no_user IS 'Rows whose sub linked no user in the auth system.';
COMMENT ON COLUMN siwa.auth_adapter_overview.last_error IS 'The latest error recorded (our own words).';
COMMENT ON COLUMN siwa.auth_adapter_overview.last_error_at IS 'When the attempt that recorded last_error was made.';

-- A row names the sub the auth system knows at its point of the user's queue: the transfer's own row
-- moves the identity, so a transfer keeps the sub of the rows before it.
INSERT INTO siwa.sub_columns (table_name, column_name, on_transfer, why) VALUES
    ('auth_adapter_events', 'sub', 'keep', 'an auth system knows the old sub until the transfer''s own row (ordered after the old sub''s) moves the identity; rows before it apply to the old sub'),
    ('auth_adapter_events', 'old_sub', 'keep', 'the sub the transfer''s row moves the identity from')
ON CONFLICT (table_name, column_name) DO UPDATE SET on_transfer = EXCLUDED.on_transfer, why = EXCLUDED.why;
