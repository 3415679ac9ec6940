-- Moving users when the app changes teams: the rewrite list, progress, aliases, siwa.history_of

-- A user's sub is team-scoped: when the app moves to another developer team, every sub changes. The old
-- team asks Apple for each user's transfer identifier (siwactl transfer export, progress in
-- siwa.transfer_exports); the new team exchanges each for its new sub (siwactl transfer import, progress
-- in siwa.transfer_imports) and rewrites every table that holds a sub, one batch per call of
-- siwa.apply_sub_transfer, which records the batch in siwa.sub_transfer_batches and keeps each old sub
-- in siwa.sub_aliases. The history (siwa.notification_log) keeps the sub Apple sent: siwa.history_of
-- finds a user's history by either sub. A notification for an old sub arriving after the transfer (a
-- redelivery) is stored as sent and applied to the aliased account (the worker's claim resolves the
-- alias). Every object here is new: tables created only when missing, functions replaced.

-- The rewrite list: every column named sub of a table in schema siwa, and what a transfer does with it.
-- A table added later with a sub column adds its row here (INSERT … ON CONFLICT DO UPDATE, below);
-- siwa.apply_sub_transfer refuses to run while any sub column is missing from this list.
CREATE TABLE IF NOT EXISTS siwa.sub_columns (
    table_name  text NOT NULL,
    column_name text NOT NULL,
    on_transfer text NOT NULL,
    why         text NOT NULL,
    PRIMARY KEY (table_name, column_name),
    CONSTRAINT sub_columns_on_transfer_check CHECK (on_transfer IN ('rewrite', 'keep'))
);
COMMENT ON TABLE siwa.sub_columns IS
    'The rewrite list of a team transfer: every column named sub of a table in schema siwa, rewritten to the new sub (rewrite) or kept as it is (keep). siwa.apply_sub_transfer refuses to run while a sub column is missing here.';
INSERT INTO siwa.sub_columns (table_name, column_name, on_transfer, why) VALUES
    ('accounts', 'sub', 'rewrite', 'the user''s account'),
    ('sessions', 'sub', 'rewrite', 'the app''s sessions'),
    ('refresh_tokens', 'sub', 'rewrite', 'stored refresh tokens'),
    ('sign_in_codes', 'sub', 'rewrite', 'exchanged authorization codes'),
    ('sign_ins', 'sub', 'rewrite', 'sign-ins per client ID'),
    ('revocation_requests', 'sub', 'rewrite', 'the revocation ledger'),
    ('changes', 'sub', 'rewrite', 'the changefeed: a change read or delivered after the transfer names the sub the app now knows'),
    ('webhook_deliveries', 'sub', 'rewrite', 'per-user delivery order, which follows the change''s sub'),
    ('notification_log', 'sub', 'keep', 'the history keeps the sub Apple sent; siwa.history_of finds it by either sub'),
    ('transfer_exports', 'sub', 'keep', 'the old team''s own progress, by its own subs')
ON CONFLICT (table_name, column_name) DO UPDATE SET on_transfer = EXCLUDED.on_transfer, why = EXCLUDED.why;

-- Old team: one row per user and target team, what Apple answered for it.
CREATE TABLE IF NOT EXISTS siwa.transfer_exports (
    target_team     text        NOT NULL,
    sub             text        NOT NULL,
    transfer_sub    text,
    state           text        NOT NULL DEFAULT 'pending',
    attempts        integer     NOT NULL DEFAULT 0,
    apple_status    integer,
    apple_error     text,
    last_attempt_at timestamptz,
    done_at         timestamptz,
    PRIMARY KEY (target_team, sub),
    CONSTRAINT transfer_exports_state_check CHECK (state IN ('pending', 'done', 'failed')),
    CONSTRAINT transfer_exports_done_check CHECK ((state = 'done') = (transfer_sub IS NOT NULL))
);
COMMENT ON TABLE siwa.transfer_exports IS
    'siwactl transfer export''s progress (old team): per user and target team, the transfer identifier Apple gave (done), or Apple''s exact error (failed: a refusal; pending with an error: a transient failure to retry), and the attempts.';
COMMENT ON COLUMN siwa.transfer_exports.apple_error IS
    'Apple''s error as answered: the error word of a 400 (invalid_request, invalid_grant, …), or the failure kind with its status (rate_limited 429, server_error 503, timeout).';

