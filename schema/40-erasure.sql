-- Erasure of a user's personal data: at the deletion and delayed (siwa.settings.erase_personal_data_after)

-- Erases the personal data of the accounts p_subs: their email, their notifications' emails and raw
-- tokens, and the encrypted refresh tokens, with one statement per table for all of them (the worker's
-- set-based pass erases every account deleted in a batch at once). The caller holds the siwa.accounts row
-- locks of these subs, so no other worker applies these users' notifications meanwhile; pending rows
-- another worker has claimed but left alone (it could not take the lock) are skipped rather than waited
-- for, which could deadlock with that worker's batch: they are erased when applied (see
-- siwa.apply_claimed_batch).
-- p_leave: notification_log ids the caller updates itself later in its transaction, erasing them as it
-- does (the set-based pass: its batch's own rows, which its marking UPDATE erases), left out here so
-- that each of those rows is written once, not twice. Tested with array_position, which the planner
-- leaves alone: an `id <> ALL (p_leave)` would be expanded into one clause per id and tried against every
-- partition's constraints while planning (measured: most of the drain's instructions).
-- Its statements keep one generic plan per session, made with sequential scans disabled, so that each
-- table is read through the index of its keys whatever its size was then: see siwa.apply_claimed_batch.
CREATE OR REPLACE FUNCTION siwa.erase_personal_data_of(p_subs text[], p_leave bigint[] DEFAULT '{}') RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off AS $$
DECLARE
    v_ids bigint[];
    v_all text[];
