-- Privileges: nothing for PUBLIC, then what each role is granted, one block per role

-- Nothing in schema siwa is usable by PUBLIC: functions are executable by everyone by default.
REVOKE ALL ON SCHEMA siwa FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA siwa FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA siwa FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA siwa FROM PUBLIC;
-- The SECURITY DEFINER gauges of schema/70-health.sql: never PUBLIC's (also covered by the line above).
REVOKE ALL ON FUNCTION siwa.health_gauges(timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION siwa.client_ids_in_use(timestamptz) FROM PUBLIC;
-- The sign-in API's SECURITY DEFINER functions (schema/55-sign-in.sql): never PUBLIC's either.
REVOKE ALL ON FUNCTION siwa.begin_sign_in(bytea, text, text), siwa.abandon_sign_in(bytea),
    siwa.record_sign_in(bytea, text, text, text, boolean, boolean, integer, bytea, bytea),
    siwa.sign_in_answer(bytea, text, text) FROM PUBLIC;
-- The developer loop's SECURITY DEFINER functions (schema/65-webhooks.sql): never PUBLIC's either.
REVOKE ALL ON FUNCTION siwa.add_temporary_webhook_endpoint(text, text, text[], interval),
    siwa.renew_temporary_webhook_endpoint(bigint, interval), siwa.remove_temporary_webhook_endpoint(bigint),
    siwa.remove_expired_webhook_endpoints() FROM PUBLIC;
-- The relay-mail gate's SECURITY DEFINER functions (schema/68-relay-mail.sql): never PUBLIC's either.
REVOKE ALL ON FUNCTION siwa.relay_mail_decision(text), siwa.relay_mail_decisions(text[]),
    siwa.remember_erased_mail_addresses(text[], timestamptz[]) FROM PUBLIC;
-- The relay bounces' recording function (schema/72-bounces.sql): never PUBLIC's either.
REVOKE ALL ON FUNCTION siwa.record_relay_bounce(text, text, text, text, text, text, text) FROM PUBLIC;

-- Each block grants one role what its job needs, and only when the role exists (see
-- schema/80-roles.sql). Functions run with the caller's rights: a role is granted the tables its
-- functions touch. Views read their tables with the owner's rights: siwa_admin reads views, not tables.
-- Secrets (siwa.webhook_secrets) are readable by siwa_worker and the owner only. The team transfer's
-- progress tables (an exchanged row holds an email until applied) and siwa.apply_sub_transfer are the
-- owner's (siwactl transfer runs as the owner, as migrate does). Row-level policies keep each service
-- role to the heartbeats of its own kind (to upsert its row and prune stale ones).

-- siwa_admin: read the views (never a secret or a token), the team transfer's aliases, batches and
-- rewrite list, a user's history by either sub, and the heartbeats and health gauges.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_admin') THEN
        GRANT USAGE ON SCHEMA siwa TO siwa_admin;
        GRANT SELECT ON siwa.event_history, siwa.account_overview, siwa.queue_health, siwa.changefeed
            TO siwa_admin;
        GRANT SELECT ON siwa.revocation_ledger TO siwa_admin;
        GRANT SELECT ON siwa.sub_aliases, siwa.sub_transfer_batches, siwa.sub_columns TO siwa_admin;
        GRANT EXECUTE ON FUNCTION siwa.history_of(text), siwa.current_sub(text) TO siwa_admin;
        GRANT SELECT ON siwa.webhook_endpoint_overview, siwa.webhook_attempt_history, siwa.webhook_delivery_status
            TO siwa_admin;
        GRANT SELECT ON siwa.webhook_signing_keys TO siwa_admin;  -- ed25519: public keys, never a secret
        GRANT SELECT ON siwa.service_heartbeats TO siwa_admin;
        GRANT SELECT ON siwa.relay_bounce_history, siwa.relay_bounce_counts TO siwa_admin;
        GRANT EXECUTE ON FUNCTION siwa.health_gauges(timestamptz) TO siwa_admin;
        GRANT EXECUTE ON FUNCTION siwa.client_ids_in_use(timestamptz) TO siwa_admin;
        -- The developer loop: temporary endpoints only (siwactl webhooks listen --forward-to).
        GRANT EXECUTE ON FUNCTION siwa.add_temporary_webhook_endpoint(text, text, text[], interval),
            siwa.renew_temporary_webhook_endpoint(bigint, interval),
            siwa.remove_temporary_webhook_endpoint(bigint), siwa.remove_expired_webhook_endpoints()
            TO siwa_admin;
        DROP POLICY IF EXISTS service_heartbeats_admin ON siwa.service_heartbeats;
        CREATE POLICY service_heartbeats_admin ON siwa.service_heartbeats FOR SELECT TO siwa_admin USING (true);
    END IF;
