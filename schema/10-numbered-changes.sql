-- Upgrades: the numbered changes, each run once, before the desired state

-- The rest of this file is the desired state, written so that applying it again changes nothing
-- (CREATE … IF NOT EXISTS, CREATE OR REPLACE, views, comments, grants): an empty database gets the
-- current schema from it alone. What cannot be said that way — a column or constraint added to an
-- existing table, a type or a function signature changed, a backfill — is a numbered change below. Each
-- change N runs on a database whose recorded version is below N (and not empty), in order, exactly once:
-- in one statement with its row in siwa.schema_version, under the advisory lock siwactl migrate also
-- holds ('siwa.migrate'), after which the version is read. An empty database skips the changes and
-- records every version.
--
-- Writing change N+1: add it at the end, with `IF v_from < N+1`, raise the version in the refusal
-- (schema/01-preamble.sql) to N+1, and make the desired state below create
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
    -- siwa.notifications in its place; the block "Change 3, the rows" near the end of this file
    -- (schema/75-data-moves.sql), in the same transaction and under the same lock, moves every row into
    -- them (states, errors, erasure and ids as they were) and only then drops the renamed table.
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

    -- 5: one home for each rule. Changes to existing tables and functions go inside `IF v_from > 0`.
    IF v_from < 5 THEN
        -- Consumers that call out (webhook lanes, the revoker) commit a claim with a lease (owner and
        -- expiry) instead of holding a row lock across the call. A table that does not exist yet is
        -- created by the desired state with these columns.
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
        -- Heartbeats record the product version and the commit each process was built
        -- from (NULL in the rows of processes built before version 5, which write only version). The
        -- table came with version 4: from an older version the desired state creates it with the columns.
        IF v_from >= 4 THEN
            ALTER TABLE siwa.service_heartbeats
                ADD COLUMN product_version text
                    CONSTRAINT service_heartbeats_product_version_check CHECK (length(product_version) BETWEEN 1 AND 64),
                ADD COLUMN build_commit text
                    CONSTRAINT service_heartbeats_build_commit_check CHECK (length(build_commit) BETWEEN 1 AND 64);
        END IF;
        IF v_from > 0 THEN
            -- Each effect once: the set-based pass is the only implementation of the worker's effects
            -- (its fallback runs it on batches of one) and returns its changes, which
            -- siwa.number_changes(changes) inserts and numbers. Version 4's one-at-a-time functions go;
            -- the two whose signature changed are created again by the desired state.
            DROP FUNCTION IF EXISTS siwa.process_claimed_notification(siwa.notifications, integer, interval);
            DROP FUNCTION IF EXISTS siwa.apply_notification(siwa.notifications);
            DROP FUNCTION IF EXISTS siwa.apply_claimed_batch(siwa.notifications[]);
            DROP FUNCTION IF EXISTS siwa.number_changes();
        END IF;
        -- The worker verifies each stored token: a rejected state, the origin the receiver cannot write.
        IF pg_catalog.to_regclass('siwa.notification_log') IS NOT NULL THEN
            ALTER TABLE siwa.notification_log
                ADD COLUMN origin text NOT NULL DEFAULT 'apple',
                DROP CONSTRAINT notification_log_state_check,
                ADD CONSTRAINT notification_log_state_check
                    CHECK (state IN ('pending', 'applied', 'skipped', 'dead', 'rejected')),
                ADD CONSTRAINT notification_log_origin_check CHECK (origin IN ('apple', 'refresh-check'));
            -- Version 4's consent-lost rows, told apart by their jti as version 4 did.
            UPDATE siwa.notification_log SET origin = 'refresh-check'
             WHERE jti LIKE 'siwa-refresh-check:%' AND raw_token IS NULL;
            DROP INDEX IF EXISTS siwa.notification_log_exceptions_idx;  -- its predicate names rejected now
        END IF;
        INSERT INTO siwa.schema_version (version, description)
        VALUES (5, 'one home for each rule: the schema written as concern files (schema/), one implementation of the worker''s effects, the receiver''s store siwa.store_notifications; leases instead of row locks across network calls (lease_owner, lease_expires_at on siwa.webhook_deliveries and siwa.revocation_requests), every transition of the webhook, revocation and heartbeat queues a siwa function; heartbeats record the product version and the commit (siwa.service_heartbeats.product_version, build_commit)');
    END IF;
END;
$$;