-- New team: one row per transfer identifier received, what Apple answered and what the rewrite did.
CREATE TABLE IF NOT EXISTS siwa.transfer_imports (
    transfer_id      text        NOT NULL,
    transfer_sub     text        NOT NULL,
    old_sub          text        NOT NULL,
    new_sub          text,
    email            text,
    is_private_email boolean,
    state            text        NOT NULL DEFAULT 'pending',
    attempts         integer     NOT NULL DEFAULT 0,
    apple_status     integer,
    apple_error      text,
    detail           text,
    last_attempt_at  timestamptz,
    applied_at       timestamptz,
    PRIMARY KEY (transfer_id, transfer_sub),
    CONSTRAINT transfer_imports_old_sub_key UNIQUE (transfer_id, old_sub),
    CONSTRAINT transfer_imports_state_check
        CHECK (state IN ('pending', 'exchanged', 'failed', 'applied', 'mismatch', 'conflict', 'duplicate')),
    CONSTRAINT transfer_imports_email_check CHECK (state = 'exchanged' OR email IS NULL)
);
-- Erasure finds a held email by either sub (the rows that hold one are few: until applied).
CREATE INDEX IF NOT EXISTS transfer_imports_email_idx ON siwa.transfer_imports (old_sub) WHERE email IS NOT NULL;
CREATE INDEX IF NOT EXISTS transfer_imports_new_sub_email_idx ON siwa.transfer_imports (new_sub) WHERE email IS NOT NULL;
COMMENT ON TABLE siwa.transfer_imports IS
    'siwactl transfer import''s progress (new team): per transfer identifier, the old sub, the new sub Apple exchanged it for, and the outcome: pending, exchanged (the email is held only until applied), failed (Apple''s error), applied, mismatch (the answer does not fit the account: detail says how), conflict (the new sub already has an account), duplicate (two transfer identifiers gave the same new sub: neither applied).';

-- siwa.sub_aliases (each replaced sub and the sub it became) and siwa.current_sub, the one rule that
-- maps any sub to the account's current sub, are in schema/25-accounts.sql: every place a sub enters
-- uses them.