BEGIN
    -- The history of a user whose sub a team transfer replaced is stored under the old sub too.
    v_all := p_subs || ARRAY(SELECT a.old_sub FROM siwa.sub_aliases a WHERE a.new_sub = ANY (p_subs));
    -- Every address about to be erased (the account's, its notifications' and changes', p_leave's rows
    -- included) is remembered as a keyed hash first, so that the relay-mail gate still blocks it.
    PERFORM siwa.remember_erased_mail_addresses(pg_catalog.array_agg(x.email), pg_catalog.array_agg(x.deleted_at))
       FROM (SELECT a.email, a.deleted_at FROM siwa.accounts a WHERE a.sub = ANY (p_subs) AND a.email IS NOT NULL
             UNION
             SELECT l.email, a.deleted_at
               FROM siwa.accounts a
               JOIN LATERAL (SELECT a.sub AS s UNION ALL
                             SELECT o.old_sub FROM siwa.sub_aliases o WHERE o.new_sub = a.sub) AS who ON true
               JOIN siwa.notification_log l ON l.sub = who.s
              WHERE a.sub = ANY (p_subs) AND l.email IS NOT NULL
             UNION
             SELECT c.email, a.deleted_at
               FROM siwa.accounts a
               JOIN LATERAL (SELECT a.sub AS s UNION ALL
                             SELECT o.old_sub FROM siwa.sub_aliases o WHERE o.new_sub = a.sub) AS who ON true
               JOIN siwa.changes c ON c.sub = who.s
              WHERE a.sub = ANY (p_subs) AND c.email IS NOT NULL) AS x
     HAVING pg_catalog.count(*) > 0;
    -- An account erased before (a second account-delete) keeps the time of its first erasure.
    UPDATE siwa.accounts
       SET email = NULL, is_private_email = NULL,
           personal_data_erased_at = coalesce(personal_data_erased_at, clock_timestamp()),
           updated_at = clock_timestamp()
     WHERE sub = ANY (p_subs);
    -- Every state: applied, skipped, dead (a failed late event) and pending alike, in the log (found by
    -- its sub index in every partition). The worker's claims lock queue rows, never log rows, so this
    -- waits for no other worker's batch. A pending consent-revoked or account-delete without an address
    -- keeps its token (nothing in it but the sub, which the account keeps) so that the worker can still
    -- verify and apply it; its marking clears it then (siwa.apply_claimed_batch).
    -- siwa.erased_error is called only for a row with a last_error: it maps NULL to NULL, and a call
    -- costs a search_path switch (its SET clause keeps it from being inlined), which most rows (applied,
    -- without an error) need not pay.
    UPDATE siwa.notification_log
       SET email = NULL,
           raw_token = CASE WHEN state = 'pending' AND event_type IN ('consent-revoked', 'account-delete')
                                 AND email IS NULL THEN raw_token END,
           last_error = CASE WHEN last_error IS NOT NULL THEN siwa.erased_error(last_error, state) END,
           personal_data_erased_at =
               CASE WHEN state = 'pending' AND event_type IN ('consent-revoked', 'account-delete')
                         AND email IS NULL AND raw_token IS NOT NULL
                    THEN personal_data_erased_at
                    ELSE coalesce(personal_data_erased_at, clock_timestamp()) END
     WHERE sub = ANY (v_all) AND pg_catalog.array_position(p_leave, id) IS NULL
       AND (email IS NOT NULL
            OR (raw_token IS NOT NULL
                AND NOT (state = 'pending' AND event_type IN ('consent-revoked', 'account-delete')))
            OR (last_error IS NOT NULL AND last_error IS DISTINCT FROM siwa.erased_error(last_error, state)));
    -- The error texts of the user's queued rows (found through the log). Rows another worker has claimed
    -- but left alone (it could not take the lock) are skipped rather than waited for, which could deadlock
    -- with that worker's batch: they are erased when applied or failed (siwa.record_failure).
    -- The ids first (the log's sub index), then the queue by its primary key: a join would let the
    -- planner read the whole queue, which it believes has few rows with an error.
    v_ids := ARRAY(SELECT l.id FROM siwa.notification_log l
                    WHERE l.sub = ANY (v_all) AND l.state = 'pending'
                      AND pg_catalog.array_position(p_leave, l.id) IS NULL);
    IF pg_catalog.cardinality(v_ids) > 0 THEN
        UPDATE siwa.notification_queue AS t
           SET last_error = siwa.erased_error(t.last_error, 'pending')
          FROM (SELECT q.id FROM siwa.notification_queue q
                 WHERE q.id = ANY (v_ids) AND q.last_error IS NOT NULL
                   AND q.last_error IS DISTINCT FROM siwa.erased_error(q.last_error, 'pending')
                 FOR UPDATE SKIP LOCKED) AS c
         WHERE t.id = c.id;
    END IF;
    UPDATE siwa.refresh_tokens SET token_ciphertext = NULL
     WHERE sub = ANY (p_subs) AND token_ciphertext IS NOT NULL;
    -- The changefeed keeps no email of them either (nor what a webhook would send later).
    UPDATE siwa.changes SET email = NULL, is_private_email = NULL
     WHERE sub = ANY (v_all) AND (email IS NOT NULL OR is_private_email IS NOT NULL);
    -- A team transfer's import holds the new team's email between the exchange and the rewrite, found by
    -- either sub: the old one, or the new one (Apple notifies under the new sub once the app has moved, so
    -- the new sub's account may be deleted and erased before the rewrite). The table is created further
    -- down this file: absent while an older file's version is being upgraded.
    IF pg_catalog.to_regclass('siwa.transfer_imports') IS NOT NULL THEN
        PERFORM siwa.remember_erased_mail_addresses(pg_catalog.array_agg(t.email), pg_catalog.array_agg(a.deleted_at))
           FROM siwa.accounts a
           JOIN LATERAL (SELECT a.sub AS s UNION ALL
                         SELECT o.old_sub FROM siwa.sub_aliases o WHERE o.new_sub = a.sub) AS who ON true
           JOIN siwa.transfer_imports t ON t.old_sub = who.s OR t.new_sub = who.s
          WHERE a.sub = ANY (p_subs) AND t.email IS NOT NULL
         HAVING pg_catalog.count(*) > 0;
        UPDATE siwa.transfer_imports SET email = NULL
         WHERE (old_sub = ANY (v_all) OR new_sub = ANY (v_all)) AND email IS NOT NULL;
    END IF;
    -- The auth adapters' finished rows keep no sub of them (schema/76-auth-adapters.sql): done and no_user
    -- ones at once; dead ones, which an operator may still retry, once they finished longer ago than the
    -- changes' retention (siwa.settings.changes_retention; the changes keep the sub as long). Pending rows
    -- keep it: they are still to be applied (this erasure's own change among them). Absent while an older
    -- file's version is being upgraded, as the transfer's table above.
    IF pg_catalog.to_regclass('siwa.auth_adapter_events') IS NOT NULL THEN
        UPDATE siwa.auth_adapter_events SET sub = NULL, old_sub = NULL
         WHERE (sub = ANY (v_all) OR old_sub = ANY (v_all))
           AND (state IN ('done', 'no_user')
                OR (state = 'dead'
                    AND finished_at < clock_timestamp() - (SELECT s.changes_retention FROM siwa.settings s)));
    END IF;
END;
$$;
COMMENT ON FUNCTION siwa.erase_personal_data_of(text[], bigint[]) IS
    'Erases the personal data of the accounts p_subs: email in siwa.accounts; email, raw token (but that of a pending consent-revoked or account-delete without an address, which the worker still verifies and clears when it applies it) and the text of last_error (its SQLSTATE stays) in every stored notification of these subs and of the subs a team transfer replaced with them, whatever its state, but those of p_leave (ids the caller erases itself); encrypted refresh tokens; email and is_private_email of their siwa.changes rows; the email a team transfer''s import holds for either sub; the sub and old_sub of their finished auth adapter rows (done and no_user; dead ones once finished longer ago than siwa.settings.changes_retention). Call with the subs'' siwa.accounts rows locked (FOR UPDATE). Writes no change itself: its callers write siwa.personal_data_erased.';

-- Erases one account's personal data (siwa.erase_personal_data_of for one sub).
CREATE OR REPLACE FUNCTION siwa.erase_personal_data(p_sub text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM siwa.erase_personal_data_of(ARRAY[p_sub]);
END;
$$;
COMMENT ON FUNCTION siwa.erase_personal_data(text) IS
    'Erases one account''s personal data: email in siwa.accounts; email, raw token and the text of last_error (its SQLSTATE stays) in every stored notification of that sub, whatever its state; encrypted refresh tokens. Call with the sub''s siwa.accounts row locked (FOR UPDATE).';

-- Erases personal data of deleted accounts whose retention period has passed (see siwa.settings).
-- At most 64 accounts per call, each in a subtransaction that writes: see siwa.process_claimed_notifications.
CREATE OR REPLACE FUNCTION siwa.erase_due_personal_data(p_limit integer DEFAULT 100) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_sub        text;
    v_deleted_at timestamptz;
    v_count      integer := 0;
    v_erasure    siwa.changes;
    v_on_change  boolean := pg_catalog.to_regprocedure('siwa.on_change(siwa.changes, boolean)') IS NOT NULL;
    v_hook_path  text;
BEGIN
    FOR v_sub, v_deleted_at IN
        SELECT a.sub, a.deleted_at FROM siwa.accounts a, siwa.settings s
         WHERE a.deleted_at IS NOT NULL AND a.personal_data_erased_at IS NULL
           AND a.deleted_at + s.erase_personal_data_after <= clock_timestamp()
         ORDER BY a.deleted_at
         LIMIT least(p_limit, 64)
         FOR UPDATE OF a SKIP LOCKED
    LOOP
        -- The account row lock (held here, skipped when a worker applying this user's events holds it)
        -- serialises erasure with the worker, as its set-based pass does. A row of this
        -- user that an app transaction holds ends the wait with lock_timeout: that account is erased on
        -- the next pass, the others now.
        -- The change siwa.personal_data_erased, with the deletion's event_time, and the jti and audience
        -- of the user's earliest stored account-delete ('' and NULL once retention dropped it); and the
        -- hook siwa.on_change, if it exists (siwa.on_event hears nothing of a delayed erasure). If the
        -- hook raises, this call's erasures are undone (the maintenance pass logs the failure) and tried
        -- again on the next pass.
        BEGIN
            PERFORM siwa.erase_personal_data(v_sub);
            INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti, audience)
            SELECT 'siwa.personal_data_erased', v_sub, v_deleted_at, clock_timestamp(),
                   coalesce(d.jti, ''), d.audience
              FROM (SELECT 1) AS one
              LEFT JOIN LATERAL (SELECT l.jti, l.audience FROM siwa.notification_log l
                                  WHERE l.sub = v_sub AND l.event_type = 'account-delete'
                                  ORDER BY l.event_time, l.id LIMIT 1) AS d ON true
            RETURNING * INTO v_erasure;
            IF v_on_change THEN
                v_hook_path := siwa.hook_path();
                PERFORM pg_catalog.set_config('search_path', v_hook_path, true);
                PERFORM siwa.on_change(v_erasure, false);
                PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
            END IF;
            v_count := v_count + 1;
        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
            NULL;
        END;
    END LOOP;
    PERFORM siwa.number_changes();  -- last: see siwa.changes
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION siwa.erase_due_personal_data(integer) IS
    'Maintenance: erases the personal data of up to p_limit (at most 64, one subtransaction each) deleted accounts whose siwa.settings.erase_personal_data_after has passed, writing a siwa.personal_data_erased change for each (and calling siwa.on_change if it exists). Returns how many.';
