-- The set-based pass siwa.apply_claimed_batch, the only implementation of the worker's effects

-- Work on one user (sub) is serialised by the lock on its siwa.accounts row (FOR UPDATE SKIP LOCKED):
-- only roles that may UPDATE siwa.accounts can hold it, never one that merely connects.

-- The fallback calls it before the pass, so that a wait for a concurrent insert (that user is busy) is
-- told apart from a lock wait of the effects (a failure).
CREATE OR REPLACE FUNCTION siwa.create_accounts(p_subs text[]) RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET lock_timeout = '1ms' AS $$
DECLARE
    v_created text[];
BEGIN
    WITH created AS (
        INSERT INTO siwa.accounts (sub) SELECT m.sub FROM unnest(p_subs) AS m(sub) ORDER BY m.sub
        ON CONFLICT (sub) DO NOTHING RETURNING sub)
    SELECT coalesce(array_agg(created.sub), '{}') INTO v_created FROM created;
    RETURN v_created;
END;
$$;
COMMENT ON FUNCTION siwa.create_accounts(text[]) IS
    'Creates the siwa.accounts rows of p_subs that do not exist (ON CONFLICT DO NOTHING), waiting 1 ms at most for a concurrent uncommitted insert of the same sub (55P03: that user is busy), and returns the subs it created, which this transaction then holds.';

CREATE OR REPLACE FUNCTION siwa.put_off_busy(p_ids bigint[], p_now timestamptz) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    UPDATE siwa.notification_queue AS t
       SET busy_since      = coalesce(t.busy_since, p_now),
           next_attempt_at = p_now + least(greatest((p_now - coalesce(t.busy_since, p_now)) / 2,
                                                    interval '100 milliseconds'),
                                           interval '5 seconds') * (0.5 + random() / 2)
     WHERE t.id = ANY (p_ids)
$$;
COMMENT ON FUNCTION siwa.put_off_busy(bigint[], timestamptz) IS
    'Puts off the pending notifications p_ids of busy users (their siwa.accounts row held elsewhere), counting no attempt: busy_since set (p_now if it was not), next attempt after half the time busy, between 0.1 s and 5 s, times a jitter in [0.5, 1).';

-- The set-based pass -------------------------------------------------------------------------------
--
-- One statement per effect for the whole batch, so that what a call costs (SET search_path, the hook's
-- path, the account lock, a subtransaction) is paid once per batch; its contract is its COMMENT ON.

-- One claimed notification as the set-based pass sees it.
DO $$
BEGIN
    IF to_regtype('siwa.batch_event') IS NULL THEN
        CREATE TYPE siwa.batch_event AS (
            ord              integer,
            id               bigint,
            jti              text,
            event_type       text,
            sub              text,
            email            text,
            is_private_email boolean,
            event_time       timestamptz,
            received_at      timestamptz,
            attempts         integer,
            busy_since       timestamptz,
            locked           boolean,
            known            boolean,
            first_delete     integer,
            erased_before    boolean,
            erased_after     boolean
        );
    END IF;
END;
$$;
COMMENT ON TYPE siwa.batch_event IS
    'One notification of a batch in siwa.apply_claimed_batch: ord is its claim order; locked: its user''s siwa.accounts row is held by this transaction (else it is busy); known: it is applied (its event type is one the worker applies, and it is no duplicate of an earlier stored jti); first_delete: ord of the first account-delete of its user in the batch; erased_before: its user''s personal data is erased when its turn comes (before the batch, or by an earlier account-delete of the batch); erased_after: erased once the batch is applied.';

-- One locked account of a batch as it was before the batch.
DO $$
BEGIN
    IF to_regtype('siwa.batch_account') IS NULL THEN
        CREATE TYPE siwa.batch_account AS (
            sub                text,
            email_status_at    timestamptz,
            consent_revoked_at timestamptz,
            deleted_at         timestamptz
        );
    END IF;
END;
$$;
COMMENT ON TYPE siwa.batch_account IS
    'One account siwa.apply_claimed_batch locked, with the columns of siwa.accounts its rules compare events with, as they were before the batch (NULL for an account the batch created).';

