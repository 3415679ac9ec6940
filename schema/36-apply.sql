-- The set-based pass siwa.apply_claimed_batch, the only implementation of the worker's effects

-- Work on one user (sub) is serialised by the lock on its siwa.accounts row, taken with FOR UPDATE SKIP
-- LOCKED: only roles that may UPDATE siwa.accounts (the worker, the owner, the app) can hold it, never a
-- role that merely connects or reads the admin views. The advisory lock on a guessable key that version 1
-- used could be held by any role (and its key function resolved hashtextextended through the caller's
-- search_path): it is gone, also from databases upgraded to version 2 (change 2 in
-- schema/10-numbered-changes.sql).

-- Creates the accounts p_subs (that do not exist yet) and returns the subs it created, which this
-- transaction holds until it ends. The INSERT waits only for a concurrent uncommitted insert of the same
-- sub (another lane's batch, or the app's sign-in), and for 1 ms at most (lock_timeout, then 55P03): that
-- user is busy. Called by the set-based pass (step 1) and by its fallback, which creates a batch of one's
-- account before the pass so that such a wait is told apart from a lock wait of the effects.
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
    'Creates the siwa.accounts rows of p_subs that do not exist (ON CONFLICT DO NOTHING), waiting 1 ms at most for a concurrent insert of the same sub (55P03: that user is busy), and returns the subs it created.';

-- Puts off pending notifications whose user is busy (its siwa.accounts row held by another transaction):
-- by half the time each has been busy (busy_since, set to p_now when it was not busy yet), between 0.1 s
-- and 5 s, times a factor in [0.5, 1): short at first, rarer while the user stays busy, never an attempt.
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
    'Puts off the pending notifications p_ids of busy users (busy_since set, next attempt in 0.05–5 s, growing while the user stays busy); counts no attempt.';

-- The set-based pass ---------------------------------------------------------------------------------
--
-- siwa.apply_claimed_batch is the only implementation of the worker's effects: one statement per effect
-- for the whole batch instead of one subtransaction per notification, so that the costs paid per call (a
-- function's SET search_path, the switch to the hook's path and back, the account row lock, the
-- subtransaction) are paid once per batch. It leaves exactly what applying the batch's notifications one
-- after the other, in claim order, each as a batch of one, leaves. If any of it fails, nothing of it is
-- kept (siwa.process_claimed_notifications rolls its subtransaction back) and the same pass runs on each
-- notification alone, in a subtransaction of its own, the failure recorded for the one that fails: a
-- single bad event, or a hook that raises for one, still affects only itself.
--
-- The tables it reads and writes, by statement: siwa.accounts (lock, create, email/consent/deletion),
-- siwa.settings, siwa.sessions and siwa.refresh_tokens (revocation), siwa.erase_personal_data_of
-- (erasure), siwa.on_event (the hook), siwa.notification_queue and siwa.notification_log (marking the
-- batch's states: finished rows leave the queue and their outcome goes to the log).

-- One claimed notification as the set-based pass sees it: the queue row's fields it needs (no raw
-- token), its position in the batch (ord, claim order), and what the pass worked out about it.
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

