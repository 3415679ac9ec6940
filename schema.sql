-- Sign in with Apple server-to-server notifications: the database.
--
-- Re-runnable: `psql -v ON_ERROR_STOP=1 --single-transaction -f schema.sql` on an empty or an existing
-- database (at any earlier version, see "Upgrades" below) brings it to
-- the current version and never drops data. `siwactl migrate` applies this same file (it is embedded in
-- the binary). Everything lives in schema `siwa`.
--
-- Admins read history from the view siwa.event_history; see docs/sql.md for a cookbook.
--
-- search_path: this file runs with the path pg_catalog, pg_temp (set just below), and every function it
-- creates carries `SET search_path = pg_catalog, pg_temp`. So no object another role created (a
-- `public.hashtextextended(text, integer)` that wins overload resolution, say) can stand in for one of
-- PostgreSQL's, whatever the search_path of the session that applies this file or calls the functions.
-- Objects of this schema are always written siwa.…. The one exception is the admins' hook siwa.on_event:
-- it is called with the worker session's own search_path (see siwa.settings.hook_search_path).
-- The session's own path is restored at the end of the file.

SET client_min_messages = warning;
DO $$
BEGIN
    PERFORM pg_catalog.set_config('siwa.schema_sql_saved_search_path',
                                  pg_catalog.current_setting('search_path'), false);
END;
$$;
SET search_path = pg_catalog, pg_temp;

CREATE SCHEMA IF NOT EXISTS siwa;

-- ---------------------------------------------------------------------------------------------------
-- Schema version
-- ---------------------------------------------------------------------------------------------------

