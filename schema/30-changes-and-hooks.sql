-- The changes (siwa.changes, one row per applied effect), their numbering, and the hooks siwa.on_event and siwa.on_change

-- The worker writes one siwa.changes row per effect it applies, in the transaction that applies it, from
-- both paths (siwa.apply_claimed_batch and siwa.apply_notification, which leave the same rows) and from
-- delayed erasure (siwa.erase_due_personal_data):
--   siwa.email_disabled, siwa.email_enabled  an email event that set the relay email status (last writer
--                                            wins by event_time); email and is_private_email as Apple
--                                            sent them, unless the account's personal data is erased;
--   siwa.consent_revoked                     with the sessions and refresh tokens it revoked;
--   siwa.account_deleted                     with the sessions and refresh tokens it revoked;
--   siwa.personal_data_erased                when an account's personal data is actually erased (at the
--                                            deletion, or later once siwa.settings.erase_personal_data_after
--                                            has passed); never for an account erased before.
-- A superseded event writes no row: one that changed nothing because the state it is about is newer (an
-- email event older than the status, or of a deleted account; a consent-revoked no later than the
-- recorded one that revoked nothing; an account-delete of a deleted account that revoked nothing). The
-- hook siwa.on_change still hears of it, marked superseded. Unknown event types and skipped duplicates
-- write none either. Erasure sets email and is_private_email of every change row of the user to NULL.
--
-- The cursor, position: assigned at the very end of the writing transaction, in commit order, under the
-- row lock of siwa.changes_counter, which is held until that transaction ends: by the set-based pass as
-- it inserts its changes, its last statement (siwa.apply_claimed_batch, step 7); by siwa.number_changes
-- for the rows the other paths inserted without a position (called last by the worker's entry points). A transaction that numbers after another therefore waited for it to commit: every position is
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
                                        'siwa.consent_revoked', 'siwa.account_deleted', 'siwa.personal_data_erased')),
    sub                    text        NOT NULL,
    event_time             timestamptz NOT NULL,
    applied_at             timestamptz NOT NULL,
    jti                    text        NOT NULL,
    audience               text,
    sessions_revoked       integer     NOT NULL DEFAULT 0,
    refresh_tokens_revoked integer     NOT NULL DEFAULT 0,
    email                  text,
    is_private_email       boolean
);
COMMENT ON TABLE siwa.changes IS
    'The changefeed: one row per effect the worker applied (email status set, consent revoked, account deleted, personal data erased), written in the transaction that applied it. Apps read siwa.changefeed; position is the cursor.';
COMMENT ON COLUMN siwa.changes.id IS 'Identity, in insert order (per sub, the order the changes were applied). Not a cursor: see position.';
COMMENT ON COLUMN siwa.changes.position IS
    'The gap-free cursor: assigned in commit order at the end of the writing transaction (siwa.number_changes); NULL until then. A reader that has seen position p has seen every change with a lower one.';
COMMENT ON COLUMN siwa.changes.type IS
    'siwa.email_disabled, siwa.email_enabled, siwa.consent_revoked, siwa.account_deleted or siwa.personal_data_erased.';
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

-- Numbers the changes not numbered yet (this transaction's, and any another transaction committed without
-- numbering), in id order, after the last position given; then NOTIFY siwa_changes with the new last
-- position (delivered at commit). Call it last in the transaction: the counter's row lock is held until
-- the transaction ends, and every other numbering waits for it. Does nothing, and takes no lock, when
-- there is nothing to number. Returns how many it numbered.
CREATE OR REPLACE FUNCTION siwa.number_changes() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_ids  bigint[];
    v_last bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM siwa.changes c WHERE c.position IS NULL) THEN
        RETURN 0;
    END IF;
    SELECT k.last_position INTO v_last FROM siwa.changes_counter k FOR UPDATE;
    -- Read after the lock: rows another transaction left unnumbered may have been numbered meanwhile.
    v_ids := ARRAY(SELECT c.id FROM siwa.changes c WHERE c.position IS NULL ORDER BY c.id);
    IF cardinality(v_ids) = 0 THEN
        RETURN 0;
    END IF;
    UPDATE siwa.changes AS c SET position = v_last + o.n
      FROM unnest(v_ids) WITH ORDINALITY AS o(id, n)
     WHERE c.id = o.id;
    v_last := v_last + cardinality(v_ids);
    UPDATE siwa.changes_counter SET last_position = v_last;
    PERFORM pg_catalog.pg_notify('siwa_changes', v_last::text);
    RETURN cardinality(v_ids);
END;
$$;
COMMENT ON FUNCTION siwa.number_changes() IS
    'Gives the changes without a position the next positions, in id order, under the siwa.changes_counter row lock (held to the end of the transaction: call it last), and notifies siwa_changes with the last position. Returns how many.';

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
-- Both paths (the set-based siwa.apply_claimed_batch and one at a time) make exactly the same calls in
-- the same order. A record carries what siwa.on_event lacks: audience, is_private_email, revocation
-- counts, the type of change; its email is what siwa.on_event gets. If it raises, like siwa.on_event, nothing of that
-- application is kept and the event is retried.