END;
$$;

-- siwa_receiver: EXECUTE on siwa.store_notifications, which runs with its rights: INSERT … ON CONFLICT
-- (jti) DO NOTHING RETURNING jti, issued_at into the dedupe keys (jti, issued_at, expires_at), then
-- INSERT … ON CONFLICT (jti, issued_at) DO NOTHING RETURNING id, jti, issued_at into the log, of exactly
-- the columns the receiver writes (the state, attempts and error columns keep their defaults: it cannot
-- store a row already applied; personal_data_erased_at it may set, for a row it stores without email
-- and token), which needs SELECT on those three columns and on no other (not sub, email, raw_token or the
-- outcome); and INSERT of (id, jti, issued_at) into the queue, the rest keeping its defaults. A queue row
-- is worth no more to a stolen receiver role than the new notification it can store anyway. A
-- table-wide INSERT grant (as version 1 had on its table) is revoked first (which revokes column grants
-- too). The receiver reads two columns of siwa.accounts to store nothing personal of an erased account,
-- and the aliases (siwa.current_sub) to find the account a replaced sub became.
-- Its heartbeats (of its own kind) and the health gauges.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_receiver') THEN
        GRANT USAGE ON SCHEMA siwa TO siwa_receiver;
        REVOKE INSERT ON siwa.notification_log FROM siwa_receiver;
        GRANT INSERT (jti, event_type, sub, audience, email, is_private_email, event_time, issued_at,
                      expires_at, raw_token, personal_data_erased_at, claimed_event_time)
            ON siwa.notification_log TO siwa_receiver;
        GRANT SELECT (id, jti, issued_at) ON siwa.notification_log TO siwa_receiver;
        REVOKE INSERT ON siwa.notification_jtis FROM siwa_receiver;
        GRANT INSERT (jti, issued_at, expires_at), SELECT (jti, issued_at) ON siwa.notification_jtis TO siwa_receiver;
        REVOKE INSERT ON siwa.notification_queue FROM siwa_receiver;
        GRANT INSERT (id, jti, issued_at) ON siwa.notification_queue TO siwa_receiver;
        GRANT SELECT (sub, personal_data_erased_at) ON siwa.accounts TO siwa_receiver;
        GRANT SELECT (old_sub, new_sub) ON siwa.sub_aliases TO siwa_receiver;
        GRANT EXECUTE ON FUNCTION siwa.current_sub(text) TO siwa_receiver;
        GRANT EXECUTE ON FUNCTION siwa.store_notifications(text[], text[], text[], text[], text[], boolean[],
            timestamptz[], timestamptz[], timestamptz[], text[], timestamptz[]) TO siwa_receiver;
        GRANT SELECT, INSERT, UPDATE, DELETE ON siwa.service_heartbeats TO siwa_receiver;
        GRANT EXECUTE ON FUNCTION siwa.record_heartbeat(text, text, integer, integer, text, text, text[], timestamptz, interval),
            siwa.remove_heartbeat(text, text, integer) TO siwa_receiver;
        GRANT EXECUTE ON FUNCTION siwa.health_gauges(timestamptz) TO siwa_receiver;
        DROP POLICY IF EXISTS service_heartbeats_receiver ON siwa.service_heartbeats;
        CREATE POLICY service_heartbeats_receiver ON siwa.service_heartbeats TO siwa_receiver
            USING (kind = 'receiver') WITH CHECK (kind = 'receiver');
    END IF;