CREATE TABLE IF NOT EXISTS siwa.schema_version (
    version     integer     PRIMARY KEY,
    description text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- A database newer than this file is refused before anything is changed: this file would put its older
-- functions in place of the newer ones. (Raise the version here with every new version.)
DO $$
DECLARE
    v_from integer := coalesce((SELECT pg_catalog.max(version) FROM siwa.schema_version), 0);
BEGIN
    IF v_from > 5 THEN
        RAISE EXCEPTION 'the database is at schema version %, newer than this schema.sql (version 5); not applying it', v_from
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Apply the schema.sql of the release that brought the database to that version, or a newer one.';
    END IF;
END;
$$;

-- ---------------------------------------------------------------------------------------------------
-- How errors are stored (used by the worker's functions below, and by the upgrade to version 2)
-- ---------------------------------------------------------------------------------------------------

-- What the worker stores as a notification's last_error: 'SQLSTATE: message' with the parts of the
-- message that may carry user data masked. PostgreSQL quotes the offending input in its messages
-- (invalid input syntax for type integer: "john.doe"), and a hook's RAISE may say anything: every
-- single-quoted text, every double-quoted text except an object's name (relation "users", column
-- "email", constraint "…"), and every email-shaped word becomes …. The message's words stay.
CREATE OR REPLACE FUNCTION siwa.redact_error(p_error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
SELECT pg_catalog.replace(pg_catalog.replace(
         pg_catalog.regexp_replace(
           pg_catalog.regexp_replace(
             pg_catalog.regexp_replace(
               pg_catalog.regexp_replace(
                 pg_catalog.replace(pg_catalog.replace(p_error, chr(1), ''), chr(2), ''),
                 -- names of objects: protect them from the next step
                 '(relation|column|constraint|table|schema|type|function|procedure|index|sequence|view|trigger|operator|domain|extension|role|database|cursor|variable|parameter|field|key) "([^"]*)"',
                 '\1 ' || chr(1) || '\2' || chr(2), 'g'),
               '"[^"]*("|$)', '"…"', 'g'),
             '''[^'']*(''|$)', '''…''', 'g'),
           '[^[:space:]"''(),;:<>' || chr(1) || chr(2) || ']+@[^[:space:]"''(),;:<>' || chr(1) || chr(2) || ']+',
           '…@…', 'g'),
         chr(1), '"'), chr(2), '"')
$$;
COMMENT ON FUNCTION siwa.redact_error(text) IS
    'Masks what may carry user data in an error text (quoted values, email addresses) and keeps the SQLSTATE, the message''s words and quoted object names. What siwa.record_failure stores in last_error.';

-- What is left of a failure's last_error once the account's personal data is erased: its SQLSTATE.
-- Skip reasons (state skipped) are the worker's own words about the event type and stay.
CREATE OR REPLACE FUNCTION siwa.erased_error(p_error text, p_state text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
SELECT CASE
         WHEN p_error IS NULL OR p_state = 'skipped' THEN p_error
         WHEN p_error ~ '^[0-9A-Z]{5}: ' THEN pg_catalog.left(p_error, 5) || ': (erased with the account''s personal data)'
         ELSE '(erased with the account''s personal data)'
       END
$$;
COMMENT ON FUNCTION siwa.erased_error(text, text) IS
    'The last_error of a notification of an erased account: only the SQLSTATE of a failure is kept; a skip reason (state skipped) is kept as it is.';

-- ---------------------------------------------------------------------------------------------------
-- Upgrades: numbered changes, each run once
-- ---------------------------------------------------------------------------------------------------
--
-- The rest of this file is the desired state, written so that applying it again changes nothing
-- (CREATE … IF NOT EXISTS, CREATE OR REPLACE, views, comments, grants): an empty database gets the
-- current schema from it alone. What cannot be said that way — a column or constraint added to an
-- existing table, a type or a function signature changed, a backfill — is a numbered change below. Each
-- change N runs on a database whose recorded version is below N (and not empty), in order, exactly once:
-- in one statement with its row in siwa.schema_version, under the advisory lock siwactl migrate also
-- holds ('siwa.migrate'), after which the version is read. An empty database skips the changes and
-- records every version.
--
-- Writing change N+1: add it at the end, with `IF v_from < N+1`, raise the version in the refusal above
-- to N+1, and make the desired state below create
-- the same result on an empty database (a test compares an upgraded database with a fresh one, catalog
-- entry by catalog entry). A change runs before the desired state: it may use only what the previous
-- released version has, and the functions defined above it. Released versions are kept in Tests/Fixtures/released-schemas/, and every one
-- of them is migrated by the tests. A version that never shipped needs no change of its own.
DO $$
DECLARE
    v_from integer;
    v_bad  text;
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('siwa.migrate', 0));
    v_from := coalesce((SELECT pg_catalog.max(version) FROM siwa.schema_version), 0);

    -- 1: the first release.
    IF v_from < 1 THEN
        INSERT INTO siwa.schema_version (version, description)
        VALUES (1, 'notification log, queue, accounts, sessions, refresh tokens, event history');
    END IF;

    -- 2: hardening.
    IF v_from < 2 THEN
        IF v_from > 0 THEN
            ALTER TABLE siwa.settings ADD COLUMN hook_search_path text;
            ALTER TABLE siwa.notifications ADD COLUMN busy_since timestamptz;
            ALTER TYPE siwa.processing_result ADD ATTRIBUTE busy_seconds double precision;
            -- Version 1's advisory lock key function: the account row lock replaced it.
            DROP FUNCTION IF EXISTS siwa.sub_lock_key(text);
            -- Version 1's default no-op hook, never replaced by the admins, gets its search_path (and
            -- this version's description); a replaced hook is left exactly as it is.
            IF EXISTS (SELECT 1 FROM pg_catalog.pg_proc p
                        WHERE p.oid = pg_catalog.to_regprocedure('siwa.on_event(text, text, timestamptz, text, text)')
                          AND p.proconfig IS NULL
                          AND pg_catalog.regexp_replace(p.prosrc, '--[^\n]*|\s', '', 'g') = 'BEGINEND;') THEN
                ALTER FUNCTION siwa.on_event(text, text, timestamptz, text, text)
                    SET search_path = pg_catalog, pg_temp;
                COMMENT ON FUNCTION siwa.on_event(text, text, timestamptz, text, text) IS
                    'Hook called by the worker for every known event, inside the transaction that applies it (after the built-in effects). A no-op by default; replace it with CREATE OR REPLACE FUNCTION to update your own tables (give it its own SET search_path, e.g. SET search_path = app, pg_catalog, pg_temp; without one it runs with siwa.settings.hook_search_path). If it raises, nothing of that application is kept and the event is retried.';
            END IF;
            -- Version 1 stored errors as PostgreSQL (or a hook) worded them, quoted values and email
            -- addresses included, and kept them, as well as the email and token of a notification that
            -- failed or arrived after its account's erasure. Version 2 stores neither: the rows version 1
            -- wrote are brought to what version 2 would have written (skip reasons are the worker's own
            -- words and stay).
            UPDATE siwa.notifications
               SET last_error = pg_catalog.left(siwa.redact_error(pg_catalog.left(last_error, 10000)), 2000)
             WHERE last_error IS NOT NULL AND state <> 'skipped'
               AND last_error IS DISTINCT FROM pg_catalog.left(siwa.redact_error(pg_catalog.left(last_error, 10000)), 2000);
            UPDATE siwa.notifications AS n
               SET email = NULL, raw_token = NULL, last_error = siwa.erased_error(n.last_error, n.state),
                   personal_data_erased_at = coalesce(n.personal_data_erased_at, pg_catalog.clock_timestamp())
              FROM siwa.accounts AS a
             WHERE a.sub = n.sub AND a.personal_data_erased_at IS NOT NULL
               AND (n.email IS NOT NULL OR n.raw_token IS NOT NULL
                    OR n.last_error IS DISTINCT FROM siwa.erased_error(n.last_error, n.state));
            -- The invariants tying a notification's state to its timestamps and error, and erased rows
            -- to their data. Version 1's functions never break them; rows edited by hand may. Those
            -- are not repaired here (the log is an audit record: no timestamp or error is made up):
            -- the whole upgrade stops, changing nothing, and says which rows to look at.
            SELECT pg_catalog.string_agg(c.name || ': ' || c.bad || ' rows', ', ') INTO v_bad
              FROM (SELECT 'notifications_applied_at_check' AS name,
                           pg_catalog.count(*) FILTER (
                               WHERE (n.state IN ('applied', 'skipped')) IS DISTINCT FROM (n.applied_at IS NOT NULL)) AS bad
                      FROM siwa.notifications n
                    UNION ALL
                    SELECT 'notifications_dead_error_check',
                           pg_catalog.count(*) FILTER (WHERE n.state = 'dead' AND n.last_error IS NULL)
                      FROM siwa.notifications n
                    UNION ALL
                    SELECT 'notifications_erased_check',
                           pg_catalog.count(*) FILTER (
                               WHERE n.personal_data_erased_at IS NOT NULL
                                 AND (n.email IS NOT NULL OR n.raw_token IS NOT NULL))
                      FROM siwa.notifications n
                    UNION ALL
                    SELECT 'accounts_erased_check',
                           pg_catalog.count(*) FILTER (
                               WHERE a.personal_data_erased_at IS NOT NULL
                                 AND (a.email IS NOT NULL OR a.is_private_email IS NOT NULL))
                      FROM siwa.accounts a) AS c
             WHERE c.bad > 0;
            IF v_bad IS NOT NULL THEN
                RAISE EXCEPTION 'schema version 2 adds CHECK constraints that existing rows violate (%); nothing was changed', v_bad
                    USING ERRCODE = 'check_violation',
                          HINT = 'See docs/operations.md, "Upgrades": find the rows with the queries given there, correct them, and migrate again.';
            END IF;
            ALTER TABLE siwa.notifications
                ADD CONSTRAINT notifications_applied_at_check
                    CHECK ((state IN ('applied', 'skipped')) = (applied_at IS NOT NULL)),
                ADD CONSTRAINT notifications_dead_error_check CHECK (state <> 'dead' OR last_error IS NOT NULL),
                ADD CONSTRAINT notifications_busy_check CHECK (busy_since IS NULL OR state = 'pending'),
                ADD CONSTRAINT notifications_erased_check
                    CHECK (personal_data_erased_at IS NULL OR (email IS NULL AND raw_token IS NULL));
            ALTER TABLE siwa.accounts
                ADD CONSTRAINT accounts_erased_check
                    CHECK (personal_data_erased_at IS NULL OR (email IS NULL AND is_private_email IS NULL));
        END IF;
        INSERT INTO siwa.schema_version (version, description)
        VALUES (2, 'hardening: pinned search_path, per-user serialisation by the account row lock, busy notifications put off, erasure in every state, redacted errors, receiver column grants, state invariants as CHECK constraints');
    END IF;

    -- 3: the history split from the queue. Version 2's one table siwa.notifications (log and queue) is
    -- renamed out of the way here, with what depends on its row type; the desired state below creates
    -- the partitioned log siwa.notification_log, the queue siwa.notification_queue and the view
    -- siwa.notifications in its place; the block "Change 3, the rows" at the end of this file, in the
    -- same transaction and under the same lock, moves every row into them (states, errors, erasure and
    -- ids as they were) and only then drops the renamed table.
    IF v_from < 3 THEN
        IF v_from > 0 THEN
            DROP TRIGGER IF EXISTS notifications_erase_late ON siwa.notifications;
            DROP FUNCTION IF EXISTS siwa.erase_late_notification();
            DROP FUNCTION IF EXISTS siwa.apply_notification(siwa.notifications);
            DROP FUNCTION IF EXISTS siwa.process_claimed_notification(siwa.notifications, integer, interval);
            -- The views read the new tables from the desired state on; until then they follow the rename.
            ALTER TABLE siwa.notifications RENAME TO notifications_v2;
            -- Its index-backed constraints' names are taken by nothing new, but keep them apart anyway.
            ALTER INDEX siwa.notifications_pkey RENAME TO notifications_v2_pkey;
            ALTER INDEX siwa.notifications_jti_key RENAME TO notifications_v2_jti_key;
        END IF;
        INSERT INTO siwa.schema_version (version, description)
        VALUES (3, 'history split from the queue: siwa.notification_log partitioned by month of issued_at (dedupe by jti and issued_at, retention drops partitions), siwa.notification_queue of pending work, siwa.notifications a view of both');
    END IF;

    -- 4: the app's side and operations. The changefeed's retention setting (siwa.changes and the rest are
    -- created by the desired state).
    IF v_from < 4 THEN
        IF v_from > 0 THEN
            ALTER TABLE siwa.settings
                ADD COLUMN changes_retention interval NOT NULL DEFAULT interval '7 days'
                    CONSTRAINT settings_changes_retention_check CHECK (changes_retention >= interval '0');
        END IF;
        INSERT INTO siwa.schema_version (version, description)
        VALUES (4, 'the app''s side and operations: siwa.changes and the changefeed (a gap-free position, NOTIFY siwa_changes, siwa.settings.changes_retention), the optional hook siwa.on_change, signed webhooks, service heartbeats and health gauges, team transfer with siwa.sub_aliases');
    END IF;

    -- 5: consumers that call out (webhook lanes, the revoker) commit a claim with a lease (owner and
    -- expiry) instead of holding a row lock across the call. A table that does not exist yet is
    -- created by the desired state with these columns.
    IF v_from < 5 THEN
        IF pg_catalog.to_regclass('siwa.webhook_deliveries') IS NOT NULL THEN
            ALTER TABLE siwa.webhook_deliveries
                ADD COLUMN lease_owner text,
                ADD COLUMN lease_expires_at timestamptz,
                ADD CONSTRAINT webhook_deliveries_lease_check CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL));
        END IF;
        IF pg_catalog.to_regclass('siwa.revocation_requests') IS NOT NULL THEN
            ALTER TABLE siwa.revocation_requests
                ADD COLUMN lease_owner text,
                ADD COLUMN lease_expires_at timestamptz,
                ADD CONSTRAINT revocation_requests_lease_check CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL));
        END IF;
        INSERT INTO siwa.schema_version (version, description)
        VALUES (5, 'leases instead of row locks across network calls: siwa.webhook_deliveries and siwa.revocation_requests carry lease_owner and lease_expires_at; every transition of the webhook, revocation and heartbeat queues is a siwa function');
    END IF;
END;
$$;

COMMENT ON SCHEMA siwa IS
    'Sign in with Apple server-to-server notifications: the verified notification log, the queue the worker drains, and the account state it maintains.';

COMMENT ON TABLE siwa.schema_version IS 'One row per schema version applied to this database; the highest is current.';
COMMENT ON COLUMN siwa.schema_version.version IS 'Schema version number (increases by one per change to schema.sql).';
COMMENT ON COLUMN siwa.schema_version.description IS 'What this version added.';
COMMENT ON COLUMN siwa.schema_version.applied_at IS 'When this version was first applied here.';

-- ---------------------------------------------------------------------------------------------------
-- Settings the database itself acts on (one row)
-- ---------------------------------------------------------------------------------------------------

CREATE TABLE IF NOT EXISTS siwa.settings (
    singleton                     boolean  PRIMARY KEY DEFAULT true CHECK (singleton),
    erase_personal_data_after     interval NOT NULL DEFAULT interval '0' CHECK (erase_personal_data_after >= interval '0'),
    hook_search_path              text,
    changes_retention             interval NOT NULL DEFAULT interval '7 days'
        CONSTRAINT settings_changes_retention_check CHECK (changes_retention >= interval '0')
);
COMMENT ON TABLE siwa.settings IS
    'Settings read by the database functions; exactly one row. Change with UPDATE siwa.settings SET ….';
COMMENT ON COLUMN siwa.settings.singleton IS 'Always true: keeps this table to a single row.';
COMMENT ON COLUMN siwa.settings.erase_personal_data_after IS
    'How long after an account-delete event the account''s personal data (email, raw tokens) is kept. 0 (default): erased in the same transaction that applies the deletion; otherwise erased by the worker''s maintenance pass once deleted_at + this interval has passed.';
COMMENT ON COLUMN siwa.settings.hook_search_path IS
    'The search_path the admins'' hook siwa.on_event is called with. NULL (default): the worker session''s own search_path (its role''s or connection''s setting, PostgreSQL''s default "$user", public), as a hook written without schema names expects. A hook with its own SET search_path clause (recommended) uses that instead.';
COMMENT ON COLUMN siwa.settings.changes_retention IS
    'How long a numbered change (siwa.changes) is kept after it was applied before siwa.prune deletes it: the longest a changefeed reader may stay away and still catch up. 7 days by default.';
INSERT INTO siwa.settings DEFAULT VALUES ON CONFLICT DO NOTHING;

-- ---------------------------------------------------------------------------------------------------
-- The notification log, the worker's queue, and the view of both
-- ---------------------------------------------------------------------------------------------------
--
-- siwa.notification_log is the history: one row per verified notification, appended by the receiver,
-- partitioned by month of the token's issued_at (iat). Its rows change rarely: once when the worker is
-- done with them (state, attempts, applied_at, last_error), and on erasure or token pruning. Retention
-- drops whole months (siwa.drop_log_partitions): no DELETE, no vacuum debt.
--
-- Deduplication is by jti alone, as the receiver promises: siwa.notification_jtis holds one small row
-- per jti (primary key jti), written in the statement that stores the notification, and the log row is
-- written only for a jti that was new there. A partitioned table cannot have a unique index without its
-- partition key, so the log's own primary key (jti, issued_at) would let a redelivery that Apple re-signed
-- with another iat through as a second row. A key is kept while a token with that jti can still be
-- accepted: for 7 days after its iat (the dedupe window; the receiver's --max-token-age, 24 h by default,
-- must stay below it) and until its exp; siwa.prune deletes older keys (a small table: days of keys,
-- never the history). Past the window, a token is refused by the receiver for its age, and should one
-- still arrive, siwa.apply_notification finds the jti's earlier row and skips the second.
-- A token whose iat falls outside every month partition lands in the DEFAULT partition: no insert fails
-- for want of a partition.
--
-- siwa.notification_queue holds the work still to do: one small row per pending notification, with its
-- attempts, next attempt and busy state. Its only index is its primary key, so the worker's updates of
-- a pending row (retry, busy) are HOT; the row is deleted when the notification is applied, skipped or
-- dead. The receiver writes it in the statement that stores the notification (see below).
--
-- siwa.notifications is the view of both with version 2's columns: the row type the worker's functions
-- take, and a table-like face for the owner's own maintenance (INSERT, UPDATE, DELETE through
-- INSTEAD OF triggers). Nothing in the hot paths uses it.

CREATE TABLE IF NOT EXISTS siwa.notification_log (
    id                      bigint      GENERATED ALWAYS AS IDENTITY,
    jti                     text        NOT NULL,
    event_type              text        NOT NULL,
    sub                     text        NOT NULL,
    audience                text        NOT NULL,
    email                   text,
    is_private_email        boolean,
    event_time              timestamptz NOT NULL,
    issued_at               timestamptz NOT NULL,
    expires_at              timestamptz,
    raw_token               text,
    received_at             timestamptz NOT NULL DEFAULT now(),
    state                   text        NOT NULL DEFAULT 'pending',
    attempts                integer     NOT NULL DEFAULT 0,
    applied_at              timestamptz,
    last_error              text,
    personal_data_erased_at timestamptz,
    CONSTRAINT notification_log_pkey PRIMARY KEY (jti, issued_at),
    CONSTRAINT notification_log_state_check CHECK (state IN ('pending', 'applied', 'skipped', 'dead')),
    CONSTRAINT notification_log_sub_check CHECK (sub <> ''),
    CONSTRAINT notification_log_jti_check CHECK (jti <> ''),
    -- Tied to the state: applied_at is set exactly when it is applied or skipped; a dead one says why;
    -- an erased one holds no email or token.
    CONSTRAINT notification_log_applied_at_check CHECK ((state IN ('applied', 'skipped')) = (applied_at IS NOT NULL)),
    CONSTRAINT notification_log_dead_error_check CHECK (state <> 'dead' OR last_error IS NOT NULL),
    CONSTRAINT notification_log_erased_check
        CHECK (personal_data_erased_at IS NULL OR (email IS NULL AND raw_token IS NULL))
) PARTITION BY RANGE (issued_at);
CREATE TABLE IF NOT EXISTS siwa.notification_log_default PARTITION OF siwa.notification_log DEFAULT;

CREATE TABLE IF NOT EXISTS siwa.notification_jtis (
    jti        text        PRIMARY KEY,
    issued_at  timestamptz NOT NULL,
    expires_at timestamptz
);
COMMENT ON TABLE siwa.notification_jtis IS
    'Deduplication by jti: one row per jti stored in the dedupe window (7 days after iat, and until exp), written with the notification by the receiver; pruned by siwa.prune.';
COMMENT ON COLUMN siwa.notification_jtis.jti IS 'The token''s jti.';
COMMENT ON COLUMN siwa.notification_jtis.issued_at IS 'The token''s iat: the key is kept for 7 days after it.';
COMMENT ON COLUMN siwa.notification_jtis.expires_at IS 'The token''s exp: the key is kept at least until then.';
CREATE INDEX IF NOT EXISTS notification_jtis_issued_idx ON siwa.notification_jtis USING brin (issued_at)
    WITH (autosummarize = on);
COMMENT ON TABLE siwa.notification_log IS
    'The history: one row per verified notification from Apple, unique by (jti, issued_at) (a redelivery is the same token), partitioned by month of issued_at; retention drops whole months. Written by siwa-receiver; its outcome columns by siwa-worker. Read it through siwa.event_history.';
COMMENT ON TABLE siwa.notification_log_default IS
    'Rows of siwa.notification_log whose issued_at has no month partition (yet), and the pending or dead rows of months that retention dropped.';
COMMENT ON COLUMN siwa.notification_log.id IS 'Surrogate key, in order of arrival.';
COMMENT ON COLUMN siwa.notification_log.jti IS 'The token''s unique identifier (jti claim): with issued_at, deduplicates redeliveries.';
COMMENT ON COLUMN siwa.notification_log.event_type IS
    'Canonical event type: email-disabled, email-enabled, consent-revoked, account-delete (Apple''s spelling account-deleted is normalised), or an unknown type exactly as received.';
COMMENT ON COLUMN siwa.notification_log.sub IS 'The user''s team-scoped Apple identifier (events.sub).';
COMMENT ON COLUMN siwa.notification_log.audience IS 'The client ID (bundle ID or Services ID) the token was addressed to and matched.';
COMMENT ON COLUMN siwa.notification_log.email IS 'Email address from the event (email events only); NULL once personal data is erased.';
COMMENT ON COLUMN siwa.notification_log.is_private_email IS 'Whether the address is an Apple private relay address (email events only).';
COMMENT ON COLUMN siwa.notification_log.event_time IS 'When the event happened at Apple (events.event_time).';
COMMENT ON COLUMN siwa.notification_log.issued_at IS 'The token''s iat claim: the partition key.';
COMMENT ON COLUMN siwa.notification_log.expires_at IS 'The token''s exp claim, when present.';
COMMENT ON COLUMN siwa.notification_log.raw_token IS
    'The signed token as received, for audit (re-verify with siwactl verify --at). NULL once pruned by retention or erased with the account''s personal data.';
COMMENT ON COLUMN siwa.notification_log.received_at IS 'When the receiver committed this row (the 200 to Apple follows the commit).';
COMMENT ON COLUMN siwa.notification_log.state IS
    'Processing state: pending (in siwa.notification_queue), applied (effects committed), skipped (verified but nothing to do, e.g. an unknown event type; see last_error), dead (gave up after the maximum attempts; see last_error, requeue with siwactl replay).';
COMMENT ON COLUMN siwa.notification_log.attempts IS 'How many times the worker tried to apply it (while pending: see siwa.notification_queue).';
COMMENT ON COLUMN siwa.notification_log.applied_at IS 'When it reached applied or skipped.';
COMMENT ON COLUMN siwa.notification_log.last_error IS
    'The last failure as SQLSTATE: message, with quoted values and email addresses masked (siwa.redact_error); only the SQLSTATE once the account''s personal data is erased. For a skipped notification, the reason. While pending: see siwa.notification_queue.';
COMMENT ON COLUMN siwa.notification_log.personal_data_erased_at IS
    'When email, raw token and error text were erased after an account deletion (or, for a notification that arrived after the erasure, when it was stored without them).';

-- What the admins' questions need (docs/sql.md): one user's timeline (a btree on sub), per day by
-- arrival or by event time (BRIN: the log is appended in arrival order, so a block range's times are
-- close together; a BRIN index costs next to nothing per insert, a btree a page descent; autosummarize
-- has autovacuum summarize each block range as soon as it is full). The outcome is
-- indexed only where it is rare (skipped, dead) or needed by queue_health (applied_at): a row inserted
-- pending has no entry in these two.
CREATE INDEX IF NOT EXISTS notification_log_sub_idx ON siwa.notification_log (sub, event_time);
CREATE INDEX IF NOT EXISTS notification_log_received_idx ON siwa.notification_log USING brin (received_at)
    WITH (autosummarize = on);
CREATE INDEX IF NOT EXISTS notification_log_event_time_idx ON siwa.notification_log USING brin (event_time)
    WITH (autosummarize = on);
-- Retention keeps rows whose token has not expired yet (siwa.drop_log_partitions): found by this.
CREATE INDEX IF NOT EXISTS notification_log_expires_idx ON siwa.notification_log USING brin (expires_at)
    WITH (autosummarize = on);
CREATE INDEX IF NOT EXISTS notification_log_applied_idx
    ON siwa.notification_log (applied_at) WHERE applied_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS notification_log_exceptions_idx
    ON siwa.notification_log (state, received_at) WHERE state IN ('skipped', 'dead');

CREATE TABLE IF NOT EXISTS siwa.notification_queue (
    id              bigint      PRIMARY KEY,
    jti             text        NOT NULL,
    issued_at       timestamptz NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0,
    busy_since      timestamptz,
    last_error      text
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000);
COMMENT ON TABLE siwa.notification_queue IS
    'The worker''s queue: one row per pending notification of siwa.notification_log (same id, jti, issued_at), deleted when it is applied, skipped or dead. Written by the receiver in the statement that stores the notification; only the primary key is indexed, so the worker''s updates are HOT.';
COMMENT ON COLUMN siwa.notification_queue.id IS 'The notification''s id in siwa.notification_log; the order work is claimed in.';
COMMENT ON COLUMN siwa.notification_queue.jti IS 'With issued_at, the key of its row in siwa.notification_log.';
COMMENT ON COLUMN siwa.notification_queue.issued_at IS 'With jti, the key of its row in siwa.notification_log (and its partition).';
COMMENT ON COLUMN siwa.notification_queue.received_at IS 'When the receiver stored it (the log row''s received_at: the same transaction''s now()).';
COMMENT ON COLUMN siwa.notification_queue.next_attempt_at IS 'When it is next due (backoff after a failure, or put off while busy).';
COMMENT ON COLUMN siwa.notification_queue.attempts IS 'How many times the worker has tried to apply it.';
COMMENT ON COLUMN siwa.notification_queue.busy_since IS
    'Since when every attempt found its user (the siwa.accounts row) held by another transaction, so it was put off without counting an attempt (NULL: not busy). Cleared by the next real attempt.';
COMMENT ON COLUMN siwa.notification_queue.last_error IS
    'The last failure, redacted as in siwa.notification_log.last_error (only its SQLSTATE once the account''s personal data is erased).';

-- The receiver writes log and queue in one statement per batch (Sources/Receiver/NotificationStore.swift):
--     WITH stored AS (INSERT INTO siwa.notification_log … ON CONFLICT (jti, issued_at) DO NOTHING
--                     RETURNING id, jti, issued_at),
--          queued AS (INSERT INTO siwa.notification_queue (id, jti, issued_at) SELECT … FROM stored …)
--     SELECT jti FROM stored …, pg_notify('siwa_notifications', '') once if it queued anything
-- NOTIFY is sent at commit (never for work rolled back); a redelivered jti inserts nothing and wakes
-- nobody. A notification of an account whose personal data is already erased (Apple may send an email
-- event after the deletion, or redeliver one) is stored without email and raw token: the same statement
-- leaves them out (one primary-key probe of siwa.accounts per row). A row stored while the erasure
-- commits concurrently is caught when the worker applies it (siwa.apply_notification) or records its
-- failure (siwa.record_failure). There is no trigger on either table: version 2's row trigger cost ~30 µs
-- per row, a statement trigger with a transition table ~20.

-- The view with version 2's columns (the worker functions' row type).
CREATE OR REPLACE VIEW siwa.notifications AS
SELECT l.id, l.jti, l.event_type, l.sub, l.audience, l.email, l.is_private_email, l.event_time, l.issued_at,
       l.expires_at, l.raw_token, l.received_at, l.state,
       coalesce(q.attempts, l.attempts) AS attempts,
       q.next_attempt_at,
       l.applied_at,
       CASE WHEN q.id IS NOT NULL THEN q.last_error ELSE l.last_error END AS last_error,
       l.personal_data_erased_at,
       q.busy_since
  FROM siwa.notification_log l
  LEFT JOIN siwa.notification_queue q ON q.id = l.id AND q.jti = l.jti AND q.issued_at = l.issued_at;
COMMENT ON VIEW siwa.notifications IS
    'Every notification as one row (siwa.notification_log with its siwa.notification_queue row while pending): version 2''s table, now a view; the row type of the worker''s functions. The owner may INSERT, UPDATE and DELETE through it (INSTEAD OF triggers keep log and queue in step); next_attempt_at and busy_since are NULL once it is no longer pending.';

COMMENT ON COLUMN siwa.notifications.id IS 'Surrogate key, in order of arrival (siwa.notification_log.id).';
COMMENT ON COLUMN siwa.notifications.jti IS 'The token''s jti (siwa.notification_log.jti).';
COMMENT ON COLUMN siwa.notifications.event_type IS 'Canonical event type (siwa.notification_log.event_type).';
COMMENT ON COLUMN siwa.notifications.sub IS 'The user (siwa.notification_log.sub).';
COMMENT ON COLUMN siwa.notifications.audience IS 'The client ID (siwa.notification_log.audience).';
COMMENT ON COLUMN siwa.notifications.email IS 'Email from the event; NULL once erased (siwa.notification_log.email).';
COMMENT ON COLUMN siwa.notifications.is_private_email IS 'Whether the email is a private relay address.';
COMMENT ON COLUMN siwa.notifications.event_time IS 'When the event happened at Apple.';
COMMENT ON COLUMN siwa.notifications.issued_at IS 'The token''s iat: the log''s partition key.';
COMMENT ON COLUMN siwa.notifications.expires_at IS 'The token''s exp, when present.';
COMMENT ON COLUMN siwa.notifications.raw_token IS 'The signed token as received; NULL once pruned or erased.';
COMMENT ON COLUMN siwa.notifications.received_at IS 'When the receiver committed it.';
COMMENT ON COLUMN siwa.notifications.state IS 'pending (queued), applied, skipped or dead (siwa.notification_log.state).';
COMMENT ON COLUMN siwa.notifications.attempts IS 'Attempts made (from the queue while pending).';
COMMENT ON COLUMN siwa.notifications.next_attempt_at IS 'When a pending notification is next due (siwa.notification_queue); NULL otherwise.';
COMMENT ON COLUMN siwa.notifications.applied_at IS 'When it was applied or skipped.';
COMMENT ON COLUMN siwa.notifications.last_error IS 'Last failure, or why it was skipped (from the queue while pending).';
COMMENT ON COLUMN siwa.notifications.personal_data_erased_at IS 'When its personal data was erased.';
COMMENT ON COLUMN siwa.notifications.busy_since IS 'While pending: since when its user has been busy (siwa.notification_queue.busy_since).';

-- Writes through the view: the owner's hand edits and tests. Not a hot path.
CREATE OR REPLACE FUNCTION siwa.notifications_write() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM siwa.notification_queue WHERE id = OLD.id;
        DELETE FROM siwa.notification_log WHERE jti = OLD.jti AND issued_at = OLD.issued_at;
        DELETE FROM siwa.notification_jtis WHERE jti = OLD.jti AND issued_at = OLD.issued_at;
        RETURN OLD;
    END IF;
    IF NEW.busy_since IS NOT NULL AND coalesce(NEW.state, 'pending') <> 'pending' THEN
        RAISE EXCEPTION 'only a pending notification can be busy' USING ERRCODE = 'check_violation';
    END IF;
    IF TG_OP = 'INSERT' THEN
        NEW.state := coalesce(NEW.state, 'pending');
        NEW.attempts := coalesce(NEW.attempts, 0);
        NEW.received_at := coalesce(NEW.received_at, now());
        -- A jti already stored is refused, as the receiver would store it once (unique_violation).
        INSERT INTO siwa.notification_jtis (jti, issued_at, expires_at)
        VALUES (NEW.jti, NEW.issued_at, NEW.expires_at);
        IF NEW.id IS NULL THEN
            INSERT INTO siwa.notification_log (jti, event_type, sub, audience, email, is_private_email, event_time,
                                               issued_at, expires_at, raw_token, received_at, state, attempts,
                                               applied_at, last_error, personal_data_erased_at)
            VALUES (NEW.jti, NEW.event_type, NEW.sub, NEW.audience, NEW.email, NEW.is_private_email, NEW.event_time,
                    NEW.issued_at, NEW.expires_at, NEW.raw_token, NEW.received_at, NEW.state, NEW.attempts,
                    NEW.applied_at, NEW.last_error, NEW.personal_data_erased_at)
            RETURNING id INTO NEW.id;
        ELSE
            INSERT INTO siwa.notification_log (id, jti, event_type, sub, audience, email, is_private_email,
                                               event_time, issued_at, expires_at, raw_token, received_at, state,
                                               attempts, applied_at, last_error, personal_data_erased_at)
            OVERRIDING SYSTEM VALUE
            VALUES (NEW.id, NEW.jti, NEW.event_type, NEW.sub, NEW.audience, NEW.email, NEW.is_private_email,
                    NEW.event_time, NEW.issued_at, NEW.expires_at, NEW.raw_token, NEW.received_at, NEW.state,
                    NEW.attempts, NEW.applied_at, NEW.last_error, NEW.personal_data_erased_at);
        END IF;
        IF NEW.state = 'pending' THEN
            INSERT INTO siwa.notification_queue (id, jti, issued_at, received_at, next_attempt_at, attempts,
                                                 busy_since, last_error)
            VALUES (NEW.id, NEW.jti, NEW.issued_at, NEW.received_at, coalesce(NEW.next_attempt_at, now()),
                    NEW.attempts, NEW.busy_since, NEW.last_error);
            PERFORM pg_notify('siwa_notifications', '');
        END IF;
        RETURN NEW;
    END IF;
    IF (NEW.id, NEW.jti, NEW.issued_at) IS DISTINCT FROM (OLD.id, OLD.jti, OLD.issued_at) THEN
        RAISE EXCEPTION 'a notification''s id, jti and issued_at cannot change' USING ERRCODE = 'check_violation';
    END IF;
    UPDATE siwa.notification_log
       SET event_type = NEW.event_type, sub = NEW.sub, audience = NEW.audience, email = NEW.email,
           is_private_email = NEW.is_private_email, event_time = NEW.event_time, expires_at = NEW.expires_at,
           raw_token = NEW.raw_token, received_at = NEW.received_at, state = NEW.state, attempts = NEW.attempts,
           applied_at = NEW.applied_at, last_error = NEW.last_error,
           personal_data_erased_at = NEW.personal_data_erased_at
     WHERE jti = OLD.jti AND issued_at = OLD.issued_at;
    IF NEW.state = 'pending' THEN
        INSERT INTO siwa.notification_queue AS q (id, jti, issued_at, received_at, next_attempt_at,
                                                  attempts, busy_since, last_error)
        VALUES (NEW.id, NEW.jti, NEW.issued_at, NEW.received_at, coalesce(NEW.next_attempt_at, now()),
                NEW.attempts, NEW.busy_since, NEW.last_error)
        ON CONFLICT (id) DO UPDATE
           SET received_at = EXCLUDED.received_at, next_attempt_at = EXCLUDED.next_attempt_at,
               attempts = EXCLUDED.attempts, busy_since = EXCLUDED.busy_since, last_error = EXCLUDED.last_error;
        IF OLD.state IS DISTINCT FROM 'pending' THEN
            PERFORM pg_notify('siwa_notifications', '');  -- put back to pending: wake the workers
        END IF;
    ELSE
        DELETE FROM siwa.notification_queue WHERE id = OLD.id;
    END IF;
    RETURN NEW;
END;
$$;
COMMENT ON FUNCTION siwa.notifications_write() IS
    'INSTEAD OF trigger on the view siwa.notifications: writes the row to siwa.notification_log and keeps its siwa.notification_queue row in step with its state.';
DROP TRIGGER IF EXISTS notifications_write ON siwa.notifications;
CREATE TRIGGER notifications_write
    INSTEAD OF INSERT OR UPDATE OR DELETE ON siwa.notifications
    FOR EACH ROW EXECUTE FUNCTION siwa.notifications_write();

-- ---------------------------------------------------------------------------------------------------
-- State the app can use
-- ---------------------------------------------------------------------------------------------------

CREATE TABLE IF NOT EXISTS siwa.accounts (
    sub                text        PRIMARY KEY,
    email              text,
    is_private_email   boolean,
    email_status       text,
    email_status_at    timestamptz,
    consent_revoked_at timestamptz,
    deleted_at         timestamptz,
    personal_data_erased_at timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT accounts_email_status_check CHECK (email_status IN ('enabled', 'disabled')),
    CONSTRAINT accounts_erased_check
        CHECK (personal_data_erased_at IS NULL OR (email IS NULL AND is_private_email IS NULL))
);
COMMENT ON TABLE siwa.accounts IS
    'One row per Apple user (sub) seen in a notification or created by the app: relay-email status, consent and deletion as Apple last told us.';
COMMENT ON COLUMN siwa.accounts.sub IS 'The user''s team-scoped Apple identifier.';
COMMENT ON COLUMN siwa.accounts.email IS 'The latest email address Apple reported (often a private relay address); NULL once erased.';
COMMENT ON COLUMN siwa.accounts.is_private_email IS 'Whether email is an Apple private relay address.';
COMMENT ON COLUMN siwa.accounts.email_status IS
    'enabled or disabled: whether Apple forwards mail to the relay address (NULL until an email event arrives). Last writer wins by event_time; no longer changes once the account is deleted.';
COMMENT ON COLUMN siwa.accounts.email_status_at IS 'event_time of the email event that set email_status.';
COMMENT ON COLUMN siwa.accounts.consent_revoked_at IS 'event_time of the latest consent-revoked event (the user stopped using Sign in with Apple with this app).';
COMMENT ON COLUMN siwa.accounts.deleted_at IS 'event_time of the account-delete event (the user deleted the Apple account).';
COMMENT ON COLUMN siwa.accounts.personal_data_erased_at IS 'When the account''s personal data was erased after deletion.';
COMMENT ON COLUMN siwa.accounts.created_at IS 'When this row was created.';
COMMENT ON COLUMN siwa.accounts.updated_at IS 'When this row last changed.';

CREATE TABLE IF NOT EXISTS siwa.sessions (
    id            bigint      GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    sub           text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz,
    revoke_reason text
);
COMMENT ON TABLE siwa.sessions IS
    'The app''s sign-in sessions for Apple users. The app inserts (sub, created_at) at sign-in and treats a row with revoked_at set as signed out.';
COMMENT ON COLUMN siwa.sessions.id IS 'Session identifier.';
COMMENT ON COLUMN siwa.sessions.sub IS 'The Apple user the session belongs to (no foreign key: the app may sign a user in before any notification).';
COMMENT ON COLUMN siwa.sessions.created_at IS 'When the user signed in; consent-revoked revokes sessions created at or before its event_time.';
COMMENT ON COLUMN siwa.sessions.revoked_at IS 'When the session was revoked; NULL while valid.';
COMMENT ON COLUMN siwa.sessions.revoke_reason IS 'Why: consent-revoked, account-delete, or the app''s own reason.';
CREATE INDEX IF NOT EXISTS sessions_sub_idx ON siwa.sessions (sub) WHERE revoked_at IS NULL;

CREATE TABLE IF NOT EXISTS siwa.refresh_tokens (
    id               bigint      GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    sub              text        NOT NULL,
    client_id        text,
    token_sha256     bytea,
    token_ciphertext bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    revoked_at       timestamptz,
    revoke_reason    text,
    CONSTRAINT refresh_tokens_sha256_key UNIQUE (token_sha256)
);
COMMENT ON TABLE siwa.refresh_tokens IS
    'Apple refresh tokens the app holds. Store the token encrypted by the app (token_ciphertext) and its SHA-256 for lookup; never the plaintext.';
COMMENT ON COLUMN siwa.refresh_tokens.id IS 'Row identifier.';
COMMENT ON COLUMN siwa.refresh_tokens.sub IS 'The Apple user the token belongs to.';
COMMENT ON COLUMN siwa.refresh_tokens.client_id IS 'The client ID the token was issued to (needed to call Apple''s revoke endpoint).';
COMMENT ON COLUMN siwa.refresh_tokens.token_sha256 IS 'SHA-256 of the token, for lookup without the plaintext.';
COMMENT ON COLUMN siwa.refresh_tokens.token_ciphertext IS 'The token encrypted by the app with a key the database never sees; erased (NULL) when revoked by account deletion.';
COMMENT ON COLUMN siwa.refresh_tokens.created_at IS 'When the app obtained the token.';
COMMENT ON COLUMN siwa.refresh_tokens.revoked_at IS 'When the token was revoked; NULL while usable.';
COMMENT ON COLUMN siwa.refresh_tokens.revoke_reason IS 'Why: consent-revoked, account-delete, or the app''s own reason.';
CREATE INDEX IF NOT EXISTS refresh_tokens_sub_idx ON siwa.refresh_tokens (sub) WHERE revoked_at IS NULL;

-- The validity rule: a session or refresh token of user sub created at created_at is valid unless the
-- account is deleted, or consent was revoked at or after created_at. The worker revokes what exists when
-- it applies an event; this rule also covers what is recorded afterwards (a sign-in that commits after
-- the worker ran, a clock behind, a backfill). Enforced on write (the trigger below stores such a row
-- revoked) and on read (the app's session lookup adds AND siwa.session_is_valid(sub, created_at), which
-- also covers a row inserted concurrently with the worker's transaction, which neither saw). One
-- primary-key probe of siwa.accounts; SECURITY INVOKER: the caller needs SELECT on siwa.accounts
-- (sub, consent_revoked_at, deleted_at).
CREATE OR REPLACE FUNCTION siwa.session_is_valid(sub text, created_at timestamptz) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT NOT EXISTS (SELECT 1 FROM siwa.accounts a
                        WHERE a.sub = session_is_valid.sub
                          AND (a.deleted_at IS NOT NULL
                               OR a.consent_revoked_at >= session_is_valid.created_at));
$$;
COMMENT ON FUNCTION siwa.session_is_valid(text, timestamptz) IS
    'The validity rule: false when the account sub is deleted or consent was revoked at or after created_at. Add AND siwa.session_is_valid(sub, created_at) to the app''s session lookup.';

-- Row trigger before INSERT or UPDATE OF created_at on siwa.sessions and siwa.refresh_tokens: a row the
-- validity rule already invalidates is stored revoked, with the reason (consent-revoked when consent
-- was revoked at or after its created_at, else account-delete, as the worker would have); a refresh
-- token of an account whose personal data is erased is stored without its ciphertext. It does not fire
-- on the worker's revocations (UPDATE of revoked_at) and leaves a row already revoked alone.
CREATE OR REPLACE FUNCTION siwa.revoke_if_invalid() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_consent_revoked_at timestamptz;
    v_deleted_at         timestamptz;
    v_erased_at          timestamptz;
BEGIN
    SELECT a.consent_revoked_at, a.deleted_at, a.personal_data_erased_at
      INTO v_consent_revoked_at, v_deleted_at, v_erased_at
      FROM siwa.accounts a WHERE a.sub = NEW.sub;
    IF NOT FOUND THEN
        RETURN NEW;
    END IF;
    IF NEW.revoked_at IS NULL THEN
        IF v_consent_revoked_at >= NEW.created_at THEN
            NEW.revoked_at := clock_timestamp();
            NEW.revoke_reason := 'consent-revoked';
        ELSIF v_deleted_at IS NOT NULL THEN
            NEW.revoked_at := clock_timestamp();
            NEW.revoke_reason := 'account-delete';
        END IF;
    END IF;
    IF TG_TABLE_NAME = 'refresh_tokens' AND v_erased_at IS NOT NULL THEN
        NEW.token_ciphertext := NULL;
    END IF;
    RETURN NEW;
END;
$$;
COMMENT ON FUNCTION siwa.revoke_if_invalid() IS
    'Row trigger before INSERT or UPDATE OF created_at on siwa.sessions and siwa.refresh_tokens: stores a row that siwa.session_is_valid already invalidates revoked, with the reason; drops the ciphertext of a refresh token of an erased account.';
DROP TRIGGER IF EXISTS sessions_revoke_if_invalid ON siwa.sessions;
CREATE TRIGGER sessions_revoke_if_invalid
    BEFORE INSERT OR UPDATE OF created_at ON siwa.sessions
    FOR EACH ROW EXECUTE FUNCTION siwa.revoke_if_invalid();
DROP TRIGGER IF EXISTS refresh_tokens_revoke_if_invalid ON siwa.refresh_tokens;
CREATE TRIGGER refresh_tokens_revoke_if_invalid
    BEFORE INSERT OR UPDATE OF created_at ON siwa.refresh_tokens
    FOR EACH ROW EXECUTE FUNCTION siwa.revoke_if_invalid();

-- ---------------------------------------------------------------------------------------------------
-- The changefeed: one row per applied effect (issue 12, item 3)
-- ---------------------------------------------------------------------------------------------------
--
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

-- ---------------------------------------------------------------------------------------------------
-- Applying notifications (called by siwa-worker)
-- ---------------------------------------------------------------------------------------------------

-- Work on one user (sub) is serialised by the lock on its siwa.accounts row, taken with FOR UPDATE SKIP
-- LOCKED: only roles that may UPDATE siwa.accounts (the worker, the owner, the app) can hold it, never a
-- role that merely connects or reads the admin views. The advisory lock on a guessable key that version 1
-- used could be held by any role (and its key function resolved hashtextextended through the caller's
-- search_path): it is gone, also from databases upgraded to version 2 (change 2 above).

-- Erases the personal data of the accounts p_subs: their email, their notifications' emails and raw
-- tokens, and the encrypted refresh tokens, with one statement per table for all of them (the worker's
-- set-based pass erases every account deleted in a batch at once). The caller holds the siwa.accounts row
-- locks of these subs, so no other worker applies these users' notifications meanwhile; pending rows
-- another worker has claimed but left alone (it could not take the lock) are skipped rather than waited
-- for, which could deadlock with that worker's batch: they are erased when applied (see
-- siwa.process_claimed_notification and siwa.apply_claimed_batch).
-- Its statements are planned for each call, with the array and the tables' current sizes: see
-- siwa.apply_claimed_batch.
CREATE OR REPLACE FUNCTION siwa.erase_personal_data_of(p_subs text[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_ids bigint[];
    v_all text[];
BEGIN
    UPDATE siwa.accounts
       SET email = NULL, is_private_email = NULL, personal_data_erased_at = clock_timestamp(),
           updated_at = clock_timestamp()
     WHERE sub = ANY (p_subs);
    -- The history of a user whose sub a team transfer replaced is stored under the old sub too.
    v_all := p_subs || ARRAY(SELECT a.old_sub FROM siwa.sub_aliases a WHERE a.new_sub = ANY (p_subs));
    -- Every state: applied, skipped, dead (a failed late event) and pending alike, in the log (found by
    -- its sub index in every partition). The worker's claims lock queue rows, never log rows, so this
    -- waits for no other worker's batch.
    -- siwa.erased_error is called only for a row with a last_error: it maps NULL to NULL, and a call
    -- costs a search_path switch (its SET clause keeps it from being inlined), which most rows (applied,
    -- without an error) need not pay.
    UPDATE siwa.notification_log
       SET email = NULL, raw_token = NULL,
           last_error = CASE WHEN last_error IS NOT NULL THEN siwa.erased_error(last_error, state) END,
           personal_data_erased_at = coalesce(personal_data_erased_at, clock_timestamp())
     WHERE sub = ANY (v_all)
       AND (email IS NOT NULL OR raw_token IS NOT NULL
            OR (last_error IS NOT NULL AND last_error IS DISTINCT FROM siwa.erased_error(last_error, state)));
    -- The error texts of the user's queued rows (found through the log). Rows another worker has claimed
    -- but left alone (it could not take the lock) are skipped rather than waited for, which could deadlock
    -- with that worker's batch: they are erased when applied or failed (siwa.record_failure).
    -- The ids first (the log's sub index), then the queue by its primary key: a join would let the
    -- planner read the whole queue, which it believes has few rows with an error.
    v_ids := ARRAY(SELECT l.id FROM siwa.notification_log l WHERE l.sub = ANY (v_all) AND l.state = 'pending');
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
    -- A team transfer's import holds the new team's email between the exchange and the rewrite. The table
    -- is created further down this file: absent while an older file's version is being upgraded.
    IF pg_catalog.to_regclass('siwa.transfer_imports') IS NOT NULL THEN
        UPDATE siwa.transfer_imports SET email = NULL
         WHERE old_sub = ANY (v_all) AND email IS NOT NULL;
    END IF;
END;
$$;
COMMENT ON FUNCTION siwa.erase_personal_data_of(text[]) IS
    'Erases the personal data of the accounts p_subs: email in siwa.accounts; email, raw token and the text of last_error (its SQLSTATE stays) in every stored notification of these subs, whatever its state; encrypted refresh tokens; email and is_private_email of their siwa.changes rows. Call with the subs'' siwa.accounts rows locked (FOR UPDATE). Writes no change itself: its callers write siwa.personal_data_erased.';

-- Erases one account's personal data (siwa.erase_personal_data_of for one sub).
CREATE OR REPLACE FUNCTION siwa.erase_personal_data(p_sub text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM siwa.erase_personal_data_of(ARRAY[p_sub]);
END;
$$;
COMMENT ON FUNCTION siwa.erase_personal_data(text) IS
    'Erases one account''s personal data: email in siwa.accounts; email, raw token and the text of last_error (its SQLSTATE stays) in every stored notification of that sub, whatever its state; encrypted refresh tokens. Call with the sub''s siwa.accounts row locked (FOR UPDATE).';

-- Applies the effects of one notification. Raises on failure; the caller owns the transaction and the
-- notification's state. Returns 'applied', or 'skipped: <reason>' for a notification with nothing to do.
CREATE OR REPLACE FUNCTION siwa.apply_notification(n siwa.notifications) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_account    siwa.accounts;
    v_erased     boolean;
    v_email      text;
    v_hook_path  text;
    v_rows       integer;
    v_sessions   integer := 0;
    v_tokens     integer := 0;
    v_superseded boolean;
    v_change     siwa.changes;
    v_erasure    siwa.changes;
    v_on_change  boolean;
BEGIN
    IF n.event_type NOT IN ('email-disabled', 'email-enabled', 'consent-revoked', 'account-delete') THEN
        RETURN 'skipped: unknown event type ' || quote_literal(left(n.event_type, 100));
    END IF;
    -- The receiver stores each jti once while its key is kept (siwa.notification_jtis, the dedupe
    -- window). Should a jti still be stored twice past it, the earlier row is found here (the log's
    -- primary key, by jti, in every partition) and this one is skipped: applied once all the same.
    IF EXISTS (SELECT 1 FROM siwa.notification_log d
                WHERE d.jti = n.jti AND d.issued_at <> n.issued_at AND d.id < n.id) THEN
        RETURN 'skipped: duplicate jti (an earlier notification has the same jti)';
    END IF;

    -- Accounts are created on first sight of a sub, and the row lock orders work on one user with the
    -- app's own updates. The worker (siwa.process_claimed_notification) already holds it, so the
    -- SELECT … FOR UPDATE finds its own lock and the INSERT is needed only by a caller that does not.
    SELECT * INTO v_account FROM siwa.accounts WHERE sub = n.sub FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO siwa.accounts (sub) VALUES (n.sub) ON CONFLICT (sub) DO NOTHING;
        SELECT * INTO v_account FROM siwa.accounts WHERE sub = n.sub FOR UPDATE;
    END IF;
    v_erased := v_account.personal_data_erased_at IS NOT NULL;

    IF n.event_type IN ('email-disabled', 'email-enabled') THEN
        -- Last writer wins by event_time: an older event delivered late never overrides a newer one.
        -- A deleted account's email status no longer changes: its relay address is gone with it.
        UPDATE siwa.accounts
           SET email            = CASE WHEN personal_data_erased_at IS NULL THEN coalesce(n.email, email) END,
               is_private_email = CASE WHEN personal_data_erased_at IS NULL
                                       THEN coalesce(n.is_private_email, is_private_email) END,
               email_status     = CASE n.event_type WHEN 'email-enabled' THEN 'enabled' ELSE 'disabled' END,
               email_status_at  = n.event_time,
               updated_at       = clock_timestamp()
         WHERE sub = n.sub AND deleted_at IS NULL
           AND (email_status_at IS NULL OR email_status_at <= n.event_time);
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        v_superseded := v_rows = 0;
    ELSIF n.event_type = 'consent-revoked' THEN
        -- Only what existed when the user revoked consent: a later sign-in stays valid.
        UPDATE siwa.sessions SET revoked_at = clock_timestamp(), revoke_reason = 'consent-revoked'
         WHERE sub = n.sub AND revoked_at IS NULL AND created_at <= n.event_time;
        GET DIAGNOSTICS v_sessions = ROW_COUNT;
        UPDATE siwa.refresh_tokens SET revoked_at = clock_timestamp(), revoke_reason = 'consent-revoked'
         WHERE sub = n.sub AND revoked_at IS NULL AND created_at <= n.event_time;
        GET DIAGNOSTICS v_tokens = ROW_COUNT;
        UPDATE siwa.accounts
           SET consent_revoked_at = greatest(consent_revoked_at, n.event_time), updated_at = clock_timestamp()
         WHERE sub = n.sub;
        v_superseded := coalesce(v_account.consent_revoked_at >= n.event_time, false)
                        AND v_sessions = 0 AND v_tokens = 0;
    ELSE -- account-delete
        UPDATE siwa.sessions SET revoked_at = clock_timestamp(), revoke_reason = 'account-delete'
         WHERE sub = n.sub AND revoked_at IS NULL;
        GET DIAGNOSTICS v_sessions = ROW_COUNT;
        UPDATE siwa.refresh_tokens SET revoked_at = clock_timestamp(), revoke_reason = 'account-delete'
         WHERE sub = n.sub AND revoked_at IS NULL;
        GET DIAGNOSTICS v_tokens = ROW_COUNT;
        UPDATE siwa.accounts
           SET deleted_at = least(deleted_at, n.event_time), updated_at = clock_timestamp()
         WHERE sub = n.sub;
        v_superseded := v_account.deleted_at IS NOT NULL AND v_sessions = 0 AND v_tokens = 0;
    END IF;

    -- The change (siwa.changes), written unless superseded; its email only for an account not erased.
    v_change.type := siwa.change_type(n.event_type);
    v_change.sub := n.sub;
    v_change.event_time := n.event_time;
    v_change.applied_at := clock_timestamp();
    v_change.jti := n.jti;
    v_change.audience := n.audience;
    v_change.sessions_revoked := v_sessions;
    v_change.refresh_tokens_revoked := v_tokens;
    IF n.event_type IN ('email-disabled', 'email-enabled') AND NOT v_erased THEN
        v_change.email := n.email;
        v_change.is_private_email := n.is_private_email;
    END IF;
    IF NOT v_superseded THEN
        INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti, audience, sessions_revoked,
                                  refresh_tokens_revoked, email, is_private_email)
        VALUES (v_change.type, v_change.sub, v_change.event_time, v_change.applied_at, v_change.jti,
                v_change.audience, v_change.sessions_revoked, v_change.refresh_tokens_revoked,
                v_change.email, v_change.is_private_email)
        RETURNING * INTO v_change;
    END IF;

    IF n.event_type = 'account-delete' AND (SELECT erase_personal_data_after FROM siwa.settings) = interval '0' THEN
        PERFORM siwa.erase_personal_data(n.sub);  -- this notification's row and the user's changes included
        IF NOT v_erased THEN
            -- Erasure actually happened (not for an account erased before).
            INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti, audience)
            VALUES ('siwa.personal_data_erased', n.sub, n.event_time, clock_timestamp(), n.jti, n.audience)
            RETURNING * INTO v_erasure;
        END IF;
        v_erased := true;
    END IF;
    IF v_erased AND (n.email IS NOT NULL OR n.raw_token IS NOT NULL) THEN
        -- The user's personal data is erased: this notification (which may have arrived, or been
        -- claimed elsewhere, after the erasure; an account-delete of an account erased before) keeps
        -- none either.
        UPDATE siwa.notification_log
           SET email = NULL, raw_token = NULL, personal_data_erased_at = clock_timestamp()
         WHERE jti = n.jti AND issued_at = n.issued_at AND (email IS NOT NULL OR raw_token IS NOT NULL);
    END IF;

    -- The hooks run with the search_path they were written for (the worker session's own, or
    -- siwa.settings.hook_search_path, see siwa.hook_path), not this function's: a hook written as
    -- `UPDATE my_users …` keeps working. set_config(…, true) inside a function with a SET clause lasts
    -- until the function returns. siwa.on_event first; then the optional siwa.on_change, if it exists,
    -- with the change (stored, or for a superseded event the one it would have written, id NULL) and,
    -- when this event erased the user's personal data, with that change too.
    v_email := CASE WHEN v_erased THEN NULL ELSE n.email END;
    v_on_change := pg_catalog.to_regprocedure('siwa.on_change(siwa.changes, boolean)') IS NOT NULL;
    v_hook_path := siwa.hook_path();
    PERFORM pg_catalog.set_config('search_path', v_hook_path, true);
    PERFORM siwa.on_event(n.event_type, n.sub, n.event_time, v_email, n.jti);
    IF v_on_change THEN
        PERFORM siwa.on_change(v_change, v_superseded);
        IF v_erasure.id IS NOT NULL THEN
            PERFORM siwa.on_change(v_erasure, false);
        END IF;
    END IF;
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    RETURN 'applied';
END;
$$;
COMMENT ON FUNCTION siwa.apply_notification(siwa.notifications) IS
    'Applies one notification''s effects (sessions, refresh tokens, account state, its siwa.changes rows, the hooks siwa.on_event and siwa.on_change). Raises on failure; does not change the notification''s state. Leaves its changes unnumbered: the caller''s transaction ends with siwa.number_changes.';

-- Result rows of the processing functions. Only functions depend on it: an attribute added later is
-- added to existing databases by a numbered change with ALTER TYPE … ADD ATTRIBUTE (at the end, so
-- callers that name the columns they read keep working).
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
    'One handled notification: outcome applied, skipped, retry, dead, gone (no longer pending) or busy (its user''s siwa.accounts row is held by another transaction; put off briefly without counting an attempt); attempt is the attempt number just made; latency is seconds from received_at to now; busy_seconds is, for a busy one, how long it has been busy in a row.';

-- Handles one notification the caller has locked (FOR UPDATE), in a subtransaction:
--  1. takes its user's siwa.accounts row lock, creating the row first if it does not exist. The lock is
--     tried, never waited for (SKIP LOCKED); the INSERT can only wait for a concurrent uncommitted insert
--     of the same sub, and does so for 1 ms at most (lock_timeout, 55P03). Either means the user is busy: the notification is put off for a short, growing, jittered
--     delay (no attempt counted, busy_since set) so that it no longer fills the batches of any lane;
--  2. applies it and marks it applied or skipped, or records the failure with backoff. A lock wait
--     inside the application (e.g. an app transaction holding a session row) ends with the caller's
--     lock_timeout as 55P03, which the EXCEPTION block catches: that event is retried, the rest of the
--     batch applies.
-- A failed or busy attempt rolls the subtransaction back, the account row it created included. Errors
-- the EXCEPTION block cannot catch (query_canceled from statement_timeout, assert_failure) abort the
-- caller's transaction; the worker then records them with siwa.record_failure in a new transaction.
CREATE OR REPLACE FUNCTION siwa.process_claimed_notification(
    n siwa.notifications, p_max_attempts integer, p_retry_base_delay interval)
RETURNS siwa.processing_result
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    r         siwa.processing_result;
    v_result  text;
    v_locking boolean := true;
    v_busy    boolean := false;
    v_busy_for interval;
    v_now     timestamptz;
    v_lock_timeout text;
BEGIN
    r.id := n.id; r.jti := n.jti; r.event_type := n.event_type; r.attempt := n.attempts + 1;
    BEGIN
        PERFORM 1 FROM siwa.accounts a WHERE a.sub = n.sub FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            IF EXISTS (SELECT 1 FROM siwa.accounts a WHERE a.sub = n.sub) THEN
                v_busy := true;  -- the row exists and someone else holds it
            ELSE
                -- The INSERT waits only for a concurrent uncommitted insert of the same sub (another
                -- lane's batch, or the app's sign-in): that is busy too, so barely wait for it.
                v_lock_timeout := current_setting('lock_timeout');
                PERFORM set_config('lock_timeout', '1ms', true);
                INSERT INTO siwa.accounts (sub) VALUES (n.sub) ON CONFLICT (sub) DO NOTHING;
                PERFORM set_config('lock_timeout', v_lock_timeout, true);
                PERFORM 1 FROM siwa.accounts a WHERE a.sub = n.sub FOR UPDATE SKIP LOCKED;
                v_busy := NOT FOUND;
            END IF;
        END IF;
        IF NOT v_busy THEN
            v_locking := false;
            v_result := siwa.apply_notification(n);
            r.outcome := CASE WHEN v_result = 'applied' THEN 'applied' ELSE 'skipped' END;
            r.error := CASE WHEN v_result = 'applied' THEN NULL ELSE substr(v_result, 10) END;
            -- Done: out of the queue, the outcome into the log (one update of its row).
            DELETE FROM siwa.notification_queue WHERE id = n.id;
            UPDATE siwa.notification_log AS t
               SET state = r.outcome, attempts = n.attempts + 1, applied_at = clock_timestamp(),
                   last_error = r.error
             WHERE t.jti = n.jti AND t.issued_at = n.issued_at;
            -- A skipped notification of a user whose personal data is already erased keeps none either
            -- (apply_notification does this itself for the notifications it applies).
            IF r.outcome = 'skipped'
               AND EXISTS (SELECT 1 FROM siwa.accounts a
                            WHERE a.sub = n.sub AND a.personal_data_erased_at IS NOT NULL) THEN
                UPDATE siwa.notification_log AS t
                   SET email = NULL, raw_token = NULL, personal_data_erased_at = clock_timestamp()
                 WHERE t.jti = n.jti AND t.issued_at = n.issued_at
                   AND (t.email IS NOT NULL OR t.raw_token IS NOT NULL);
            END IF;
        END IF;
    EXCEPTION WHEN OTHERS THEN
        IF v_locking AND SQLSTATE IN ('55P03', '40P01') THEN
            v_busy := true;  -- waited for a concurrent insert of this sub's account row
        ELSE
            r.error := left(siwa.redact_error(left(SQLSTATE || ': ' || SQLERRM, 10000)), 2000);
            r.outcome := siwa.record_failure(n.id, r.error, p_max_attempts, p_retry_base_delay);
        END IF;
    END;
    IF v_busy THEN
        -- Put off by half the time it has been busy, between 0.1 s and 5 s, times a factor in [0.5, 1):
        -- short at first, rarer while the user stays busy, never an attempt.
        v_now := clock_timestamp();
        v_busy_for := v_now - coalesce(n.busy_since, v_now);
        UPDATE siwa.notification_queue AS t
           SET next_attempt_at = v_now + least(greatest(v_busy_for / 2, interval '100 milliseconds'),
                                               interval '5 seconds') * (0.5 + random() / 2),
               busy_since = coalesce(t.busy_since, v_now)
         WHERE t.id = n.id;
        r.outcome := 'busy'; r.attempt := n.attempts; r.error := NULL;
        r.busy_seconds := extract(epoch FROM v_busy_for)::double precision;
    END IF;
    r.latency := extract(epoch FROM clock_timestamp() - n.received_at);
    RETURN r;
END;
$$;
COMMENT ON FUNCTION siwa.process_claimed_notification(siwa.notifications, integer, interval) IS
    'Applies one claimed notification in a subtransaction, holding its sub''s siwa.accounts row lock, and records the outcome (applied, skipped, retry, dead); or, when another transaction holds that row, reports it busy and puts it off briefly (busy_since, no attempt counted). The caller holds the notification''s row lock.';

-- The set-based pass ---------------------------------------------------------------------------------
--
-- siwa.process_due_notifications applies a claimed batch with siwa.apply_claimed_batch: one statement per
-- effect for the whole batch instead of one subtransaction per notification, so that the costs paid per
-- call (a function's SET search_path, the switch to the hook's path and back, the account row lock,
-- the subtransaction) are paid once per batch. It must leave exactly what applying the batch's
-- notifications one after the other, in claim order (siwa.process_claimed_notification), would leave.
-- If any of it fails, nothing of it is kept (the caller rolls back to a savepoint) and the batch is
-- processed one notification at a time as before: a single bad event, or a hook that raises for one,
-- still affects only itself.
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
    'One notification of a batch in siwa.apply_claimed_batch: ord is its claim order; locked: its user''s siwa.accounts row is held by this transaction (else it is busy); known: its event type is one the worker applies; first_delete: ord of the first account-delete of its user in the batch; erased_before: its user''s personal data is erased when its turn comes (before the batch, or by an earlier account-delete of the batch); erased_after: erased once the batch is applied.';

-- Applies a claimed batch (rows the caller holds with FOR UPDATE, in claim order) with one statement per
-- effect, and returns one siwa.processing_result per notification, in claim order. Raises on any failure;
-- the caller owns the savepoint and falls back to one subtransaction per notification.
--  1. Users: every account row of the batch is locked at once (FOR UPDATE SKIP LOCKED); the missing ones
--     are created (INSERT … ON CONFLICT DO NOTHING, waiting 1 ms at most for a concurrent insert of the
--     same sub: past that the pass raises 55P03 and the fallback reports that user busy). A user whose
--     row another transaction holds is busy: its notifications are put off as before.
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
--  6. One UPDATE marks every notification: applied, skipped (unknown type, with the reason), or busy
--     (put off, no attempt counted); a late event of an erased user keeps no email or token.
--  7. One INSERT of the changes, numbered, under the siwa.changes_counter row lock held from then on.
CREATE OR REPLACE FUNCTION siwa.apply_claimed_batch(p_batch siwa.notifications[])
RETURNS siwa.processing_result[]
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
    v_lock_timeout text;
    v_erase_now    boolean;
    v_events       siwa.batch_event[];
    v_hooks        siwa.batch_event[];
    v_hook         siwa.batch_event;
    v_hook_path    text;
    v_deleted      text[];
    v_revoke_subs  text[];
    v_revoke_upto  timestamptz[];
    v_revoke_all   boolean[];
    v_results      siwa.processing_result[];
    v_plan_cache_mode text;
    v_done         bigint;
    v_marked       bigint;
    v_status_at    timestamptz[];
    v_deleted_before text[];
    v_consent_at   timestamptz[];
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
    v_last         bigint;
    v_numbered     bigint;
    i              integer;
BEGIN
    -- Plans: every statement here reads or writes a few dozen rows by their keys, with arrays as
    -- parameters. PL/pgSQL would keep a generic plan for the session, and one made while a table was
    -- still small (a new deployment's siwa.accounts, not yet analysed) scans it sequentially, batch
    -- after batch, as it grows (measured: most of the pass's CPU in a 100k drain). Planned for each
    -- batch with its arrays and the tables' current sizes, they use the keys' indexes. (Disabling
    -- sequential scans instead makes the planner cost them at 10^10, and JIT-compile the statements
    -- that have no other path.) The hook runs with the session's own setting.
    v_plan_cache_mode := current_setting('plan_cache_mode');
    PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);

    -- 1. Lock the batch's users; create the missing ones. Each account row is looked up by its key,
    --    one LATERAL lookup per user, in sub order (the same order in every lane), whatever the planner
    --    thinks of the table's size; the locked rows' state before the batch is kept for step 2.
    v_subs := ARRAY(SELECT DISTINCT b.sub FROM unnest(p_batch) AS b ORDER BY 1);
    SELECT coalesce(array_agg(l.sub ORDER BY l.sub), '{}'),
           coalesce(array_agg(l.email_status_at ORDER BY l.sub), '{}'),
           coalesce(array_agg(l.sub) FILTER (WHERE l.personal_data_erased_at IS NOT NULL), '{}'),
           coalesce(array_agg(l.sub) FILTER (WHERE l.deleted_at IS NOT NULL), '{}'),
           coalesce(array_agg(l.consent_revoked_at ORDER BY l.sub), '{}')
      INTO v_locked, v_status_at, v_erased, v_deleted_before, v_consent_at
      FROM unnest(v_subs) AS s(sub),
           LATERAL (SELECT a.sub, a.email_status_at, a.personal_data_erased_at, a.deleted_at, a.consent_revoked_at
                      FROM siwa.accounts a WHERE a.sub = s.sub FOR UPDATE SKIP LOCKED) AS l;
    IF cardinality(v_locked) < cardinality(v_subs) THEN
        v_missing := ARRAY(SELECT s.sub FROM unnest(v_subs) AS s(sub)
                            WHERE s.sub <> ALL (v_locked)
                              AND (SELECT true FROM siwa.accounts a WHERE a.sub = s.sub) IS NULL);
        IF cardinality(v_missing) > 0 THEN
            v_lock_timeout := current_setting('lock_timeout');
            PERFORM set_config('lock_timeout', '1ms', true);
            WITH created AS (
                INSERT INTO siwa.accounts (sub) SELECT m.sub FROM unnest(v_missing) AS m(sub) ORDER BY m.sub
                ON CONFLICT (sub) DO NOTHING RETURNING sub)
            SELECT coalesce(array_agg(created.sub), '{}') INTO v_inserted FROM created;
            PERFORM set_config('lock_timeout', v_lock_timeout, true);
            v_locked := v_locked || v_inserted;
            v_status_at := v_status_at || array_fill(NULL::timestamptz, ARRAY[cardinality(v_inserted)]);
            v_consent_at := v_consent_at || array_fill(NULL::timestamptz, ARRAY[cardinality(v_inserted)]);
            IF cardinality(v_inserted) < cardinality(v_missing) THEN
                -- Created by another transaction that committed meanwhile: lock it like the others.
                SELECT v_locked || coalesce(array_agg(l.sub ORDER BY l.sub), '{}'),
                       v_status_at || coalesce(array_agg(l.email_status_at ORDER BY l.sub), '{}'),
                       v_erased || coalesce(array_agg(l.sub) FILTER (WHERE l.personal_data_erased_at IS NOT NULL), '{}'),
                       v_deleted_before || coalesce(array_agg(l.sub) FILTER (WHERE l.deleted_at IS NOT NULL), '{}'),
                       v_consent_at || coalesce(array_agg(l.consent_revoked_at ORDER BY l.sub), '{}')
                  INTO v_locked, v_status_at, v_erased, v_deleted_before, v_consent_at
                  FROM unnest(v_missing) AS s(sub),
                       LATERAL (SELECT a.sub, a.email_status_at, a.personal_data_erased_at, a.deleted_at,
                                       a.consent_revoked_at
                                  FROM siwa.accounts a
                                 WHERE a.sub = s.sub AND a.sub <> ALL (v_inserted) FOR UPDATE SKIP LOCKED) AS l;
            END IF;
        END IF;
    END IF;

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
                           AS known,
                       (min(b.ordinality) FILTER (WHERE b.event_type = 'account-delete')
                            OVER (PARTITION BY b.sub))::integer AS first_delete
                  FROM unnest(p_batch) WITH ORDINALITY AS b) AS e
         ORDER BY e.ord);

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

    -- 3. Revocation, one statement updating both tables: up to the latest consent-revoked event_time
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
             WHERE x.locked AND x.event_type IN ('consent-revoked', 'account-delete')
             GROUP BY x.sub) AS r;
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
                     WHERE x.locked AND x.sub = v.sub
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
    --     not erased before; the same rows, in the same order, as one-at-a-time application writes
    --     (siwa.apply_notification). Worked out here, with the emails one-at-a-time application writes
    --     before the erasure of step 4 clears them, given to the hook (step 5) as they are, and written
    --     last (step 7), with the emails that erasure cleared. A superseded event (see siwa.changes)
    --     writes none, but its record is kept for the hook.
    --     Email events: applied as in step 2. Consent-revoked: superseded when the user's consent was
    --     revoked at or after its event_time already (before the batch, or by an earlier one of the
    --     batch) and it revoked nothing. Account-delete: when the account was deleted already and it
    --     revoked nothing.
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
            SELECT e.*, a.status_at, a.consent_at,
                   max(e.event_time) FILTER (WHERE e.event_type IN ('email-disabled', 'email-enabled'))
                       OVER (PARTITION BY e.sub ORDER BY e.ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                       AS earlier_email,
                   max(e.event_time) FILTER (WHERE e.event_type = 'consent-revoked')
                       OVER (PARTITION BY e.sub ORDER BY e.ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                       AS earlier_consent
              FROM e JOIN unnest(v_locked, v_status_at, v_consent_at) AS a(sub, status_at, consent_at)
                ON a.sub = e.sub),
        s AS (
            SELECT w.*,
                   CASE w.event_type
                       WHEN 'consent-revoked' THEN
                           coalesce(greatest(w.consent_at, w.earlier_consent) >= w.event_time, false)
                           AND w.sessions = 0 AND w.tokens = 0
                       WHEN 'account-delete' THEN
                           (w.sub = ANY (v_deleted_before) OR w.first_delete < w.ord)
                           AND w.sessions = 0 AND w.tokens = 0
                       ELSE NOT ((w.first_delete IS NULL OR w.ord < w.first_delete)
                                 AND w.sub <> ALL (v_deleted_before)
                                 AND (w.status_at IS NULL OR w.status_at <= w.event_time)
                                 AND (w.earlier_email IS NULL OR w.earlier_email <= w.event_time))
                   END AS superseded
              FROM w)
        SELECT s.ord, 0 AS kind, s.superseded,
               jsonb_populate_record(NULL::siwa.changes, jsonb_build_object(
                   'type', siwa.change_type(s.event_type), 'sub', s.sub, 'event_time', s.event_time,
                   'applied_at', clock_timestamp(), 'jti', s.jti, 'audience', s.audience,
                   'sessions_revoked', s.sessions, 'refresh_tokens_revoked', s.tokens,
                   'email', CASE WHEN s.event_type IN ('email-disabled', 'email-enabled') AND NOT s.erased_before
                                 THEN s.email END,
                   'is_private_email', CASE WHEN s.event_type IN ('email-disabled', 'email-enabled')
                                                 AND NOT s.erased_before THEN s.is_private_email END)) AS change
          FROM s
        UNION ALL
        SELECT s.ord, 1, false,
               jsonb_populate_record(NULL::siwa.changes, jsonb_build_object(
                   'type', 'siwa.personal_data_erased', 'sub', s.sub, 'event_time', s.event_time,
                   'applied_at', clock_timestamp(), 'jti', s.jti, 'audience', s.audience,
                   'sessions_revoked', 0, 'refresh_tokens_revoked', 0))
          FROM s
         WHERE s.event_type = 'account-delete' AND s.ord = s.first_delete AND v_erase_now
           AND s.sub <> ALL (v_erased)) AS c;
    -- Their ids now, from the identity's sequence in this order, so that the hook gets them; the rows
    -- themselves are inserted last, numbered (step 7).
    IF false = ANY (v_list_superseded) THEN
        v_seq := pg_catalog.pg_get_serial_sequence('siwa.changes', 'id')::regclass;
        FOR i IN 1 .. cardinality(v_list) LOOP
            IF NOT v_list_superseded[i] THEN
                v_change := v_list[i];
                v_change.id := pg_catalog.nextval(v_seq);
                v_list[i] := v_change;
            END IF;
        END LOOP;
    END IF;

    -- 4. Erasure of every user deleted in this batch, at once (the batch's own rows of these users
    --    included: this transaction holds their locks).
    IF v_erase_now THEN
        v_deleted := ARRAY(SELECT DISTINCT x.sub FROM unnest(v_events) AS x
                            WHERE x.locked AND x.event_type = 'account-delete');
        IF cardinality(v_deleted) > 0 THEN
            PERFORM siwa.erase_personal_data_of(v_deleted);
        END IF;
    END IF;

    -- 5. The hooks, once per known event in claim order, with the path they were written for (see
    --    siwa.apply_notification): switched once around the loop, which evaluates no operator or function
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
        PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
    END IF;

    -- 6. Mark the batch. Finished (applied or skipped, an attempt): out of the queue, and the outcome
    --    into its log row, one statement each (a late event of an erased user keeps no email or token).
    --    Busy (no attempt): its queue row is put off by half the time it has been busy, between 0.1 s and
    --    5 s, times a factor in [0.5, 1).
    DELETE FROM siwa.notification_queue AS q
     WHERE q.id = ANY (ARRAY(SELECT x.id FROM unnest(v_events) AS x WHERE x.locked));
    GET DIAGNOSTICS v_done = ROW_COUNT;
    UPDATE siwa.notification_log AS t
       SET state      = CASE WHEN x.known THEN 'applied' ELSE 'skipped' END,
           attempts   = x.attempts + 1,
           applied_at = clock_timestamp(),
           last_error = CASE WHEN x.known THEN NULL
                             ELSE 'unknown event type ' || quote_literal(left(x.event_type, 100)) END,
           email      = CASE WHEN x.erased_after THEN NULL ELSE t.email END,
           raw_token  = CASE WHEN x.erased_after THEN NULL ELSE t.raw_token END,
           personal_data_erased_at =
               CASE WHEN x.erased_after AND (t.email IS NOT NULL OR t.raw_token IS NOT NULL)
                    THEN clock_timestamp() ELSE t.personal_data_erased_at END
      FROM unnest(v_events) AS x JOIN unnest(p_batch) AS n ON n.id = x.id
     WHERE x.locked AND t.jti = n.jti AND t.issued_at = n.issued_at;
    GET DIAGNOSTICS v_marked = ROW_COUNT;
    IF v_marked <> v_done OR v_done <> (SELECT count(*) FROM unnest(v_events) AS x WHERE x.locked) THEN
        RAISE EXCEPTION 'siwa.apply_claimed_batch finished % queue rows and % log rows of % applied',
                        v_done, v_marked, (SELECT count(*) FROM unnest(v_events) AS x WHERE x.locked);
    END IF;
    UPDATE siwa.notification_queue AS t
       SET busy_since      = coalesce(t.busy_since, v_now),
           next_attempt_at = v_now + least(greatest((v_now - coalesce(t.busy_since, v_now)) / 2,
                                                    interval '100 milliseconds'),
                                           interval '5 seconds') * (0.5 + random() / 2)
      FROM unnest(v_events) AS x
     WHERE NOT x.locked AND t.id = x.id;
    v_results := ARRAY(
        SELECT ROW(x.id, x.jti, x.event_type,
                   CASE WHEN NOT x.locked THEN 'busy' WHEN x.known THEN 'applied' ELSE 'skipped' END,
                   CASE WHEN x.locked AND NOT x.known
                        THEN 'unknown event type ' || quote_literal(left(x.event_type, 100)) END,
                   x.attempts + CASE WHEN x.locked THEN 1 ELSE 0 END,
                   extract(epoch FROM clock_timestamp() - x.received_at)::double precision,
                   CASE WHEN NOT x.locked
                        THEN extract(epoch FROM v_now - coalesce(x.busy_since, v_now))::double precision END
                  )::siwa.processing_result
          FROM unnest(v_events) AS x ORDER BY x.ord);
    -- 7. The changes, last: numbered as they are inserted, under the siwa.changes_counter row lock, which
    --    is then held until the caller's transaction ends (see siwa.changes and siwa.number_changes), so
    --    the lock covers only what is left of the transaction, not the batch's work; and no second write
    --    of each row to number it. The emails of users erased in this batch are left out (step 4 erased
    --    those of their earlier changes).
    IF false = ANY (v_list_superseded) THEN
        SELECT k.last_position INTO v_last FROM siwa.changes_counter k FOR UPDATE;
        INSERT INTO siwa.changes (id, position, type, sub, event_time, applied_at, jti, audience, sessions_revoked,
                                  refresh_tokens_revoked, email, is_private_email)
        OVERRIDING SYSTEM VALUE
        SELECT c.id, v_last + row_number() OVER (ORDER BY c.id), c.type, c.sub, c.event_time, c.applied_at, c.jti,
               c.audience, c.sessions_revoked, c.refresh_tokens_revoked,
               CASE WHEN c.sub = ANY (coalesce(v_deleted, '{}')) THEN NULL ELSE c.email END,
               CASE WHEN c.sub = ANY (coalesce(v_deleted, '{}')) THEN NULL ELSE c.is_private_email END
          FROM unnest(v_list) AS c
         WHERE c.id IS NOT NULL
         ORDER BY c.id;
        GET DIAGNOSTICS v_numbered = ROW_COUNT;
        UPDATE siwa.changes_counter SET last_position = v_last + v_numbered;
        PERFORM pg_catalog.pg_notify('siwa_changes', (v_last + v_numbered)::text);
    END IF;
    PERFORM set_config('plan_cache_mode', v_plan_cache_mode, true);
    RETURN v_results;
END;
$$;
COMMENT ON FUNCTION siwa.apply_claimed_batch(siwa.notifications[]) IS
    'The worker''s set-based pass: applies a claimed batch (rows the caller holds FOR UPDATE, in claim order) with one statement per effect — account locks (busy users put off), account state with last writer wins by event_time, revocation, erasure, the on_event hook once per known event in order, one UPDATE marking every state — and returns one result per notification in claim order. Raises on any failure; the caller rolls back to a savepoint and falls back to siwa.process_claimed_notification per notification.';

-- Claims up to p_limit due notifications and applies them, all in the caller's transaction: the claim
-- (row locks, FOR UPDATE SKIP LOCKED) disappears with a crashed worker's connection, and effects commit
-- together with the state change that marks them applied. The user's siwa.accounts row lock (tried,
-- never waited for) keeps two events of one user from being applied concurrently by two workers; such
-- rows are reported busy and put off briefly.
--
-- First the set-based pass (siwa.apply_claimed_batch) in one subtransaction. If it raises (an event whose
-- hook raises, a lock wait past lock_timeout, anything), it is rolled back and the same batch is
-- processed as before the set-based pass: each notification in its own subtransaction
-- (siwa.process_claimed_notification), so that a failure affects only its own notification.
--
-- Last, siwa.number_changes gives the changes written the next positions (under the siwa.changes_counter
-- row lock, held until the caller commits: call this function in a transaction of its own, as the worker
-- does, and commit right away).
--
-- At most 64 per call, whatever p_limit says. In that fallback each notification's subtransaction writes
-- (it locks its user's account row, at least), so it gets a subtransaction XID, and these stay with the
-- transaction until it ends (only a rolled-back one gives its XID back, as the failed set-based pass
-- does). PostgreSQL keeps 64 of them per transaction in shared memory (PGPROC_MAX_CACHED_SUBXIDS); beyond
-- that the transaction's cache overflows, and every snapshot any session takes while it is open must
-- look subtransactions up in pg_subtrans, which slows the whole server down. The set-based pass uses one.
-- A hook (siwa.on_event) with BEGIN … EXCEPTION blocks of its own that write uses one more per block
-- entered: the worker's --batch-size must then be lower (docs/operations.md).
CREATE OR REPLACE FUNCTION siwa.process_due_notifications(
    p_limit integer, p_max_attempts integer, p_retry_base_delay interval)
RETURNS SETOF siwa.processing_result
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    n         siwa.notifications;
    v_batch   siwa.notifications[];
    v_results siwa.processing_result[];
BEGIN
    -- The claim locks queue rows (in id order: oldest first; the queue's only index), never log rows.
    v_batch := ARRAY(
        -- A sub that a team transfer replaced is applied to the account it became (siwa.sub_aliases).
        SELECT ROW(l.id, l.jti, l.event_type,
                   coalesce((SELECT sa.new_sub FROM siwa.sub_aliases sa WHERE sa.old_sub = l.sub), l.sub),
                   l.audience, l.email, l.is_private_email, l.event_time,
                   l.issued_at, l.expires_at, l.raw_token, l.received_at, l.state, q.attempts,
                   q.next_attempt_at, l.applied_at, q.last_error, l.personal_data_erased_at,
                   q.busy_since)::siwa.notifications
          FROM siwa.notification_queue q
          JOIN siwa.notification_log l ON l.jti = q.jti AND l.issued_at = q.issued_at
         WHERE q.next_attempt_at <= clock_timestamp()
         ORDER BY q.id
         LIMIT least(p_limit, 64)
         FOR UPDATE OF q SKIP LOCKED);
    IF cardinality(v_batch) = 0 THEN
        RETURN;
    END IF;
    -- A jti stored twice (only possible past the dedupe window, see siwa.notification_jtis) is skipped by
    -- siwa.apply_notification: such a batch takes the one-at-a-time path.
    IF NOT EXISTS (SELECT 1 FROM unnest(v_batch) AS b
                    WHERE EXISTS (SELECT 1 FROM siwa.notification_log d
                                   WHERE d.jti = b.jti AND d.issued_at <> b.issued_at AND d.id < b.id)) THEN
        BEGIN
            v_results := siwa.apply_claimed_batch(v_batch);
        EXCEPTION WHEN OTHERS THEN
            v_results := NULL;  -- rolled back to the block's start: nothing of the set-based pass is kept
        END;
        IF v_results IS NOT NULL THEN
            RETURN QUERY SELECT * FROM unnest(v_results);
            PERFORM siwa.number_changes();  -- last: see siwa.changes
            RETURN;
        END IF;
    END IF;
    FOREACH n IN ARRAY v_batch LOOP
        RETURN NEXT siwa.process_claimed_notification(n, p_max_attempts, p_retry_base_delay);
    END LOOP;
    PERFORM siwa.number_changes();
END;
$$;
COMMENT ON FUNCTION siwa.process_due_notifications(integer, integer, interval) IS
    'Worker entry point: claims up to p_limit (at most 64) due notifications (FOR UPDATE SKIP LOCKED) and applies them with one statement per effect (siwa.apply_claimed_batch); if that fails, rolls it back and handles each in its own subtransaction (one each, and PostgreSQL caches 64 per transaction). Marks each applied, skipped, retried with backoff, or dead. One row per notification handled (busy: its user''s account row is held elsewhere; put off briefly, no attempt counted).';

-- The worker's fallback when a whole batch failed with an error no subtransaction can catch: handles
-- exactly one notification, so that the culprit can be identified and recorded separately.
CREATE OR REPLACE FUNCTION siwa.process_notification(
    p_id bigint, p_max_attempts integer, p_retry_base_delay interval)
RETURNS SETOF siwa.processing_result
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    n siwa.notifications;
BEGIN
    SELECT l.id, l.jti, l.event_type,
           coalesce((SELECT sa.new_sub FROM siwa.sub_aliases sa WHERE sa.old_sub = l.sub), l.sub),
           l.audience, l.email, l.is_private_email, l.event_time,
           l.issued_at, l.expires_at, l.raw_token, l.received_at, l.state, q.attempts, q.next_attempt_at,
           l.applied_at, q.last_error, l.personal_data_erased_at, q.busy_since
      INTO n
      FROM siwa.notification_queue q
      JOIN siwa.notification_log l ON l.jti = q.jti AND l.issued_at = q.issued_at
     WHERE q.id = p_id AND q.next_attempt_at <= clock_timestamp()
       FOR UPDATE OF q SKIP LOCKED;
    IF FOUND THEN
        RETURN NEXT siwa.process_claimed_notification(n, p_max_attempts, p_retry_base_delay);
        PERFORM siwa.number_changes();  -- last: see siwa.changes
    END IF;
END;
$$;
COMMENT ON FUNCTION siwa.process_notification(bigint, integer, interval) IS
    'Like siwa.process_due_notifications for the one notification p_id, if it is still pending, due and not locked elsewhere. Returns no row otherwise.';

-- Records a failed attempt: back off exponentially with jitter, or give up (dead) after p_max_attempts.
CREATE OR REPLACE FUNCTION siwa.record_failure(
    p_id bigint, p_error text, p_max_attempts integer, p_retry_base_delay interval)
RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_attempts  integer;
    v_sub       text;
    v_jti       text;
    v_issued_at timestamptz;
    v_error     text;
BEGIN
    -- A real attempt: the row is no longer busy, and a dead row always says why it died (the CHECK
    -- constraints on siwa.notification_log).
    UPDATE siwa.notification_queue
       SET attempts = attempts + 1,
           last_error = coalesce(left(siwa.redact_error(left(nullif(p_error, ''), 10000)), 2000), '(no error text)'),
           busy_since = NULL
     WHERE id = p_id
    RETURNING attempts, jti, issued_at, last_error INTO v_attempts, v_jti, v_issued_at, v_error;
    IF v_attempts IS NULL THEN
        RETURN 'gone';
    END IF;
    v_sub := (SELECT l.sub FROM siwa.notification_log l WHERE l.jti = v_jti AND l.issued_at = v_issued_at);
    -- A late event of an account whose personal data is already erased: its attempt (which would have
    -- erased this row's data) was rolled back, so erase it here, outside that attempt, whatever follows.
    IF EXISTS (SELECT 1 FROM siwa.accounts a WHERE a.sub = v_sub AND a.personal_data_erased_at IS NOT NULL) THEN
        v_error := siwa.erased_error(v_error, 'pending');
        UPDATE siwa.notification_queue SET last_error = v_error WHERE id = p_id;
        UPDATE siwa.notification_log
           SET email = NULL, raw_token = NULL,
               last_error = CASE WHEN last_error IS NOT NULL THEN siwa.erased_error(last_error, state) END,
               personal_data_erased_at = coalesce(personal_data_erased_at, clock_timestamp())
         WHERE jti = v_jti AND issued_at = v_issued_at;
    END IF;
    IF v_attempts >= p_max_attempts THEN
        DELETE FROM siwa.notification_queue WHERE id = p_id;
        UPDATE siwa.notification_log SET state = 'dead', attempts = v_attempts, last_error = v_error
         WHERE jti = v_jti AND issued_at = v_issued_at;
        RETURN 'dead';
    ELSE
        -- base × 2^(attempts−1), capped at one hour, times a random factor in [0.5, 1).
        UPDATE siwa.notification_queue
           SET next_attempt_at = clock_timestamp()
                                 + least(p_retry_base_delay * power(2, least(v_attempts - 1, 30)),
                                         interval '1 hour') * (0.5 + random() / 2)
         WHERE id = p_id;
        RETURN 'retry';
    END IF;
END;
$$;
COMMENT ON FUNCTION siwa.record_failure(bigint, text, integer, interval) IS
    'Records a failed attempt at one pending notification: stores the error redacted (siwa.redact_error), clears busy_since, erases the row''s personal data if its account''s is erased, and schedules a retry with exponential backoff (base × 2^(attempt−1), at most 1 hour) and jitter, or marks it dead after p_max_attempts. Returns retry, dead, or gone (not pending).';

-- Erases personal data of deleted accounts whose retention period has passed (see siwa.settings).
-- At most 64 accounts per call, each in a subtransaction that writes: see siwa.process_due_notifications.
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
        -- serialises erasure with the worker, as siwa.process_claimed_notification does. A row of this
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
    -- One creator at a time (two workers' maintenance passes), then look again.
    PERFORM pg_advisory_xact_lock(hashtextextended('siwa.notification_log partitions', 0));
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
        -- unexpired tokens by the BRIN index on expires_at.
        EXECUTE format('INSERT INTO siwa.notification_log_default
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
    'Retention: clears raw tokens of finished notifications (applied, skipped or dead) received before now - p_tokens_older_than, up to p_batch per call from where the last call stopped, and drops the months of history that ended before now - p_rows_older_than (siwa.drop_log_partitions; pending and dead rows are kept). NULL: keep. Also deletes dedupe keys past the window and changes (siwa.changes) older than siwa.settings.changes_retention, whatever the arguments. Call until both counts are 0.';

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

-- ---------------------------------------------------------------------------------------------------
-- What admins read
-- ---------------------------------------------------------------------------------------------------

-- The log, with the queue's columns while a notification is pending. Every filter on a log column
-- (sub, received_at, event_type and event_time, state skipped or dead, applied_at) reaches the log's
-- indexes in every partition; the queue is joined by its primary key (from the log), or the log by its
-- (from the queue: a filter on next_attempt_at or busy_since, only a pending row has them).
CREATE OR REPLACE VIEW siwa.event_history AS
SELECT l.jti,
       l.event_type,
       l.sub,
       l.audience,
       l.email,
       l.is_private_email,
       l.event_time,
       l.received_at,
       l.state,
       coalesce(q.attempts, l.attempts) AS attempts,
       l.applied_at,
       CASE WHEN q.id IS NOT NULL THEN q.last_error ELSE l.last_error END AS last_error,
       l.issued_at,
       l.expires_at,
       q.next_attempt_at,
       l.personal_data_erased_at,
       l.id
  FROM siwa.notification_log l
  LEFT JOIN siwa.notification_queue q ON q.id = l.id AND q.jti = l.jti AND q.issued_at = l.issued_at;
COMMENT ON VIEW siwa.event_history IS
    'Every verified notification, one row each, newest last by id: the one place to read what Apple told us and what the worker did with it.';
COMMENT ON COLUMN siwa.event_history.jti IS 'The token''s unique identifier.';
COMMENT ON COLUMN siwa.event_history.event_type IS
    'email-disabled, email-enabled, consent-revoked, account-delete, or an unknown type as received.';
COMMENT ON COLUMN siwa.event_history.sub IS 'The user''s team-scoped Apple identifier.';
COMMENT ON COLUMN siwa.event_history.audience IS 'The client ID the notification was for.';
COMMENT ON COLUMN siwa.event_history.email IS 'Email from the event; NULL for other events and once erased.';
COMMENT ON COLUMN siwa.event_history.is_private_email IS 'Whether the email is a private relay address.';
COMMENT ON COLUMN siwa.event_history.event_time IS 'When the event happened at Apple.';
COMMENT ON COLUMN siwa.event_history.received_at IS 'When we stored it (the 200 to Apple follows).';
COMMENT ON COLUMN siwa.event_history.state IS 'pending, applied, skipped or dead (see siwa.notification_log.state).';
COMMENT ON COLUMN siwa.event_history.attempts IS 'Attempts made to apply it.';
COMMENT ON COLUMN siwa.event_history.applied_at IS 'When it was applied or skipped.';
COMMENT ON COLUMN siwa.event_history.last_error IS 'Last failure, or why it was skipped.';
COMMENT ON COLUMN siwa.event_history.issued_at IS 'The token''s iat.';
COMMENT ON COLUMN siwa.event_history.expires_at IS 'The token''s exp, when present.';
COMMENT ON COLUMN siwa.event_history.next_attempt_at IS 'When a pending notification is next due; NULL once it is no longer pending.';
COMMENT ON COLUMN siwa.event_history.personal_data_erased_at IS 'When its personal data was erased.';
COMMENT ON COLUMN siwa.event_history.id IS 'Arrival order.';

-- ---------------------------------------------------------------------------------------------------
-- Admin views and roles
-- ---------------------------------------------------------------------------------------------------
--
-- Three views are what people read (siwa.event_history above, siwa.account_overview, siwa.queue_health);
-- three NOLOGIN group roles say who may do what. An administrator grants a group role to a login role:
--
--     CREATE ROLE alice LOGIN IN ROLE siwa_admin;            -- a person reading history (docs/sql.md)
--     CREATE ROLE receiver LOGIN PASSWORD '…' IN ROLE siwa_receiver;
--     CREATE ROLE worker LOGIN PASSWORD '…' IN ROLE siwa_worker;
--
-- Functions run with the caller's rights (SECURITY INVOKER, PostgreSQL's default): each role is granted
-- exactly the tables its functions touch and nothing runs with more rights than its caller has. Every
-- function pins its search_path (pg_catalog, pg_temp), so objects another role creates in a schema on
-- the caller's path (public, say) are never used in their place. The consequence: a replaced siwa.on_event hook runs as the worker, so grant
-- siwa_worker what the hook touches in your own tables. Views, in contrast, read their tables with the
-- rights of their owner (the role that ran this file): that is how siwa_admin reads history without any
-- access to the tables themselves, and why the views never show raw tokens or refresh tokens.
--
-- Roles are cluster-wide: they are created only when missing and never altered or dropped, so passwords
-- and memberships set by an administrator stay. Applying this file as an owner without CREATEROLE still
-- works: missing roles are reported with a warning and their grants skipped.

-- One row per account, with the counts an admin asks for first.
CREATE OR REPLACE VIEW siwa.account_overview AS
SELECT a.sub,
       a.email,
       a.is_private_email,
       a.email_status,
       a.email_status_at,
       a.consent_revoked_at,
       a.deleted_at,
       a.personal_data_erased_at,
       s.open_sessions,
       t.open_refresh_tokens,
       last_event.event_type AS last_event_type,
       last_event.event_time AS last_event_time,
       e.last_received_at,
       e.event_count,
       e.pending_events,
       e.dead_events,
       s.last_session_created_at,
       r.revoked_sessions_by_reason,
       CASE WHEN a.deleted_at IS NOT NULL THEN 'deleted' ELSE 'active' END AS account_status
  FROM siwa.accounts a
  CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE ss.revoked_at IS NULL) AS open_sessions,
               max(ss.created_at) AS last_session_created_at
          FROM siwa.sessions ss
         WHERE ss.sub = a.sub) AS s
  CROSS JOIN LATERAL (
        SELECT coalesce(jsonb_object_agg(g.reason, g.sessions), '{}'::jsonb) AS revoked_sessions_by_reason
          FROM (SELECT coalesce(ss.revoke_reason, 'unknown') AS reason, count(*) AS sessions
                  FROM siwa.sessions ss
                 WHERE ss.sub = a.sub AND ss.revoked_at IS NOT NULL
                 GROUP BY 1) AS g) AS r
  CROSS JOIN LATERAL (
        SELECT count(*) AS open_refresh_tokens
          FROM siwa.refresh_tokens rt
         WHERE rt.sub = a.sub AND rt.revoked_at IS NULL) AS t
  CROSS JOIN LATERAL (
        SELECT max(n.received_at) AS last_received_at,
               count(*) AS event_count,
               count(*) FILTER (WHERE n.state = 'pending') AS pending_events,
               count(*) FILTER (WHERE n.state = 'dead') AS dead_events
          FROM siwa.notification_log n
         WHERE n.sub = a.sub) AS e
  LEFT JOIN LATERAL (
        SELECT n.event_type, n.event_time
          FROM siwa.notification_log n
         WHERE n.sub = a.sub
         ORDER BY n.event_time DESC, n.id DESC
         LIMIT 1) AS last_event ON true;
COMMENT ON VIEW siwa.account_overview IS
    'One row per account (siwa.accounts): what Apple last told us about the user, their open sessions and refresh tokens, and a summary of their notifications. A user whose notifications are all still pending has no account row yet: see siwa.event_history.';
COMMENT ON COLUMN siwa.account_overview.sub IS 'The user''s team-scoped Apple identifier.';
COMMENT ON COLUMN siwa.account_overview.email IS 'Latest email address Apple reported; NULL if none or erased.';
COMMENT ON COLUMN siwa.account_overview.is_private_email IS 'Whether email is an Apple private relay address.';
COMMENT ON COLUMN siwa.account_overview.email_status IS
    'enabled or disabled: whether Apple forwards mail to the relay address; NULL until an email event arrives. Frozen once the account is deleted (account_status deleted): a deleted account has no address to mail.';
COMMENT ON COLUMN siwa.account_overview.email_status_at IS 'event_time of the email event that set email_status.';
COMMENT ON COLUMN siwa.account_overview.consent_revoked_at IS 'event_time of the latest consent-revoked event, if any.';
COMMENT ON COLUMN siwa.account_overview.deleted_at IS 'event_time of the account-delete event, if any.';
COMMENT ON COLUMN siwa.account_overview.personal_data_erased_at IS 'When the account''s personal data was erased.';
COMMENT ON COLUMN siwa.account_overview.open_sessions IS 'Sessions of this user not revoked (siwa.sessions.revoked_at IS NULL).';
COMMENT ON COLUMN siwa.account_overview.open_refresh_tokens IS 'Refresh tokens of this user not revoked.';
COMMENT ON COLUMN siwa.account_overview.last_event_type IS 'Type of the user''s latest notification by event_time (any state).';
COMMENT ON COLUMN siwa.account_overview.last_event_time IS 'event_time of that latest notification.';
COMMENT ON COLUMN siwa.account_overview.last_received_at IS 'When we last stored a notification for this user.';
COMMENT ON COLUMN siwa.account_overview.event_count IS 'Notifications stored for this user (pruned rows no longer count).';
COMMENT ON COLUMN siwa.account_overview.pending_events IS 'Of those, still pending (waiting for the worker).';
COMMENT ON COLUMN siwa.account_overview.dead_events IS 'Of those, dead (the worker gave up; see siwa.event_history.last_error).';
COMMENT ON COLUMN siwa.account_overview.last_session_created_at IS
    'When the user last signed in (latest siwa.sessions.created_at, revoked or not); NULL if never.';
COMMENT ON COLUMN siwa.account_overview.revoked_sessions_by_reason IS
    'Revoked sessions counted by revoke_reason, e.g. {"consent-revoked": 2}; {} if none.';
COMMENT ON COLUMN siwa.account_overview.account_status IS
    'deleted (the user deleted the Apple account: deleted_at is set; email_status no longer changes and means nothing) or active.';

-- The queue at a glance, one row. `siwactl stats` reads these columns by name: add, never rename.
CREATE OR REPLACE VIEW siwa.queue_health AS
SELECT p.pending,
       p.due,
       p.retrying,
       d.dead,
       p.oldest_pending_seconds,
       r.received_last_hour,
       l.applied_last_hour,
       l.apply_latency_p50_seconds,
       l.apply_latency_p99_seconds,
       b.busy,
       b.oldest_busy_seconds
  FROM (SELECT count(*) AS pending,
               count(*) FILTER (WHERE n.next_attempt_at <= now()) AS due,
               count(*) FILTER (WHERE n.attempts > 0) AS retrying,
               extract(epoch FROM now() - min(n.received_at))::double precision AS oldest_pending_seconds
          FROM siwa.notification_queue n) AS p,
       (SELECT count(*) AS dead FROM siwa.notification_log n WHERE n.state = 'dead') AS d,
       (SELECT count(*) AS received_last_hour
          FROM siwa.notification_log n
         WHERE n.received_at > now() - interval '1 hour') AS r,
       (SELECT count(*) AS applied_last_hour,
               percentile_cont(0.5) WITHIN GROUP (
                   ORDER BY extract(epoch FROM n.applied_at - n.received_at)::double precision)
                   AS apply_latency_p50_seconds,
               percentile_cont(0.99) WITHIN GROUP (
                   ORDER BY extract(epoch FROM n.applied_at - n.received_at)::double precision)
                   AS apply_latency_p99_seconds
          FROM siwa.notification_log n
         WHERE n.applied_at > now() - interval '1 hour' AND n.state IN ('applied', 'skipped')) AS l,
       (SELECT count(*) AS busy,
               extract(epoch FROM now() - min(n.busy_since))::double precision AS oldest_busy_seconds
          FROM siwa.notification_queue n
         WHERE n.busy_since IS NOT NULL) AS b;
COMMENT ON VIEW siwa.queue_health IS
    'The worker''s queue right now, one row: backlog, failures, throughput and apply latency over the last hour. Read by siwactl stats.';
COMMENT ON COLUMN siwa.queue_health.pending IS 'Notifications waiting to be applied (state pending).';
COMMENT ON COLUMN siwa.queue_health.due IS 'Pending notifications whose next attempt is due now (next_attempt_at <= now()).';
COMMENT ON COLUMN siwa.queue_health.retrying IS 'Pending notifications that have failed at least once (attempts > 0).';
COMMENT ON COLUMN siwa.queue_health.dead IS 'Notifications the worker gave up on (state dead): look at last_error, requeue with siwactl replay.';
COMMENT ON COLUMN siwa.queue_health.oldest_pending_seconds IS
    'Seconds since the oldest pending notification was received; NULL when nothing is pending.';
COMMENT ON COLUMN siwa.queue_health.received_last_hour IS 'Notifications received in the last hour (still stored).';
COMMENT ON COLUMN siwa.queue_health.applied_last_hour IS
    'Notifications finished in the last hour: applied or skipped, by applied_at.';
COMMENT ON COLUMN siwa.queue_health.apply_latency_p50_seconds IS
    'Median seconds from received_at to applied_at over the notifications finished in the last hour; NULL if none.';
COMMENT ON COLUMN siwa.queue_health.apply_latency_p99_seconds IS
    '99th percentile (interpolated) of the same latency; NULL if none.';
COMMENT ON COLUMN siwa.queue_health.busy IS
    'Pending notifications put off because their user''s account row is held by another transaction (busy_since set); no attempt is counted for that.';
COMMENT ON COLUMN siwa.queue_health.oldest_busy_seconds IS
    'Seconds the longest-busy pending notification has been waiting for its user; NULL when none is busy. Growing: a transaction (the app''s, or a stuck worker''s) holds that siwa.accounts row.';

-- The changefeed for apps (siwa_app) and admins: the numbered changes, in position order. Read it with
-- a cursor: SELECT … FROM siwa.changefeed WHERE position > $last ORDER BY position LIMIT n (the position's
-- unique index), and LISTEN siwa_changes to hear when more become readable (payload: the last position).
-- security_barrier: a caller's own function in a WHERE clause never sees a row not numbered yet.
CREATE OR REPLACE VIEW siwa.changefeed WITH (security_barrier) AS
SELECT c.position,
       c.type,
       c.sub,
       c.event_time,
       c.applied_at,
       c.jti,
       c.audience,
       c.sessions_revoked,
       c.refresh_tokens_revoked,
       c.email,
       c.is_private_email,
       c.id
  FROM siwa.changes c
 WHERE c.position IS NOT NULL;
COMMENT ON VIEW siwa.changefeed IS
    'The changefeed: every change the worker applied (siwa.changes) once numbered. Poll with WHERE position > $last ORDER BY position LIMIT n: a reader never misses a change, whatever order the workers commit in. LISTEN siwa_changes for a wake-up (payload: the last position). Kept for siwa.settings.changes_retention.';
COMMENT ON COLUMN siwa.changefeed.position IS 'The cursor: remember the last one read, ask for the ones above it.';
COMMENT ON COLUMN siwa.changefeed.type IS
    'siwa.email_disabled, siwa.email_enabled, siwa.consent_revoked, siwa.account_deleted or siwa.personal_data_erased.';
COMMENT ON COLUMN siwa.changefeed.sub IS 'The user''s team-scoped Apple identifier.';
COMMENT ON COLUMN siwa.changefeed.event_time IS 'Apple''s event_time of the notification that caused it.';
COMMENT ON COLUMN siwa.changefeed.applied_at IS 'When the worker applied it.';
COMMENT ON COLUMN siwa.changefeed.jti IS 'The notification''s jti (see siwa.event_history).';
COMMENT ON COLUMN siwa.changefeed.audience IS 'The client ID the notification was for.';
COMMENT ON COLUMN siwa.changefeed.sessions_revoked IS 'Sessions this change revoked.';
COMMENT ON COLUMN siwa.changefeed.refresh_tokens_revoked IS 'Refresh tokens this change revoked.';
COMMENT ON COLUMN siwa.changefeed.email IS
    'For email events of accounts not erased: the email Apple sent. NULL otherwise, and once erased.';
COMMENT ON COLUMN siwa.changefeed.is_private_email IS 'Whether that email is a private relay address.';
COMMENT ON COLUMN siwa.changefeed.id IS 'The change''s stable identity (per sub, in the order applied).';

-- Indexes for these views (the others they use are above): every session of one user.
CREATE INDEX IF NOT EXISTS sessions_sub_created_idx ON siwa.sessions (sub, created_at);

-- ---------------------------------------------------------------------------------------------------
-- Sign-in exchange and revocation outbox (issue 13, items 2 and 3)
-- ---------------------------------------------------------------------------------------------------
--
-- The sign-in API (siwa-receiver --signin-listen) exchanges an app's authorization code at Apple and
-- stores the refresh token in siwa.refresh_tokens (token_ciphertext: AES-256-GCM made by the service
-- with a key the database never sees; token_sha256 for lookup). siwa.sign_in_codes makes each code
-- exchanged at most once; siwa.sign_ins records what the id_token said per client.
-- siwa.request_revocation is the outbox: the app calls it inside its own account-deletion transaction
-- (as siwa_app), and siwa-worker's revoker calls Apple's /auth/revoke once that transaction commits,
-- then destroys the ciphertext. siwa.revocation_ledger is what admins read.
-- Every object here is new: tables created only when missing, functions replaced, never data dropped.

CREATE TABLE IF NOT EXISTS siwa.sign_in_codes (
    code_sha256  bytea       PRIMARY KEY,
    client_id    text        NOT NULL,
    sub          text        NOT NULL,
    state        text        NOT NULL DEFAULT 'exchanging',
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    CONSTRAINT sign_in_codes_state_check CHECK (state IN ('exchanging', 'done'))
);
COMMENT ON TABLE siwa.sign_in_codes IS
    'Authorization codes the sign-in API has exchanged or is exchanging, by SHA-256 (never the code): a code is exchanged at most once, and a retry of a finished sign-in gets the same answer.';
COMMENT ON COLUMN siwa.sign_in_codes.code_sha256 IS 'SHA-256 of the authorization code.';
COMMENT ON COLUMN siwa.sign_in_codes.client_id IS 'The client ID the code was sent with.';
COMMENT ON COLUMN siwa.sign_in_codes.sub IS 'The user the verified id_token named.';
COMMENT ON COLUMN siwa.sign_in_codes.state IS 'exchanging (a call to Apple is under way, or died: the code is spent either way) or done.';
COMMENT ON COLUMN siwa.sign_in_codes.created_at IS 'When the exchange began.';
COMMENT ON COLUMN siwa.sign_in_codes.finished_at IS 'When the exchange was recorded.';

CREATE TABLE IF NOT EXISTS siwa.sign_ins (
    sub                text        NOT NULL,
    client_id          text        NOT NULL,
    real_user_status   integer,
    email_verified     boolean,
    first_signed_in_at timestamptz NOT NULL DEFAULT now(),
    last_signed_in_at  timestamptz NOT NULL DEFAULT now(),
    sign_in_count      integer     NOT NULL DEFAULT 1,
    PRIMARY KEY (sub, client_id),
    CONSTRAINT sign_ins_real_user_status_check CHECK (real_user_status BETWEEN 0 AND 2)
);
COMMENT ON TABLE siwa.sign_ins IS
    'One row per user and client ID that signed in through the sign-in API (email and is_private_email go to siwa.accounts).';
COMMENT ON COLUMN siwa.sign_ins.real_user_status IS 'Apple''s real_user_status: 0 unsupported, 1 unknown, 2 likely real.';
COMMENT ON COLUMN siwa.sign_ins.email_verified IS 'The id_token''s email_verified.';

CREATE TABLE IF NOT EXISTS siwa.revocation_requests (
    id              bigint      GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    sub             text        NOT NULL,
    reason          text        NOT NULL,
    requested_at    timestamptz NOT NULL DEFAULT now(),
    state           text        NOT NULL DEFAULT 'pending',
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_attempt_at timestamptz,
    apple_answer    text,
    tokens_revoked  integer     NOT NULL DEFAULT 0,
    last_error      text,
    completed_at    timestamptz,
    echo_event_time timestamptz,
    echo_matched_at timestamptz,
    lease_owner     text,
    lease_expires_at timestamptz,
    CONSTRAINT revocation_requests_lease_check CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CONSTRAINT revocation_requests_state_check CHECK (state IN ('pending', 'revoked', 'no_token', 'failed')),
    CONSTRAINT revocation_requests_sub_check CHECK (length(sub) BETWEEN 1 AND 255),
    CONSTRAINT revocation_requests_reason_check CHECK (length(reason) BETWEEN 1 AND 200)
);
COMMENT ON TABLE siwa.revocation_requests IS
    'The revocation outbox: one row per siwa.request_revocation call; siwa-worker calls Apple''s /auth/revoke for every stored refresh token of the sub and records the outcome here. Read siwa.revocation_ledger.';
CREATE INDEX IF NOT EXISTS revocation_requests_due_idx
    ON siwa.revocation_requests (next_attempt_at) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS revocation_requests_sub_idx ON siwa.revocation_requests (sub);

-- Begins a sign-in's exchange of one code: 'new' (the caller exchanges it now), 'exchanging' (another
-- call is exchanging it, or died doing so), 'done' (answer from the recorded sign-in) or 'mismatch' (the
-- code was seen with another sub or client ID). Runs as the sign-in API (siwa_signin).
CREATE OR REPLACE FUNCTION siwa.begin_sign_in(p_code_sha256 bytea, p_client_id text, p_sub text)
RETURNS text LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_row siwa.sign_in_codes;
BEGIN
    INSERT INTO siwa.sign_in_codes (code_sha256, client_id, sub)
    VALUES (p_code_sha256, p_client_id, p_sub)
    ON CONFLICT (code_sha256) DO NOTHING;
    IF FOUND THEN
        RETURN 'new';
    END IF;
    SELECT * INTO v_row FROM siwa.sign_in_codes WHERE code_sha256 = p_code_sha256;
    IF v_row.client_id <> p_client_id OR v_row.sub <> p_sub THEN
        RETURN 'mismatch';
    END IF;
    RETURN v_row.state;
END;
$$;
COMMENT ON FUNCTION siwa.begin_sign_in(bytea, text, text) IS
    'Claims an authorization code (by SHA-256) for exchange: new, exchanging, done or mismatch. Called by the sign-in API.';

-- Forgets a code whose exchange failed before Apple issued tokens, so that a retry may try again.
CREATE OR REPLACE FUNCTION siwa.abandon_sign_in(p_code_sha256 bytea) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM siwa.sign_in_codes WHERE code_sha256 = p_code_sha256 AND state = 'exchanging';
END;
$$;
COMMENT ON FUNCTION siwa.abandon_sign_in(bytea) IS
    'Forgets a code whose exchange failed at Apple (no tokens issued), so a retry may exchange it.';

-- Records a finished exchange in one transaction: the account (email unless erased), the sign-in, the
-- encrypted refresh token, and the code as done.
CREATE OR REPLACE FUNCTION siwa.record_sign_in(
    p_code_sha256 bytea, p_client_id text, p_sub text, p_email text, p_is_private_email boolean,
    p_email_verified boolean, p_real_user_status integer, p_token_sha256 bytea, p_token_ciphertext bytea)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO siwa.accounts (sub, email, is_private_email)
    VALUES (p_sub, p_email, p_is_private_email)
    ON CONFLICT (sub) DO UPDATE
       SET email = coalesce(EXCLUDED.email, siwa.accounts.email),
           is_private_email = coalesce(EXCLUDED.is_private_email, siwa.accounts.is_private_email),
           updated_at = clock_timestamp()
     WHERE siwa.accounts.personal_data_erased_at IS NULL AND siwa.accounts.deleted_at IS NULL;
    INSERT INTO siwa.sign_ins (sub, client_id, real_user_status, email_verified)
    VALUES (p_sub, p_client_id, p_real_user_status, p_email_verified)
    ON CONFLICT (sub, client_id) DO UPDATE
       SET real_user_status = EXCLUDED.real_user_status, email_verified = EXCLUDED.email_verified,
           last_signed_in_at = clock_timestamp(), sign_in_count = siwa.sign_ins.sign_in_count + 1;
    IF p_token_ciphertext IS NOT NULL THEN
        INSERT INTO siwa.refresh_tokens (sub, client_id, token_sha256, token_ciphertext)
        VALUES (p_sub, p_client_id, p_token_sha256, p_token_ciphertext)
        ON CONFLICT (token_sha256) DO NOTHING;
    END IF;
    UPDATE siwa.sign_in_codes SET state = 'done', finished_at = clock_timestamp()
     WHERE code_sha256 = p_code_sha256;
END;
$$;
COMMENT ON FUNCTION siwa.record_sign_in(bytea, text, text, text, boolean, boolean, integer, bytea, bytea) IS
    'Records one exchanged sign-in: account, sign-in, encrypted refresh token, code done. Called by the sign-in API.';

-- The identity a finished sign-in answers (also for a retried code).
CREATE OR REPLACE FUNCTION siwa.sign_in_identity(p_sub text, p_client_id text)
RETURNS TABLE (sub text, email text, is_private_email boolean, email_verified boolean,
               real_user_status integer)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT s.sub, a.email, a.is_private_email, s.email_verified, s.real_user_status
      FROM siwa.sign_ins s LEFT JOIN siwa.accounts a ON a.sub = s.sub
     WHERE s.sub = p_sub AND s.client_id = p_client_id;
$$;
COMMENT ON FUNCTION siwa.sign_in_identity(text, text) IS 'The identity answered for a sign-in (never tokens).';

-- The outbox's entry point, for the app's own account-deletion transaction (role siwa_app) and for
-- POST /v1/revocations. It inserts a pending request and wakes the revoker when the transaction commits
-- (NOTIFY is delivered only then); a rolled-back transaction leaves nothing. It reads nothing: whether
-- the user has a token is the worker's finding ('no_token'), made after the commit.
CREATE OR REPLACE FUNCTION siwa.request_revocation(sub text, reason text) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id bigint;
BEGIN
    IF sub IS NULL OR length(sub) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'siwa.request_revocation: sub must be 1 to 255 characters' USING ERRCODE = '22023';
    END IF;
    IF reason IS NULL OR length(reason) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'siwa.request_revocation: reason must be 1 to 200 characters' USING ERRCODE = '22023';
    END IF;
    INSERT INTO siwa.revocation_requests AS r (sub, reason)
    VALUES (request_revocation.sub, request_revocation.reason)
    RETURNING r.id INTO v_id;
    PERFORM pg_catalog.pg_notify('siwa_revocations', '');
    RETURN v_id;
END;
$$;
COMMENT ON FUNCTION siwa.request_revocation(text, text) IS
    'Asks siwa-worker to revoke the user''s Apple tokens once the calling transaction commits (the transactional outbox); returns the request id. Call it inside the account-deletion transaction as siwa_app.';

-- The echoed consent-revoked: when the worker applies a consent-revoked for a user (siwa.accounts.
-- consent_revoked_at moves), the user's requests not yet matched are marked with its event_time. Runs as
-- whoever updates siwa.accounts (the worker).
CREATE OR REPLACE FUNCTION siwa.match_revocation_echo() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.consent_revoked_at IS NOT NULL
       AND (TG_OP = 'INSERT' OR NEW.consent_revoked_at IS DISTINCT FROM OLD.consent_revoked_at) THEN
        UPDATE siwa.revocation_requests
           SET echo_event_time = NEW.consent_revoked_at, echo_matched_at = clock_timestamp()
         WHERE sub = NEW.sub AND echo_matched_at IS NULL AND state IN ('pending', 'revoked')
           AND attempts > 0;
    END IF;
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION siwa.match_revocation_echo() IS
    'Row trigger after INSERT or UPDATE OF consent_revoked_at on siwa.accounts: marks the user''s revocation requests with the echoed consent-revoked.';
DROP TRIGGER IF EXISTS accounts_match_revocation_echo ON siwa.accounts;
CREATE TRIGGER accounts_match_revocation_echo
    AFTER INSERT OR UPDATE OF consent_revoked_at ON siwa.accounts
    FOR EACH ROW WHEN (NEW.consent_revoked_at IS NOT NULL) EXECUTE FUNCTION siwa.match_revocation_echo();

-- Refresh-token checks (issue 13, item 4; optional, siwa-worker --refresh-check-interval): each stored
-- token is refreshed at Apple at most once per interval; invalid_grant means the user's consent is gone,
-- which Apple should have told us with consent-revoked. The check then records a consent-revoked of our
-- own (jti 'siwa-refresh-check:…', no raw token) that the worker applies like Apple's, so a missed
-- notification is caught and shows in siwa.event_history.
CREATE TABLE IF NOT EXISTS siwa.refresh_token_checks (
    token_id   bigint      PRIMARY KEY,
    checked_at timestamptz NOT NULL DEFAULT now(),
    outcome    text        NOT NULL
);
COMMENT ON TABLE siwa.refresh_token_checks IS
    'When each stored refresh token (siwa.refresh_tokens.id) was last refreshed at Apple by the worker''s check, and the outcome: valid, invalid_grant, or the failure kind.';

-- The one SECURITY DEFINER function in this file: siwa_worker may not insert notifications (nothing
-- but the receiver writes Apple's history), so it records this event of our own through a function
-- that can write exactly one shape of row: a consent-revoked, jti prefixed siwa-refresh-check:, no
-- email or raw token, for a user with a stored refresh token. It runs as the schema's owner with the
-- pinned search_path; EXECUTE is granted to siwa_worker only.
CREATE OR REPLACE FUNCTION siwa.record_consent_lost(p_sub text, p_client_id text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_jti text := 'siwa-refresh-check:' || pg_catalog.gen_random_uuid()::text;
BEGIN
    IF p_client_id IS NULL OR p_client_id = ''
       OR NOT EXISTS (SELECT 1 FROM siwa.refresh_tokens t WHERE t.sub = p_sub) THEN
        RAISE EXCEPTION 'siwa.record_consent_lost: no stored refresh token for that user' USING ERRCODE = '22023';
    END IF;
    INSERT INTO siwa.notifications (jti, event_type, sub, audience, event_time, issued_at)
    VALUES (v_jti, 'consent-revoked', p_sub, p_client_id, clock_timestamp(), clock_timestamp());
    RETURN v_jti;
END;
$$;
COMMENT ON FUNCTION siwa.record_consent_lost(text, text) IS
    'Records a consent-revoked of our own for a user whose refresh token Apple answered invalid_grant; the worker applies it like Apple''s. Returns its jti (siwa-refresh-check:…).';

-- What admins read: the ledger, one row per request, with the echoed notification's jti.
CREATE OR REPLACE VIEW siwa.revocation_ledger AS
SELECT r.id,
       r.sub,
       r.reason,
       r.requested_at,
       r.state,
       r.attempts,
       r.last_attempt_at,
       r.next_attempt_at,
       r.apple_answer,
       r.tokens_revoked,
       r.completed_at,
       r.echo_event_time,
       r.echo_matched_at,
       echo.jti AS echo_jti,
       r.last_error
  FROM siwa.revocation_requests r
  LEFT JOIN LATERAL (
        SELECT e.jti FROM siwa.event_history e
         WHERE e.sub = r.sub AND e.event_type = 'consent-revoked' AND e.event_time = r.echo_event_time
         ORDER BY e.id LIMIT 1) AS echo ON r.echo_event_time IS NOT NULL;
COMMENT ON VIEW siwa.revocation_ledger IS
    'One row per revocation request: requested, attempts, Apple''s answer, completed, and the echoed consent-revoked matched to it.';
COMMENT ON COLUMN siwa.revocation_ledger.id IS 'The request''s id (what siwa.request_revocation returned).';
COMMENT ON COLUMN siwa.revocation_ledger.sub IS 'The user whose Apple tokens are to be revoked.';
COMMENT ON COLUMN siwa.revocation_ledger.reason IS 'The caller''s reason, e.g. account deleted in app.';
COMMENT ON COLUMN siwa.revocation_ledger.requested_at IS 'When the requesting transaction ran (it committed, or the row would not be here).';
COMMENT ON COLUMN siwa.revocation_ledger.attempts IS 'Calls to Apple made for it (a request found without a token counts none).';
COMMENT ON COLUMN siwa.revocation_ledger.last_attempt_at IS 'When the worker last handled it.';
COMMENT ON COLUMN siwa.revocation_ledger.next_attempt_at IS 'When a pending request is next due (backoff with jitter after a retryable failure).';
COMMENT ON COLUMN siwa.revocation_ledger.completed_at IS 'When it ended revoked, no_token or failed.';
COMMENT ON COLUMN siwa.revocation_ledger.state IS
    'pending (waiting or retrying), revoked (Apple answered 200 for every stored token; ciphertexts destroyed), no_token (nothing stored to revoke), failed (Apple refused for good, or the token could not be decrypted: see last_error).';
COMMENT ON COLUMN siwa.revocation_ledger.apple_answer IS
    'Apple''s last answer: 200, or the failure kind with its HTTP status (e.g. server_error (HTTP 503)).';
COMMENT ON COLUMN siwa.revocation_ledger.tokens_revoked IS 'Stored refresh tokens revoked at Apple and destroyed.';
COMMENT ON COLUMN siwa.revocation_ledger.echo_event_time IS 'event_time of the consent-revoked applied for the user after the request (Apple''s echo).';
COMMENT ON COLUMN siwa.revocation_ledger.echo_matched_at IS 'When the worker applied that consent-revoked.';
COMMENT ON COLUMN siwa.revocation_ledger.echo_jti IS 'The echoed notification''s jti (NULL once retention pruned it).';
COMMENT ON COLUMN siwa.revocation_ledger.last_error IS 'The last failure, without tokens or secrets.';

-- Roles of this section: siwa_signin (the sign-in API in siwa-receiver: grant it to the receiver's login
-- role when you turn the API on) and siwa_app (the app's account deletion).
DO $$
DECLARE
    v_role text;
    v_can_create boolean := (SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user);
BEGIN
    FOREACH v_role IN ARRAY ARRAY['siwa_signin', 'siwa_app'] LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role);
        IF NOT v_can_create THEN
            RAISE WARNING 'role % does not exist and % may not create it: create it (NOLOGIN) and apply schema.sql again',
                v_role, current_user;
            CONTINUE;
        END IF;
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
            EXECUTE format('COMMENT ON ROLE %I IS %L', v_role, CASE v_role
                WHEN 'siwa_signin' THEN
                    'Sign in with Apple: what the sign-in API (siwa-receiver --signin-listen) needs: record sign-ins and encrypted refresh tokens, request revocations. Grant to the receiver''s login role when the API is on.'
                ELSE
                    'Sign in with Apple: what the app needs: record, look up and revoke its sessions and refresh tokens, siwa.session_is_valid, siwa.request_revocation inside its account-deletion transaction. Grant to the app''s login role.'
                END);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END LOOP;
END;
$$;

-- ---------------------------------------------------------------------------------------------------
-- Moving users when the app changes teams (issue 14, item 3)
-- ---------------------------------------------------------------------------------------------------
--
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
-- Erasure finds a held email by the old sub (the rows that hold one are few: until applied).
CREATE INDEX IF NOT EXISTS transfer_imports_email_idx ON siwa.transfer_imports (old_sub) WHERE email IS NOT NULL;
COMMENT ON TABLE siwa.transfer_imports IS
    'siwactl transfer import''s progress (new team): per transfer identifier, the old sub, the new sub Apple exchanged it for, and the outcome: pending, exchanged (the email is held only until applied), failed (Apple''s error), applied, mismatch (the answer does not fit the account: detail says how), conflict (the new sub already has an account), duplicate (two transfer identifiers gave the same new sub: neither applied).';

CREATE TABLE IF NOT EXISTS siwa.sub_aliases (
    old_sub        text        PRIMARY KEY,
    new_sub        text        NOT NULL,
    transferred_at timestamptz NOT NULL DEFAULT now(),
    transfer_id    text        NOT NULL,
    CONSTRAINT sub_aliases_subs_check CHECK (old_sub <> '' AND new_sub <> '' AND old_sub <> new_sub)
);
COMMENT ON TABLE siwa.sub_aliases IS
    'Each sub a team transfer replaced, with the sub it became: the account, sessions, tokens and ledgers now carry new_sub; the history keeps old_sub (siwa.history_of finds both).';
CREATE INDEX IF NOT EXISTS sub_aliases_new_sub_idx ON siwa.sub_aliases (new_sub);

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
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('siwa.transfer', 0));
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

    -- Lock the accounts concerned, in sub order, as the worker does.
    PERFORM 1 FROM siwa.accounts a
     WHERE a.sub = ANY (p_old_subs) OR a.sub = ANY (p_new_subs)
     ORDER BY a.sub FOR UPDATE;
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
                        THEN 'conflict'
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
                        THEN 'the new sub already has an account or sign-in'
                    END AS why) AS x) AS c;

    v_apply_old := ARRAY(SELECT m.o FROM unnest(v_old, v_new, v_outcomes) AS m(o, n, r) WHERE m.r = 'applied');
    v_apply_new := ARRAY(SELECT m.n FROM unnest(v_old, v_new, v_outcomes) AS m(o, n, r) WHERE m.r = 'applied');
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
     WHERE m.r = 'applied' AND a.sub = m.n AND m.p AND m.e IS NOT NULL
       AND a.personal_data_erased_at IS NULL AND a.is_private_email IS DISTINCT FROM false;
    -- Earlier aliases of the old subs (a second transfer) follow to the newest sub.
    UPDATE siwa.sub_aliases a SET new_sub = m.n
      FROM unnest(v_apply_old, v_apply_new) AS m(o, n) WHERE a.new_sub = m.o;
    INSERT INTO siwa.sub_aliases (old_sub, new_sub, transfer_id)
    SELECT m.o, m.n, p_transfer_id FROM unnest(v_apply_old, v_apply_new) AS m(o, n);
    UPDATE siwa.transfer_imports i
       SET state = CASE m.r WHEN 'already' THEN 'applied' ELSE m.r END,
           new_sub = m.n, detail = m.why, email = NULL,
           applied_at = CASE WHEN m.r IN ('applied', 'already') THEN coalesce(i.applied_at, clock_timestamp()) END
      FROM unnest(v_old, v_new, v_outcomes, v_details) AS m(o, n, r, why)
     WHERE i.transfer_id = p_transfer_id AND i.old_sub = m.o;
    INSERT INTO siwa.sub_transfer_batches (transfer_id, users, outcomes, rewritten)
    SELECT p_transfer_id, cardinality(p_old_subs),
           (SELECT jsonb_object_agg(o.r, o.k)
              FROM (SELECT m.r, count(*) AS k FROM unnest(v_outcomes) AS m(r) GROUP BY m.r) AS o),
           v_rewritten;
    RETURN QUERY SELECT m.o, m.n, m.r, m.why FROM unnest(v_old, v_new, v_outcomes, v_details) AS m(o, n, r, why);
END;
$$;
COMMENT ON FUNCTION siwa.apply_sub_transfer(text, text[], text[], text[], boolean[]) IS
    'A team transfer''s rewrite of one batch (old subs, new subs, and Apple''s email and is_private_email for each): verifies, rewrites every sub column siwa.sub_columns lists, keeps the old subs in siwa.sub_aliases, records the batch in siwa.sub_transfer_batches. One row per user: applied, already, mismatch or conflict. Refuses the whole batch (23505) when a sub appears twice. Owner only unless granted.';

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

-- ---------------------------------------------------------------------------------------------------
-- Signed outbound webhooks (issue 12, items 4 and 5)
-- ---------------------------------------------------------------------------------------------------
--
-- Every change in siwa.changes is sent to every enabled endpoint whose types it matches, by siwa-worker,
-- as a Standard Webhooks message (webhook-id msg_<change id>_<endpoint id>, webhook-timestamp,
-- webhook-signature v1,… with each of the endpoint's live secrets; docs/webhooks.md).
--  - siwa.webhook_endpoints: where to send (https, or http to a loopback IP literal), which types, whether
--    enabled, and how many attempts may be in flight at once (max_in_flight).
--  - siwa.webhook_secrets: the endpoint's whsec_ secrets. A rotation gives the current one an expiry (the
--    overlap) and adds a new one; until the expiry both sign. Readable by siwa_worker and the owner only.
--  - siwa.webhook_slots: 64 lockable rows per endpoint. A claim (siwa.claim_webhook_delivery) locks the
--    first for its short transaction while it counts the endpoint's live leases, so at most
--    max_in_flight attempts to one endpoint run at once, across every worker process; no lock is held
--    during an attempt.
--  - siwa.webhook_deliveries: one row per change and endpoint, written by the AFTER INSERT trigger on
--    siwa.changes in the change's transaction. It holds no payload and no email: the body is built from
--    the change row at send time, so an erasure (email set NULL in the change) also erases what is sent
--    later. pending → delivered (a 2xx) or dead (the retry schedule ran out).
--  - siwa.webhook_attempts: every attempt (HTTP status or none, latency, the next attempt, a bounded error
--    text of our own words: never the secret, the body or the answer's body). Admins read
--    siwa.webhook_attempt_history.
-- Order: per endpoint and sub, a delivery is not attempted while an earlier change's delivery to that
-- endpoint is pending (in flight or waiting for a retry). So that a claim looks at queue heads only, not
-- at every waiting delivery, each delivery carries `ready`, kept by SQL alone: set by the fan-out for a
-- delivery with no pending one of its endpoint and sub ahead of it (it share-locks those ahead, so a
-- delivery being finished is waited for), passed on by siwa.record_webhook_attempt to the next one when
-- a delivery ends (delivered or dead), recomputed by replays, and repaired by siwa.repair_webhook_ready
-- (once a minute) for what a replay racing a finish could leave. The claim
-- checks the order itself as well, so a wrong hint can delay a delivery but never reorder one. A dead delivery no longer blocks the later ones:
-- the user's later changes go out rather than waiting forever, and a replay of the dead one then arrives
-- after them (receivers compare the body's timestamp, the event time; docs/webhooks.md).
-- Pruning: a change with a pending delivery must not be deleted (deleting a change deletes its delivery
-- history, ON DELETE CASCADE): the changefeed's pruning adds
--     AND NOT EXISTS (SELECT 1 FROM siwa.webhook_deliveries d WHERE d.change_id = c.id AND d.state = 'pending')
-- Every object here is new: created only when missing, functions replaced, never data dropped.

CREATE TABLE IF NOT EXISTS siwa.webhook_endpoints (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    url           text        NOT NULL,
    types         text[],
    enabled       boolean     NOT NULL DEFAULT true,
    max_in_flight integer     NOT NULL DEFAULT 4,
    created_at    timestamptz NOT NULL DEFAULT now(),
    disabled_at   timestamptz,
    -- https anywhere; plain http only to a loopback IP literal; never user:password@ in the URL.
    CONSTRAINT webhook_endpoints_url_check CHECK (
        length(url) <= 2000
        AND url !~ '[[:space:][:cntrl:]]'
        AND (url ~* '^https://[^/?#@]+([/?#]|$)'
             OR url ~* '^http://(127\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}|\[::1\])(:[0-9]{1,5})?([/?#]|$)')),
    CONSTRAINT webhook_endpoints_types_check CHECK (
        types IS NULL OR (cardinality(types) > 0 AND types <@ ARRAY['siwa.email_disabled', 'siwa.email_enabled',
            'siwa.consent_revoked', 'siwa.account_deleted', 'siwa.personal_data_erased'])),
    CONSTRAINT webhook_endpoints_max_in_flight_check CHECK (max_in_flight BETWEEN 1 AND 64)
);
COMMENT ON TABLE siwa.webhook_endpoints IS
    'Webhook endpoints (siwactl webhooks add): where siwa-worker sends each change, signed (Standard Webhooks).';
COMMENT ON COLUMN siwa.webhook_endpoints.types IS 'The change types sent here; NULL: every type.';
COMMENT ON COLUMN siwa.webhook_endpoints.enabled IS 'Whether new changes fan out here and pending deliveries are attempted.';
COMMENT ON COLUMN siwa.webhook_endpoints.max_in_flight IS 'Attempts to this endpoint at once, across all workers (1 to 64).';

CREATE TABLE IF NOT EXISTS siwa.webhook_secrets (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id bigint      NOT NULL REFERENCES siwa.webhook_endpoints (id) ON DELETE CASCADE,
    secret      text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    -- whsec_ and the standard base64 of 24 to 64 random bytes (Standard Webhooks).
    CONSTRAINT webhook_secrets_secret_check CHECK (
        secret ~ '^whsec_[A-Za-z0-9+/]+={0,2}$' AND length(secret) BETWEEN 6 + 32 AND 6 + 88)
);
COMMENT ON TABLE siwa.webhook_secrets IS
    'Webhook signing secrets (whsec_…): every secret of an endpoint not past expires_at signs. Readable by siwa_worker and the owner only.';
COMMENT ON COLUMN siwa.webhook_secrets.expires_at IS 'NULL: the current secret; else the end of its rotation overlap.';
CREATE INDEX IF NOT EXISTS webhook_secrets_endpoint_idx ON siwa.webhook_secrets (endpoint_id);

CREATE TABLE IF NOT EXISTS siwa.webhook_slots (
    endpoint_id bigint  NOT NULL REFERENCES siwa.webhook_endpoints (id) ON DELETE CASCADE,
    slot        integer NOT NULL,
    PRIMARY KEY (endpoint_id, slot)
);
COMMENT ON TABLE siwa.webhook_slots IS
    'Lockable rows per endpoint: a claim locks the first while it counts the endpoint''s live leases against siwa.webhook_endpoints.max_in_flight.';

CREATE TABLE IF NOT EXISTS siwa.webhook_deliveries (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    change_id        bigint      NOT NULL REFERENCES siwa.changes (id) ON DELETE CASCADE,
    endpoint_id      bigint      NOT NULL REFERENCES siwa.webhook_endpoints (id) ON DELETE CASCADE,
    sub              text        NOT NULL,
    state            text        NOT NULL DEFAULT 'pending',
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    first_attempt_at timestamptz,
    last_attempt_at  timestamptz,
    delivered_at     timestamptz,
    last_status      integer,
    last_error       text,
    ready            boolean     NOT NULL DEFAULT true,
    lease_owner      text,
    lease_expires_at timestamptz,
    CONSTRAINT webhook_deliveries_lease_check CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CONSTRAINT webhook_deliveries_state_check CHECK (state IN ('pending', 'delivered', 'dead')),
    CONSTRAINT webhook_deliveries_error_check CHECK (length(last_error) <= 300),
    UNIQUE (change_id, endpoint_id)
);
COMMENT ON TABLE siwa.webhook_deliveries IS
    'One row per change and webhook endpoint: pending, delivered (a 2xx) or dead. No payload, no email: the body is built from siwa.changes at send time.';
COMMENT ON COLUMN siwa.webhook_deliveries.ready IS
    'Whether it heads its endpoint and sub''s queue (no earlier change of the sub pending to the endpoint): only these are claimed. A hint kept by the fan-out, the worker and replays; the claim checks the order itself too.';
CREATE INDEX IF NOT EXISTS webhook_deliveries_ready_idx
    ON siwa.webhook_deliveries (next_attempt_at, id) WHERE state = 'pending' AND ready;
CREATE INDEX IF NOT EXISTS webhook_deliveries_order_idx
    ON siwa.webhook_deliveries (endpoint_id, sub, change_id) WHERE state = 'pending';

CREATE TABLE IF NOT EXISTS siwa.webhook_attempts (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id     bigint      NOT NULL REFERENCES siwa.webhook_deliveries (id) ON DELETE CASCADE,
    attempt         integer     NOT NULL,
    started_at      timestamptz NOT NULL,
    latency_ms      integer     NOT NULL,
    status          integer,
    outcome         text        NOT NULL,
    next_attempt_at timestamptz,
    error           text,
    CONSTRAINT webhook_attempts_outcome_check CHECK (outcome IN ('delivered', 'retry', 'dead')),
    CONSTRAINT webhook_attempts_error_check CHECK (length(error) <= 300)
);
COMMENT ON TABLE siwa.webhook_attempts IS 'Every webhook attempt; admins read siwa.webhook_attempt_history.';
CREATE INDEX IF NOT EXISTS webhook_attempts_delivery_idx ON siwa.webhook_attempts (delivery_id);

-- The fan-out: once per INSERT statement on siwa.changes (the worker's set-based pass inserts a batch's
-- changes in one), one delivery per new change and enabled endpoint whose types match, and one NOTIFY
-- siwa_webhooks (sent at commit) when there is any. SECURITY INVOKER: the inserting role (the worker, the
-- owner) needs SELECT on siwa.webhook_endpoints and INSERT on siwa.webhook_deliveries.
CREATE OR REPLACE FUNCTION siwa.webhook_fan_out() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- The pending deliveries ahead of the new ones, share-locked in change order (the order in which
    -- siwa.record_webhook_attempt locks them): a delivery being finished is waited for and then seen
    -- ended, and one not yet being finished cannot end before this transaction commits, when its
    -- finisher sees the new delivery. Either way `ready` is right when this transaction commits.
    PERFORM 1 FROM siwa.webhook_deliveries p
     WHERE p.state = 'pending'
       AND (p.endpoint_id, p.sub) IN (
           SELECT e.id, c.sub FROM new_changes c
             JOIN siwa.webhook_endpoints e ON e.enabled AND (e.types IS NULL OR c.type = ANY (e.types)))
     ORDER BY p.change_id, p.id
       FOR SHARE OF p;
    INSERT INTO siwa.webhook_deliveries (change_id, endpoint_id, sub, ready)
    SELECT c.id, e.id, c.sub,
           pg_catalog.row_number() OVER (PARTITION BY e.id, c.sub ORDER BY c.id) = 1
           AND NOT EXISTS (SELECT 1 FROM siwa.webhook_deliveries p
                            WHERE p.endpoint_id = e.id AND p.sub = c.sub AND p.state = 'pending')
      FROM new_changes c
      JOIN siwa.webhook_endpoints e ON e.enabled AND (e.types IS NULL OR c.type = ANY (e.types))
     ORDER BY c.id, e.id;
    IF FOUND THEN
        PERFORM pg_catalog.pg_notify('siwa_webhooks', '');
    END IF;
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION siwa.webhook_fan_out() IS
    'Statement trigger after INSERT on siwa.changes: one webhook delivery per new change and matching enabled endpoint.';
DROP TRIGGER IF EXISTS changes_webhook_fan_out ON siwa.changes;
CREATE TRIGGER changes_webhook_fan_out
    AFTER INSERT ON siwa.changes REFERENCING NEW TABLE AS new_changes
    FOR EACH STATEMENT EXECUTE FUNCTION siwa.webhook_fan_out();

-- Adds an endpoint with its secret and its slots; returns its id. For siwactl webhooks add (the owner).
CREATE OR REPLACE FUNCTION siwa.add_webhook_endpoint(p_url text, p_secret text, p_types text[] DEFAULT NULL,
                                                     p_max_in_flight integer DEFAULT 4) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO siwa.webhook_endpoints AS e (url, types, max_in_flight)
    VALUES (p_url, p_types, p_max_in_flight) RETURNING e.id INTO v_id;
    INSERT INTO siwa.webhook_secrets (endpoint_id, secret) VALUES (v_id, p_secret);
    INSERT INTO siwa.webhook_slots (endpoint_id, slot) SELECT v_id, s FROM generate_series(0, 63) s;
    RETURN v_id;
END;
$$;
COMMENT ON FUNCTION siwa.add_webhook_endpoint(text, text, text[], integer) IS
    'Adds a webhook endpoint with its first secret (siwactl webhooks add); returns its id.';

-- Rotates an endpoint's secret: the live ones expire after p_overlap (they sign until then), the new one
-- signs from now on; secrets already expired are deleted. Returns false for an unknown endpoint.
CREATE OR REPLACE FUNCTION siwa.rotate_webhook_secret(p_endpoint bigint, p_secret text, p_overlap interval)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM 1 FROM siwa.webhook_endpoints e WHERE e.id = p_endpoint FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_overlap IS NULL OR p_overlap < interval '0' THEN
        RAISE EXCEPTION 'the overlap must not be negative' USING ERRCODE = '22023';
    END IF;
    DELETE FROM siwa.webhook_secrets s WHERE s.endpoint_id = p_endpoint AND s.expires_at <= now();
    UPDATE siwa.webhook_secrets s SET expires_at = now() + p_overlap
     WHERE s.endpoint_id = p_endpoint AND (s.expires_at IS NULL OR s.expires_at > now() + p_overlap);
    INSERT INTO siwa.webhook_secrets (endpoint_id, secret) VALUES (p_endpoint, p_secret);
    RETURN true;
END;
$$;
COMMENT ON FUNCTION siwa.rotate_webhook_secret(bigint, text, interval) IS
    'Adds a new signing secret; the live ones keep signing for the overlap (siwactl webhooks rotate-secret).';

-- Puts deliveries back to pending with a fresh retry schedule (same webhook-id: receivers dedupe on it):
-- one delivery; every delivery of one change; or, for one endpoint, every change applied in
-- [p_since, p_until) that matches its types, creating the deliveries it never had (an endpoint added
-- later, or disabled meanwhile). Pending ones are left as they are. Returns how many were queued.
CREATE OR REPLACE FUNCTION siwa.replay_webhook_deliveries(
    p_delivery bigint DEFAULT NULL, p_change bigint DEFAULT NULL, p_endpoint bigint DEFAULT NULL,
    p_since timestamptz DEFAULT NULL, p_until timestamptz DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_count     integer;
    v_endpoints bigint[];
BEGIN
    IF num_nonnulls(p_delivery, p_change, p_endpoint) <> 1 THEN
        RAISE EXCEPTION 'give exactly one of a delivery, a change or an endpoint' USING ERRCODE = '22023';
    END IF;
    IF p_endpoint IS NULL AND (p_since IS NOT NULL OR p_until IS NOT NULL) THEN
        RAISE EXCEPTION 'a time range needs an endpoint' USING ERRCODE = '22023';
    END IF;
    IF p_endpoint IS NULL THEN
        WITH replayed AS (
            UPDATE siwa.webhook_deliveries d
               SET state = 'pending', attempts = 0, next_attempt_at = now(), first_attempt_at = NULL,
                   delivered_at = NULL
             WHERE d.state <> 'pending' AND (d.id = p_delivery OR d.change_id = p_change)
            RETURNING d.endpoint_id)
        SELECT count(*), array_agg(DISTINCT r.endpoint_id) INTO v_count, v_endpoints FROM replayed r;
    ELSE
        v_endpoints := ARRAY[p_endpoint];
        WITH upserted AS (
            INSERT INTO siwa.webhook_deliveries AS d (change_id, endpoint_id, sub)
            SELECT c.id, e.id, c.sub
              FROM siwa.webhook_endpoints e
              JOIN siwa.changes c ON (e.types IS NULL OR c.type = ANY (e.types))
             WHERE e.id = p_endpoint
               AND c.applied_at >= coalesce(p_since, '-infinity') AND c.applied_at < coalesce(p_until, 'infinity')
             ORDER BY c.id
            ON CONFLICT (change_id, endpoint_id) DO UPDATE
               SET state = 'pending', attempts = 0, next_attempt_at = now(), first_attempt_at = NULL,
                   delivered_at = NULL
             WHERE d.state <> 'pending'
            RETURNING 1)
        SELECT count(*) INTO v_count FROM upserted;
    END IF;
    -- Queue heads again: a replayed delivery goes before the later pending ones of its sub.
    UPDATE siwa.webhook_deliveries d SET ready = (d.change_id = h.head)
      FROM (SELECT q.endpoint_id, q.sub, min(q.change_id) AS head FROM siwa.webhook_deliveries q
             WHERE q.state = 'pending' AND q.endpoint_id = ANY (v_endpoints) GROUP BY q.endpoint_id, q.sub) h
     WHERE d.endpoint_id = h.endpoint_id AND d.sub = h.sub AND d.state = 'pending'
       AND d.ready <> (d.change_id = h.head);
    IF v_count > 0 THEN
        PERFORM pg_catalog.pg_notify('siwa_webhooks', '');
    END IF;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION siwa.replay_webhook_deliveries(bigint, bigint, bigint, timestamptz, timestamptz) IS
    'Queues deliveries again (siwactl webhooks replay): by delivery, by change, or by endpoint and applied_at range.';

-- What admins read: endpoints without their secrets, and every attempt.
CREATE OR REPLACE VIEW siwa.webhook_endpoint_overview AS
SELECT e.id, e.url, e.types, e.enabled, e.max_in_flight, e.created_at, e.disabled_at,
       (SELECT count(*) FROM siwa.webhook_secrets s
         WHERE s.endpoint_id = e.id AND (s.expires_at IS NULL OR s.expires_at > now())) AS live_secrets,
       (SELECT count(*) FROM siwa.webhook_deliveries d WHERE d.endpoint_id = e.id AND d.state = 'pending') AS pending,
       (SELECT count(*) FROM siwa.webhook_deliveries d WHERE d.endpoint_id = e.id AND d.state = 'dead') AS dead,
       (SELECT max(d.delivered_at) FROM siwa.webhook_deliveries d WHERE d.endpoint_id = e.id) AS last_delivered_at
  FROM siwa.webhook_endpoints e;
COMMENT ON VIEW siwa.webhook_endpoint_overview IS
    'Webhook endpoints with their delivery counts; never their secrets.';

CREATE OR REPLACE VIEW siwa.webhook_attempt_history AS
SELECT a.id, d.id AS delivery_id, 'msg_' || d.change_id || '_' || d.endpoint_id AS webhook_id,
       d.change_id, d.endpoint_id, c.type, d.sub, a.attempt, a.started_at, a.latency_ms, a.status, a.outcome,
       a.next_attempt_at, a.error, d.state AS delivery_state
  FROM siwa.webhook_attempts a
  JOIN siwa.webhook_deliveries d ON d.id = a.delivery_id
  JOIN siwa.changes c ON c.id = d.change_id;
COMMENT ON VIEW siwa.webhook_attempt_history IS
    'Every webhook attempt: status (NULL: no answer), latency, outcome, when the next is due, a bounded error text (never a secret, body or email).';
COMMENT ON COLUMN siwa.webhook_attempt_history.webhook_id IS 'The webhook-id header, the same for every attempt of a delivery.';
COMMENT ON COLUMN siwa.webhook_attempt_history.status IS 'The HTTP status answered; NULL when there was no answer (timeout, refused, TLS).';
COMMENT ON COLUMN siwa.webhook_attempt_history.outcome IS 'delivered (2xx), retry (next_attempt_at says when) or dead (the schedule ran out).';

CREATE OR REPLACE VIEW siwa.webhook_delivery_status AS
SELECT d.id, 'msg_' || d.change_id || '_' || d.endpoint_id AS webhook_id, d.change_id, d.endpoint_id, c.type,
       d.sub, d.state, d.attempts, d.next_attempt_at, d.created_at, d.first_attempt_at, d.last_attempt_at,
       d.delivered_at, d.last_status, d.last_error
  FROM siwa.webhook_deliveries d
  JOIN siwa.changes c ON c.id = d.change_id;
COMMENT ON VIEW siwa.webhook_delivery_status IS
    'One row per change and webhook endpoint: pending, delivered or dead, with attempts and the last answer.';
COMMENT ON COLUMN siwa.webhook_endpoint_overview.id IS 'The endpoint''s id (siwactl webhooks --endpoint ID).';
COMMENT ON COLUMN siwa.webhook_endpoint_overview.url IS 'Where deliveries are POSTed.';
COMMENT ON COLUMN siwa.webhook_endpoint_overview.types IS 'The change types sent here; NULL: every type.';
COMMENT ON COLUMN siwa.webhook_endpoint_overview.enabled IS 'Whether changes fan out here and pending deliveries are attempted.';
COMMENT ON COLUMN siwa.webhook_endpoint_overview.max_in_flight IS 'Attempts to this endpoint at once, across all workers.';
COMMENT ON COLUMN siwa.webhook_endpoint_overview.created_at IS 'When the endpoint was added.';
COMMENT ON COLUMN siwa.webhook_endpoint_overview.disabled_at IS 'When it was disabled; NULL while enabled.';
COMMENT ON COLUMN siwa.webhook_endpoint_overview.live_secrets IS 'Secrets that sign now: 2 during a rotation''s overlap, else 1.';
COMMENT ON COLUMN siwa.webhook_endpoint_overview.pending IS 'Deliveries not yet delivered or dead.';
COMMENT ON COLUMN siwa.webhook_endpoint_overview.dead IS 'Deliveries given up after the retry schedule (siwactl webhooks replay).';
COMMENT ON COLUMN siwa.webhook_endpoint_overview.last_delivered_at IS 'When a delivery to it last got a 2xx.';
COMMENT ON COLUMN siwa.webhook_attempt_history.id IS 'The attempt''s id (attempt order).';
COMMENT ON COLUMN siwa.webhook_attempt_history.delivery_id IS 'The delivery (siwa.webhook_delivery_status.id).';
COMMENT ON COLUMN siwa.webhook_attempt_history.change_id IS 'The change sent (siwa.changes.id).';
COMMENT ON COLUMN siwa.webhook_attempt_history.endpoint_id IS 'The endpoint it was sent to.';
COMMENT ON COLUMN siwa.webhook_attempt_history.type IS 'The change''s type, e.g. siwa.consent_revoked.';
COMMENT ON COLUMN siwa.webhook_attempt_history.sub IS 'The user''s team-scoped Apple identifier.';
COMMENT ON COLUMN siwa.webhook_attempt_history.attempt IS 'Which attempt of the delivery (1, 2, …; a replay starts again at 1).';
COMMENT ON COLUMN siwa.webhook_attempt_history.started_at IS 'When the attempt was signed and sent.';
COMMENT ON COLUMN siwa.webhook_attempt_history.latency_ms IS 'How long the HTTP exchange took (or until it failed).';
COMMENT ON COLUMN siwa.webhook_attempt_history.next_attempt_at IS 'When the next attempt is due after a retry outcome; NULL otherwise.';
COMMENT ON COLUMN siwa.webhook_attempt_history.error IS 'Why it failed, in our own words (HTTP 503, timeout: …); never a secret, a body or an email.';
COMMENT ON COLUMN siwa.webhook_attempt_history.delivery_state IS 'The delivery''s state now: pending, delivered or dead.';
COMMENT ON COLUMN siwa.webhook_delivery_status.id IS 'The delivery''s id (siwactl webhooks replay --delivery ID).';
COMMENT ON COLUMN siwa.webhook_delivery_status.webhook_id IS 'The webhook-id header: msg_<change_id>_<endpoint_id>, the same for every attempt.';
COMMENT ON COLUMN siwa.webhook_delivery_status.change_id IS 'The change sent (siwa.changes.id).';
COMMENT ON COLUMN siwa.webhook_delivery_status.endpoint_id IS 'The endpoint it is sent to.';
COMMENT ON COLUMN siwa.webhook_delivery_status.type IS 'The change''s type, e.g. siwa.consent_revoked.';
COMMENT ON COLUMN siwa.webhook_delivery_status.sub IS 'The user''s team-scoped Apple identifier.';
COMMENT ON COLUMN siwa.webhook_delivery_status.state IS 'pending (waiting, in flight or retrying), delivered (a 2xx) or dead (the schedule ran out).';
COMMENT ON COLUMN siwa.webhook_delivery_status.attempts IS 'Attempts made (since the last replay).';
COMMENT ON COLUMN siwa.webhook_delivery_status.next_attempt_at IS 'When a pending delivery is next due.';
COMMENT ON COLUMN siwa.webhook_delivery_status.created_at IS 'When the change fanned out to this endpoint.';
COMMENT ON COLUMN siwa.webhook_delivery_status.first_attempt_at IS 'When the first attempt (since the last replay) was made; the retry schedule runs from here.';
COMMENT ON COLUMN siwa.webhook_delivery_status.last_attempt_at IS 'When the last attempt was made.';
COMMENT ON COLUMN siwa.webhook_delivery_status.delivered_at IS 'When the endpoint answered 2xx.';
COMMENT ON COLUMN siwa.webhook_delivery_status.last_status IS 'The last HTTP status answered; NULL when there was no answer.';
COMMENT ON COLUMN siwa.webhook_delivery_status.last_error IS 'The last failure, in our own words; never a secret, a body or an email.';

-- ---------------------------------------------------------------------------------------------------
-- Month partitions ahead, and change 3, the rows
-- ---------------------------------------------------------------------------------------------------
--
-- Change 3 (above) renamed version 2's siwa.notifications to siwa.notifications_v2; its rows move here,
-- in the same transaction and under the migrate lock, into the log (ids, states, attempts, errors,
-- erasure as they were; a month partition for every month of issued_at they cover) and, while pending,
-- into the queue (next attempt, attempts, busy state, error). The old table is dropped only after that.
DO $$
DECLARE
    v_month date;
    v_max   bigint;
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('siwa.migrate', 0));
    IF pg_catalog.to_regclass('siwa.notifications_v2') IS NOT NULL THEN
        FOR v_month IN
            SELECT DISTINCT pg_catalog.date_trunc('month', o.issued_at AT TIME ZONE 'UTC')::date
              FROM siwa.notifications_v2 o
        LOOP
            PERFORM siwa.create_log_partition(v_month);
        END LOOP;
        INSERT INTO siwa.notification_log (id, jti, event_type, sub, audience, email, is_private_email,
                                           event_time, issued_at, expires_at, raw_token, received_at, state,
                                           attempts, applied_at, last_error, personal_data_erased_at)
        OVERRIDING SYSTEM VALUE
        SELECT o.id, o.jti, o.event_type, o.sub, o.audience, o.email, o.is_private_email, o.event_time,
               o.issued_at, o.expires_at, o.raw_token, o.received_at, o.state, o.attempts, o.applied_at,
               o.last_error, o.personal_data_erased_at
          FROM siwa.notifications_v2 o
         ORDER BY o.id;
        -- The pending ones are queued, with their next attempt, attempts, busy state and error.
        INSERT INTO siwa.notification_queue (id, jti, issued_at, received_at, next_attempt_at, attempts,
                                             busy_since, last_error)
        SELECT o.id, o.jti, o.issued_at, o.received_at, o.next_attempt_at, o.attempts, o.busy_since, o.last_error
          FROM siwa.notifications_v2 o
         WHERE o.state = 'pending';
        -- Dedupe keys of the tokens still inside the window (version 2 kept every jti unique forever;
        -- past the window the receiver refuses a token for its age).
        INSERT INTO siwa.notification_jtis (jti, issued_at, expires_at)
        SELECT o.jti, o.issued_at, o.expires_at
          FROM siwa.notifications_v2 o
         WHERE o.issued_at >= pg_catalog.now() - interval '7 days' OR o.expires_at > pg_catalog.now();
        v_max := (SELECT pg_catalog.max(o.id) FROM siwa.notifications_v2 o);
        IF v_max IS NOT NULL THEN
            PERFORM pg_catalog.setval(pg_catalog.pg_get_serial_sequence('siwa.notification_log', 'id'), v_max);
        END IF;
        IF (SELECT pg_catalog.count(*) FROM siwa.notifications_v2)
           <> (SELECT pg_catalog.count(*) FROM siwa.notification_log l
                WHERE l.id <= coalesce(v_max, 0)) THEN
            RAISE EXCEPTION 'change 3 did not move every notification; nothing was changed';
        END IF;
        DROP TABLE siwa.notifications_v2;
        DROP FUNCTION IF EXISTS siwa.notify_workers_requeued();
        DROP FUNCTION IF EXISTS siwa.notify_workers();
    END IF;
    -- This month and the next (the worker's maintenance keeps it so). Only one ahead: every statement
    -- on the log that cannot prune by issued_at (erasure by sub) plans and opens every partition.
    PERFORM siwa.create_log_partitions(1);
END;
$$;

-- Nothing in schema siwa is usable by PUBLIC: functions are executable by everyone by default.
REVOKE ALL ON SCHEMA siwa FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA siwa FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA siwa FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA siwa FROM PUBLIC;

DO $$
DECLARE
    v_role     text;
    v_function regprocedure;
    v_can_create boolean := (SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user);
BEGIN
    FOREACH v_role IN ARRAY ARRAY['siwa_admin', 'siwa_receiver', 'siwa_worker'] LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role);
        IF NOT v_can_create THEN
            RAISE WARNING 'role % does not exist and % may not create it: create it (NOLOGIN) and apply schema.sql again',
                v_role, current_user;
            CONTINUE;
        END IF;
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
            EXECUTE format('COMMENT ON ROLE %I IS %L', v_role, CASE v_role
                WHEN 'siwa_admin' THEN
                    'Sign in with Apple notifications: read the admin views siwa.event_history, siwa.account_overview, siwa.queue_health (docs/sql.md). Grant to people.'
                WHEN 'siwa_receiver' THEN
                    'Sign in with Apple notifications: what siwa-receiver needs (INSERT into siwa.notification_log). Grant to its login role.'
                ELSE
                    'Sign in with Apple notifications: what siwa-worker needs (apply, retry, prune, erase). Grant to its login role.'
                END);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL; -- created meanwhile by a concurrent run of this file in another database
        END;
    END LOOP;

    -- siwa_admin: read the three views, nothing else (views read their tables with the owner's rights).
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_admin') THEN
        GRANT USAGE ON SCHEMA siwa TO siwa_admin;
        GRANT SELECT ON siwa.event_history, siwa.account_overview, siwa.queue_health, siwa.changefeed
            TO siwa_admin;
    END IF;

    -- siwa_receiver: INSERT … ON CONFLICT (jti) DO NOTHING RETURNING jti, issued_at into the dedupe keys
    -- (jti, issued_at, expires_at), then INSERT … ON CONFLICT (jti, issued_at) DO NOTHING RETURNING id,
    -- jti, issued_at into the log, of exactly the columns the receiver writes (the state, attempts and error columns keep
    -- their defaults: it cannot store a row already applied; personal_data_erased_at it may set, for a
    -- row it stores without email and token), which needs SELECT on those three columns and on no other
    -- (not sub, email, raw_token or the outcome); and INSERT of (id, jti, issued_at) into the queue, the
    -- rest keeping its defaults. A queue row is worth no more to a stolen receiver role than the new
    -- notification it can store anyway. A table-wide INSERT grant (as version 1 had on its table) is
    -- revoked first (which revokes column grants too). The receiver reads two columns of siwa.accounts
    -- to store nothing personal of an erased account.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_receiver') THEN
        GRANT USAGE ON SCHEMA siwa TO siwa_receiver;
        REVOKE INSERT ON siwa.notification_log FROM siwa_receiver;
        GRANT INSERT (jti, event_type, sub, audience, email, is_private_email, event_time, issued_at,
                      expires_at, raw_token, personal_data_erased_at)
            ON siwa.notification_log TO siwa_receiver;
        GRANT SELECT (id, jti, issued_at) ON siwa.notification_log TO siwa_receiver;
        REVOKE INSERT ON siwa.notification_jtis FROM siwa_receiver;
        GRANT INSERT (jti, issued_at, expires_at), SELECT (jti, issued_at) ON siwa.notification_jtis TO siwa_receiver;
        REVOKE INSERT ON siwa.notification_queue FROM siwa_receiver;
        GRANT INSERT (id, jti, issued_at) ON siwa.notification_queue TO siwa_receiver;
        GRANT SELECT (sub, personal_data_erased_at) ON siwa.accounts TO siwa_receiver;
    END IF;

    -- siwa_worker: the worker's functions and everything they touch, as the worker (SECURITY INVOKER).
    -- Functions are matched by name so that every overload (and a function added later to this list's
    -- family) is covered when it exists; LISTEN needs no grant. UPDATE on siwa.accounts is also what lets
    -- the worker hold a user's row lock, the per-user serialisation no other role here can take.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT USAGE ON SCHEMA siwa TO siwa_worker;
        GRANT SELECT, UPDATE ON siwa.notification_log TO siwa_worker;
        GRANT SELECT ON siwa.notifications TO siwa_worker;  -- the view of the two, nothing more
        GRANT SELECT, UPDATE, DELETE ON siwa.notification_queue TO siwa_worker;
        GRANT SELECT, DELETE ON siwa.notification_jtis TO siwa_worker;
        GRANT SELECT, UPDATE ON siwa.retention_state TO siwa_worker;
        GRANT SELECT, INSERT, UPDATE ON siwa.accounts TO siwa_worker;
        GRANT SELECT, UPDATE ON siwa.sessions, siwa.refresh_tokens TO siwa_worker;
        GRANT SELECT ON siwa.settings TO siwa_worker;
        GRANT SELECT, INSERT, UPDATE, DELETE ON siwa.changes TO siwa_worker;
        GRANT SELECT, UPDATE ON siwa.changes_counter TO siwa_worker;
        -- The set-based pass takes its changes' ids before it inserts them (numbered, last).
        EXECUTE format('GRANT USAGE ON SEQUENCE %s TO siwa_worker',
                       pg_catalog.pg_get_serial_sequence('siwa.changes', 'id'));
        FOR v_function IN
            SELECT p.oid::regprocedure
              FROM pg_proc p
             WHERE p.pronamespace = 'siwa'::regnamespace
               AND p.proname IN ('process_due_notifications', 'process_notification',
                                 'process_claimed_notification', 'apply_notification', 'record_failure',
                                 'prune', 'erase_due_personal_data', 'erase_personal_data', 'on_event',
                                 'redact_error', 'erased_error', 'create_log_partitions',
                                 'drop_log_partitions', 'apply_claimed_batch', 'erase_personal_data_of',
                                 'number_changes', 'change_type', 'hook_path', 'on_change')
        LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO siwa_worker', v_function);
        END LOOP;
    END IF;
END;
$$;

-- Grants of the sign-in and revocation section (see its comment above).
DO $$
DECLARE
    v_function regprocedure;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_admin') THEN
        GRANT SELECT ON siwa.revocation_ledger TO siwa_admin;
    END IF;
    -- siwa_app: request a revocation, nothing else: it inserts exactly sub and reason and reads back the
    -- id; it cannot read the ledger, the errors, the tokens or their ciphertexts.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_app') THEN
        GRANT USAGE ON SCHEMA siwa TO siwa_app;
        GRANT INSERT (sub, reason) ON siwa.revocation_requests TO siwa_app;
        GRANT SELECT (id) ON siwa.revocation_requests TO siwa_app;
        GRANT EXECUTE ON FUNCTION siwa.request_revocation(text, text) TO siwa_app;
        -- Its sessions and refresh tokens: record, look up, revoke (and correct created_at, which the
        -- validity trigger checks); never a refresh token's ciphertext or hash (it finds its tokens by id
        -- or sub; a duplicate token is a unique violation, 23505). The validity rule (the function
        -- and the trigger, both SECURITY INVOKER) reads three columns of siwa.accounts: whether and when
        -- the user revoked consent or deleted the account, what the app learns from the rule anyway.
        GRANT SELECT, INSERT (id, sub, created_at, revoked_at, revoke_reason),
              UPDATE (created_at, revoked_at, revoke_reason)
            ON siwa.sessions TO siwa_app;
        GRANT SELECT (id, sub, client_id, created_at, revoked_at, revoke_reason),
              INSERT (sub, client_id, token_sha256, token_ciphertext, created_at, revoked_at, revoke_reason),
              UPDATE (created_at, revoked_at, revoke_reason)
            ON siwa.refresh_tokens TO siwa_app;
        GRANT SELECT (sub, consent_revoked_at, deleted_at, personal_data_erased_at) ON siwa.accounts TO siwa_app;
        GRANT EXECUTE ON FUNCTION siwa.session_is_valid(text, timestamptz) TO siwa_app;
        -- The changefeed, through its view only (never siwa.changes, its unnumbered rows or the counter).
        GRANT SELECT ON siwa.changefeed TO siwa_app;
    END IF;
    -- siwa_signin: record sign-ins (codes, accounts' email, sign-ins, encrypted refresh tokens it may
    -- insert but never read back), and request revocations.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_signin') THEN
        GRANT USAGE ON SCHEMA siwa TO siwa_signin;
        GRANT SELECT, INSERT, UPDATE, DELETE ON siwa.sign_in_codes TO siwa_signin;
        GRANT SELECT, INSERT, UPDATE ON siwa.sign_ins TO siwa_signin;
        GRANT SELECT (sub, email, is_private_email, consent_revoked_at, deleted_at, personal_data_erased_at),
              INSERT (sub, email, is_private_email),
              UPDATE (email, is_private_email, updated_at)
            ON siwa.accounts TO siwa_signin;
        GRANT INSERT (sub, client_id, token_sha256, token_ciphertext) ON siwa.refresh_tokens TO siwa_signin;
        GRANT SELECT (token_sha256) ON siwa.refresh_tokens TO siwa_signin;
        GRANT INSERT (sub, reason) ON siwa.revocation_requests TO siwa_signin;
        GRANT SELECT (id) ON siwa.revocation_requests TO siwa_signin;
        FOR v_function IN
            SELECT p.oid::regprocedure FROM pg_proc p
             WHERE p.pronamespace = 'siwa'::regnamespace
               AND p.proname IN ('begin_sign_in', 'abandon_sign_in', 'record_sign_in', 'sign_in_identity',
                                 'request_revocation')
        LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO siwa_signin', v_function);
        END LOOP;
    END IF;
    -- siwa_worker: the revoker claims and updates requests, and (already granted above) reads and
    -- destroys refresh-token ciphertexts; applying a consent-revoked marks the echo (a trigger).
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT SELECT, UPDATE ON siwa.revocation_requests TO siwa_worker;
        -- The revoker forgets sign-in codes a day old (Apple's codes live five minutes).
        GRANT SELECT (created_at), DELETE ON siwa.sign_in_codes TO siwa_worker;
        -- The refresh-token check: its bookkeeping, and consent-revoked events of our own.
        GRANT SELECT, INSERT, UPDATE ON siwa.refresh_token_checks TO siwa_worker;
        GRANT EXECUTE ON FUNCTION siwa.record_consent_lost(text, text) TO siwa_worker;
    END IF;
END;
$$;

-- Grants of the team-transfer section: admins read the aliases, the batches and the rewrite list and
-- find history by either sub; the worker resolves aliases when it claims notifications (and when it
-- erases a user's history). The progress tables (an exchanged row holds an email until applied) and
-- siwa.apply_sub_transfer are the owner's (siwactl transfer runs as the owner, as migrate does).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_admin') THEN
        GRANT SELECT ON siwa.sub_aliases, siwa.sub_transfer_batches, siwa.sub_columns TO siwa_admin;
        GRANT EXECUTE ON FUNCTION siwa.history_of(text) TO siwa_admin;
    END IF;
    -- Every role that creates accounts reads the aliases (the guard trigger above).
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_signin') THEN
        GRANT SELECT (old_sub) ON siwa.sub_aliases TO siwa_signin;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT SELECT ON siwa.sub_aliases TO siwa_worker;
        -- Erasure drops the email an import holds (siwa.erase_personal_data_of).
        GRANT SELECT (old_sub, email), UPDATE (email) ON siwa.transfer_imports TO siwa_worker;
    END IF;
END;
$$;

-- Grants of the webhooks section. Secrets (siwa.webhook_secrets) are readable by siwa_worker and the
-- owner only: siwa_admin reads the three views (never a secret), siwa_app nothing of webhooks. The worker
-- inserts deliveries (the fan-out trigger runs as the role inserting the change, and share-locks the
-- pending ones ahead: FOR SHARE needs UPDATE), claims and updates them, records attempts, reads
-- endpoints and secrets, and locks slots (FOR UPDATE needs UPDATE).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_admin') THEN
        GRANT SELECT ON siwa.webhook_endpoint_overview, siwa.webhook_attempt_history, siwa.webhook_delivery_status
            TO siwa_admin;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT SELECT ON siwa.changes TO siwa_worker;
        GRANT SELECT ON siwa.webhook_endpoints, siwa.webhook_secrets TO siwa_worker;
        GRANT SELECT, UPDATE ON siwa.webhook_slots TO siwa_worker;
        GRANT SELECT, INSERT, UPDATE ON siwa.webhook_deliveries TO siwa_worker;
        GRANT SELECT, INSERT ON siwa.webhook_attempts TO siwa_worker;
        GRANT EXECUTE ON FUNCTION siwa.webhook_fan_out() TO siwa_worker;
    END IF;
END;
$$;

-- ---------------------------------------------------------------------------------------------------
-- Health: service heartbeats and the gauges behind /metrics (issue 14)
-- ---------------------------------------------------------------------------------------------------
--
-- Every siwa-receiver and siwa-worker process upserts its row here every few seconds (and deletes rows
-- of its own kind not seen for a day), so that `siwactl doctor --database-url` can tell whether workers
-- are alive and which audiences the receivers accept. Row-level security keeps each role to the rows of
-- its own kind: a receiver cannot fake a live worker. Both objects are new: no numbered change.

CREATE TABLE IF NOT EXISTS siwa.service_heartbeats (
    kind       text        NOT NULL,
    host       text        NOT NULL,
    pid        integer     NOT NULL,
    version    text        NOT NULL,
    audiences  text[]      NOT NULL DEFAULT '{}',
    started_at timestamptz NOT NULL,
    last_seen  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT service_heartbeats_pkey PRIMARY KEY (kind, host, pid),
    CONSTRAINT service_heartbeats_kind_check CHECK (kind IN ('receiver', 'worker')),
    CONSTRAINT service_heartbeats_host_check CHECK (length(host) BETWEEN 1 AND 255),
    CONSTRAINT service_heartbeats_version_check CHECK (length(version) BETWEEN 1 AND 100),
    CONSTRAINT service_heartbeats_audiences_check CHECK (cardinality(audiences) <= 1000)
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
REVOKE ALL ON FUNCTION siwa.health_gauges(timestamptz) FROM PUBLIC;

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
REVOKE ALL ON FUNCTION siwa.client_ids_in_use(timestamptz) FROM PUBLIC;

-- Grants and row-level policies of this section: each service role reads and writes the heartbeats of
-- its own kind only (to upsert its row and prune stale ones); siwa_admin reads them all.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_receiver') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON siwa.service_heartbeats TO siwa_receiver;
        GRANT EXECUTE ON FUNCTION siwa.health_gauges(timestamptz) TO siwa_receiver;
        DROP POLICY IF EXISTS service_heartbeats_receiver ON siwa.service_heartbeats;
        CREATE POLICY service_heartbeats_receiver ON siwa.service_heartbeats TO siwa_receiver
            USING (kind = 'receiver') WITH CHECK (kind = 'receiver');
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON siwa.service_heartbeats TO siwa_worker;
        GRANT EXECUTE ON FUNCTION siwa.health_gauges(timestamptz) TO siwa_worker;
        DROP POLICY IF EXISTS service_heartbeats_worker ON siwa.service_heartbeats;
        CREATE POLICY service_heartbeats_worker ON siwa.service_heartbeats TO siwa_worker
            USING (kind = 'worker') WITH CHECK (kind = 'worker');
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_admin') THEN
        GRANT SELECT ON siwa.service_heartbeats TO siwa_admin;
        GRANT EXECUTE ON FUNCTION siwa.health_gauges(timestamptz) TO siwa_admin;
        GRANT EXECUTE ON FUNCTION siwa.client_ids_in_use(timestamptz) TO siwa_admin;
        DROP POLICY IF EXISTS service_heartbeats_admin ON siwa.service_heartbeats;
        CREATE POLICY service_heartbeats_admin ON siwa.service_heartbeats FOR SELECT TO siwa_admin USING (true);
    END IF;
END;
$$;

-- ---------------------------------------------------------------------------------------------------
-- Consumer queues: claims with a lease, and every transition of the webhook, revocation and heartbeat
-- queues
-- ---------------------------------------------------------------------------------------------------
--
-- A consumer that calls out over the network (a webhook lane POSTing to an endpoint, the revoker
-- calling Apple) never holds a row lock or a transaction across the call:
--   1. claim: one short transaction picks a due row (FOR UPDATE SKIP LOCKED, so concurrent claimers
--      never wait for each other), writes a lease (lease_owner, lease_expires_at) and commits;
--   2. call out, with no transaction open;
--   3. record: one short transaction writes the result, only if the lease is still the caller's
--      (lease_owner matches); a lease taken over by another consumer makes the record a no-op (false,
--      or 'lost').
-- A lease that expired (its process died, or hung past the lease) is rescued by the next claim: the
-- claim takes rows whose lease is missing or expired, under FOR UPDATE SKIP LOCKED, so exactly one
-- claimer takes it over. The attempt counter is raised when an attempt is recorded: an attempt whose
-- process died before recording it is not counted (as when a transaction never committed).
-- Every function here is SECURITY INVOKER (the caller's grants and row policies apply) with the pinned
-- search_path, and executable only by the role whose process calls it (grants at the end).

-- The webhook lanes' claim: the first due delivery that heads its endpoint and sub's queue (`ready`
-- and no earlier pending delivery of the pair, leased or not, so per-user order holds), of an enabled
-- endpoint not in p_skip, due by p_due_by (a drain passes its start: it never retries what it just
-- tried), not leased or with an expired lease. 'claimed': the lease is written (p_lease long); the row carries what the POST needs (URL, live secrets newest first). 'saturated':
-- the endpoint already has max_in_flight live leases (counted under its row's lock, so two workers
-- cannot both take the last one): nothing is written; the caller skips the endpoint this pass. No row:
-- nothing is claimable.
CREATE OR REPLACE FUNCTION siwa.claim_webhook_delivery(p_owner text, p_lease interval,
                                                       p_skip bigint[] DEFAULT '{}',
                                                       p_due_by timestamptz DEFAULT NULL)
RETURNS TABLE (outcome text, delivery_id bigint, change_id bigint, endpoint_id bigint, attempt integer,
               first_attempt_at timestamptz, url text, secrets text[])
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_delivery siwa.webhook_deliveries%ROWTYPE;
    v_endpoint siwa.webhook_endpoints%ROWTYPE;
    v_in_flight integer;
BEGIN
    IF p_owner IS NULL OR p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION 'a claim needs an owner and a positive lease' USING ERRCODE = '22023';
    END IF;
    SELECT d.* INTO v_delivery
      FROM siwa.webhook_deliveries d
      JOIN siwa.webhook_endpoints e ON e.id = d.endpoint_id
     WHERE d.state = 'pending' AND d.ready AND e.enabled
       AND d.next_attempt_at <= coalesce(p_due_by, pg_catalog.now())
       AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= pg_catalog.clock_timestamp())
       AND d.endpoint_id <> ALL (coalesce(p_skip, '{}'))
       AND NOT EXISTS (
           SELECT 1 FROM siwa.webhook_deliveries p
            WHERE p.endpoint_id = d.endpoint_id AND p.sub = d.sub AND p.state = 'pending'
              AND p.change_id < d.change_id)
     ORDER BY d.next_attempt_at, d.id
     LIMIT 1
       FOR UPDATE OF d SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- The endpoint's first slot row serialises the claims that count its leases (held to this
    -- transaction's short end only).
    PERFORM 1 FROM siwa.webhook_slots s WHERE s.endpoint_id = v_delivery.endpoint_id AND s.slot = 0
       FOR UPDATE;
    SELECT e.* INTO v_endpoint FROM siwa.webhook_endpoints e WHERE e.id = v_delivery.endpoint_id;
    SELECT pg_catalog.count(*) INTO v_in_flight
      FROM siwa.webhook_deliveries d
     WHERE d.endpoint_id = v_delivery.endpoint_id AND d.state = 'pending'
       AND d.lease_expires_at > pg_catalog.clock_timestamp();
    IF v_in_flight >= v_endpoint.max_in_flight THEN
        RETURN QUERY SELECT 'saturated'::text, v_delivery.id, v_delivery.change_id, v_delivery.endpoint_id,
                            NULL::integer, NULL::timestamptz, NULL::text, NULL::text[];
        RETURN;
    END IF;
    UPDATE siwa.webhook_deliveries d
       SET lease_owner = p_owner, lease_expires_at = pg_catalog.clock_timestamp() + p_lease
     WHERE d.id = v_delivery.id;
    RETURN QUERY
    SELECT 'claimed'::text, v_delivery.id, v_delivery.change_id, v_delivery.endpoint_id,
           v_delivery.attempts + 1, v_delivery.first_attempt_at, v_endpoint.url,
           ARRAY(SELECT s.secret FROM siwa.webhook_secrets s
                  WHERE s.endpoint_id = v_delivery.endpoint_id
                    AND (s.expires_at IS NULL OR s.expires_at > pg_catalog.now())
                  ORDER BY s.id DESC);
END;
$$;
COMMENT ON FUNCTION siwa.claim_webhook_delivery(text, interval, bigint[], timestamptz) IS
    'The webhook lanes'' claim: leases the first due queue head (rescuing an expired lease) and returns what the POST needs; ''saturated'' when its endpoint has max_in_flight live leases. Executable by siwa_worker.';

-- Records one attempt of a delivery the caller leased: the attempt row, the delivery's new state
-- (p_outcome: delivered, retry after p_retry_in seconds, or dead), the lease released, and — when the
-- delivery ended — `ready` passed on to the next pending delivery of its endpoint and sub. False, with
-- nothing written, when the lease is no longer the caller's (it expired and another lane took the
-- delivery over). Locks the delivery, then the next head: the order in which the fan-out share-locks
-- them (siwa.webhook_fan_out), so the two never deadlock and `ready` is never left stale.
CREATE OR REPLACE FUNCTION siwa.record_webhook_attempt(p_delivery bigint, p_owner text, p_started timestamptz,
                                                       p_latency_ms integer, p_status integer, p_outcome text,
                                                       p_retry_in double precision, p_error text)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_delivery siwa.webhook_deliveries%ROWTYPE;
    v_next     timestamptz;
BEGIN
    IF p_outcome IS NULL OR p_outcome NOT IN ('delivered', 'retry', 'dead') THEN
        RAISE EXCEPTION 'an attempt ends delivered, retry or dead' USING ERRCODE = '22023';
    END IF;
    SELECT d.* INTO v_delivery FROM siwa.webhook_deliveries d
     WHERE d.id = p_delivery AND d.state = 'pending' AND d.lease_owner = p_owner
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    v_next := CASE WHEN p_outcome = 'retry'
                   THEN pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => coalesce(p_retry_in, 0)) END;
    INSERT INTO siwa.webhook_attempts
        (delivery_id, attempt, started_at, latency_ms, status, outcome, next_attempt_at, error)
    VALUES (p_delivery, v_delivery.attempts + 1, p_started, p_latency_ms, p_status, p_outcome, v_next,
            pg_catalog.left(p_error, 300));
    UPDATE siwa.webhook_deliveries d
       SET state = CASE WHEN p_outcome = 'retry' THEN 'pending' ELSE p_outcome END, attempts = d.attempts + 1,
           first_attempt_at = coalesce(d.first_attempt_at, p_started), last_attempt_at = p_started,
           next_attempt_at = coalesce(v_next, d.next_attempt_at),
           delivered_at = CASE WHEN p_outcome = 'delivered' THEN pg_catalog.clock_timestamp() END,
           last_status = p_status, last_error = pg_catalog.left(p_error, 300),
           lease_owner = NULL, lease_expires_at = NULL
     WHERE d.id = p_delivery;
    IF p_outcome <> 'retry' THEN
        -- The next change of this sub to this endpoint heads the queue now.
        UPDATE siwa.webhook_deliveries d SET ready = true
         WHERE d.id = (SELECT q.id FROM siwa.webhook_deliveries q
                        WHERE q.endpoint_id = v_delivery.endpoint_id AND q.sub = v_delivery.sub
                          AND q.state = 'pending'
                        ORDER BY q.change_id LIMIT 1)
           AND NOT d.ready;
    END IF;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION siwa.record_webhook_attempt(bigint, text, timestamptz, integer, integer, text, double precision, text) IS
    'Records a leased webhook attempt (delivered, retry or dead), releases the lease and passes `ready` on; false when the lease is no longer the caller''s. Executable by siwa_worker.';

-- Marks ready every pending delivery with no pending delivery of its endpoint and sub ahead of it, and
-- not ready one with such a delivery ahead; returns how many it changed. Every transition keeps `ready`
-- itself (the fan-out, siwa.record_webhook_attempt, replays); this is a repair for what they cannot
-- see, such as a replay running while the delivery ahead is being recorded. The worker calls it once a
-- minute and before a --once drain; the claim checks the order itself, so a wrong hint can only delay.
CREATE OR REPLACE FUNCTION siwa.repair_webhook_ready() RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    -- Rows another transaction holds (a claim, a record, a fan-out's share lock) are skipped, not
    -- waited for: they are being kept by that transaction, and a repair never deadlocks with it.
    WITH wrong AS (
        SELECT d.id FROM siwa.webhook_deliveries d
         WHERE d.state = 'pending'
           AND d.ready = EXISTS (SELECT 1 FROM siwa.webhook_deliveries p
                                  WHERE p.endpoint_id = d.endpoint_id AND p.sub = d.sub
                                    AND p.state = 'pending' AND p.change_id < d.change_id)
           FOR UPDATE OF d SKIP LOCKED),
    repaired AS (
        UPDATE siwa.webhook_deliveries d SET ready = NOT d.ready FROM wrong w WHERE d.id = w.id
        RETURNING 1)
    SELECT pg_catalog.count(*)::integer FROM repaired
$$;
COMMENT ON FUNCTION siwa.repair_webhook_ready() IS
    'Recomputes the webhook queue heads'' `ready` hint where it is wrong; returns how many rows it changed. Executable by siwa_worker.';

-- The revoker's claim: the first due pending request (due by p_due_by: a drain passes its start) not
-- leased or with an expired lease, with the user's stored refresh tokens, read without a lock (a
-- plain read never waits for one: another transaction may hold a token row meanwhile). Without a
-- token it ends here ('revoked' when an earlier attempt revoked some, else 'no_token'; one row, no
-- token). Otherwise 'claimed': the lease is written (p_lease long), one row per token (id, client ID, ciphertext). No row: nothing is due.
CREATE OR REPLACE FUNCTION siwa.claim_revocation(p_owner text, p_lease interval,
                                                 p_due_by timestamptz DEFAULT NULL)
RETURNS TABLE (outcome text, request_id bigint, sub text, attempt integer, token_id bigint,
               client_id text, token_ciphertext bytea)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_request siwa.revocation_requests%ROWTYPE;
    v_state   text;
BEGIN
    IF p_owner IS NULL OR p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION 'a claim needs an owner and a positive lease' USING ERRCODE = '22023';
    END IF;
    SELECT r.* INTO v_request FROM siwa.revocation_requests r
     WHERE r.state = 'pending' AND r.next_attempt_at <= coalesce(p_due_by, pg_catalog.now())
       AND (r.lease_expires_at IS NULL OR r.lease_expires_at <= pg_catalog.clock_timestamp())
     ORDER BY r.next_attempt_at, r.id
     LIMIT 1
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM siwa.refresh_tokens t
                    WHERE t.sub = v_request.sub AND t.token_ciphertext IS NOT NULL) THEN
        v_state := CASE WHEN v_request.tokens_revoked > 0 THEN 'revoked' ELSE 'no_token' END;
        UPDATE siwa.revocation_requests r
           SET state = v_state, completed_at = pg_catalog.now(), last_attempt_at = pg_catalog.now(),
               last_error = NULL, lease_owner = NULL, lease_expires_at = NULL
         WHERE r.id = v_request.id;
        RETURN QUERY SELECT v_state, v_request.id, v_request.sub, v_request.attempts, NULL::bigint,
                            NULL::text, NULL::bytea;
        RETURN;
    END IF;
    UPDATE siwa.revocation_requests r
       SET lease_owner = p_owner, lease_expires_at = pg_catalog.clock_timestamp() + p_lease
     WHERE r.id = v_request.id;
    RETURN QUERY
    SELECT 'claimed'::text, v_request.id, v_request.sub, v_request.attempts + 1, t.id, t.client_id,
           t.token_ciphertext
      FROM siwa.refresh_tokens t
     WHERE t.sub = v_request.sub AND t.token_ciphertext IS NOT NULL
     ORDER BY t.id;
END;
$$;
COMMENT ON FUNCTION siwa.claim_revocation(text, interval, timestamptz) IS
    'The revoker''s claim: leases the first due revocation request (rescuing an expired lease) and returns the user''s stored tokens, or ends a request without tokens. Executable by siwa_worker.';

-- Records a leased revocation attempt: destroys exactly the tokens Apple accepted (p_token_ids with the
-- ciphertexts they had when claimed: a row whose ciphertext changed meanwhile holds another token,
-- which is kept), then p_state: 'revoked'; 'retry' after p_retry_in seconds; 'failed' for good. Apple's
-- answer and the error (bounded) are kept. Returns the state recorded, 'lost' (nothing written) when
-- the lease is no longer the caller's, or 'busy' when another transaction holds one of those token rows:
-- then nothing but the lease is released, and the request is due again after p_retry_in seconds (the
-- revoke at Apple is repeated then; Apple answers 200 for a token already revoked). A token row is
-- locked NOWAIT, so the revoker never waits for an app's transaction.
CREATE OR REPLACE FUNCTION siwa.record_revocation(p_request bigint, p_owner text, p_token_ids bigint[],
                                                  p_ciphertexts bytea[], p_state text, p_answer text,
                                                  p_error text, p_retry_in double precision)
RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_request siwa.revocation_requests%ROWTYPE;
    v_revoked integer;
BEGIN
    IF p_state IS NULL OR p_state NOT IN ('revoked', 'retry', 'failed') THEN
        RAISE EXCEPTION 'a revocation attempt ends revoked, retry or failed' USING ERRCODE = '22023';
    END IF;
    SELECT r.* INTO v_request FROM siwa.revocation_requests r
     WHERE r.id = p_request AND r.state = 'pending' AND r.lease_owner = p_owner
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'lost';
    END IF;
    BEGIN
        PERFORM 1 FROM siwa.refresh_tokens t WHERE t.id = ANY (coalesce(p_token_ids, '{}'))
         ORDER BY t.id FOR UPDATE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        UPDATE siwa.revocation_requests r
           SET lease_owner = NULL, lease_expires_at = NULL, last_attempt_at = pg_catalog.now(),
               next_attempt_at = pg_catalog.clock_timestamp()
                                 + pg_catalog.make_interval(secs => coalesce(p_retry_in, 0))
         WHERE r.id = p_request;
        RETURN 'busy';
    END;
    WITH revoked AS (
        UPDATE siwa.refresh_tokens t
           SET token_ciphertext = NULL, revoked_at = coalesce(t.revoked_at, pg_catalog.now()),
               revoke_reason = coalesce(t.revoke_reason, 'revocation-requested')
          FROM unnest(coalesce(p_token_ids, '{}'), coalesce(p_ciphertexts, '{}')) AS u(id, ciphertext)
         WHERE t.id = u.id AND t.token_ciphertext = u.ciphertext
        RETURNING 1)
    SELECT pg_catalog.count(*) INTO v_revoked FROM revoked;
    UPDATE siwa.revocation_requests r
       SET state = CASE p_state WHEN 'retry' THEN 'pending' ELSE p_state END, attempts = r.attempts + 1,
           last_attempt_at = pg_catalog.now(),
           next_attempt_at = CASE WHEN p_state = 'retry'
                                  THEN pg_catalog.now() + pg_catalog.make_interval(secs => coalesce(p_retry_in, 0))
                                  ELSE r.next_attempt_at END,
           completed_at = CASE WHEN p_state <> 'retry' THEN pg_catalog.now() END,
           apple_answer = CASE WHEN p_state = 'revoked' THEN '200' ELSE coalesce(p_answer, r.apple_answer) END,
           tokens_revoked = r.tokens_revoked + v_revoked,
           last_error = CASE WHEN p_state = 'revoked' THEN NULL ELSE pg_catalog.left(p_error, 500) END,
           lease_owner = NULL, lease_expires_at = NULL
     WHERE r.id = p_request;
    RETURN p_state;
END;
$$;
COMMENT ON FUNCTION siwa.record_revocation(bigint, text, bigint[], bytea[], text, text, text, double precision) IS
    'Records a leased revocation attempt: destroys exactly the tokens Apple accepted (unless their rows changed), then revoked, retry or failed; ''lost'' when the lease is not the caller''s, ''busy'' when a token row is held by another transaction. Executable by siwa_worker.';

-- Gives a leased revocation request back at once (the revoker could not record its attempt but lives
-- on): due again now, the attempt not counted. False when the lease is not the caller's.
CREATE OR REPLACE FUNCTION siwa.release_revocation(p_request bigint, p_owner text) RETURNS boolean
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH released AS (
        UPDATE siwa.revocation_requests r SET lease_owner = NULL, lease_expires_at = NULL
         WHERE r.id = p_request AND r.state = 'pending' AND r.lease_owner = p_owner
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM released)
$$;
COMMENT ON FUNCTION siwa.release_revocation(bigint, text) IS
    'Releases a revocation request''s lease held by the caller (due again at once); false when it is not the caller''s. Executable by siwa_worker.';

-- The refresh check's claim: the stored token checked longest ago (or never) and not within
-- p_interval; its check is recorded as begun now ('checking'), and committed, so another worker skips
-- it and a process that dies leaves it due again after the interval. No row: none is due.
CREATE OR REPLACE FUNCTION siwa.claim_refresh_check(p_interval interval)
RETURNS TABLE (token_id bigint, sub text, client_id text, token_ciphertext bytea)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_token siwa.refresh_tokens%ROWTYPE;
BEGIN
    SELECT t.* INTO v_token
      FROM siwa.refresh_tokens t LEFT JOIN siwa.refresh_token_checks c ON c.token_id = t.id
     WHERE t.token_ciphertext IS NOT NULL AND t.revoked_at IS NULL
       AND (c.checked_at IS NULL OR c.checked_at <= pg_catalog.now() - p_interval)
     ORDER BY c.checked_at NULLS FIRST, t.id
     LIMIT 1
       FOR UPDATE OF t SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO siwa.refresh_token_checks AS c (token_id, checked_at, outcome)
    VALUES (v_token.id, pg_catalog.now(), 'checking')
    ON CONFLICT ON CONSTRAINT refresh_token_checks_pkey
    DO UPDATE SET checked_at = excluded.checked_at, outcome = excluded.outcome;
    RETURN QUERY SELECT v_token.id, v_token.sub, v_token.client_id, v_token.token_ciphertext;
END;
$$;
COMMENT ON FUNCTION siwa.claim_refresh_check(interval) IS
    'The refresh check''s claim: the stored token due for a check, marked as being checked now. Executable by siwa_worker.';

-- Records a refresh check's outcome. invalid_grant (consent is gone): the token is destroyed, unless its
-- row holds another ciphertext by now, and a consent-revoked of our own is recorded
-- (siwa.record_consent_lost); returns its jti (NULL otherwise).
CREATE OR REPLACE FUNCTION siwa.record_refresh_check(p_token bigint, p_ciphertext bytea, p_outcome text)
RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_token siwa.refresh_tokens%ROWTYPE;
    v_jti   text;
BEGIN
    UPDATE siwa.refresh_token_checks c SET checked_at = pg_catalog.now(), outcome = p_outcome
     WHERE c.token_id = p_token;
    IF p_outcome = 'invalid_grant' THEN
        UPDATE siwa.refresh_tokens t SET token_ciphertext = NULL
         WHERE t.id = p_token AND t.token_ciphertext = p_ciphertext
        RETURNING t.* INTO v_token;
        IF FOUND THEN
            v_jti := siwa.record_consent_lost(v_token.sub, v_token.client_id);
        END IF;
    END IF;
    RETURN v_jti;
END;
$$;
COMMENT ON FUNCTION siwa.record_refresh_check(bigint, bytea, text) IS
    'Records a refresh check''s outcome; on invalid_grant destroys the token and records a consent-revoked (returns its jti). Executable by siwa_worker.';

-- Forgets sign-in codes claimed longer ago than p_older_than; returns how many.
CREATE OR REPLACE FUNCTION siwa.prune_sign_in_codes(p_older_than interval) RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH pruned AS (DELETE FROM siwa.sign_in_codes c WHERE c.created_at < pg_catalog.now() - p_older_than
                    RETURNING 1)
    SELECT pg_catalog.count(*)::integer FROM pruned
$$;
COMMENT ON FUNCTION siwa.prune_sign_in_codes(interval) IS
    'Deletes sign-in codes older than the interval (Apple''s codes live five minutes); returns how many. Executable by siwa_worker.';

-- A service process's heartbeat: upserts its row and prunes rows of its kind not seen for
-- p_prune_after. SECURITY INVOKER: the row policy lets each role write only its own kind.
CREATE OR REPLACE FUNCTION siwa.record_heartbeat(p_kind text, p_host text, p_pid integer, p_version text,
                                                 p_audiences text[], p_started_at timestamptz,
                                                 p_prune_after interval) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO siwa.service_heartbeats AS h (kind, host, pid, version, audiences, started_at, last_seen)
    VALUES (p_kind, p_host, p_pid, p_version, p_audiences, p_started_at, pg_catalog.now())
    ON CONFLICT (kind, host, pid) DO UPDATE
       SET version = excluded.version, audiences = excluded.audiences,
           started_at = excluded.started_at, last_seen = excluded.last_seen;
    DELETE FROM siwa.service_heartbeats h
     WHERE h.kind = p_kind AND h.last_seen < pg_catalog.now() - p_prune_after;
$$;
COMMENT ON FUNCTION siwa.record_heartbeat(text, text, integer, text, text[], timestamptz, interval) IS
    'Upserts a service process''s heartbeat row and prunes stale rows of its kind. Executable by siwa_receiver and siwa_worker (each for its own kind).';

-- A stopping process deletes its heartbeat row, so that it does not look alive.
CREATE OR REPLACE FUNCTION siwa.remove_heartbeat(p_kind text, p_host text, p_pid integer) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    DELETE FROM siwa.service_heartbeats h WHERE h.kind = p_kind AND h.host = p_host AND h.pid = p_pid;
$$;
COMMENT ON FUNCTION siwa.remove_heartbeat(text, text, integer) IS
    'Deletes a stopping service process''s heartbeat row. Executable by siwa_receiver and siwa_worker (each for its own kind).';

-- Grants of this section: each function to the role whose process calls it, nobody else.
REVOKE ALL ON FUNCTION siwa.claim_webhook_delivery(text, interval, bigint[], timestamptz),
    siwa.record_webhook_attempt(bigint, text, timestamptz, integer, integer, text, double precision, text),
    siwa.repair_webhook_ready(), siwa.claim_revocation(text, interval, timestamptz),
    siwa.record_revocation(bigint, text, bigint[], bytea[], text, text, text, double precision),
    siwa.release_revocation(bigint, text), siwa.claim_refresh_check(interval), siwa.record_refresh_check(bigint, bytea, text),
    siwa.prune_sign_in_codes(interval),
    siwa.record_heartbeat(text, text, integer, text, text[], timestamptz, interval),
    siwa.remove_heartbeat(text, text, integer) FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT EXECUTE ON FUNCTION siwa.claim_webhook_delivery(text, interval, bigint[], timestamptz),
            siwa.record_webhook_attempt(bigint, text, timestamptz, integer, integer, text, double precision, text),
            siwa.repair_webhook_ready(), siwa.claim_revocation(text, interval, timestamptz),
            siwa.record_revocation(bigint, text, bigint[], bytea[], text, text, text, double precision),
            siwa.release_revocation(bigint, text), siwa.claim_refresh_check(interval), siwa.record_refresh_check(bigint, bytea, text),
            siwa.prune_sign_in_codes(interval),
            siwa.record_heartbeat(text, text, integer, text, text[], timestamptz, interval),
            siwa.remove_heartbeat(text, text, integer) TO siwa_worker;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_receiver') THEN
        GRANT EXECUTE ON FUNCTION siwa.record_heartbeat(text, text, integer, text, text[], timestamptz, interval),
            siwa.remove_heartbeat(text, text, integer) TO siwa_receiver;
    END IF;
END;
$$;

-- The applying session gets its own search_path back (psql ends anyway; a longer session goes on).
DO $$
BEGIN
    PERFORM pg_catalog.set_config('search_path',
                                  pg_catalog.current_setting('siwa.schema_sql_saved_search_path'), false);
END;
$$;
