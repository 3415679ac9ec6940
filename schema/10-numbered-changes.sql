-- Upgrades: the numbered changes, each run once, before the desired state

-- The rest of this file is the desired state, written so that applying it again changes nothing
-- (CREATE … IF NOT EXISTS, CREATE OR REPLACE, views, comments, grants): an empty database gets the
-- current schema from it alone. What cannot be said that way — a column or constraint added to an
-- existing table, a type or a function signature changed, a backfill — is a numbered change below. Each
-- change N runs on a database whose recorded version is below N (and not empty), in order, exactly once:
-- in one statement with its row in siwa.schema_version, under the migration lock siwactl migrate also
-- holds (siwa.schema_version in SHARE ROW EXCLUSIVE mode, a mode only a role that may write that table
-- can take: the owner), after which the version is read. An empty database skips the changes and
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
    v_from    integer;
    v_bad     text;
    v_timeout text := pg_catalog.current_setting('lock_timeout');
BEGIN
    LOCK TABLE siwa.schema_version IN SHARE ROW EXCLUSIVE MODE;
    v_from := coalesce((SELECT pg_catalog.max(version) FROM siwa.schema_version), 0);

    -- A database in use: every table and view of siwa taken at once, before anything changes, so the
    -- services' transactions wait for this one instead of deadlocking with it (40P01 under load). A try
    -- waits 100 ms at most and gives back what it took, so it never holds a lock a service waits on.
    IF v_from > 0 THEN
        FOR v_try IN 1 .. 600 LOOP
            BEGIN
                PERFORM pg_catalog.set_config('lock_timeout', '100ms', true);
                EXECUTE (SELECT 'LOCK TABLE ' || pg_catalog.string_agg(c.oid::regclass::text, ', ' ORDER BY c.oid)
                                || ' IN ACCESS EXCLUSIVE MODE'
                           FROM pg_catalog.pg_class c
                          WHERE c.relnamespace = 'siwa'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
                            AND NOT c.relispartition);
                EXIT;
            EXCEPTION WHEN lock_not_available THEN
                IF v_try = 600 THEN
                    RAISE;
                END IF;
            END;
        END LOOP;
        PERFORM pg_catalog.set_config('lock_timeout', v_timeout, true);
    END IF;

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
        -- Revocation after a transfer and per token: which stored tokens the service's sign-in API
        -- wrote (siwa.refresh_tokens.service_format; version 4's rows with its layout and a sign-in of
        -- the same user and client are taken as its own), and a request may end partially_revoked.
        IF v_from > 0 THEN
            ALTER TABLE siwa.refresh_tokens ADD COLUMN service_format boolean NOT NULL DEFAULT false;
            IF pg_catalog.to_regclass('siwa.sign_ins') IS NOT NULL THEN
                UPDATE siwa.refresh_tokens t SET service_format = true
                 WHERE t.token_ciphertext IS NOT NULL AND t.token_sha256 IS NOT NULL
                   AND CASE WHEN pg_catalog.length(t.token_ciphertext) > 2
                            THEN pg_catalog.get_byte(t.token_ciphertext, 0) = 1
                                 AND pg_catalog.length(t.token_ciphertext)
                                     >= 2 + pg_catalog.get_byte(t.token_ciphertext, 1) + 12 + 16
                            ELSE false END
                   AND EXISTS (SELECT 1 FROM siwa.sign_ins s WHERE s.sub = t.sub AND s.client_id = t.client_id);
            END IF;
        END IF;
        IF pg_catalog.to_regclass('siwa.revocation_requests') IS NOT NULL THEN
            ALTER TABLE siwa.revocation_requests
                DROP CONSTRAINT revocation_requests_state_check,
                ADD CONSTRAINT revocation_requests_state_check
                    CHECK (state IN ('pending', 'revoked', 'partially_revoked', 'no_token', 'failed'));
        END IF;
        -- Team transfers tell apps: the change siwa.sub_transferred (with the replaced sub in
        -- siwa.changes.old_sub), which webhook endpoints may subscribe to. Tables created by version 4.
        IF pg_catalog.to_regclass('siwa.changes') IS NOT NULL THEN
            ALTER TABLE siwa.changes
                ADD COLUMN old_sub text,
                DROP CONSTRAINT changes_type_check,
                ADD CONSTRAINT changes_type_check CHECK (type IN ('siwa.email_disabled', 'siwa.email_enabled',
                    'siwa.consent_revoked', 'siwa.account_deleted', 'siwa.personal_data_erased',
                    'siwa.sub_transferred'));
        END IF;
        IF pg_catalog.to_regclass('siwa.webhook_endpoints') IS NOT NULL THEN
            ALTER TABLE siwa.webhook_endpoints
                DROP CONSTRAINT webhook_endpoints_types_check,
                ADD CONSTRAINT webhook_endpoints_types_check CHECK (
                    types IS NULL OR (cardinality(types) > 0 AND types <@ ARRAY['siwa.email_disabled', 'siwa.email_enabled',
                        'siwa.consent_revoked', 'siwa.account_deleted', 'siwa.personal_data_erased', 'siwa.sub_transferred']));
        END IF;
        -- A verifiable transfer list: the import's unverified load of the export's rows goes.
        DROP FUNCTION IF EXISTS siwa.transfer_import_load_exports(text, text);
        -- The sign-in API answers through siwa.sign_in_answer(code, client, sub), what is true now; the
        -- lookup by sub alone (any signed-in user's email) goes.
        DROP FUNCTION IF EXISTS siwa.sign_in_identity(text, text);
        -- Heartbeats cannot lie to the doctor: bounded times, no control characters. A row that breaks
        -- them was not written by a receiver or worker (or by one whose clock ran ahead): it is deleted
        -- (a live process writes its row again within its heartbeat interval).
        IF v_from >= 4 THEN
            DELETE FROM siwa.service_heartbeats h
             WHERE (pg_catalog.isfinite(h.last_seen) AND pg_catalog.isfinite(h.started_at)
                    AND h.last_seen <= pg_catalog.now() + interval '1 minute'
                    AND h.started_at <= pg_catalog.now() + interval '5 minutes'
                    AND h.host !~ '[\x01-\x1f\x7f-\x9f]' AND h.version !~ '[\x01-\x1f\x7f-\x9f]'
                    AND h.product_version !~ '[\x01-\x1f\x7f-\x9f]' AND h.build_commit !~ '[\x01-\x1f\x7f-\x9f]'
                    AND (pg_catalog.cardinality(h.audiences) = 0
                         OR pg_catalog.array_to_string(h.audiences, E'\n', '')
                            ~ '^[^\x01-\x1f\x7f-\x9f]{1,255}(\n[^\x01-\x1f\x7f-\x9f]{1,255})*$'
                             AND pg_catalog.array_to_string(h.audiences, ' ', '') !~ '[\x01-\x1f\x7f-\x9f]')) IS FALSE;
            ALTER TABLE siwa.service_heartbeats
                ADD CONSTRAINT service_heartbeats_time_check
                    CHECK (isfinite(last_seen) AND isfinite(started_at) AND last_seen <= now() + interval '1 minute'
                           AND started_at <= now() + interval '5 minutes'),
                ADD CONSTRAINT service_heartbeats_text_check
                    CHECK (host !~ '[\x01-\x1f\x7f-\x9f]' AND version !~ '[\x01-\x1f\x7f-\x9f]'
                           AND product_version !~ '[\x01-\x1f\x7f-\x9f]' AND build_commit !~ '[\x01-\x1f\x7f-\x9f]'),
                ADD CONSTRAINT service_heartbeats_audiences_text_check
                    CHECK (cardinality(audiences) = 0
                           OR array_to_string(audiences, E'\n', '')
                              ~ '^[^\x01-\x1f\x7f-\x9f]{1,255}(\n[^\x01-\x1f\x7f-\x9f]{1,255})*$'
                              AND array_to_string(audiences, ' ', '') !~ '[\x01-\x1f\x7f-\x9f]');
        END IF;
        -- A future event_time: the signed value not believed, kept beside the effective event_time.
        IF pg_catalog.to_regclass('siwa.notification_log') IS NOT NULL THEN
            ALTER TABLE siwa.notification_log
                ADD COLUMN claimed_event_time timestamptz,
                ADD CONSTRAINT notification_log_claimed_event_time_check
                    CHECK (claimed_event_time IS NULL OR claimed_event_time > event_time);
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
        -- Ed25519 webhook signatures (v1a): whsk_ keys beside whsec_ secrets, with their whpk_ public key.
        IF pg_catalog.to_regclass('siwa.webhook_secrets') IS NOT NULL THEN
            ALTER TABLE siwa.webhook_secrets
                ADD COLUMN public_key text,
                DROP CONSTRAINT webhook_secrets_secret_check,
                ADD CONSTRAINT webhook_secrets_secret_check CHECK (
                    (secret ~ '^whsec_[A-Za-z0-9+/]+={0,2}$' AND length(secret) BETWEEN 6 + 32 AND 6 + 88
                     AND public_key IS NULL)
                    OR (secret ~ '^whsk_[A-Za-z0-9+/]{43}=$' AND public_key IS NOT NULL AND public_key ~ '^whpk_[A-Za-z0-9+/]{43}=$'));
        END IF;
        DROP FUNCTION IF EXISTS siwa.add_webhook_endpoint(text, text, text[], integer);
        DROP FUNCTION IF EXISTS siwa.rotate_webhook_secret(bigint, text, interval);
        -- replay chooses dead, failed or all (p_state): the five-argument replay goes, the
        -- desired state creates the six-argument one.
        DROP FUNCTION IF EXISTS siwa.replay_webhook_deliveries(bigint, bigint, bigint, timestamptz, timestamptz);
        -- auto-disable of a webhook endpoint on 410 Gone or after failing continuously for
        -- siwa.settings.webhook_auto_disable_after (recorded in disabled_reason).
        IF pg_catalog.to_regclass('siwa.webhook_endpoints') IS NOT NULL THEN
            ALTER TABLE siwa.webhook_endpoints
                ADD COLUMN failing_since timestamptz,
                ADD COLUMN disabled_reason text
                    CONSTRAINT webhook_endpoints_disabled_reason_check CHECK (length(disabled_reason) <= 300);
            UPDATE siwa.webhook_endpoints SET disabled_reason = 'manual' WHERE NOT enabled;
        END IF;
        IF v_from > 0 THEN
            ALTER TABLE siwa.settings
                ADD COLUMN webhook_auto_disable_after interval NOT NULL DEFAULT interval '3 days'
                    CONSTRAINT settings_webhook_auto_disable_after_check CHECK (webhook_auto_disable_after > interval '0');
            -- The relay-mail gate's answer after consent-revoked.
            ALTER TABLE siwa.settings
                ADD COLUMN relay_mail_after_consent_revoked text NOT NULL DEFAULT 'allow'
                    CONSTRAINT settings_relay_mail_after_consent_revoked_check
                        CHECK (relay_mail_after_consent_revoked IN ('allow', 'block'));
        END IF;
        -- The developer loop: temporary endpoints of siwactl webhooks listen --forward-to (expires_at).
        IF pg_catalog.to_regclass('siwa.webhook_endpoints') IS NOT NULL THEN
            ALTER TABLE siwa.webhook_endpoints ADD COLUMN expires_at timestamptz;
        END IF;
        -- Webhook isolation: the endpoint's run of failures, backoff and rotation on its row (the one home
        -- of "failing since"); the claim locks that row, so the slots go; the due heads by endpoint.
        IF pg_catalog.to_regclass('siwa.webhook_endpoints') IS NOT NULL THEN
            ALTER TABLE siwa.webhook_endpoints
                ADD COLUMN consecutive_failures integer NOT NULL DEFAULT 0,
                ADD COLUMN last_failure_at timestamptz,
                ADD COLUMN backoff_until timestamptz,
                ADD COLUMN last_claimed_at timestamptz,
                ADD CONSTRAINT webhook_endpoints_failures_check
                    CHECK (consecutive_failures >= 0 AND (consecutive_failures = 0) = (failing_since IS NULL));
        END IF;
        DROP TABLE IF EXISTS siwa.webhook_slots;
        DROP INDEX IF EXISTS siwa.webhook_deliveries_ready_idx;
        -- The drain: erasure leaves the rows its caller erases itself (p_leave), each written once.
        DROP FUNCTION IF EXISTS siwa.erase_personal_data_of(text[]);
        -- A call that stops the worker every time is not claimed forever: the claims count the leases that
        -- ran out unrecorded (crashes) and end the request, or the token's checks, at a bound.
        IF pg_catalog.to_regclass('siwa.revocation_requests') IS NOT NULL THEN
            ALTER TABLE siwa.revocation_requests ADD COLUMN crashes integer NOT NULL DEFAULT 0;
        END IF;
        IF pg_catalog.to_regclass('siwa.refresh_token_checks') IS NOT NULL THEN
            ALTER TABLE siwa.refresh_token_checks ADD COLUMN crashes integer NOT NULL DEFAULT 0;
        END IF;
        INSERT INTO siwa.schema_version (version, description)
        VALUES (5, 'one home for each rule: the schema written as concern files (schema/), one implementation of the worker''s effects, the receiver''s store siwa.store_notifications; leases instead of row locks across network calls (lease_owner, lease_expires_at on siwa.webhook_deliveries and siwa.revocation_requests), every transition of the webhook, revocation and heartbeat queues a siwa function; heartbeats record the product version and the commit (siwa.service_heartbeats.product_version, build_commit)');
    END IF;
END;
$$;
