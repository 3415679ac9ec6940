-- The group roles: siwa_admin, siwa_receiver, siwa_worker, siwa_signin, siwa_app, siwa_webhook_admin, siwa_mail, siwa_bounce, siwa_ssf (created when missing, one block)

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
--
-- Two more roles serve the sign-in and revocation section: siwa_signin (the sign-in API in
-- siwa-receiver: grant it to a login of its own, the API's --signin-database-url, never to the
-- receiver's login) and siwa_app (the app's
-- account deletion, its sessions and refresh tokens, the changefeed). What each role may do is granted
-- in schema/85-privileges.sql, one block per role. siwa_mail is the relay-mail gate's (siwa-mailgate,
-- siwactl mail check): it may ask siwa.relay_mail_decision(s), nothing else. siwa_bounce is siwactl mail
-- bounce's: it may record a relay bounce (siwa.record_relay_bounce), nothing else. siwa_ssf is the Shared
-- Signals transmitter API's (siwa-receiver --ssf-listen, its own --ssf-database-url login): receivers'
-- tokens, their streams and subjects, the streams' own events and poll.
DO $$
DECLARE
    v_role     text;
    v_can_create boolean := (SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user);
BEGIN
    FOREACH v_role IN ARRAY ARRAY['siwa_admin', 'siwa_receiver', 'siwa_worker', 'siwa_signin', 'siwa_app',
                                  'siwa_webhook_admin', 'siwa_mail', 'siwa_bounce', 'siwa_ssf'] LOOP
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
                WHEN 'siwa_worker' THEN
                    'Sign in with Apple notifications: what siwa-worker needs (apply, retry, prune, erase). Grant to its login role.'
                -- siwa_webhook_admin
                WHEN 'siwa_webhook_admin' THEN
                    'Sign in with Apple: manage webhook endpoints through the siwa functions (siwactl webhooks add, rotate-secret, enable, disable, retry, replay, remove) without being the owner; never reads a secret back. Grant to people or a deploy tool.'
                WHEN 'siwa_mail' THEN
                    'Sign in with Apple: ask the relay-mail gate (siwa.relay_mail_decision, siwa.relay_mail_decisions) whether an address may be mailed now; nothing else (no table, no other function). Grant to siwa-mailgate''s login and to what runs siwactl mail check.'
                WHEN 'siwa_bounce' THEN
                    'Sign in with Apple: record bounces from Apple''s relay (siwa.record_relay_bounce, siwactl mail bounce); nothing else. Grant to the login of the Postfix pipe transport that runs siwactl mail bounce.'
                WHEN 'siwa_ssf' THEN
                    'Sign in with Apple: what the Shared Signals transmitter API (siwa-receiver --ssf-listen) needs: check receivers'' secrets, issue tokens, manage their streams and subjects, poll. Grant to the API''s own login role (--ssf-database-url), never the receiver''s.'
                WHEN 'siwa_signin' THEN
                    'Sign in with Apple: what the sign-in API (siwa-receiver --signin-listen) needs: record sign-ins and encrypted refresh tokens through its functions, request revocations. Grant to the API''s own login role (--signin-database-url), never the receiver''s.'
                ELSE
                    'Sign in with Apple: what the app needs: record, look up and revoke its sessions and refresh tokens, siwa.session_is_valid, siwa.request_revocation inside its account-deletion transaction. Grant to the app''s login role.'
                END);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL; -- created meanwhile by a concurrent run of this file in another database
        END;
    END LOOP;
END;
$$;