-- A replaced sub never comes back as an account: a writer that resolved no alias a moment before the
-- rewrite committed (the worker's claim, then its account lock) is refused with 40001, rolls back and
-- retries (the worker counts an attempt; its next claim resolves the alias). Checked once per INSERT
-- statement (a transition table: the worker creates a batch's accounts in one statement), and per row
-- only for an UPDATE that sets sub, which no service does.
CREATE OR REPLACE FUNCTION siwa.refuse_replaced_sub() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_LEVEL = 'ROW' THEN
        IF EXISTS (SELECT 1 FROM siwa.sub_aliases a WHERE a.old_sub = NEW.sub) THEN
            RAISE EXCEPTION 'siwa.accounts: this sub was replaced in a team transfer (siwa.sub_aliases); use its new sub'
                USING ERRCODE = '40001';
        END IF;
        RETURN NEW;
    END IF;
    IF EXISTS (SELECT 1 FROM inserted_accounts i JOIN siwa.sub_aliases a ON a.old_sub = i.sub) THEN
        RAISE EXCEPTION 'siwa.accounts: this sub was replaced in a team transfer (siwa.sub_aliases); use its new sub'
            USING ERRCODE = '40001';
    END IF;
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION siwa.refuse_replaced_sub() IS
    'Triggers on siwa.accounts (after each INSERT statement, before each UPDATE OF sub): refuses (40001) a sub that a team transfer replaced (siwa.sub_aliases.old_sub).';
DROP TRIGGER IF EXISTS accounts_refuse_replaced_sub_insert ON siwa.accounts;
CREATE TRIGGER accounts_refuse_replaced_sub_insert
    AFTER INSERT ON siwa.accounts REFERENCING NEW TABLE AS inserted_accounts
    FOR EACH STATEMENT EXECUTE FUNCTION siwa.refuse_replaced_sub();
DROP TRIGGER IF EXISTS accounts_refuse_replaced_sub_update ON siwa.accounts;
CREATE TRIGGER accounts_refuse_replaced_sub_update
    BEFORE UPDATE OF sub ON siwa.accounts
    FOR EACH ROW EXECUTE FUNCTION siwa.refuse_replaced_sub();

-- One row per batch siwa.apply_sub_transfer applied: who, when, how many users and rows per table.
CREATE TABLE IF NOT EXISTS siwa.sub_transfer_batches (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    transfer_id text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    applied_by  text        NOT NULL DEFAULT session_user,
    users       integer     NOT NULL,
    outcomes    jsonb       NOT NULL,
    rewritten   jsonb       NOT NULL
);
COMMENT ON TABLE siwa.sub_transfer_batches IS
    'The audit trail of team transfers: one row per batch rewritten by siwa.apply_sub_transfer, with the login role that ran it, the users per outcome and the rows rewritten per table.';

-- The rewrite, one batch per call, in one transaction: checks the batch (refused whole, 23505, when two
-- old subs map to one new sub, within it or with an earlier alias), checks each answer against the
-- account (mismatch: the private flag differs, or a non-private email differs), refuses a new sub that
-- already has an account (conflict), rewrites every column siwa.sub_columns lists as rewrite, replaces
-- the email of private-relay accounts with the new team's relay address, records the aliases, the
-- import rows' outcomes (siwa.transfer_imports, email dropped) and the batch. Idempotent: a pair already
-- aliased is 'already'. SECURITY DEFINER with the pinned search_path, so that the owner may grant it to a
-- login role for the migration; EXECUTE is granted to no role here (siwa_app, siwa_admin: 42501).
CREATE OR REPLACE FUNCTION siwa.apply_sub_transfer(
    p_transfer_id text, p_old_subs text[], p_new_subs text[], p_emails text[], p_private boolean[])
RETURNS TABLE (old_sub text, new_sub text, outcome text, detail text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
-- Hash joins: the batch meets each table once. Several tables have no index on sub alone (sessions and
-- refresh_tokens index only the unrevoked rows), and a nested loop over an array the planner believes
-- short scans them once per user.
SET enable_nestloop = off AS $$
DECLARE
    v_unlisted  text;
    v_duplicate text;
    v_column    record;
    v_count     bigint;
    v_rewritten jsonb := '{}';
    v_old       text[];
    v_new       text[];
    v_emails    text[];
    v_private   boolean[];
    v_outcomes  text[];
    v_details   text[];
    v_apply_old text[];
    v_apply_new text[];
    v_merge_old text[];
    v_merge_new text[];
    v_created   text[];
    v_erased    text[];
    v_now       timestamptz := clock_timestamp();
BEGIN
    IF p_transfer_id IS NULL OR p_transfer_id = '' OR p_old_subs IS NULL OR p_new_subs IS NULL
       OR cardinality(p_old_subs) <> cardinality(p_new_subs)
       OR cardinality(coalesce(p_emails, '{}')) NOT IN (0, cardinality(p_old_subs))
       OR cardinality(coalesce(p_private, '{}')) NOT IN (0, cardinality(p_old_subs))
       OR EXISTS (SELECT 1 FROM unnest(p_old_subs, p_new_subs) AS m(o, n)
                   WHERE m.o IS NULL OR m.n IS NULL OR m.o = '' OR m.n = '' OR m.o = m.n) THEN
        RAISE EXCEPTION 'siwa.apply_sub_transfer: a transfer id and two arrays of non-empty, distinct subs of one length'
            USING ERRCODE = '22023';
    END IF;
    IF cardinality(p_old_subs) = 0 THEN
        RETURN;
    END IF;
    -- One batch at a time, under a lock only the owner can take (nothing else may write this table).
    LOCK TABLE siwa.sub_transfer_batches IN SHARE ROW EXCLUSIVE MODE;
    SELECT string_agg(format('siwa.%I.%I', c.relname, a.attname), ', ' ORDER BY c.relname) INTO v_unlisted
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid
     WHERE c.relnamespace = 'siwa'::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition
       AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = 'sub'
       AND NOT EXISTS (SELECT 1 FROM siwa.sub_columns s
                        WHERE s.table_name = c.relname AND s.column_name = a.attname);
    IF v_unlisted IS NOT NULL THEN
        RAISE EXCEPTION 'siwa.apply_sub_transfer: % not in siwa.sub_columns; say whether a transfer rewrites it', v_unlisted
            USING ERRCODE = '55000';
    END IF;
    -- The wrong-identifier guard: one new sub for two old ones refuses the whole batch.
    SELECT string_agg(d.n, ', ') INTO v_duplicate
      FROM (SELECT m.n FROM unnest(p_new_subs) AS m(n) GROUP BY m.n HAVING count(*) > 1
            UNION
            SELECT m.o FROM unnest(p_old_subs) AS m(o) GROUP BY m.o HAVING count(*) > 1
            UNION
            SELECT m.n FROM unnest(p_old_subs, p_new_subs) AS m(o, n)
              JOIN siwa.sub_aliases a ON a.new_sub = m.n AND a.old_sub <> m.o) AS d;
    IF v_duplicate IS NOT NULL THEN
        RAISE EXCEPTION 'siwa.apply_sub_transfer: a sub appears twice in the batch or is already another sub''s alias target; nothing was changed'
            USING ERRCODE = '23505', DETAIL = format('%s sub(s)', cardinality(string_to_array(v_duplicate, ', ')));
    END IF;

    -- The race with a writer creating an old sub's account (the worker, the sign-in API): one that
    -- resolved no alias a moment ago may be inserting that account now, and an uncommitted row is
    -- neither locked below nor seen by the rewrite; nor does the alias this transaction inserts stop it
    -- (siwa.refuse_replaced_sub does not see the alias until this commits). So the unique index on
    -- siwa.accounts is made the lock: every old sub gets its account row here first (ON CONFLICT DO
    -- NOTHING, in sub order). An insert under way elsewhere makes this wait until it commits (its row is
    -- then locked and moved below like any other) or rolls back; an insert that comes after this waits
    -- for this transaction (the worker's 1 ms, then that user is busy) and then, the row gone and the
    -- alias committed, is refused by siwa.refuse_replaced_sub (40001) and retried under the new sub.
    -- The rows created here only for that are deleted again right away: the index entry of a row this
    -- transaction inserted still makes any other insert of that sub wait for this transaction.
    WITH created AS (
        INSERT INTO siwa.accounts AS a (sub)
        SELECT DISTINCT m.o FROM unnest(p_old_subs) AS m(o)
         WHERE NOT EXISTS (SELECT 1 FROM siwa.sub_aliases x WHERE x.old_sub = m.o)
         ORDER BY m.o
        ON CONFLICT (sub) DO NOTHING
        RETURNING a.sub)
    SELECT coalesce(array_agg(created.sub), '{}') INTO v_created FROM created;
    -- Lock the accounts concerned, in sub order, as the worker does.
    PERFORM 1 FROM siwa.accounts a
     WHERE a.sub = ANY (p_old_subs) OR a.sub = ANY (p_new_subs)
     ORDER BY a.sub FOR UPDATE;
    DELETE FROM siwa.accounts AS a WHERE a.sub = ANY (v_created);
    -- Each user's outcome (no temporary table: this runs as the owner).
    SELECT array_agg(c.o ORDER BY c.ord), array_agg(c.n ORDER BY c.ord), array_agg(c.e ORDER BY c.ord),
           array_agg(c.p ORDER BY c.ord), array_agg(c.outcome ORDER BY c.ord), array_agg(c.why ORDER BY c.ord)
      INTO v_old, v_new, v_emails, v_private, v_outcomes, v_details
      FROM (SELECT b.ord, b.o, b.n, b.e, b.p, x.outcome, x.why
              FROM unnest(p_old_subs, p_new_subs,
                          coalesce(p_emails, array_fill(NULL::text, ARRAY[cardinality(p_old_subs)])),
                          coalesce(p_private, array_fill(NULL::boolean, ARRAY[cardinality(p_old_subs)])))
                   WITH ORDINALITY AS b(o, n, e, p, ord)
              LEFT JOIN siwa.accounts acct ON acct.sub = b.o
              CROSS JOIN LATERAL (
                SELECT CASE
                    WHEN EXISTS (SELECT 1 FROM siwa.sub_aliases a WHERE a.old_sub = b.o AND a.new_sub = b.n)
                        THEN 'already'
                    WHEN EXISTS (SELECT 1 FROM siwa.sub_aliases a WHERE a.old_sub = b.o)
                        THEN 'mismatch'
                    WHEN acct.is_private_email IS NOT NULL AND b.p IS NOT NULL AND acct.is_private_email <> b.p
                        THEN 'mismatch'
                    WHEN acct.is_private_email = false AND b.p = false AND acct.email IS NOT NULL
                         AND b.e IS NOT NULL AND lower(acct.email) <> lower(b.e)
                        THEN 'mismatch'
                    WHEN EXISTS (SELECT 1 FROM siwa.accounts a WHERE a.sub = b.n)
                         OR EXISTS (SELECT 1 FROM siwa.sign_ins s WHERE s.sub = b.n)
                        THEN 'merged'
                    ELSE 'applied' END AS outcome,
                       CASE
                    WHEN EXISTS (SELECT 1 FROM siwa.sub_aliases a WHERE a.old_sub = b.o AND a.new_sub = b.n)
                        THEN NULL
                    WHEN EXISTS (SELECT 1 FROM siwa.sub_aliases a WHERE a.old_sub = b.o)
                        THEN 'the old sub is already aliased to another sub'
                    WHEN acct.is_private_email IS NOT NULL AND b.p IS NOT NULL AND acct.is_private_email <> b.p
                        THEN 'is_private_email differs from the account''s'
                    WHEN acct.is_private_email = false AND b.p = false AND acct.email IS NOT NULL
                         AND b.e IS NOT NULL AND lower(acct.email) <> lower(b.e)
                        THEN 'the email differs from the account''s'
                    WHEN EXISTS (SELECT 1 FROM siwa.accounts a WHERE a.sub = b.n)
                         OR EXISTS (SELECT 1 FROM siwa.sign_ins s WHERE s.sub = b.n)
                        THEN 'merged: the new sub already had an account or sign-in'
                    END AS why) AS x) AS c;

    v_apply_old := ARRAY(SELECT m.o FROM unnest(v_old, v_new, v_outcomes) AS m(o, n, r)
                          WHERE m.r IN ('applied', 'merged'));
    v_apply_new := ARRAY(SELECT m.n FROM unnest(v_old, v_new, v_outcomes) AS m(o, n, r)
                          WHERE m.r IN ('applied', 'merged'));
    v_merge_old := ARRAY(SELECT m.o FROM unnest(v_old, v_new, v_outcomes) AS m(o, n, r) WHERE m.r = 'merged');
    v_merge_new := ARRAY(SELECT m.n FROM unnest(v_old, v_new, v_outcomes) AS m(o, n, r) WHERE m.r = 'merged');
    -- A new sub that already has an account (Apple notifies under the new sub once the app has moved,
    -- so an event before the import creates it; or the user signed in under it): the old account is
    -- merged into it, so that nothing of the user is left under a sub no one will name again. The
    -- merged account keeps the earliest deletion, the latest consent revocation, the newest email
    -- status (by its event time), the new sub's address (else the old one's; a private relay address is
    -- then replaced by the import's, below), and is erased if either was. Sign-ins of one client ID
    -- are added up into the new sub's row; every other row of the old sub follows in the rewrite.
    IF cardinality(v_merge_old) > 0 THEN
        UPDATE siwa.accounts AS c
           SET email            = CASE WHEN x.erased THEN NULL ELSE coalesce(c.email, o.email) END,
               is_private_email = CASE WHEN x.erased THEN NULL ELSE coalesce(c.is_private_email, o.is_private_email) END,
               email_status     = CASE WHEN o.email_status_at > c.email_status_at
                                         OR (c.email_status_at IS NULL AND o.email_status IS NOT NULL)
                                       THEN o.email_status ELSE c.email_status END,
               email_status_at  = CASE WHEN o.email_status_at > c.email_status_at
                                         OR (c.email_status_at IS NULL AND o.email_status IS NOT NULL)
                                       THEN o.email_status_at ELSE c.email_status_at END,
               consent_revoked_at = greatest(c.consent_revoked_at, o.consent_revoked_at),
               deleted_at       = least(c.deleted_at, o.deleted_at),
               personal_data_erased_at = least(c.personal_data_erased_at, o.personal_data_erased_at),
               created_at       = least(c.created_at, o.created_at),
               updated_at       = v_now
          FROM unnest(v_merge_old, v_merge_new) AS m(o, n)
          JOIN siwa.accounts AS o ON o.sub = m.o,
               LATERAL (SELECT o.personal_data_erased_at IS NOT NULL OR EXISTS (
                                   SELECT 1 FROM siwa.accounts e
                                    WHERE e.sub = m.n AND e.personal_data_erased_at IS NOT NULL) AS erased) AS x
         WHERE c.sub = m.n;
        DELETE FROM siwa.accounts AS o USING unnest(v_merge_old, v_merge_new) AS m(o, n)
         WHERE o.sub = m.o AND EXISTS (SELECT 1 FROM siwa.accounts c WHERE c.sub = m.n);
        UPDATE siwa.sign_ins AS c
           SET first_signed_in_at = least(c.first_signed_in_at, o.first_signed_in_at),
               last_signed_in_at  = greatest(c.last_signed_in_at, o.last_signed_in_at),
               sign_in_count      = c.sign_in_count + o.sign_in_count
          FROM unnest(v_merge_old, v_merge_new) AS m(o, n)
          JOIN siwa.sign_ins AS o ON o.sub = m.o
         WHERE c.sub = m.n AND c.client_id = o.client_id;
        DELETE FROM siwa.sign_ins AS o USING unnest(v_merge_old, v_merge_new) AS m(o, n)
         WHERE o.sub = m.o
           AND EXISTS (SELECT 1 FROM siwa.sign_ins c WHERE c.sub = m.n AND c.client_id = o.client_id);
    END IF;
    FOR v_column IN
        SELECT s.table_name, s.column_name FROM siwa.sub_columns s
         WHERE s.on_transfer = 'rewrite' ORDER BY s.table_name, s.column_name
    LOOP
        EXECUTE format('UPDATE siwa.%I AS t SET %I = m.n FROM unnest($1::text[], $2::text[]) AS m(o, n) WHERE t.%I = m.o',
                       v_column.table_name, v_column.column_name, v_column.column_name)
          USING v_apply_old, v_apply_new;
        GET DIAGNOSTICS v_count = ROW_COUNT;
        v_rewritten := v_rewritten || jsonb_build_object(v_column.table_name || '.' || v_column.column_name, v_count);
    END LOOP;
    -- The new team's relay address replaces the old team's (which stops forwarding for the new team).
    UPDATE siwa.accounts a SET email = m.e, updated_at = clock_timestamp()
      FROM unnest(v_new, v_emails, v_private, v_outcomes) AS m(n, e, p, r)
     WHERE m.r IN ('applied', 'merged') AND a.sub = m.n AND m.p AND m.e IS NOT NULL
       AND a.personal_data_erased_at IS NULL AND a.is_private_email IS DISTINCT FROM false;
    -- Earlier aliases of the old subs (a second transfer) follow to the newest sub.
    UPDATE siwa.sub_aliases a SET new_sub = m.n
      FROM unnest(v_apply_old, v_apply_new) AS m(o, n) WHERE a.new_sub = m.o;
    INSERT INTO siwa.sub_aliases (old_sub, new_sub, transfer_id)
    SELECT m.o, m.n, p_transfer_id FROM unnest(v_apply_old, v_apply_new) AS m(o, n);
    IF cardinality(v_merge_new) > 0 THEN
        -- What the old account brought to a merged one that the merged state invalidates is revoked, as
        -- the validity trigger would have stored it (consent-revoked first, else account-delete)...
        UPDATE siwa.sessions AS t
           SET revoked_at = v_now,
               revoke_reason = CASE WHEN a.consent_revoked_at >= t.created_at THEN 'consent-revoked' ELSE 'account-delete' END
          FROM siwa.accounts AS a
         WHERE a.sub = ANY (v_merge_new) AND t.sub = a.sub AND t.revoked_at IS NULL
           AND (a.deleted_at IS NOT NULL OR a.consent_revoked_at >= t.created_at);
        UPDATE siwa.refresh_tokens AS t
           SET revoked_at = v_now,
               revoke_reason = CASE WHEN a.consent_revoked_at >= t.created_at THEN 'consent-revoked' ELSE 'account-delete' END
          FROM siwa.accounts AS a
         WHERE a.sub = ANY (v_merge_new) AND t.sub = a.sub AND t.revoked_at IS NULL
           AND (a.deleted_at IS NOT NULL OR a.consent_revoked_at >= t.created_at);
        -- ...an erased one is erased again, now with the old sub's history and tokens (the aliases are
        -- in: siwa.erase_personal_data_of finds the old sub's notifications through them)...
        v_erased := ARRAY(SELECT a.sub FROM siwa.accounts a
                           WHERE a.sub = ANY (v_merge_new) AND a.personal_data_erased_at IS NOT NULL);
        IF cardinality(v_erased) > 0 THEN
            PERFORM siwa.erase_personal_data_of(v_erased);
        END IF;
        -- ...and two subs' webhook queues are one now: each endpoint's head of it is the ready one.
        UPDATE siwa.webhook_deliveries AS d
           SET ready = NOT d.ready
         WHERE d.sub = ANY (v_merge_new) AND d.state = 'pending'
           AND d.ready = EXISTS (SELECT 1 FROM siwa.webhook_deliveries p
                                  WHERE p.endpoint_id = d.endpoint_id AND p.sub = d.sub
                                    AND p.state = 'pending' AND p.change_id < d.change_id);
    END IF;
    -- Apps hear of it: one siwa.sub_transferred change per user moved (sub: the new sub, old_sub: the
    -- one it replaced), in the changefeed and to the webhooks, numbered when this transaction commits.
    INSERT INTO siwa.changes (type, sub, old_sub, event_time, applied_at, jti)
    SELECT 'siwa.sub_transferred', m.n, m.o, v_now, v_now, ''
      FROM unnest(v_apply_old, v_apply_new) AS m(o, n) ORDER BY m.o;
    UPDATE siwa.transfer_imports i
       SET state = CASE WHEN m.r IN ('already', 'merged') THEN 'applied' ELSE m.r END,
           new_sub = m.n, detail = m.why, email = NULL,
           applied_at = CASE WHEN m.r IN ('applied', 'already', 'merged') THEN coalesce(i.applied_at, clock_timestamp()) END
      FROM unnest(v_old, v_new, v_outcomes, v_details) AS m(o, n, r, why)
     WHERE i.transfer_id = p_transfer_id AND i.old_sub = m.o;
    INSERT INTO siwa.sub_transfer_batches (transfer_id, users, outcomes, rewritten)
    SELECT p_transfer_id, cardinality(p_old_subs),
           (SELECT jsonb_object_agg(o.r, o.k)
              FROM (SELECT m.r, count(*) AS k FROM unnest(v_outcomes) AS m(r) GROUP BY m.r) AS o),
           v_rewritten;
    PERFORM siwa.number_changes();  -- last: see siwa.changes
    RETURN QUERY SELECT m.o, m.n, m.r, m.why FROM unnest(v_old, v_new, v_outcomes, v_details) AS m(o, n, r, why);
END;
$$;
COMMENT ON FUNCTION siwa.apply_sub_transfer(text, text[], text[], text[], boolean[]) IS
    'A team transfer''s rewrite of one batch (old subs, new subs, and Apple''s email and is_private_email for each): verifies, rewrites every sub column siwa.sub_columns lists, keeps the old subs in siwa.sub_aliases, records the batch in siwa.sub_transfer_batches. One row per user: applied, already, mismatch or conflict. Refuses the whole batch (23505) when a sub appears twice. Owner only unless granted.';

-- The progress of a transfer run (siwactl transfer, the TeamTransfer library): every change to
-- siwa.transfer_exports and siwa.transfer_imports outside siwa.apply_sub_transfer is one of these
-- functions. The owner's, as the tables are (EXECUTE is granted to no role).
--
-- Old team: lists every account not deleted for the target team (a sub already listed keeps its row).
CREATE OR REPLACE FUNCTION siwa.transfer_export_enlist(p_target_team text) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_count bigint;
BEGIN
    INSERT INTO siwa.transfer_exports (target_team, sub)
    SELECT p_target_team, a.sub FROM siwa.accounts a WHERE a.deleted_at IS NULL
    ON CONFLICT (target_team, sub) DO NOTHING;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION siwa.transfer_export_enlist(text) IS
    'A team transfer''s export (old team): adds a pending row to siwa.transfer_exports for every account not deleted that has none for the target team. Returns the rows added.';

-- Old team: what Apple answered for a batch of users. p_outcomes is a JSON array of
-- {k: sub, s: done|failed|pending, v: transfer_sub, a: attempts, err: Apple's error, st: its status}.
CREATE OR REPLACE FUNCTION siwa.transfer_export_record(p_target_team text, p_outcomes jsonb) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_count bigint;
BEGIN
    UPDATE siwa.transfer_exports e
       SET state = r.s, transfer_sub = r.v,
           attempts = e.attempts + r.a, apple_error = r.err, apple_status = r.st,
           last_attempt_at = clock_timestamp(),
           done_at = CASE WHEN r.s = 'done' THEN clock_timestamp() END
      FROM jsonb_to_recordset(p_outcomes) AS r(k text, s text, v text, a integer, err text, st integer)
     WHERE e.target_team = p_target_team AND e.sub = r.k;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION siwa.transfer_export_record(text, jsonb) IS
    'A team transfer''s export (old team): records Apple''s answers for a batch of users (JSON array of {k, s, v, a, err, st}: sub, state done/failed/pending, transfer_sub, attempts made, Apple''s error and status). Returns the rows updated.';

-- New team: loads the old team's list (JSON array of {sub, transfer_sub}), which the caller has verified
-- against the digest both teams compared (TeamTransfer's TransferList: the list decides whose account
-- each new sub goes to). A pair already loaded (a second run) is counted as already; another pairing of
-- a sub or transfer_sub already listed is neither loaded nor counted (the caller reports it). Both teams
-- in one database load the export's done rows the same way, verified the same way.
CREATE OR REPLACE FUNCTION siwa.transfer_import_load(p_transfer_id text, p_pairs jsonb)
RETURNS TABLE (loaded bigint, already bigint)
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH r AS (SELECT r.sub, r.transfer_sub FROM jsonb_to_recordset(p_pairs) AS r(sub text, transfer_sub text)),
         ins AS (INSERT INTO siwa.transfer_imports (transfer_id, transfer_sub, old_sub)
                 SELECT p_transfer_id, r.transfer_sub, r.sub FROM r
                 ON CONFLICT DO NOTHING RETURNING 1)
    SELECT (SELECT count(*) FROM ins)::bigint,
           (SELECT count(*) FROM r WHERE EXISTS (
                SELECT 1 FROM siwa.transfer_imports i
                 WHERE i.transfer_id = p_transfer_id AND i.transfer_sub = r.transfer_sub AND i.old_sub = r.sub))::bigint;
$$;
COMMENT ON FUNCTION siwa.transfer_import_load(text, jsonb) IS
    'A team transfer''s import (new team): loads {sub, transfer_sub} pairs of the old team''s list into siwa.transfer_imports. Returns the pairs loaded now and those loaded by an earlier run; the rest conflict with a pairing already listed.';

-- New team: what Apple answered for a batch of transfer identifiers. p_outcomes is a JSON array of
-- {k: transfer_sub, s: done|failed|pending, v: new sub, e: email, p: is_private_email, a, err, st}.
CREATE OR REPLACE FUNCTION siwa.transfer_import_record(p_transfer_id text, p_outcomes jsonb) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_count bigint;
BEGIN
    UPDATE siwa.transfer_imports i
       SET state = CASE r.s WHEN 'done' THEN 'exchanged' ELSE r.s END, new_sub = r.v,
           email = CASE WHEN r.s = 'done' THEN r.e END, is_private_email = r.p,
           attempts = i.attempts + r.a, apple_error = r.err, apple_status = r.st,
           last_attempt_at = clock_timestamp()
      FROM jsonb_to_recordset(p_outcomes)
           AS r(k text, s text, v text, e text, p boolean, a integer, err text, st integer)
     WHERE i.transfer_id = p_transfer_id AND i.transfer_sub = r.k;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION siwa.transfer_import_record(text, jsonb) IS
    'A team transfer''s import (new team): records Apple''s answers for a batch of transfer identifiers (JSON array of {k, s, v, e, p, a, err, st}); done becomes exchanged, holding the email until applied. Returns the rows updated.';

-- New team: the wrong-identifier guard. A new sub Apple gave for two old subs of this transfer, or that
-- is already another old sub's alias, is applied to neither: those exchanged rows become duplicate and
-- drop the email they held.
CREATE OR REPLACE FUNCTION siwa.transfer_import_refuse_duplicates(p_transfer_id text) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_count bigint;
BEGIN
    -- Fresh statistics: a run has just filled the table, and the grouping below meets all of it.
    ANALYZE siwa.transfer_imports;
    WITH duplicate AS (
        SELECT d.new_sub FROM siwa.transfer_imports d
         WHERE d.transfer_id = p_transfer_id AND d.state IN ('exchanged', 'applied', 'duplicate')
         GROUP BY d.new_sub HAVING count(*) > 1
        UNION
        SELECT i.new_sub FROM siwa.transfer_imports i
          JOIN siwa.sub_aliases a ON a.new_sub = i.new_sub AND a.old_sub <> i.old_sub
         WHERE i.transfer_id = p_transfer_id AND i.state = 'exchanged')
    UPDATE siwa.transfer_imports i
       SET state = 'duplicate', email = NULL,
           detail = 'Apple gave this new sub for more than one old sub (or it is already another old sub''s alias)'
      FROM duplicate
     WHERE i.transfer_id = p_transfer_id AND i.state = 'exchanged' AND i.new_sub = duplicate.new_sub;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION siwa.transfer_import_refuse_duplicates(text) IS
    'A team transfer''s wrong-identifier guard (new team): marks duplicate (not applied, email dropped) every exchanged row whose new sub Apple also gave another old sub of the transfer, or that is already another old sub''s alias. Returns the rows marked.';

-- New team: rewrites the next batch of exchanged users (at most p_limit, in old-sub order) with
-- siwa.apply_sub_transfer; the users per outcome, no row when nothing was left to rewrite.
CREATE OR REPLACE FUNCTION siwa.transfer_import_apply_batch(p_transfer_id text, p_limit integer)
RETURNS TABLE (outcome text, users bigint)
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH b AS MATERIALIZED (
        SELECT i.old_sub, i.new_sub, i.email, i.is_private_email FROM siwa.transfer_imports i
         WHERE i.transfer_id = p_transfer_id AND i.state = 'exchanged' ORDER BY i.old_sub LIMIT p_limit)
    SELECT r.outcome, count(*)::bigint
      FROM siwa.apply_sub_transfer(p_transfer_id,
               ARRAY(SELECT b.old_sub FROM b ORDER BY b.old_sub),
               ARRAY(SELECT b.new_sub FROM b ORDER BY b.old_sub),
               ARRAY(SELECT b.email FROM b ORDER BY b.old_sub),
               ARRAY(SELECT b.is_private_email FROM b ORDER BY b.old_sub)) AS r
     GROUP BY r.outcome;
$$;
COMMENT ON FUNCTION siwa.transfer_import_apply_batch(text, integer) IS
    'A team transfer''s rewrite (new team): applies the next batch of at most p_limit exchanged users of the transfer with siwa.apply_sub_transfer, in old-sub order. One row per outcome with its users; none when nothing is left.';

-- A user's history by either sub: every notification stored for the sub, for the sub it became, and
-- for every sub that became it.
CREATE OR REPLACE FUNCTION siwa.history_of(p_sub text) RETURNS SETOF siwa.event_history
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH current AS (
        SELECT coalesce((SELECT a.new_sub FROM siwa.sub_aliases a WHERE a.old_sub = p_sub), p_sub) AS sub),
    subs AS (
        SELECT c.sub FROM current c
        UNION SELECT p_sub
        UNION SELECT a.old_sub FROM siwa.sub_aliases a, current c WHERE a.new_sub = c.sub)
    SELECT e.* FROM siwa.event_history e WHERE e.sub = ANY (ARRAY(SELECT s.sub FROM subs s)) ORDER BY e.id;
$$;
COMMENT ON FUNCTION siwa.history_of(text) IS
    'A user''s notifications by either sub: the one given, the sub it became in a team transfer, and every sub that became it (siwa.sub_aliases); the rows of siwa.event_history, oldest first.';