END;
$$;

-- siwa_worker: the worker's functions and everything they touch, as the worker (SECURITY INVOKER).
-- Functions are matched by name so that every overload (and a function added later to this list's
-- family) is covered when it exists; LISTEN needs no grant. UPDATE on siwa.accounts is also what lets
-- the worker hold a user's row lock, the per-user serialisation no other role here can take.
-- The revoker claims and updates revocation requests, and reads and destroys refresh-token
-- ciphertexts; applying a consent-revoked marks the echo (a trigger). It resolves aliases when it
-- claims notifications (and when it erases a user's history). Webhooks: it inserts deliveries (the
-- fan-out trigger runs as the role inserting the change, and share-locks the pending ones ahead: FOR
-- SHARE needs UPDATE), claims and updates them, records attempts, reads endpoints and secrets, and
-- locks an endpoint's row while it counts its leases (FOR NO KEY UPDATE needs UPDATE). The
-- transitions of its queues (leases, records, repair, heartbeats) are functions run with its rights:
-- EXECUTE on exactly those. Its heartbeats (of its own kind) and the health gauges. The erasure
-- remembers erased addresses (SECURITY DEFINER), and every write of siwa.accounts computes the gate's
-- index expression siwa.mail_address_key.
DO $$
DECLARE
    v_function regprocedure;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT USAGE ON SCHEMA siwa TO siwa_worker;
        GRANT SELECT, UPDATE ON siwa.notification_log TO siwa_worker;
        GRANT SELECT ON siwa.notifications TO siwa_worker;  -- the view of the two, nothing more
        GRANT SELECT, UPDATE, DELETE ON siwa.notification_queue TO siwa_worker;
        GRANT SELECT, DELETE ON siwa.notification_jtis TO siwa_worker;
        GRANT SELECT, DELETE ON siwa.esp_events_seen TO siwa_worker;
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
                                 'process_claimed_notifications', 'create_accounts', 'put_off_busy', 'record_failure',
                                 'retry_delay',
                                 'prune', 'erase_due_personal_data', 'erase_personal_data', 'on_event',
                                 'redact_error', 'erased_error', 'create_log_partitions',
                                 'drop_log_partitions', 'apply_claimed_batch', 'erase_personal_data_of',
                                 'number_changes', 'change_type', 'hook_path', 'on_change', 'current_sub',
                                 'claim_notifications', 'apply_verified_notifications',
                                 'remember_erased_mail_addresses', 'mail_address_key')
        LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO siwa_worker', v_function);
        END LOOP;
        GRANT SELECT, UPDATE ON siwa.revocation_requests TO siwa_worker;
        -- The revoker's per-token outcomes (siwa.record_revocation).
        GRANT SELECT, INSERT, UPDATE ON siwa.revocation_token_outcomes TO siwa_worker;
        -- The revoker forgets sign-in codes a day old (Apple's codes live five minutes).
        GRANT SELECT (created_at), DELETE ON siwa.sign_in_codes TO siwa_worker;
        -- The refresh-token check: its bookkeeping, and consent-revoked events of our own.
        GRANT SELECT, INSERT, UPDATE ON siwa.refresh_token_checks TO siwa_worker;
        GRANT EXECUTE ON FUNCTION siwa.record_consent_lost(text, text) TO siwa_worker;
        GRANT SELECT ON siwa.sub_aliases TO siwa_worker;
        -- Erasure drops the email an import holds for either sub (siwa.erase_personal_data_of).
        GRANT SELECT (old_sub, new_sub, email), UPDATE (email) ON siwa.transfer_imports TO siwa_worker;
        GRANT SELECT ON siwa.webhook_endpoints, siwa.webhook_secrets TO siwa_worker;
        -- auto-disable and isolation (siwa.record_webhook_attempts keeps the run of failures and the
        -- backoff, and disables; a claim locks the endpoint's row and notes when it was claimed)
        GRANT UPDATE (enabled, disabled_at, failing_since, disabled_reason, consecutive_failures, last_failure_at,
                      backoff_until, last_claimed_at) ON siwa.webhook_endpoints TO siwa_worker;
        -- Temporary endpoints past their expiry (the developer loop) are removed by the webhook lanes.
        GRANT EXECUTE ON FUNCTION siwa.remove_expired_webhook_endpoints() TO siwa_worker;
        GRANT SELECT, INSERT, UPDATE ON siwa.webhook_deliveries TO siwa_worker;
        GRANT SELECT, INSERT ON siwa.webhook_attempts TO siwa_worker;
        GRANT EXECUTE ON FUNCTION siwa.webhook_fan_out() TO siwa_worker;
        GRANT EXECUTE ON FUNCTION siwa.claim_webhook_delivery(text, interval, bigint[], timestamptz, integer),
            siwa.record_webhook_attempt(bigint, text, timestamptz, integer, integer, text, double precision, text,
                                        double precision, double precision),
            siwa.claim_webhook_deliveries(text, interval, integer, timestamptz, integer, bigint[]),
            siwa.record_webhook_attempts(text, bigint[], timestamptz[], integer[], integer[], text[],
                                         double precision[], text[], double precision, double precision),
            siwa.repair_webhook_ready(), siwa.claim_revocation(text, interval, timestamptz, integer),
            siwa.record_revocation(bigint, text, bigint[], bytea[], text, text, text, double precision, jsonb),
            siwa.release_revocation(bigint, text), siwa.claim_refresh_check(interval, interval, integer),
            siwa.record_refresh_check(bigint, bytea, text), siwa.prune_sign_in_codes(interval),
            siwa.record_heartbeat(text, text, integer, integer, text, text, text[], timestamptz, interval),
            siwa.remove_heartbeat(text, text, integer) TO siwa_worker;
        -- Suppression lists (schema/69-suppressions.sql): the fan-out trigger on siwa.accounts runs as
        -- the worker; its consumer claims, records and keeps what it added.
        GRANT SELECT ON siwa.suppression_providers TO siwa_worker;
        GRANT SELECT, INSERT, UPDATE ON siwa.suppression_outbox TO siwa_worker;
        GRANT SELECT, INSERT, UPDATE, DELETE ON siwa.suppressions_we_added TO siwa_worker;
        GRANT EXECUTE ON FUNCTION siwa.suppression_fan_out(), siwa.expire_suppression_erasures(),
            siwa.finish_suppression(bigint, text, text), siwa.claim_suppressions(text, interval, integer, text),
            siwa.record_suppression_attempt(bigint, text, text, integer, text, double precision, integer, interval,
                                            interval),
            siwa.record_suppression_attempts(text, bigint[], text[], integer[], text[], double precision[], integer,
                                             interval, interval),
            siwa.suppression_add_sent(bigint, text, boolean), siwa.suppression_added_at(text, text) TO siwa_worker;
        -- Its retention task deletes finished rows past --suppression-retention-days.
        GRANT DELETE ON siwa.suppression_outbox TO siwa_worker;
        GRANT EXECUTE ON FUNCTION siwa.prune_suppressions(interval, integer) TO siwa_worker;
        GRANT SELECT, INSERT, UPDATE, DELETE ON siwa.service_heartbeats TO siwa_worker;
        GRANT EXECUTE ON FUNCTION siwa.health_gauges(timestamptz) TO siwa_worker;
        DROP POLICY IF EXISTS service_heartbeats_worker ON siwa.service_heartbeats;
        CREATE POLICY service_heartbeats_worker ON siwa.service_heartbeats TO siwa_worker
            USING (kind = 'worker') WITH CHECK (kind = 'worker');
    END IF;
END;
$$;

-- siwa_app: request a revocation, nothing else: it inserts exactly sub and reason and reads back the
-- id; it cannot read the ledger, the errors, the tokens or their ciphertexts. It reads the old→new
-- mapping of team transfers (old_sub, new_sub: not who ran it), which siwa.current_sub,
-- siwa.request_revocation and the validity rule use for it too.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_app') THEN
        GRANT USAGE ON SCHEMA siwa TO siwa_app;
        GRANT INSERT (sub, reason) ON siwa.revocation_requests TO siwa_app;
        GRANT SELECT (id) ON siwa.revocation_requests TO siwa_app;
        GRANT EXECUTE ON FUNCTION siwa.request_revocation(text, text) TO siwa_app;
        GRANT SELECT (old_sub, new_sub) ON siwa.sub_aliases TO siwa_app;
        GRANT EXECUTE ON FUNCTION siwa.current_sub(text) TO siwa_app;
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
END;
$$;

-- siwa_signin: the sign-in API's own credential (siwa-receiver --signin-database-url). It acts through
-- the sign-in functions only (SECURITY DEFINER, schema/55-sign-in.sql), and requests revocations
-- through siwa.request_revocation (which runs with its rights: INSERT of sub and reason, SELECT of the
-- id). Every table grant earlier versions gave it (the code and sign-in tables, siwa.accounts' email
-- columns with UPDATE, a refresh token's INSERT, the aliases) is revoked: with them it could read
-- every user's email, rewrite it, insert token rows for anyone, and lock every account row (SELECT …
-- FOR NO KEY UPDATE needs UPDATE of a column), which made every notification busy.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_signin') THEN
        GRANT USAGE ON SCHEMA siwa TO siwa_signin;
        REVOKE ALL ON siwa.sign_in_codes, siwa.sign_ins, siwa.accounts, siwa.refresh_tokens, siwa.sub_aliases
            FROM siwa_signin;
        GRANT INSERT (sub, reason) ON siwa.revocation_requests TO siwa_signin;
        GRANT SELECT (id) ON siwa.revocation_requests TO siwa_signin;
        GRANT EXECUTE ON FUNCTION siwa.begin_sign_in(bytea, text, text), siwa.abandon_sign_in(bytea),
            siwa.record_sign_in(bytea, text, text, text, boolean, boolean, integer, bytea, bytea),
            siwa.sign_in_answer(bytea, text, text), siwa.request_revocation(text, text), siwa.current_sub(text)
            TO siwa_signin;
        -- siwa.request_revocation runs with its caller's rights and maps a replaced sub (siwa.current_sub).
        GRANT SELECT (old_sub, new_sub) ON siwa.sub_aliases TO siwa_signin;
    END IF;
END;
$$;

-- ==== siwa_webhook_admin ====
-- siwa_webhook_admin: manages webhook endpoints through the siwa functions (which run with its rights)
-- without being the owner: add, rotate a secret, enable/disable, retry, replay, remove; reads the
-- webhook views. It writes secrets but never reads one back: no SELECT on siwa.webhook_secrets.secret
-- (only the columns a rotation's WHERE reads). Of siwa.changes it reads the four columns a replay
-- needs (never an email). Deleting an endpoint cascades with the tables' owner's rights.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_webhook_admin') THEN
        GRANT USAGE ON SCHEMA siwa TO siwa_webhook_admin;
        GRANT SELECT ON siwa.webhook_endpoint_overview, siwa.webhook_attempt_history, siwa.webhook_delivery_status
            TO siwa_webhook_admin;
        GRANT EXECUTE ON FUNCTION siwa.add_webhook_endpoint(text, text, text[], integer, text),
            siwa.rotate_webhook_secret(bigint, text, interval, text), siwa.set_webhook_endpoint_enabled(bigint, boolean),
            siwa.retry_webhook_deliveries(bigint, bigint),
            siwa.replay_webhook_deliveries(bigint, bigint, bigint, timestamptz, timestamptz, text),
            siwa.remove_webhook_endpoint(bigint, boolean) TO siwa_webhook_admin;
        GRANT SELECT, INSERT (url, types, max_in_flight), DELETE ON siwa.webhook_endpoints TO siwa_webhook_admin;
        GRANT UPDATE (enabled, disabled_at, disabled_reason, failing_since, consecutive_failures, backoff_until)
            ON siwa.webhook_endpoints TO siwa_webhook_admin;
        GRANT SELECT (id, endpoint_id, created_at, expires_at), INSERT (endpoint_id, secret, public_key), UPDATE (expires_at),
            DELETE ON siwa.webhook_secrets TO siwa_webhook_admin;
        GRANT SELECT, INSERT (change_id, endpoint_id, sub),
            UPDATE (state, attempts, next_attempt_at, first_attempt_at, delivered_at, ready)
            ON siwa.webhook_deliveries TO siwa_webhook_admin;
        GRANT SELECT (id, sub, type, applied_at) ON siwa.changes TO siwa_webhook_admin;
    END IF;
END;
$$;
-- ==== end siwa_webhook_admin ====
-- ==== Webhook visibility (schema/70-health.sql): the per-endpoint gauges ====
-- The gauges' SECURITY DEFINER function is the worker's (/metrics) and siwa_admin's (siwactl stats).
REVOKE ALL ON FUNCTION siwa.webhook_endpoint_gauges() FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT EXECUTE ON FUNCTION siwa.webhook_endpoint_gauges() TO siwa_worker;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_admin') THEN
        GRANT EXECUTE ON FUNCTION siwa.webhook_endpoint_gauges() TO siwa_admin;
    END IF;
END;
$$;
-- ==== end of webhook visibility ====

-- siwa_mail: the relay-mail gate's two SECURITY DEFINER functions, and nothing else: USAGE on the schema
-- (to name them), no table, view, sequence or other function, no CREATE. Both read with the owner's
-- rights and pin their search_path, so nothing on the caller's path changes an answer.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_mail') THEN
        GRANT USAGE ON SCHEMA siwa TO siwa_mail;
        GRANT EXECUTE ON FUNCTION siwa.relay_mail_decision(text), siwa.relay_mail_decisions(text[]) TO siwa_mail;
    END IF;
END;
$$;

-- siwa_bounce: record relay bounces and ESP event ids through their SECURITY DEFINER functions (siwactl mail bounce as
-- Postfix's pipe transport, siwa-mailgate's ESP bounce listener), and nothing else: it reads no table, no key and no answer of the gate.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_bounce') THEN
        GRANT USAGE ON SCHEMA siwa TO siwa_bounce;
        GRANT EXECUTE ON FUNCTION siwa.record_relay_bounce(text, text, text, text, text, text, text) TO siwa_bounce;
        GRANT EXECUTE ON FUNCTION siwa.record_esp_event(text, text, timestamptz) TO siwa_bounce;
    END IF;
END;
$$;

-- Shared Signals (schema/74-shared-signals.sql): the worker's SSF lane claims and records; the fan-out
-- trigger on siwa.changes runs as the worker and reads which subjects each stream includes; admins read
-- the overview.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT SELECT ON siwa.ssf_streams TO siwa_worker;
        GRANT SELECT (stream_id, sub, included) ON siwa.ssf_stream_subjects TO siwa_worker;
        GRANT UPDATE (last_claimed_at) ON siwa.ssf_streams TO siwa_worker;
        GRANT SELECT, INSERT, UPDATE ON siwa.ssf_events TO siwa_worker;
        GRANT EXECUTE ON FUNCTION siwa.ssf_fan_out(), siwa.ssf_event_type(text),
            siwa.claim_ssf_events(text, interval, integer),
            siwa.record_ssf_attempt(bigint, text, text, integer, text, integer, interval, interval),
            siwa.record_ssf_attempts(text, bigint[], text[], integer[], text[], integer, interval, interval)
            TO siwa_worker;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_admin') THEN
        GRANT SELECT ON siwa.ssf_stream_overview TO siwa_admin;
    END IF;
END;
$$;

-- siwa_ssf: the transmitter API's own credential (siwa-receiver --ssf-database-url). It reads receivers
-- (the salted hash, never a secret), issues and prunes token hashes, manages the streams and subjects
-- (the API keeps every call to the caller's own), enqueues the streams' own events and polls. It reads
-- no account, change or other table; deleting a stream cascades with the owner's rights.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_ssf') THEN
        GRANT USAGE ON SCHEMA siwa TO siwa_ssf;
        GRANT SELECT (id, name, client_id, salt, secret_hash, scopes, audience) ON siwa.ssf_receivers TO siwa_ssf;
        GRANT SELECT, INSERT, DELETE ON siwa.ssf_access_tokens TO siwa_ssf;
        GRANT SELECT, DELETE, INSERT (stream_uid, receiver_id, receiver, audience, delivery_method, endpoint_url,
            authorization_ref, events_requested, default_subjects, min_verification_interval, description)
            ON siwa.ssf_streams TO siwa_ssf;
        GRANT UPDATE (audience, endpoint_url, authorization_ref, events_requested, description, status,
            status_reason, updated_at, last_verification_at) ON siwa.ssf_streams TO siwa_ssf;
        GRANT SELECT, INSERT, UPDATE, DELETE ON siwa.ssf_stream_subjects TO siwa_ssf;
        GRANT SELECT, INSERT (change_id, stream_id, change_type, sub, event_time, txn, detail),
            UPDATE (state, delivered_at, lease_owner, lease_expires_at, attempts, last_error)
            ON siwa.ssf_events TO siwa_ssf;
        GRANT EXECUTE ON FUNCTION siwa.ssf_event_type(text), siwa.enqueue_ssf_stream_event(bigint, text, jsonb),
            siwa.update_ssf_stream_status(bigint, text, text), siwa.request_ssf_verification(bigint, text),
            siwa.poll_ssf_events(bigint, text[], jsonb, integer, interval), siwa.ssf_poll_has_more(bigint),
            siwa.issue_ssf_access_token(bytea, bigint, text[], integer),
            siwa.create_ssf_stream(text, bigint, text, text, text, text[], text, integer, text),
            siwa.change_ssf_stream(bigint, text[], text, text, text), siwa.set_ssf_stream_subject(bigint, text, boolean),
            siwa.remove_ssf_stream(bigint)
            TO siwa_ssf;
    END IF;
END;
$$;

-- Auth adapters (schema/76-auth-adapters.sql): the fan-out trigger on siwa.changes runs as the worker
-- (it reads which adapters are enabled and inserts their rows); the worker's adapter lanes claim and
-- record, its erasure takes the sub out of finished rows, its retention prunes them. siwa_admin manages
-- the adapters through their functions (which run with its rights: the writes below, the outbox's
-- retry and prune; the cascade of a removal runs with the owner's) and reads the overview. Neither
-- ever sees a connection URL: the table holds only its file reference.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT SELECT ON siwa.auth_adapters TO siwa_worker;
        GRANT SELECT, INSERT, UPDATE, DELETE ON siwa.auth_adapter_events TO siwa_worker;
        GRANT EXECUTE ON FUNCTION siwa.auth_adapter_fan_out(),
            siwa.claim_auth_adapter_events(text, interval, integer, bigint, timestamptz),
            siwa.record_auth_adapter_events(text, bigint[], text[], text[], jsonb[], integer, interval, interval),
            siwa.prune_auth_adapter_events(interval, integer)
            TO siwa_worker;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_admin') THEN
        GRANT SELECT ON siwa.auth_adapter_overview TO siwa_admin;
        GRANT SELECT, INSERT, UPDATE, DELETE ON siwa.auth_adapters TO siwa_admin;
        GRANT SELECT (id, adapter_id, state, sub, finished_at),
            UPDATE (state, attempts, next_attempt_at, finished_at, result, lease_owner, lease_expires_at), DELETE
            ON siwa.auth_adapter_events TO siwa_admin;
        GRANT EXECUTE ON FUNCTION siwa.check_auth_adapter(),
            siwa.add_auth_adapter(text, text, text, text, jsonb, text, text, text, text, text, boolean),
            siwa.remove_auth_adapter(text), siwa.set_auth_adapter_enabled(text, boolean),
            siwa.retry_auth_adapter_events(bigint, bigint),
            siwa.prune_auth_adapter_events(interval, integer)
            TO siwa_admin;
    END IF;
END;
$$;
