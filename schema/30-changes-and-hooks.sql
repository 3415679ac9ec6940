-- The changes (siwa.changes, one row per applied effect), their numbering, and the hooks siwa.on_event and siwa.on_change

-- The worker writes one siwa.changes row per effect it applies, in the transaction that applies it, from
-- the set-based pass (siwa.apply_claimed_batch, for a batch or, in its fallback, for a batch of one) and
-- from delayed erasure (siwa.erase_due_personal_data):
--   siwa.email_disabled, siwa.email_enabled  an email event that set the relay email status (last writer
--                                            wins by event_time); email and is_private_email as Apple
--                                            sent them, unless the account's personal data is erased;
--   siwa.consent_revoked                     with the sessions and refresh tokens it revoked;
--   siwa.account_deleted                     with the sessions and refresh tokens it revoked;
--   siwa.personal_data_erased                when an account's personal data is actually erased (at the
--                                            deletion, or later once siwa.settings.erase_personal_data_after
--                                            has passed); never for an account erased before;
--   siwa.sub_transferred                     a team transfer moved the user to sub (old_sub: the sub it
--                                            replaced; siwa.apply_sub_transfer, event_time and applied_at
--                                            the rewrite's time, jti '').
-- A superseded event writes no row: one that changed nothing because the state it is about is newer (an
-- email event older than the status, or of a deleted account; a consent-revoked no later than the
-- recorded one that revoked nothing; an account-delete no earlier than the account's recorded deletion that
-- revoked nothing: one earlier moves deleted_at, and its change carries the account's new time). The
-- hook siwa.on_change still hears of it, marked superseded. Unknown event types and skipped duplicates
-- write none either. Erasure sets email and is_private_email of every change row of the user to NULL.
--
-- The cursor, position: assigned at the very end of the writing transaction, in commit order, under the
-- row lock of siwa.changes_counter, which is held until that transaction ends, by one function,
-- siwa.number_changes, called last by the worker's entry points: it inserts the set-based pass's changes
-- numbered (the pass hands them over with their ids, so no row is written twice) and numbers the rows
-- other writers (delayed erasure) inserted without a position. A transaction that numbers after another therefore waited for it to commit: every position is
-- visible before any higher one, so a reader doing WHERE position > $last ORDER BY position misses
-- nothing, whatever order the writers inserted their rows in (ids, from a sequence, are handed out at
-- insert and commit out of order). Rows not numbered yet are invisible to readers (siwa.changefeed). A
-- transaction that writes changes and ends without numbering them leaves them to the next one that
-- numbers, which numbers every row it sees without a position: later, never lost. The lock serialises only
-- the last moment of the worker's transactions (the numbering UPDATE and the commit), not their work.
CREATE TABLE IF NOT EXISTS siwa.changes (
    id                     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    position               bigint      UNIQUE,
    type                   text        NOT NULL CHECK (type IN ('siwa.email_disabled', 'siwa.email_enabled',
                                        'siwa.consent_revoked', 'siwa.account_deleted', 'siwa.personal_data_erased',
                                        'siwa.sub_transferred')),
    sub                    text        NOT NULL,
    event_time             timestamptz NOT NULL,
    applied_at             timestamptz NOT NULL,
    jti                    text        NOT NULL,
    audience               text,
    sessions_revoked       integer     NOT NULL DEFAULT 0,
    refresh_tokens_revoked integer     NOT NULL DEFAULT 0,
    email                  text,
    is_private_email       boolean,
    old_sub                text
);
COMMENT ON TABLE siwa.changes IS
    'The changefeed: one row per effect the worker applied (email status set, consent revoked, account deleted, personal data erased) and per user a team transfer moved (sub transferred), written in the transaction that applied it. Apps read siwa.changefeed; position is the cursor.';
COMMENT ON COLUMN siwa.changes.id IS 'Identity, in insert order (per sub, the order the changes were applied). Not a cursor: see position.';
COMMENT ON COLUMN siwa.changes.position IS
    'The gap-free cursor: assigned in commit order at the end of the writing transaction (siwa.number_changes); NULL until then. A reader that has seen position p has seen every change with a lower one.';
COMMENT ON COLUMN siwa.changes.type IS
    'siwa.email_disabled, siwa.email_enabled, siwa.consent_revoked, siwa.account_deleted, siwa.personal_data_erased or siwa.sub_transferred.';
COMMENT ON COLUMN siwa.changes.sub IS 'The user''s team-scoped Apple identifier.';
COMMENT ON COLUMN siwa.changes.event_time IS
    'Apple''s event_time of the notification that caused it (for siwa.personal_data_erased: of the account-delete).';
COMMENT ON COLUMN siwa.changes.applied_at IS 'When the worker applied it.';
COMMENT ON COLUMN siwa.changes.jti IS
    'The jti of the notification that caused it (a delayed erasure: the account-delete''s, or '''' once that is no longer stored).';
COMMENT ON COLUMN siwa.changes.audience IS 'The notification''s aud (the client ID).';
COMMENT ON COLUMN siwa.changes.sessions_revoked IS 'Sessions (siwa.sessions) this change revoked.';
COMMENT ON COLUMN siwa.changes.refresh_tokens_revoked IS 'Refresh tokens (siwa.refresh_tokens) this change revoked.';
COMMENT ON COLUMN siwa.changes.email IS
    'The email Apple sent with an email event; NULL for other changes, and once the account''s personal data is erased.';
COMMENT ON COLUMN siwa.changes.is_private_email IS
    'Whether that email is a private relay address (email events only); NULL once erased.';
COMMENT ON COLUMN siwa.changes.old_sub IS
    'For siwa.sub_transferred: the sub the team transfer replaced with sub (siwa.sub_aliases.old_sub). NULL for every other change.';
-- The rows siwa.number_changes still has to number (a handful at any time).
CREATE INDEX IF NOT EXISTS changes_unnumbered_idx ON siwa.changes (id) WHERE position IS NULL;
-- The rows erasure has to clear (email events only).
CREATE INDEX IF NOT EXISTS changes_personal_idx ON siwa.changes (sub)
    WHERE email IS NOT NULL OR is_private_email IS NOT NULL;
-- Retention (siwa.prune) by applied_at: rows are appended in about that order.
CREATE INDEX IF NOT EXISTS changes_applied_idx ON siwa.changes USING brin (applied_at)
    WITH (autosummarize = on);

CREATE TABLE IF NOT EXISTS siwa.changes_counter (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    last_position bigint  NOT NULL DEFAULT 0
);
COMMENT ON TABLE siwa.changes_counter IS
    'The last position given to a change (one row). Its row lock, taken by siwa.number_changes and held to the end of the transaction, puts positions in commit order.';
COMMENT ON COLUMN siwa.changes_counter.singleton IS 'Always true: keeps this table to a single row.';
COMMENT ON COLUMN siwa.changes_counter.last_position IS 'The highest position given so far.';
INSERT INTO siwa.changes_counter DEFAULT VALUES ON CONFLICT DO NOTHING;

-- Numbers the changes, the one place positions are given: first p_new, the set-based pass's changes of
-- this transaction (their ids taken already, not inserted yet), inserted here with the next positions in
-- id order; then the rows already inserted without a position (by another writer of this transaction, or
-- left by one that committed without numbering), in id order. A change of an account whose personal
-- data is erased by now (by an account-delete applied later in the same transaction) is inserted without
-- its email. Then NOTIFY siwa_changes with the new last position (delivered at commit). Call it last in
-- the transaction: the counter's row lock is held until the transaction ends, and every other numbering
-- waits for it. Does nothing, and takes no lock, when there is nothing to number. Returns how many it
-- numbered. Planned for each call: the webhook fan-out trigger runs inside its INSERT, with its settings (the
-- set-based pass and the claim keep generic plans made with sequential scans off: see siwa.apply_claimed_batch).
CREATE OR REPLACE FUNCTION siwa.number_changes(p_new siwa.changes[] DEFAULT '{}') RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_ids  bigint[];
    v_last bigint;
    v_new  integer := 0;
BEGIN
    IF coalesce(cardinality(p_new), 0) = 0
       AND NOT EXISTS (SELECT 1 FROM siwa.changes c WHERE c.position IS NULL) THEN
        RETURN 0;
    END IF;
    SELECT k.last_position INTO v_last FROM siwa.changes_counter k FOR UPDATE;
    IF cardinality(p_new) > 0 THEN
        INSERT INTO siwa.changes (id, position, type, sub, event_time, applied_at, jti, audience, sessions_revoked,
                                  refresh_tokens_revoked, email, is_private_email)
        OVERRIDING SYSTEM VALUE
        SELECT c.id, v_last + row_number() OVER (ORDER BY c.id), c.type, c.sub, c.event_time, c.applied_at, c.jti,
               c.audience, c.sessions_revoked, c.refresh_tokens_revoked,
               CASE WHEN e.erased_at IS NULL THEN c.email END, CASE WHEN e.erased_at IS NULL THEN c.is_private_email END
          FROM unnest(p_new) AS c
          -- One primary-key probe per change that carries an email (LIMIT 1 keeps the LATERAL a
          -- parameterised index scan). An EXISTS in the select list was planned as a hashed subplan
          -- that read all of siwa.accounts, twice, for every batch: its cost grew with the users.
          LEFT JOIN LATERAL (SELECT a.personal_data_erased_at AS erased_at FROM siwa.accounts a
                              WHERE (c.email IS NOT NULL OR c.is_private_email IS NOT NULL) AND a.sub = c.sub
                              LIMIT 1) AS e ON true
         ORDER BY c.id;
        GET DIAGNOSTICS v_new = ROW_COUNT;
    END IF;
    -- Read after the lock: rows another transaction left unnumbered may have been numbered meanwhile.
    v_ids := ARRAY(SELECT c.id FROM siwa.changes c WHERE c.position IS NULL ORDER BY c.id);
    IF v_new + cardinality(v_ids) = 0 THEN
        RETURN 0;
    END IF;
    UPDATE siwa.changes AS c SET position = v_last + v_new + o.n
      FROM unnest(v_ids) WITH ORDINALITY AS o(id, n)
     WHERE c.id = o.id;
    v_last := v_last + v_new + cardinality(v_ids);
    UPDATE siwa.changes_counter SET last_position = v_last;
    PERFORM pg_catalog.pg_notify('siwa_changes', v_last::text);
    RETURN v_new + cardinality(v_ids);
END;
$$;
COMMENT ON FUNCTION siwa.number_changes(siwa.changes[]) IS
    'The one place changes are numbered: inserts p_new (the set-based pass''s changes, ids given; without email for an account erased by now) with the next positions in id order, then gives the changes without a position the next ones, in id order, under the siwa.changes_counter row lock (held to the end of the transaction: call it last), and notifies siwa_changes with the last position. Returns how many.';

-- The change type an event type writes.
CREATE OR REPLACE FUNCTION siwa.change_type(p_event_type text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
SELECT CASE p_event_type
         WHEN 'email-disabled' THEN 'siwa.email_disabled'
         WHEN 'email-enabled' THEN 'siwa.email_enabled'
         WHEN 'consent-revoked' THEN 'siwa.consent_revoked'
         WHEN 'account-delete' THEN 'siwa.account_deleted'
       END
$$;
COMMENT ON FUNCTION siwa.change_type(text) IS
    'The siwa.changes type an applied event of this type writes (NULL for an unknown type).';

-- The search_path the admins' hooks (siwa.on_event, siwa.on_change) are called with: siwa.settings.
-- hook_search_path, or the session's own path (its reset value, read once per session from pg_settings,
-- which is slow, and kept in the session's custom setting siwa.session_search_path). The caller switches
-- to it with set_config(…, true) (inside a function with a SET clause that lasts until it returns).
CREATE OR REPLACE FUNCTION siwa.hook_path() RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_hook_path text := (SELECT s.hook_search_path FROM siwa.settings s);
BEGIN
    IF v_hook_path IS NULL THEN
        v_hook_path := nullif(pg_catalog.current_setting('siwa.session_search_path', true), '');
        IF v_hook_path IS NULL THEN
            v_hook_path := (SELECT p.reset_val FROM pg_catalog.pg_settings p WHERE p.name = 'search_path');
            PERFORM pg_catalog.set_config('siwa.session_search_path', v_hook_path, false);
        END IF;
    END IF;
    RETURN v_hook_path;
END;
$$;
COMMENT ON FUNCTION siwa.hook_path() IS
    'The search_path the hooks siwa.on_event and siwa.on_change run with: siwa.settings.hook_search_path, or the session''s own.';

-- ---------------------------------------------------------------------------------------------------
-- The admins' hook
-- ---------------------------------------------------------------------------------------------------

-- Created only when missing: admins replace it with CREATE OR REPLACE FUNCTION, and re-running this file
-- must not undo that.
DO $$
BEGIN
    IF to_regprocedure('siwa.on_event(text, text, timestamptz, text, text)') IS NULL THEN
        CREATE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz, email text, jti text)
        RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $body$
        BEGIN
            -- No-op by default. Replace to touch your own tables; runs in the worker's transaction.
        END;
        $body$;
        COMMENT ON FUNCTION siwa.on_event(text, text, timestamptz, text, text) IS
            'Hook called by the worker for every known event, inside the transaction that applies it (after the built-in effects). A no-op by default; replace it with CREATE OR REPLACE FUNCTION to update your own tables (give it its own SET search_path, e.g. SET search_path = app, pg_catalog, pg_temp; without one it runs with siwa.settings.hook_search_path). If it raises, nothing of that application is kept and the event is retried.';
    END IF;
END;
$$;

-- The optional second hook, siwa.on_change(change siwa.changes, superseded boolean): not created here.
-- When an admin creates it (and grants EXECUTE on it to siwa_worker, or applies schema.sql again), the
-- worker calls it, with the same search_path as siwa.on_event, in the same transaction:
--   * for every known event it applies, right after siwa.on_event(…) for that event, with the change
--     it wrote (id set, position NULL: numbered at commit) or, for a superseded event, the change it
--     would have written (id NULL) and superseded = true;
--   * right after that, when the event erased the user's personal data (an account-delete with
--     siwa.settings.erase_personal_data_after = 0, of an account not erased before), with the
--     siwa.personal_data_erased change;
--   * for a delayed erasure (siwa.erase_due_personal_data), with its siwa.personal_data_erased change
--     (siwa.on_event is not called for it).
-- The set-based pass makes these calls in this order for a batch as for each notification of it applied
-- alone (a batch of one, its fallback). A record carries what siwa.on_event lacks: audience, is_private_email, revocation
-- counts, the type of change; its email is what siwa.on_event gets. If it raises, like siwa.on_event, nothing of that
-- application is kept and the event is retried.