-- Applies a claimed batch (rows the caller holds with FOR UPDATE, in claim order, each with the sub it is
-- applied to: see siwa.process_claimed_notifications) with one statement per effect, and returns one
-- siwa.processing_result per notification, in claim order (results), and the changes it wrote, with
-- their ids, for siwa.number_changes to insert (changes). Raises on any failure; the caller owns the
-- subtransaction and falls back to batches of one.
--  0. Skips: an unknown event type, and a jti stored twice (possible only past the dedupe window, see
--     siwa.notification_jtis: the log's earlier row, found by its primary key in every partition, was
--     applied, and this one is skipped), are skipped with their reason; the user is locked all the same.
--  1. Users: every account row of the batch is locked at once (FOR UPDATE SKIP LOCKED); the missing ones
--     are created (siwa.create_accounts, waiting 1 ms at most for a concurrent insert of the same sub:
--     past that the pass raises 55P03, and the fallback, which creates a batch of one's account itself
--     first, reports that user busy). A user whose row another transaction holds is busy: its
--     notifications are put off (siwa.put_off_busy).
--  2. Account state, one UPDATE: relay email status with last writer wins by event_time (also between
--     events of one user in the batch; an email event after an account-delete of the batch, or of an
--     already deleted account, changes nothing), consent_revoked_at, deleted_at.
--  3. Revocation, one UPDATE each of siwa.sessions and siwa.refresh_tokens: a consent-revoked event
--     revokes what was created up to its event_time (unless an account-delete of the batch came first),
--     an account-delete everything; each revoked row counted for the event that revoked it.
--     3b. The changes (siwa.changes): what one-at-a-time application writes, in its order, with ids.
--  4. Erasure of the users deleted in the batch (siwa.settings.erase_personal_data_after = 0), at once.
--  5. The hook siwa.on_event once per known event, in claim order, after all of the above, with the
--     session's search_path (switched once for the whole loop), and the email it would have had one
--     event at a time (NULL once the user's data is erased); after each, siwa.on_change (if it exists)
--     with the event's change and its erasure's.
--  6. One UPDATE marks every notification: applied, skipped (with the reason), or busy (put off, no
--     attempt counted); a late event of an erased user keeps no email or token.
--  7. The changes are returned, not inserted: the caller inserts them last, numbered, with those of the
--     other batches of its transaction (siwa.number_changes).
CREATE OR REPLACE FUNCTION siwa.apply_claimed_batch(
    p_batch siwa.notifications[], OUT results siwa.processing_result[], OUT changes siwa.changes[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now          timestamptz := clock_timestamp();
    v_subs         text[];
    v_locked       text[];
    v_erased       text[];
    v_missing      text[];
    v_inserted     text[];
    v_duplicates   bigint[];
    v_erase_now    boolean;
    v_events       siwa.batch_event[];
    v_hooks        siwa.batch_event[];
    v_hook         siwa.batch_event;
    v_hook_path    text;
    v_deleted      text[];
    v_revoke_subs  text[];
    v_revoke_upto  timestamptz[];
    v_revoke_all   boolean[];
    v_plan_cache_mode text;
    v_enable_seqscan text;
    v_jit          text;
    v_done         bigint;
    v_marked       bigint;
    v_mark_ids     bigint[];
    v_mark_jtis    text[];
    v_mark_issued_at timestamptz[];
    v_mark_known   boolean[];
    v_mark_attempts integer[];
    v_mark_errors  text[];
    v_mark_erase   boolean[];
    v_status_at    timestamptz[];
    v_deleted_before text[];
    v_consent_at   timestamptz[];
    v_deleted_at   timestamptz[];
    v_rs_ord       integer[];
    v_rt_ord       integer[];
    v_list         siwa.changes[];
    v_list_ord     integer[];
    v_list_superseded boolean[];
    v_on_change    boolean;
    v_calls_change boolean[] := '{}';
    v_calls_event  siwa.batch_event[] := '{}';
    v_calls_record siwa.changes[] := '{}';
    v_calls_superseded boolean[] := '{}';
    v_ncalls       integer := 0;
    v_p            integer;
    v_change       siwa.changes;
    v_seq          regclass;
    i              integer;
BEGIN
    -- Plans: every statement here reads or writes a few dozen rows by their keys, with arrays as
    -- parameters. Each keeps one generic plan for the session (force_generic_plan), planned once instead
    -- of once per batch (planning the table statements per batch was a fifth of the pass's
    -- instructions). A generic plan made while a table was still small (a new deployment's
    -- siwa.accounts, not yet analysed) would scan it sequentially, batch after batch, as it grows
    -- (measured: most of the pass's CPU in a 100k drain): so sequential scans are disabled here
    -- (enable_seqscan), and every table is read through the index that serves its keys, whatever its
    -- size was when the plan was made. A table with no index for a statement is still scanned (at a
    -- cost of 10^10, which alone would make the planner JIT-compile it: jit is off here too). The hooks
    -- run with the session's own settings.
    v_plan_cache_mode := current_setting('plan_cache_mode');
    v_enable_seqscan := current_setting('enable_seqscan');
    v_jit := current_setting('jit');
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    PERFORM set_config('enable_seqscan', 'off', true);
    PERFORM set_config('jit', 'off', true);

    -- 1. Lock the batch's users; create the missing ones. Each account row is looked up by its key,
    --    one LATERAL lookup per user, in sub order (the same order in every lane), whatever the planner
    --    thinks of the table's size; the locked rows' state before the batch is kept for step 2.
    v_subs := ARRAY(SELECT DISTINCT b.sub FROM unnest(p_batch) AS b ORDER BY 1);
    SELECT coalesce(array_agg(l.sub ORDER BY l.sub), '{}'),
           coalesce(array_agg(l.email_status_at ORDER BY l.sub), '{}'),
           coalesce(array_agg(l.sub) FILTER (WHERE l.personal_data_erased_at IS NOT NULL), '{}'),
           coalesce(array_agg(l.sub) FILTER (WHERE l.deleted_at IS NOT NULL), '{}'),
           coalesce(array_agg(l.consent_revoked_at ORDER BY l.sub), '{}'),
           coalesce(array_agg(l.deleted_at ORDER BY l.sub), '{}')
      INTO v_locked, v_status_at, v_erased, v_deleted_before, v_consent_at, v_deleted_at
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
            v_status_at := v_status_at || array_fill(NULL::timestamptz, ARRAY[cardinality(v_inserted)]);
            v_consent_at := v_consent_at || array_fill(NULL::timestamptz, ARRAY[cardinality(v_inserted)]);
            v_deleted_at := v_deleted_at || array_fill(NULL::timestamptz, ARRAY[cardinality(v_inserted)]);
            IF cardinality(v_inserted) < cardinality(v_missing) THEN
                -- Created by another transaction that committed meanwhile: lock it like the others.
                SELECT v_locked || coalesce(array_agg(l.sub ORDER BY l.sub), '{}'),
                       v_status_at || coalesce(array_agg(l.email_status_at ORDER BY l.sub), '{}'),
                       v_erased || coalesce(array_agg(l.sub) FILTER (WHERE l.personal_data_erased_at IS NOT NULL), '{}'),
                       v_deleted_before || coalesce(array_agg(l.sub) FILTER (WHERE l.deleted_at IS NOT NULL), '{}'),
                       v_consent_at || coalesce(array_agg(l.consent_revoked_at ORDER BY l.sub), '{}'),
                       v_deleted_at || coalesce(array_agg(l.deleted_at ORDER BY l.sub), '{}')
                  INTO v_locked, v_status_at, v_erased, v_deleted_before, v_consent_at, v_deleted_at
                  FROM unnest(v_missing) AS s(sub),
                       LATERAL (SELECT a.sub, a.email_status_at, a.personal_data_erased_at, a.deleted_at,
                                       a.consent_revoked_at
                                  FROM siwa.accounts a
                                 WHERE a.sub = s.sub AND a.sub <> ALL (v_inserted) FOR UPDATE SKIP LOCKED) AS l;
            END IF;
        END IF;
    END IF;

    -- 0. A jti stored twice: the later row is skipped (the log's primary key, by jti, in every partition).
    v_duplicates := ARRAY(SELECT b.id FROM unnest(p_batch) AS b
                           WHERE EXISTS (SELECT 1 FROM siwa.notification_log d
                                          WHERE d.jti = b.jti AND d.issued_at <> b.issued_at AND d.id < b.id));

    -- What each notification needs, worked out once.
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

    -- 3. (Worked out here, with the other array-only statements: what step 3 below revokes.)
    --    Revocation, one statement updating both tables: up to the latest consent-revoked event_time
    --    that comes before the user's first account-delete in the batch, everything for an
    --    account-delete. (A session created later than every such consent-revoked is revoked by the
    --    account-delete alone.)
    SELECT coalesce(array_agg(r.sub), '{}'), coalesce(array_agg(r.upto), '{}'), coalesce(array_agg(r.everything), '{}')
      INTO v_revoke_subs, v_revoke_upto, v_revoke_all
      FROM (SELECT x.sub,
                   max(x.event_time) FILTER (WHERE x.event_type = 'consent-revoked'
                                               AND (x.first_delete IS NULL OR x.ord < x.first_delete)) AS upto,
                   bool_or(x.event_type = 'account-delete') AS everything
              FROM unnest(v_events) AS x
             WHERE x.locked AND x.known AND x.event_type IN ('consent-revoked', 'account-delete')
             GROUP BY x.sub) AS r;

    -- 2. Account state, one UPDATE for the batch. Email events count only before the user's first
    --    account-delete in the batch (and not at all for an account deleted before it); one applies when
    --    its event_time is at least the account's email_status_at and that of every earlier email event
    --    of the user in the batch (these are exactly the ones one-at-a-time application would apply);
    --    the last one applied sets the status, and the last email (and is_private_email) given wins.
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
          FROM m JOIN unnest(v_locked, v_status_at) AS a(sub, email_status_at) ON a.sub = m.sub
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

    -- 3. Revocation (what each user's events revoke was worked out above, before step 2).
    --    Each revoked row is counted for the event that revoked it one event at a time: the user's first,
    --    in claim order up to the first account-delete, that covers it (an account-delete, or a
    --    consent-revoked at or after its created_at).
    v_rs_ord := '{}';
    v_rt_ord := '{}';
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

    -- 3b. The changes (siwa.changes), one per known event of a locked user in claim order, and after the
    --     user's first account-delete of the batch a siwa.personal_data_erased when it erases an account
    --     not erased before; the same rows, in the same order, as applying the batch's notifications one
    --     at a time writes. Worked out here, with the emails one-at-a-time application writes before the
    --     erasure of step 4 clears them, given to the hook (step 5) as they are, and returned (step 7):
    --     siwa.number_changes inserts them without the emails that erasure cleared. A superseded event
    --     (see siwa.changes) writes none, but its record is kept for the hook.
    --     Email events: applied as in step 2. Consent-revoked: superseded when the user's consent was
    --     revoked at or after its event_time already (before the batch, or by an earlier one of the
    --     batch) and it revoked nothing. Account-delete: when the account was deleted already at or
    --     before its event_time (before the batch, or by an earlier one of the batch) and it revoked
    --     nothing: an earlier deletion moves deleted_at, so it is a change, with the account's new time.
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
            SELECT e.*, a.status_at, a.consent_at, a.deleted_at,
                   max(e.event_time) FILTER (WHERE e.event_type IN ('email-disabled', 'email-enabled'))
                       OVER (PARTITION BY e.sub ORDER BY e.ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                       AS earlier_email,
                   max(e.event_time) FILTER (WHERE e.event_type = 'consent-revoked')
                       OVER (PARTITION BY e.sub ORDER BY e.ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                       AS earlier_consent,
                   min(e.event_time) FILTER (WHERE e.event_type = 'account-delete')
                       OVER (PARTITION BY e.sub ORDER BY e.ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                       AS earlier_delete
              FROM e JOIN unnest(v_locked, v_status_at, v_consent_at, v_deleted_at)
                          AS a(sub, status_at, consent_at, deleted_at)
                ON a.sub = e.sub),
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
        -- The change type of each event type of the batch (siwa.change_type, once per type, not per row).
        t AS MATERIALIZED (
            SELECT d.event_type, siwa.change_type(d.event_type) AS type FROM (SELECT DISTINCT e.event_type FROM e) AS d)
        SELECT s.ord, 0 AS kind, s.superseded,
               -- A row of siwa.changes, its columns in table order (id, position, type, sub, event_time,
               -- applied_at, jti, audience, sessions_revoked, refresh_tokens_revoked, email,
               -- is_private_email, old_sub): built directly, no JSON per row.
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
    -- Their ids now, from the identity's sequence in this order, so that the hook gets them; the rows
    -- themselves are inserted by the caller, numbered (step 7).
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

    -- 4. Erasure of every user deleted in this batch, at once (the batch's own rows of these users
    --    included: this transaction holds their locks).
    IF v_erase_now THEN
        v_deleted := ARRAY(SELECT DISTINCT x.sub FROM unnest(v_events) AS x
                            WHERE x.locked AND x.known AND x.event_type = 'account-delete');
        IF cardinality(v_deleted) > 0 THEN
            -- The batch's own rows are erased by the marking UPDATE of step 6 (erased_after): written once.
            PERFORM siwa.erase_personal_data_of(
                v_deleted, ARRAY(SELECT x.id FROM unnest(v_events) AS x WHERE x.locked));
        END IF;
    END IF;

    -- 5. The hooks, once per known event in claim order, with the path they were written for (see
    --    siwa.hook_path): switched once around the loop, which evaluates no operator or function
    --    of its own while the session's path is in force. Per event siwa.on_event, then (if it exists)
    --    siwa.on_change with its change record and with its erasure's, exactly as one at a time: the
    --    calls are listed first, under this function's own path.
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

    -- 6. Mark the batch. Finished (applied or skipped, an attempt): out of the queue, and the outcome
    --    into its log row, in one statement (a late event of an erased user keeps no email or token).
    --    Busy (no attempt): its queue row is put off (siwa.put_off_busy). The results first: the log
    --    row's last_error is the result's (a skip's reason). The results and the marking's columns
    --    (one narrow array each, in claim order; the log row's issued_at by position in p_batch) are
    --    worked out in one statement, so that the marking UPDATE reads a single unnest of scalars:
    --    no join (it was a nested loop of 64 × 64 rows over three unnests) and a narrow row mark
    --    instead of three whole rows copied per updated row.
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
    -- Both in one statement (they write different tables): out of the queue, the outcome into the log.
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
    -- Put off from now, when they are let go, not from the pass's start: a slow pass (the first of a
    -- session makes its plans) would otherwise hand them back already due.
    IF false = ANY (ARRAY(SELECT x.locked FROM unnest(v_events) AS x)) THEN
        PERFORM siwa.put_off_busy(ARRAY(SELECT x.id FROM unnest(v_events) AS x WHERE NOT x.locked),
                                  clock_timestamp());
    END IF;
    -- 7. The changes (with their ids) go to the caller, which inserts them numbered, last in its
    --    transaction (siwa.number_changes): the siwa.changes_counter row lock then covers only what is
    --    left of the transaction, not the work of the batch (nor of the batches of one of a fallback).
    PERFORM set_config('plan_cache_mode', v_plan_cache_mode, true);
    PERFORM set_config('enable_seqscan', v_enable_seqscan, true);
    PERFORM set_config('jit', v_jit, true);
END;
$$;
COMMENT ON FUNCTION siwa.apply_claimed_batch(siwa.notifications[]) IS
    'The worker''s set-based pass, the only implementation of its effects: applies a claimed batch (rows the caller holds FOR UPDATE, in claim order, subs resolved through siwa.sub_aliases) with one statement per effect — skips (unknown type, duplicate jti), account locks (busy users put off), account state with last writer wins by event_time, revocation, erasure, the hooks once per known event in order, one UPDATE marking every state — and returns one result per notification in claim order and the changes it wrote, with ids, for siwa.number_changes to insert. Raises on any failure; siwa.process_claimed_notifications then runs it on batches of one.';