CREATE OR REPLACE FUNCTION siwa.apply_claimed_batch(
    p_batch siwa.notifications[], OUT results siwa.processing_result[], OUT changes siwa.changes[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now              timestamptz := clock_timestamp();
    v_plan_cache_mode  text;
    v_enable_seqscan   text;
    v_jit              text;
    -- 1. lock
    v_subs             text[];
    v_locked           text[];
    v_accounts         siwa.batch_account[];
    v_erased           text[];
    v_deleted_before   text[];
    v_missing          text[];
    v_inserted         text[];
    -- 2. events
    v_duplicates       bigint[];
    v_erase_now        boolean;
    v_events           siwa.batch_event[];
    v_revoke_subs      text[];
    v_revoke_upto      timestamptz[];
    v_revoke_all       boolean[];
    -- 4. revoke
    v_rs_ord           integer[] := '{}';
    v_rt_ord           integer[] := '{}';
    -- 5. changes
    v_list             siwa.changes[];
    v_list_ord         integer[];
    v_list_superseded  boolean[];
    v_change           siwa.changes;
    v_seq              regclass;
    -- 6. erase
    v_deleted          text[];
    -- 7. hooks
    v_hooks            siwa.batch_event[];
    v_hook             siwa.batch_event;
    v_hook_path        text;
    v_on_change        boolean;
    v_calls_change     boolean[] := '{}';
    v_calls_event      siwa.batch_event[] := '{}';
    v_calls_record     siwa.changes[] := '{}';
    v_calls_superseded boolean[] := '{}';
    v_ncalls           integer := 0;
    v_p                integer;
    -- 8. mark
    v_mark_ids         bigint[];
    v_mark_jtis        text[];
    v_mark_issued_at   timestamptz[];
    v_mark_known       boolean[];
    v_mark_attempts    integer[];
    v_mark_errors      text[];
    v_mark_erase       boolean[];
    v_done             bigint;
    v_marked           bigint;
    i                  integer;
BEGIN
    -- One generic plan per statement and session, read through the indexes whatever a table's size was
    -- when it was planned (sequential scans and JIT off); the hooks run with the session's own settings.
    v_plan_cache_mode := current_setting('plan_cache_mode');
    v_enable_seqscan := current_setting('enable_seqscan');
    v_jit := current_setting('jit');
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    PERFORM set_config('enable_seqscan', 'off', true);
    PERFORM set_config('jit', 'off', true);

    -- 1. lock: every user's account row (FOR UPDATE SKIP LOCKED, one lookup per sub, in sub order as in
    --    every lane), the missing ones created; a user whose row is held elsewhere is busy.
    v_subs := ARRAY(SELECT DISTINCT b.sub FROM unnest(p_batch) AS b ORDER BY 1);
    SELECT coalesce(array_agg(l.sub ORDER BY l.sub), '{}'),
           coalesce(array_agg(ROW(l.sub, l.email_status_at, l.consent_revoked_at, l.deleted_at)::siwa.batch_account
                              ORDER BY l.sub), '{}'),
           coalesce(array_agg(l.sub) FILTER (WHERE l.personal_data_erased_at IS NOT NULL), '{}'),
           coalesce(array_agg(l.sub) FILTER (WHERE l.deleted_at IS NOT NULL), '{}')
      INTO v_locked, v_accounts, v_erased, v_deleted_before
      FROM unnest(v_subs) AS s(sub),
           LATERAL (SELECT a.sub, a.email_status_at, a.personal_data_erased_at, a.deleted_at, a.consent_revoked_at
                      FROM siwa.accounts a WHERE a.sub = s.sub FOR UPDATE SKIP LOCKED) AS l;
    IF cardinality(v_locked) < cardinality(v_subs) THEN
        v_missing := ARRAY(SELECT s.sub FROM unnest(v_subs) AS s(sub)
                            WHERE s.sub <> ALL (v_locked)
                              AND (SELECT true FROM siwa.accounts a WHERE a.sub = s.sub) IS NULL);
        IF cardinality(v_missing) > 0 THEN
            v_inserted := siwa.create_accounts(v_missing);
            v_locked := v_locked || v_inserted;
            v_accounts := v_accounts || ARRAY(SELECT ROW(n.sub, NULL, NULL, NULL)::siwa.batch_account
                                                FROM unnest(v_inserted) AS n(sub));
            IF cardinality(v_inserted) < cardinality(v_missing) THEN
                -- Created by another transaction that committed meanwhile: lock it like the others.
                SELECT v_locked || coalesce(array_agg(l.sub ORDER BY l.sub), '{}'),
                       v_accounts || coalesce(array_agg(ROW(l.sub, l.email_status_at, l.consent_revoked_at,
                                                            l.deleted_at)::siwa.batch_account ORDER BY l.sub), '{}'),
                       v_erased || coalesce(array_agg(l.sub) FILTER (WHERE l.personal_data_erased_at IS NOT NULL), '{}'),
                       v_deleted_before || coalesce(array_agg(l.sub) FILTER (WHERE l.deleted_at IS NOT NULL), '{}')
                  INTO v_locked, v_accounts, v_erased, v_deleted_before
                  FROM unnest(v_missing) AS s(sub),
                       LATERAL (SELECT a.sub, a.email_status_at, a.personal_data_erased_at, a.deleted_at,
                                       a.consent_revoked_at
                                  FROM siwa.accounts a
                                 WHERE a.sub = s.sub AND a.sub <> ALL (v_inserted) FOR UPDATE SKIP LOCKED) AS l;
            END IF;
        END IF;
    END IF;

    -- 2. events: what each notification needs, worked out once (siwa.batch_event). A jti stored twice
    --    (possible only past the dedupe window): the later row is skipped, found by the log's primary key.
    v_duplicates := ARRAY(SELECT b.id FROM unnest(p_batch) AS b
                           WHERE EXISTS (SELECT 1 FROM siwa.notification_log d
                                          WHERE d.jti = b.jti AND d.issued_at <> b.issued_at AND d.id < b.id));
    v_erase_now := (SELECT s.erase_personal_data_after = interval '0' FROM siwa.settings s);
    v_events := ARRAY(
        SELECT ROW(e.ord, e.id, e.jti, e.event_type, e.sub, e.email, e.is_private_email, e.event_time,
                   e.received_at, e.attempts, e.busy_since, e.locked, e.known, e.first_delete,
                   e.locked AND (e.sub = ANY (v_erased) OR coalesce(v_erase_now AND e.first_delete <= e.ord, false)),
                   e.locked AND (e.sub = ANY (v_erased) OR (v_erase_now AND e.first_delete IS NOT NULL))
                  )::siwa.batch_event
          FROM (SELECT b.*, b.ordinality::integer AS ord, b.sub = ANY (v_locked) AS locked,
                       b.event_type IN ('email-disabled', 'email-enabled', 'consent-revoked', 'account-delete')
                           AND b.id <> ALL (v_duplicates) AS known,
                       (min(b.ordinality) FILTER (WHERE b.event_type = 'account-delete' AND b.id <> ALL (v_duplicates))
                            OVER (PARTITION BY b.sub))::integer AS first_delete
                  FROM unnest(p_batch) WITH ORDINALITY AS b) AS e
         ORDER BY e.ord);
    --    What stage 4 revokes per user: up to the latest consent-revoked before the user's first
    --    account-delete of the batch, everything for an account-delete.
    SELECT coalesce(array_agg(r.sub), '{}'), coalesce(array_agg(r.upto), '{}'), coalesce(array_agg(r.everything), '{}')
      INTO v_revoke_subs, v_revoke_upto, v_revoke_all
      FROM (SELECT x.sub,
                   max(x.event_time) FILTER (WHERE x.event_type = 'consent-revoked'
                                               AND (x.first_delete IS NULL OR x.ord < x.first_delete)) AS upto,
                   bool_or(x.event_type = 'account-delete') AS everything
              FROM unnest(v_events) AS x
             WHERE x.locked AND x.known AND x.event_type IN ('consent-revoked', 'account-delete')
             GROUP BY x.sub) AS r;

    -- 3. accounts, one UPDATE: an email event counts before the user's first account-delete (never for an
    --    account deleted before the batch) when its event_time is at least the account's and every earlier
    --    one's of the batch (last writer wins); consent_revoked_at and deleted_at.
    WITH e AS (
        SELECT x.* FROM unnest(v_events) AS x WHERE x.locked AND x.known),
    m AS (
        SELECT e.sub, e.ord, e.event_type, e.event_time, e.email, e.is_private_email,
               max(e.event_time) OVER (PARTITION BY e.sub ORDER BY e.ord
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS earlier
          FROM e
         WHERE e.event_type IN ('email-disabled', 'email-enabled')
           AND (e.first_delete IS NULL OR e.ord < e.first_delete)),
    mail AS (
        SELECT m.sub,
               (array_agg(m.event_type ORDER BY m.ord DESC))[1] AS event_type,
               (array_agg(m.event_time ORDER BY m.ord DESC))[1] AS event_time,
               (array_agg(m.email ORDER BY m.ord DESC) FILTER (WHERE m.email IS NOT NULL))[1] AS email,
               (array_agg(m.is_private_email ORDER BY m.ord DESC)
                    FILTER (WHERE m.is_private_email IS NOT NULL))[1] AS is_private_email
          FROM m JOIN unnest(v_accounts) AS a ON a.sub = m.sub
         WHERE m.sub <> ALL (v_deleted_before)
           AND (a.email_status_at IS NULL OR a.email_status_at <= m.event_time)
           AND (m.earlier IS NULL OR m.earlier <= m.event_time)
         GROUP BY m.sub),
    u AS (
        SELECT e.sub,
               max(e.event_time) FILTER (WHERE e.event_type = 'consent-revoked') AS consent_revoked_at,
               min(e.event_time) FILTER (WHERE e.event_type = 'account-delete') AS deleted_at
          FROM e GROUP BY e.sub)
    UPDATE siwa.accounts AS a
       SET email            = CASE WHEN mail.sub IS NULL THEN a.email
                                   WHEN a.personal_data_erased_at IS NULL THEN coalesce(mail.email, a.email) END,
           is_private_email = CASE WHEN mail.sub IS NULL THEN a.is_private_email
                                   WHEN a.personal_data_erased_at IS NULL
                                   THEN coalesce(mail.is_private_email, a.is_private_email) END,
           email_status     = CASE WHEN mail.sub IS NULL THEN a.email_status
                                   WHEN mail.event_type = 'email-enabled' THEN 'enabled' ELSE 'disabled' END,
           email_status_at  = coalesce(mail.event_time, a.email_status_at),
           consent_revoked_at = greatest(a.consent_revoked_at, u.consent_revoked_at),
           deleted_at       = least(a.deleted_at, u.deleted_at),
           updated_at       = clock_timestamp()
      FROM u LEFT JOIN mail ON mail.sub = u.sub
     WHERE a.sub = u.sub
       AND (mail.sub IS NOT NULL OR u.consent_revoked_at IS NOT NULL OR u.deleted_at IS NOT NULL);

    -- 4. revoke, one statement for sessions and refresh tokens; each revoked row is counted for the
    --    user's first event, in claim order up to the first account-delete, that covers it.
    IF cardinality(v_revoke_subs) > 0 THEN
        WITH revoke AS (
            SELECT * FROM unnest(v_revoke_subs, v_revoke_upto, v_revoke_all) AS r(sub, upto, everything)),
        sessions AS (
            UPDATE siwa.sessions AS t
               SET revoked_at = clock_timestamp(),
                   revoke_reason = CASE WHEN t.created_at <= r.upto THEN 'consent-revoked' ELSE 'account-delete' END
              FROM revoke AS r
             WHERE t.sub = ANY (v_revoke_subs) AND t.sub = r.sub AND t.revoked_at IS NULL
               AND (r.everything OR t.created_at <= r.upto)
            RETURNING true AS is_session, t.sub, t.created_at),
        tokens AS (
            UPDATE siwa.refresh_tokens AS t
               SET revoked_at = clock_timestamp(),
                   revoke_reason = CASE WHEN t.created_at <= r.upto THEN 'consent-revoked' ELSE 'account-delete' END
              FROM revoke AS r
             WHERE t.sub = ANY (v_revoke_subs) AND t.sub = r.sub AND t.revoked_at IS NULL
               AND (r.everything OR t.created_at <= r.upto)
            RETURNING false AS is_session, t.sub, t.created_at),
        revoked AS (
            SELECT v.is_session,
                   (SELECT min(x.ord) FROM unnest(v_events) AS x
                     WHERE x.locked AND x.known AND x.sub = v.sub
                       AND (x.first_delete IS NULL OR x.ord <= x.first_delete)
                       AND (x.event_type = 'account-delete'
                            OR (x.event_type = 'consent-revoked' AND v.created_at <= x.event_time))) AS ord
              FROM (SELECT * FROM sessions UNION ALL SELECT * FROM tokens) AS v)
        SELECT coalesce(array_agg(revoked.ord) FILTER (WHERE revoked.is_session), '{}'),
               coalesce(array_agg(revoked.ord) FILTER (WHERE NOT revoked.is_session), '{}')
          INTO v_rs_ord, v_rt_ord FROM revoked;
    END IF;

    -- 5. changes: the rows and order one-at-a-time application writes (siwa.changes says which are
    --    superseded), with the emails erasure clears later; ids taken now for the hooks, inserted by the caller.
    SELECT coalesce(array_agg(c.change ORDER BY c.ord, c.kind), '{}'),
           coalesce(array_agg(c.ord ORDER BY c.ord, c.kind), '{}'),
           coalesce(array_agg(c.superseded ORDER BY c.ord, c.kind), '{}')
      INTO v_list, v_list_ord, v_list_superseded
      FROM (
        WITH e AS (
            SELECT x.*, n.audience,
                   (SELECT count(*) FROM unnest(v_rs_ord) AS o(ord) WHERE o.ord = x.ord)::integer AS sessions,
                   (SELECT count(*) FROM unnest(v_rt_ord) AS o(ord) WHERE o.ord = x.ord)::integer AS tokens
              FROM unnest(v_events) AS x JOIN unnest(p_batch) AS n ON n.id = x.id
             WHERE x.locked AND x.known),
        w AS (
            SELECT e.*, a.email_status_at AS status_at, a.consent_revoked_at AS consent_at, a.deleted_at,
                   max(e.event_time) FILTER (WHERE e.event_type IN ('email-disabled', 'email-enabled'))
                       OVER (PARTITION BY e.sub ORDER BY e.ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                       AS earlier_email,
                   max(e.event_time) FILTER (WHERE e.event_type = 'consent-revoked')
                       OVER (PARTITION BY e.sub ORDER BY e.ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                       AS earlier_consent,
                   min(e.event_time) FILTER (WHERE e.event_type = 'account-delete')
                       OVER (PARTITION BY e.sub ORDER BY e.ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                       AS earlier_delete
              FROM e JOIN unnest(v_accounts) AS a ON a.sub = e.sub),
        s AS (
            SELECT w.*,
                   CASE w.event_type
                       WHEN 'consent-revoked' THEN
                           coalesce(greatest(w.consent_at, w.earlier_consent) >= w.event_time, false)
                           AND w.sessions = 0 AND w.tokens = 0
                       WHEN 'account-delete' THEN
                           coalesce(least(w.deleted_at, w.earlier_delete) <= w.event_time, false)
                           AND w.sessions = 0 AND w.tokens = 0
                       ELSE NOT ((w.first_delete IS NULL OR w.ord < w.first_delete)
                                 AND w.sub <> ALL (v_deleted_before)
                                 AND (w.status_at IS NULL OR w.status_at <= w.event_time)
                                 AND (w.earlier_email IS NULL OR w.earlier_email <= w.event_time))
                   END AS superseded
              FROM w),
        t AS MATERIALIZED (  -- siwa.change_type once per event type of the batch
            SELECT d.event_type, siwa.change_type(d.event_type) AS type FROM (SELECT DISTINCT e.event_type FROM e) AS d)
        SELECT s.ord, 0 AS kind, s.superseded,
               -- a row of siwa.changes, its columns in table order, built without JSON
               ROW(NULL, NULL, t.type, s.sub, s.event_time, clock_timestamp(), s.jti, s.audience, s.sessions,
                   s.tokens,
                   CASE WHEN s.event_type IN ('email-disabled', 'email-enabled') AND NOT s.erased_before
                        THEN s.email END,
                   CASE WHEN s.event_type IN ('email-disabled', 'email-enabled') AND NOT s.erased_before
                        THEN s.is_private_email END,
                   NULL)::siwa.changes AS change
          FROM s JOIN t ON t.event_type = s.event_type
        UNION ALL
        SELECT s.ord, 1, false,
               ROW(NULL, NULL, 'siwa.personal_data_erased', s.sub, s.event_time, clock_timestamp(), s.jti,
                   s.audience, 0, 0, NULL, NULL, NULL)::siwa.changes
          FROM s
         WHERE s.event_type = 'account-delete' AND s.ord = s.first_delete AND v_erase_now
           AND s.sub <> ALL (v_erased)) AS c;
    changes := '{}';
    IF false = ANY (v_list_superseded) THEN
        v_seq := pg_catalog.pg_get_serial_sequence('siwa.changes', 'id')::regclass;
        FOR i IN 1 .. cardinality(v_list) LOOP
            IF NOT v_list_superseded[i] THEN
                v_change := v_list[i];
                v_change.id := pg_catalog.nextval(v_seq);
                v_list[i] := v_change;
                changes := changes || v_change;
            END IF;
        END LOOP;
    END IF;

    -- 6. erase every user deleted in the batch, at once (siwa.settings.erase_personal_data_after = 0);
    --    the batch's own log rows are left to stage 8 (erased_after), so each is written once.
    IF v_erase_now THEN
        v_deleted := ARRAY(SELECT DISTINCT x.sub FROM unnest(v_events) AS x
                            WHERE x.locked AND x.known AND x.event_type = 'account-delete');
        IF cardinality(v_deleted) > 0 THEN
            PERFORM siwa.erase_personal_data_of(
                v_deleted, ARRAY(SELECT x.id FROM unnest(v_events) AS x WHERE x.locked));
        END IF;
    END IF;

    -- 7. hooks, as docs/sql.md "Exactly when the hooks are called" says: the calls are listed under this
    --    function's path, then made under siwa.hook_path(), switched once, evaluating nothing of our own.
    v_hooks := ARRAY(
        SELECT ROW(x.ord, x.id, x.jti, x.event_type, x.sub, CASE WHEN x.erased_before THEN NULL ELSE x.email END,
                   x.is_private_email, x.event_time, x.received_at, x.attempts, x.busy_since, x.locked, x.known,
                   x.first_delete, x.erased_before, x.erased_after)::siwa.batch_event
          FROM unnest(v_events) AS x WHERE x.locked AND x.known ORDER BY x.ord);
    IF cardinality(v_hooks) > 0 THEN
        v_hook_path := siwa.hook_path();
        v_on_change := pg_catalog.to_regprocedure('siwa.on_change(siwa.changes, boolean)') IS NOT NULL;
        v_p := 1;
        FOREACH v_hook IN ARRAY v_hooks LOOP
            v_ncalls := v_ncalls + 1;
            v_calls_change[v_ncalls] := false;
            v_calls_event[v_ncalls] := v_hook;
            WHILE v_on_change AND v_p <= cardinality(v_list) AND v_list_ord[v_p] = v_hook.ord LOOP
                v_ncalls := v_ncalls + 1;
                v_calls_change[v_ncalls] := true;
                v_calls_record[v_ncalls] := v_list[v_p];
                v_calls_superseded[v_ncalls] := v_list_superseded[v_p];
                v_p := v_p + 1;
            END LOOP;
        END LOOP;
        PERFORM set_config('plan_cache_mode', v_plan_cache_mode, true);
        PERFORM set_config('enable_seqscan', v_enable_seqscan, true);
        PERFORM set_config('jit', v_jit, true);
        PERFORM pg_catalog.set_config('search_path', v_hook_path, true);
        FOR i IN 1 .. v_ncalls LOOP
            IF v_calls_change[i] THEN
                PERFORM siwa.on_change(v_calls_record[i], v_calls_superseded[i]);
            ELSE
                v_hook := v_calls_event[i];
                PERFORM siwa.on_event(v_hook.event_type, v_hook.sub, v_hook.event_time, v_hook.email, v_hook.jti);
            END IF;
        END LOOP;
        PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
        PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
        PERFORM set_config('enable_seqscan', 'off', true);
        PERFORM set_config('jit', 'off', true);
    END IF;

    -- 8. mark: the results, and one narrow array per column of the finished rows (the marking UPDATE then
    --    reads one unnest of scalars, no join); finished rows leave the queue, their outcome goes to the log.
    SELECT coalesce(array_agg(ROW(x.id, x.jti, x.event_type,
                                  CASE WHEN NOT x.locked THEN 'busy' WHEN x.known THEN 'applied' ELSE 'skipped' END,
                                  x.error,
                                  x.attempts + CASE WHEN x.locked THEN 1 ELSE 0 END,
                                  extract(epoch FROM clock_timestamp() - x.received_at)::double precision,
                                  CASE WHEN NOT x.locked
                                       THEN extract(epoch FROM v_now - coalesce(x.busy_since, v_now))::double precision END
                                 )::siwa.processing_result ORDER BY x.ord), '{}'),
           coalesce(array_agg(x.id ORDER BY x.ord) FILTER (WHERE x.locked), '{}'),
           coalesce(array_agg(x.jti ORDER BY x.ord) FILTER (WHERE x.locked), '{}'),
           coalesce(array_agg((p_batch[array_lower(p_batch, 1) + x.ord - 1]).issued_at ORDER BY x.ord)
                        FILTER (WHERE x.locked), '{}'),
           coalesce(array_agg(x.known ORDER BY x.ord) FILTER (WHERE x.locked), '{}'),
           coalesce(array_agg(x.attempts + 1 ORDER BY x.ord) FILTER (WHERE x.locked), '{}'),
           coalesce(array_agg(x.error ORDER BY x.ord) FILTER (WHERE x.locked), '{}'),
           coalesce(array_agg(x.erased_after ORDER BY x.ord) FILTER (WHERE x.locked), '{}')
      INTO results, v_mark_ids, v_mark_jtis, v_mark_issued_at, v_mark_known, v_mark_attempts, v_mark_errors,
           v_mark_erase
      FROM (SELECT y.*,
                   CASE WHEN y.locked THEN CASE WHEN y.known THEN NULL
                                            WHEN y.event_type IN ('email-disabled', 'email-enabled', 'consent-revoked', 'account-delete')
                                            THEN 'duplicate jti (an earlier notification has the same jti)'
                                            ELSE 'unknown event type ' || quote_literal(left(y.event_type, 100)) END END
                       AS error
              FROM unnest(v_events) AS y) AS x;
    WITH gone AS (
        DELETE FROM siwa.notification_queue AS q WHERE q.id = ANY (v_mark_ids) RETURNING 1),
    marked AS (
        UPDATE siwa.notification_log AS t
           SET state      = CASE WHEN m.known THEN 'applied' ELSE 'skipped' END,
               attempts   = m.attempts,
               applied_at = clock_timestamp(),
               last_error = m.error,
               email      = CASE WHEN m.erase THEN NULL ELSE t.email END,
               raw_token  = CASE WHEN m.erase THEN NULL ELSE t.raw_token END,
               personal_data_erased_at =
                   CASE WHEN m.erase AND (t.email IS NOT NULL OR t.raw_token IS NOT NULL)
                        THEN clock_timestamp() ELSE t.personal_data_erased_at END
          FROM unnest(v_mark_jtis, v_mark_issued_at, v_mark_known, v_mark_attempts, v_mark_errors, v_mark_erase)
               AS m(jti, issued_at, known, attempts, error, erase)
         WHERE t.jti = m.jti AND t.issued_at = m.issued_at
        RETURNING 1)
    SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM marked) INTO v_done, v_marked;
    IF v_marked <> v_done OR v_done <> cardinality(v_mark_ids) THEN
        RAISE EXCEPTION 'siwa.apply_claimed_batch finished % queue rows and % log rows of % applied',
                        v_done, v_marked, cardinality(v_mark_ids);
    END IF;
    --    Busy ones are put off from now, when they are let go (a slow pass would hand them back due).
    IF false = ANY (ARRAY(SELECT x.locked FROM unnest(v_events) AS x)) THEN
        PERFORM siwa.put_off_busy(ARRAY(SELECT x.id FROM unnest(v_events) AS x WHERE NOT x.locked),
                                  clock_timestamp());
    END IF;
    PERFORM set_config('plan_cache_mode', v_plan_cache_mode, true);
    PERFORM set_config('enable_seqscan', v_enable_seqscan, true);
    PERFORM set_config('jit', v_jit, true);
END;
$$;
COMMENT ON FUNCTION siwa.apply_claimed_batch(siwa.notifications[]) IS
    'The worker''s set-based pass, the only implementation of its effects: applies a claimed batch (rows the caller holds FOR UPDATE, in claim order, subs resolved through siwa.sub_aliases) with one statement per effect, in stages: lock the users'' account rows (busy users put off, missing accounts created), work out each event (skips: unknown type, duplicate jti), account state (last writer wins by event_time), revocation, the changes, erasure, the hooks once per known event in order, one UPDATE marking every state. Leaves exactly what applying the notifications one at a time in claim order leaves. Returns one result per notification in claim order and the changes it wrote, with ids, for siwa.number_changes to insert last. Raises on any failure; siwa.process_claimed_notifications then runs it on batches of one.';
