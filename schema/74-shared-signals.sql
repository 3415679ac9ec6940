-- Shared Signals: streams to SSF receivers and the outbox of Security Event Tokens pushed to them (RFC 8935)

-- Every change in siwa.changes that Shared Signals carry (docs/shared-signals.md) becomes one SET per
-- stream whose requested event types include its type, pushed by siwa-worker's SSF lane.
--  - siwa.ssf_streams: one receiver's stream: its audience (the SETs' aud), the push URL, the reference
--    of its Authorization header (file:PATH, read by the worker at send time; the header itself is never
--    stored, logged or shown), the event types requested (NULL: all), and its status: enabled (pushed),
--    paused (kept, in order, pushed after resume) or disabled (no new events; pending ones wait).
--  - siwa.ssf_events: the outbox, one row per change and stream, written by the AFTER INSERT trigger on
--    siwa.changes in the change's transaction. It copies what a SET says (type, sub, old sub, event time,
--    Apple's jti): no email, nothing an erasure clears, so a pending SET of an erased account stays
--    deliverable and is unchanged. Its jti and iat are fixed at fan-out: every attempt sends the same SET.
--    pending → delivered (202) or failed (a permanent 400 of RFC 8935 § 2.3) or dead (retries ran out).
-- Order: per stream and sub, an event is not claimed while an earlier one of that stream and sub is
-- pending (in flight or waiting for its retry). Isolation: a claim takes at most max_in_flight leased
-- events of one stream; streams are taken least recently claimed first. No lock is held across a POST.
-- Receivers registered for the transmitter's API (siwactl ssf receivers add): OAuth 2.0 clients of the
-- client credentials grant. The secret is never stored: only a random salt and SHA-256(salt || secret).
-- Access tokens are opaque and short-lived, stored as SHA-256(token) with their scopes and expiry.
CREATE TABLE IF NOT EXISTS siwa.ssf_receivers (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text        NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9._-]{1,64}$'),
    client_id   text        NOT NULL UNIQUE CHECK (client_id <> ''),
    salt        bytea       NOT NULL CHECK (length(salt) >= 16),
    secret_hash bytea       NOT NULL CHECK (length(secret_hash) = 32),
    scopes      text[]      NOT NULL CHECK (scopes <@ ARRAY['ssf.manage', 'ssf.read'] AND cardinality(scopes) > 0),
    audience    text        NOT NULL CHECK (audience <> ''),
    created_at  timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE siwa.ssf_receivers IS
    'Shared Signals receivers (OAuth clients of the SSF API): name, client_id, salted SHA-256 of the secret (never the secret), scopes, the aud of their streams'' SETs.';

CREATE TABLE IF NOT EXISTS siwa.ssf_access_tokens (
    token_hash  bytea       PRIMARY KEY CHECK (length(token_hash) = 32),
    receiver_id bigint      NOT NULL REFERENCES siwa.ssf_receivers (id) ON DELETE CASCADE,
    scopes      text[]      NOT NULL,
    expires_at  timestamptz NOT NULL
);
COMMENT ON TABLE siwa.ssf_access_tokens IS
    'Bearer tokens issued by POST /ssf/token: SHA-256 of the token (never the token), its receiver, scopes and expiry; expired ones pruned at issue.';
CREATE INDEX IF NOT EXISTS ssf_access_tokens_expiry_idx ON siwa.ssf_access_tokens (expires_at);

CREATE TABLE IF NOT EXISTS siwa.ssf_streams (
    id                   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    receiver             text        NOT NULL CHECK (receiver <> ''),
    audience             text        NOT NULL CHECK (audience <> ''),
    delivery_method      text        NOT NULL DEFAULT 'urn:ietf:rfc:8935',
    endpoint_url         text        NOT NULL CHECK (endpoint_url ~ '^https?://'),
    authorization_ref    text        CHECK (authorization_ref ~ '^file:/'),
    events_requested     text[],
    status               text        NOT NULL DEFAULT 'enabled' CHECK (status IN ('enabled', 'paused', 'disabled')),
    status_reason        text        CHECK (length(status_reason) <= 300),
    max_in_flight        integer     NOT NULL DEFAULT 4 CHECK (max_in_flight BETWEEN 1 AND 64),
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    last_claimed_at      timestamptz
);
-- The SSF API's columns (added to streams made before it): the public stream_id, the owning receiver
-- (NULL: an operator's stream of siwactl), default subjects, and the verification rate limit.
ALTER TABLE siwa.ssf_streams
    ADD COLUMN IF NOT EXISTS stream_uid text NOT NULL DEFAULT pg_catalog.gen_random_uuid()::text,
    ADD COLUMN IF NOT EXISTS receiver_id bigint REFERENCES siwa.ssf_receivers (id) ON DELETE CASCADE,
    ADD COLUMN IF NOT EXISTS default_subjects text NOT NULL DEFAULT 'ALL',
    ADD COLUMN IF NOT EXISTS min_verification_interval integer NOT NULL DEFAULT 30,
    ADD COLUMN IF NOT EXISTS last_verification_at timestamptz,
    ADD COLUMN IF NOT EXISTS description text;
ALTER TABLE siwa.ssf_streams DROP CONSTRAINT IF EXISTS ssf_streams_delivery_method_check;
ALTER TABLE siwa.ssf_streams ADD CONSTRAINT ssf_streams_delivery_method_check
    CHECK (delivery_method IN ('urn:ietf:rfc:8935', 'urn:ietf:rfc:8936'));
ALTER TABLE siwa.ssf_streams DROP CONSTRAINT IF EXISTS ssf_streams_default_subjects_check;
ALTER TABLE siwa.ssf_streams ADD CONSTRAINT ssf_streams_default_subjects_check
    CHECK (default_subjects IN ('ALL', 'NONE'));
ALTER TABLE siwa.ssf_streams DROP CONSTRAINT IF EXISTS ssf_streams_description_check;
ALTER TABLE siwa.ssf_streams ADD CONSTRAINT ssf_streams_description_check CHECK (length(description) <= 300);
CREATE UNIQUE INDEX IF NOT EXISTS ssf_streams_uid_idx ON siwa.ssf_streams (stream_uid);
CREATE INDEX IF NOT EXISTS ssf_streams_receiver_idx ON siwa.ssf_streams (receiver_id);
COMMENT ON COLUMN siwa.ssf_streams.stream_uid IS 'The SSF API''s stream_id (random, not guessable).';
COMMENT ON COLUMN siwa.ssf_streams.receiver_id IS 'The SSF API receiver that owns it; NULL: added by siwactl.';
COMMENT ON COLUMN siwa.ssf_streams.default_subjects IS
    'ALL: every subject but those removed; NONE: only the subjects added (siwa.ssf_stream_subjects).';

-- Subjects added to (included) or removed from (excluded) a stream through the SSF API.
CREATE TABLE IF NOT EXISTS siwa.ssf_stream_subjects (
    stream_id bigint  NOT NULL REFERENCES siwa.ssf_streams (id) ON DELETE CASCADE,
    sub       text    NOT NULL CHECK (sub <> ''),
    included  boolean NOT NULL,
    PRIMARY KEY (stream_id, sub)
);
COMMENT ON TABLE siwa.ssf_stream_subjects IS
    'Per stream, iss_sub subjects added (included) or removed (excluded); the fan-out filters by them.';
COMMENT ON TABLE siwa.ssf_streams IS
    'Shared Signals push streams (siwactl ssf streams): receiver, aud, push URL, the Authorization header''s file reference (never the header), events requested, status.';
COMMENT ON COLUMN siwa.ssf_streams.authorization_ref IS
    'file:PATH of a file holding the Authorization header value the worker sends (e.g. Bearer …); NULL: none. The value is never stored here.';
COMMENT ON COLUMN siwa.ssf_streams.events_requested IS 'Event type URIs the receiver asked for; NULL: every type supported.';
COMMENT ON COLUMN siwa.ssf_streams.status IS
    'enabled: pushed; paused: new events kept and pushed in order after resume; disabled: no new events, pending ones wait.';

CREATE TABLE IF NOT EXISTS siwa.ssf_events (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    change_id        bigint,
    stream_id        bigint      NOT NULL REFERENCES siwa.ssf_streams (id) ON DELETE CASCADE,
    jti              text        NOT NULL DEFAULT pg_catalog.gen_random_uuid()::text UNIQUE,
    issued_at        timestamptz NOT NULL DEFAULT now(),
    change_type      text        NOT NULL,
    sub              text        NOT NULL,
    old_sub          text,
    event_time       timestamptz NOT NULL,
    txn              text        NOT NULL,
    state            text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed', 'dead')),
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    last_status      integer,
    last_error       text        CHECK (length(last_error) <= 300),
    lease_owner      text,
    lease_expires_at timestamptz,
    detail           jsonb,
    CONSTRAINT ssf_events_lease_check CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    UNIQUE (change_id, stream_id)
);
-- The stream's own SSF events (verification, stream-updated) have no change: change_id NULL, sub the
-- stream_uid (their sub_id is opaque), detail the event's members.
ALTER TABLE siwa.ssf_events ALTER COLUMN change_id DROP NOT NULL;
ALTER TABLE siwa.ssf_events ADD COLUMN IF NOT EXISTS detail jsonb;
COMMENT ON TABLE siwa.ssf_events IS
    'The SET outbox: one row per change and stream; what the SET says, copied at fan-out (no personal data), with its fixed jti and iat; pending, delivered, failed (permanent 400) or dead.';
COMMENT ON COLUMN siwa.ssf_events.jti IS 'The SET''s jti, the same for every attempt.';
COMMENT ON COLUMN siwa.ssf_events.txn IS 'The Apple notification''s jti (the SET''s txn; empty: none).';
COMMENT ON COLUMN siwa.ssf_events.last_error IS 'Our own bounded words, or the receiver''s err code; never a header or a body.';
CREATE INDEX IF NOT EXISTS ssf_events_order_idx ON siwa.ssf_events (stream_id, sub, id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS ssf_events_due_idx ON siwa.ssf_events (stream_id, id) WHERE state = 'pending';
-- The leased events of a stream (at most its max_in_flight), counted by every claim: without it the
-- count reads every pending event of the stream.
CREATE INDEX IF NOT EXISTS ssf_events_leased_idx
    ON siwa.ssf_events (stream_id) WHERE state = 'pending' AND lease_expires_at IS NOT NULL;

-- The event type URI a change is sent as (SharedSignals.SecurityEventToken.EventType); NULL: not carried.
CREATE OR REPLACE FUNCTION siwa.ssf_event_type(p_change_type text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE p_change_type
        WHEN 'siwa.consent_revoked' THEN 'https://schemas.openid.net/secevent/caep/event-type/session-revoked'
        WHEN 'siwa.account_deleted' THEN 'https://schemas.openid.net/secevent/risc/event-type/account-purged'
        WHEN 'siwa.sub_transferred' THEN 'urn:siwa:secevent:event-type:subject-transferred'
        WHEN 'siwa.email_disabled' THEN 'urn:siwa:secevent:event-type:email-forwarding-disabled'
        WHEN 'siwa.email_enabled' THEN 'urn:siwa:secevent:event-type:email-forwarding-enabled'
        WHEN 'ssf.verification' THEN 'https://schemas.openid.net/secevent/ssf/event-type/verification'
        WHEN 'ssf.stream_updated' THEN 'https://schemas.openid.net/secevent/ssf/event-type/stream-updated'
    END
$$;
COMMENT ON FUNCTION siwa.ssf_event_type(text) IS
    'The Shared Signals event type URI of a siwa.changes type; NULL for a type not sent (siwa.personal_data_erased).';

-- The fan-out: once per INSERT statement on siwa.changes, one SET per new change and enabled or paused
-- stream that requested its type and whose subjects include its sub (a transfer's SET: its old sub
-- too, so a receiver that added the old one hears of the new); one NOTIFY siwa_ssf (at commit) when there is any.
CREATE OR REPLACE FUNCTION siwa.ssf_fan_out() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM siwa.ssf_streams s WHERE s.status <> 'disabled') THEN
        RETURN NULL;
    END IF;
    INSERT INTO siwa.ssf_events (change_id, stream_id, change_type, sub, old_sub, event_time, txn)
    SELECT c.id, s.id, c.type, c.sub, c.old_sub, c.event_time, c.jti
      FROM new_changes c
      JOIN siwa.ssf_streams s ON s.status <> 'disabled'
       AND siwa.ssf_event_type(c.type) IS NOT NULL
       AND c.type NOT LIKE 'ssf.%'
       AND (s.events_requested IS NULL OR siwa.ssf_event_type(c.type) = ANY (s.events_requested))
       AND CASE s.default_subjects
               WHEN 'NONE' THEN EXISTS (SELECT 1 FROM siwa.ssf_stream_subjects x
                                         WHERE x.stream_id = s.id AND x.included
                                           AND (x.sub = c.sub OR x.sub = c.old_sub))
               ELSE NOT EXISTS (SELECT 1 FROM siwa.ssf_stream_subjects x
                                 WHERE x.stream_id = s.id AND NOT x.included
                                   AND (x.sub = c.sub OR x.sub = c.old_sub))
           END
     ORDER BY c.id, s.id;
    IF FOUND THEN
        PERFORM pg_catalog.pg_notify('siwa_ssf', '');
    END IF;
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION siwa.ssf_fan_out() IS
    'Statement trigger after INSERT on siwa.changes: one SET per new change and matching stream that is not disabled.';
DROP TRIGGER IF EXISTS changes_ssf_fan_out ON siwa.changes;
CREATE TRIGGER changes_ssf_fan_out
    AFTER INSERT ON siwa.changes REFERENCING NEW TABLE AS new_changes
    FOR EACH STATEMENT EXECUTE FUNCTION siwa.ssf_fan_out();

-- Leases up to p_limit due events for p_owner for p_lease, which the lane sends one after another: per
-- stream (enabled only, least recently claimed first, its row locked while its lanes are counted) at
-- most max_in_flight lanes holding leases, and per stream and sub only the earliest pending one.
-- Poll streams (urn:ietf:rfc:8936) are served by siwa.poll_ssf_events, never claimed here.
DROP FUNCTION IF EXISTS siwa.claim_ssf_events(text, interval, integer);
CREATE FUNCTION siwa.claim_ssf_events(p_owner text, p_lease interval, p_limit integer)
RETURNS TABLE (id bigint, stream_id bigint, jti text, issued_at timestamptz, change_type text, sub text,
               old_sub text, event_time timestamptz, txn text, attempts integer, audience text,
               endpoint_url text, authorization_ref text, detail jsonb)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_stream record;
    v_room   integer;
    v_left   integer := p_limit;
BEGIN
    FOR v_stream IN
        SELECT s.id, s.max_in_flight FROM siwa.ssf_streams s
         WHERE s.status = 'enabled' AND s.delivery_method = 'urn:ietf:rfc:8935'
           -- the first due pending event in the due index's order: the row bounds and the two-column order
           -- only that index answers (ordered by id alone, stale statistics let the planner walk the
           -- primary key from its start, where the delivered events gather)
           AND (SELECT e.id FROM siwa.ssf_events e
                 WHERE (e.stream_id, e.id) BETWEEN (s.id, 0) AND (s.id, 9223372036854775807)
                   AND e.state = 'pending' AND e.next_attempt_at <= now()
                 ORDER BY e.stream_id, e.id LIMIT 1) IS NOT NULL
         ORDER BY s.last_claimed_at NULLS FIRST, s.id
           FOR NO KEY UPDATE SKIP LOCKED
    LOOP
        EXIT WHEN v_left <= 0;
        -- Its lanes in flight: a lane sends its batch one SET at a time.
        SELECT v_stream.max_in_flight - count(DISTINCT e.lease_owner) INTO v_room FROM siwa.ssf_events e
         WHERE e.stream_id = v_stream.id AND e.state = 'pending'
           AND e.lease_expires_at IS NOT NULL AND e.lease_expires_at > clock_timestamp();
        CONTINUE WHEN v_room <= 0;
        RETURN QUERY
        WITH heads AS (
            SELECT e.id FROM siwa.ssf_events e
             WHERE (e.stream_id, e.id) BETWEEN (v_stream.id, 0) AND (v_stream.id, 9223372036854775807)
               AND e.state = 'pending' AND e.next_attempt_at <= now()
               AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= clock_timestamp())
               AND e.id = (SELECT p.id FROM siwa.ssf_events p
                            WHERE p.stream_id = e.stream_id AND p.sub = e.sub AND p.state = 'pending'
                            ORDER BY p.id LIMIT 1)
             ORDER BY e.stream_id, e.id
             LIMIT v_left
               FOR UPDATE SKIP LOCKED),
        leased AS (
            UPDATE siwa.ssf_events e
               SET lease_owner = p_owner, lease_expires_at = clock_timestamp() + p_lease, attempts = e.attempts + 1
              FROM heads h WHERE e.id = h.id
            RETURNING e.*)
        SELECT l.id, l.stream_id, l.jti, l.issued_at, l.change_type, l.sub, l.old_sub, l.event_time, l.txn,
               l.attempts, s.audience, s.endpoint_url, s.authorization_ref, l.detail
          FROM leased l JOIN siwa.ssf_streams s ON s.id = l.stream_id
         ORDER BY l.id;
        GET DIAGNOSTICS v_room = ROW_COUNT;
        v_left := v_left - v_room;
        IF v_room > 0 THEN
            UPDATE siwa.ssf_streams s SET last_claimed_at = now() WHERE s.id = v_stream.id;
        END IF;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION siwa.claim_ssf_events(text, interval, integer) IS
    'Leases up to p_limit due SETs of enabled push streams to one lane (p_owner), sent one after another: per stream at most max_in_flight lanes in flight, per stream and sub the earliest pending only. Executable by siwa_worker.';

-- Records one attempt of a leased event: p_outcome delivered (202), failed (a permanent 400), or retry
-- (after siwa.retry_delay(attempts, p_retry_base, p_retry_max); dead once p_max_attempts is reached).
-- False, with nothing written, when the lease is no longer the caller's.
CREATE OR REPLACE FUNCTION siwa.record_ssf_attempt(p_id bigint, p_owner text, p_outcome text, p_status integer,
                                                   p_error text, p_max_attempts integer,
                                                   p_retry_base interval, p_retry_max interval)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_outcome IS NULL OR p_outcome NOT IN ('delivered', 'failed', 'retry', 'released') THEN
        RAISE EXCEPTION 'the outcome is delivered, failed, retry or released' USING ERRCODE = '22023';
    END IF;
    IF p_outcome = 'released' THEN
        -- Claimed in a batch and never sent: the lease given back, the claim's count undone.
        UPDATE siwa.ssf_events e SET attempts = e.attempts - 1, lease_owner = NULL, lease_expires_at = NULL
         WHERE e.id = p_id AND e.lease_owner = p_owner AND e.state = 'pending';
        RETURN FOUND;
    END IF;
    UPDATE siwa.ssf_events e
       SET state = CASE WHEN p_outcome = 'delivered' THEN 'delivered'
                        WHEN p_outcome = 'failed' THEN 'failed'
                        WHEN e.attempts >= p_max_attempts THEN 'dead'
                        ELSE 'pending' END,
           delivered_at = CASE WHEN p_outcome = 'delivered' THEN now() END,
           next_attempt_at = CASE WHEN p_outcome = 'retry'
                                  THEN clock_timestamp() + siwa.retry_delay(e.attempts, p_retry_base, p_retry_max)
                                  ELSE e.next_attempt_at END,
           last_status = p_status, last_error = left(p_error, 300),
           lease_owner = NULL, lease_expires_at = NULL
     WHERE e.id = p_id AND e.lease_owner = p_owner AND e.state = 'pending';
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION siwa.record_ssf_attempt(bigint, text, text, integer, text, integer, interval, interval) IS
    'Records a push attempt of a leased SET: delivered, failed (permanent) or retry (dead after p_max_attempts); released: claimed in a batch and not sent, its attempt uncounted. False when the lease is not the caller''s. Executable by siwa_worker.';

-- Records a lane's batch in one statement: each (p_ids[i], p_outcomes[i], p_statuses[i], p_errors[i]) as
-- siwa.record_ssf_attempt records it; returns the ids whose lease was still p_owner's.
CREATE OR REPLACE FUNCTION siwa.record_ssf_attempts(p_owner text, p_ids bigint[], p_outcomes text[],
                                                    p_statuses integer[], p_errors text[], p_max_attempts integer,
                                                    p_retry_base interval, p_retry_max interval)
RETURNS SETOF bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF pg_catalog.cardinality(p_ids) IS DISTINCT FROM pg_catalog.cardinality(p_outcomes) THEN
        RAISE EXCEPTION 'one outcome per id' USING ERRCODE = '22023';
    END IF;
    FOR i IN 1 .. coalesce(pg_catalog.cardinality(p_ids), 0) LOOP
        IF siwa.record_ssf_attempt(p_ids[i], p_owner, p_outcomes[i], p_statuses[i], p_errors[i], p_max_attempts,
                                   p_retry_base, p_retry_max) THEN
            RETURN NEXT p_ids[i];
        END IF;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION siwa.record_ssf_attempts(text, bigint[], text[], integer[], text[], integer, interval, interval) IS
    'Records a lane''s batch of push attempts and releases (each as siwa.record_ssf_attempt does) in one statement; returns the ids whose lease was still p_owner''s. Executable by siwa_worker.';

-- The operator's calls (siwactl ssf streams): add, set the status, remove. Setting enabled wakes the lanes.
CREATE OR REPLACE FUNCTION siwa.add_ssf_stream(p_receiver text, p_audience text, p_endpoint_url text,
                                               p_authorization_ref text DEFAULT NULL,
                                               p_events_requested text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_events_requested) t WHERE t NOT IN (
        SELECT siwa.ssf_event_type(x) FROM unnest(ARRAY['siwa.consent_revoked', 'siwa.account_deleted',
            'siwa.sub_transferred', 'siwa.email_disabled', 'siwa.email_enabled']) x)) THEN
        RAISE EXCEPTION 'an event type requested is not supported' USING ERRCODE = '22023';
    END IF;
    INSERT INTO siwa.ssf_streams AS s (receiver, audience, endpoint_url, authorization_ref, events_requested)
    VALUES (p_receiver, p_audience, p_endpoint_url, p_authorization_ref, p_events_requested) RETURNING s.id INTO v_id;
    RETURN v_id;
END;
$$;
COMMENT ON FUNCTION siwa.add_ssf_stream(text, text, text, text, text[]) IS
    'Adds a push stream (siwactl ssf streams add); returns its id.';

CREATE OR REPLACE FUNCTION siwa.set_ssf_stream_status(p_stream bigint, p_status text, p_reason text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE siwa.ssf_streams s SET status = p_status, status_reason = left(p_reason, 300), updated_at = now()
     WHERE s.id = p_stream;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_status = 'enabled' THEN
        PERFORM pg_catalog.pg_notify('siwa_ssf', '');
    END IF;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION siwa.set_ssf_stream_status(bigint, text, text) IS
    'Sets a stream enabled, paused or disabled (siwactl ssf streams resume/pause); enabling wakes the SSF lanes. False for an unknown stream.';

-- Removes a stream and, by cascade, its SETs and subjects (siwactl ssf streams remove, and the SSF API's
-- DELETE as siwa_ssf, which keeps the call to the caller's own stream). False for an unknown stream.
CREATE OR REPLACE FUNCTION siwa.remove_ssf_stream(p_stream bigint)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM siwa.ssf_streams s WHERE s.id = p_stream;
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION siwa.remove_ssf_stream(bigint) IS
    'Removes a stream, its SETs and subjects (siwactl ssf streams remove; the SSF API''s DELETE, as siwa_ssf). False for an unknown stream.';

-- The receivers of the SSF API (siwactl ssf receivers): add one (the secret's salted hash, never the
-- secret), remove one with its tokens, streams and their SETs.
CREATE OR REPLACE FUNCTION siwa.add_ssf_receiver(p_name text, p_client_id text, p_salt bytea, p_secret_hash bytea,
                                                 p_scopes text[], p_audience text)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO siwa.ssf_receivers AS r (name, client_id, salt, secret_hash, scopes, audience)
    VALUES (p_name, p_client_id, p_salt, p_secret_hash, p_scopes, p_audience) RETURNING r.id INTO v_id;
    RETURN v_id;
END;
$$;
COMMENT ON FUNCTION siwa.add_ssf_receiver(text, text, bytea, bytea, text[], text) IS
    'Registers a receiver of the SSF API (siwactl ssf receivers add): its client_id, the salted SHA-256 of its secret (never the secret), scopes and aud; returns its id.';

CREATE OR REPLACE FUNCTION siwa.remove_ssf_receiver(p_name text)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM siwa.ssf_receivers r WHERE r.name = p_name;
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION siwa.remove_ssf_receiver(text) IS
    'Removes a receiver with its tokens, streams and their SETs (siwactl ssf receivers remove). False for an unknown name.';

-- The SSF API's writes (SignalTransmitter, as siwa_ssf; each SECURITY INVOKER, within the role's own
-- grants). An access token: expired ones pruned, then the new one's hash stored with its scopes and expiry.
CREATE OR REPLACE FUNCTION siwa.issue_ssf_access_token(p_token_hash bytea, p_receiver bigint, p_scopes text[],
                                                       p_lifetime integer)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM siwa.ssf_access_tokens t WHERE t.expires_at < now();
    INSERT INTO siwa.ssf_access_tokens (token_hash, receiver_id, scopes, expires_at)
    VALUES (p_token_hash, p_receiver, p_scopes, now() + p_lifetime * interval '1 second');
END;
$$;
COMMENT ON FUNCTION siwa.issue_ssf_access_token(bytea, bigint, text[], integer) IS
    'Prunes expired SSF access tokens and stores a new one''s SHA-256 with its receiver, scopes and lifetime in seconds (POST /ssf/token, as siwa_ssf).';

-- A stream created by a receiver through the API, with the receiver's name and aud. False (nothing
-- written) for an unknown receiver.
CREATE OR REPLACE FUNCTION siwa.create_ssf_stream(p_stream_uid text, p_receiver bigint, p_delivery_method text,
                                                  p_endpoint_url text, p_authorization_ref text,
                                                  p_events_requested text[], p_default_subjects text,
                                                  p_min_verification_interval integer, p_description text)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO siwa.ssf_streams (stream_uid, receiver_id, receiver, audience, delivery_method, endpoint_url,
        authorization_ref, events_requested, default_subjects, min_verification_interval, description)
    SELECT p_stream_uid, r.id, r.name, r.audience, p_delivery_method, p_endpoint_url, p_authorization_ref,
           p_events_requested, p_default_subjects, p_min_verification_interval, p_description
      FROM siwa.ssf_receivers r WHERE r.id = p_receiver;
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION siwa.create_ssf_stream(text, bigint, text, text, text, text[], text, integer, text) IS
    'Creates a stream of an SSF API receiver (POST /ssf/streams, as siwa_ssf) with its name and aud. False for an unknown receiver.';

-- A stream's receiver-supplied members replaced as the API's PATCH or PUT computed them.
CREATE OR REPLACE FUNCTION siwa.change_ssf_stream(p_stream bigint, p_events_requested text[], p_description text,
                                                  p_endpoint_url text, p_authorization_ref text)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE siwa.ssf_streams s SET events_requested = p_events_requested, description = p_description,
           endpoint_url = p_endpoint_url, authorization_ref = p_authorization_ref, updated_at = now()
     WHERE s.id = p_stream;
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION siwa.change_ssf_stream(bigint, text[], text, text, text) IS
    'Sets a stream''s events requested, description, push URL and Authorization file reference (PATCH or PUT /ssf/streams, as siwa_ssf). False for an unknown stream.';

-- A subject added to (included) or removed from (excluded) a stream (SSF 1.0 §§ 8.1.3.2, 8.1.3.3).
CREATE OR REPLACE FUNCTION siwa.set_ssf_stream_subject(p_stream bigint, p_sub text, p_included boolean)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO siwa.ssf_stream_subjects (stream_id, sub, included) VALUES (p_stream, p_sub, p_included)
    ON CONFLICT (stream_id, sub) DO UPDATE SET included = EXCLUDED.included;
END;
$$;
COMMENT ON FUNCTION siwa.set_ssf_stream_subject(bigint, text, boolean) IS
    'Adds (included) or removes (excluded) an iss_sub subject of a stream (the SSF API''s subjects:add/remove, as siwa_ssf).';

-- The SSF API's calls (SignalTransmitter, as siwa_ssf). A stream's own event (verification,
-- stream-updated): one SET to the stream, ordered with its other stream events (sub = stream_uid).
CREATE OR REPLACE FUNCTION siwa.enqueue_ssf_stream_event(p_stream bigint, p_type text, p_detail jsonb)
RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_jti text;
BEGIN
    IF p_type NOT IN ('ssf.verification', 'ssf.stream_updated') THEN
        RAISE EXCEPTION 'a stream event is ssf.verification or ssf.stream_updated' USING ERRCODE = '22023';
    END IF;
    INSERT INTO siwa.ssf_events AS e (change_id, stream_id, change_type, sub, event_time, txn, detail)
    SELECT NULL, s.id, p_type, s.stream_uid, now(), '', p_detail FROM siwa.ssf_streams s WHERE s.id = p_stream
    RETURNING e.jti INTO v_jti;
    IF v_jti IS NOT NULL THEN
        PERFORM pg_catalog.pg_notify('siwa_ssf', '');
    END IF;
    RETURN v_jti;
END;
$$;
COMMENT ON FUNCTION siwa.enqueue_ssf_stream_event(bigint, text, jsonb) IS
    'Enqueues a stream''s own SSF event (verification or stream-updated) as one SET; returns its jti (NULL: no stream).';

-- Sets a stream's status as the SSF API does: a changed status enqueues a stream-updated SET.
CREATE OR REPLACE FUNCTION siwa.update_ssf_stream_status(p_stream bigint, p_status text, p_reason text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_old text;
BEGIN
    SELECT s.status INTO v_old FROM siwa.ssf_streams s WHERE s.id = p_stream FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_old IS DISTINCT FROM p_status THEN
        UPDATE siwa.ssf_streams s SET status = p_status, status_reason = left(p_reason, 300), updated_at = now()
         WHERE s.id = p_stream;
        PERFORM siwa.enqueue_ssf_stream_event(p_stream, 'ssf.stream_updated',
            pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object('status', p_status, 'reason', left(p_reason, 300))));
    END IF;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION siwa.update_ssf_stream_status(bigint, text, text) IS
    'Sets a stream enabled, paused or disabled from the SSF API; a change enqueues a stream-updated SET. False for an unknown stream.';

-- A verification event unless the last one was sooner than min_verification_interval ago: returns the
-- seconds to wait (0: enqueued).
CREATE OR REPLACE FUNCTION siwa.request_ssf_verification(p_stream bigint, p_state text)
RETURNS double precision
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_stream record;
    v_wait   double precision;
BEGIN
    SELECT s.last_verification_at, s.min_verification_interval INTO v_stream
      FROM siwa.ssf_streams s WHERE s.id = p_stream FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_wait := extract(epoch FROM v_stream.last_verification_at
                      + v_stream.min_verification_interval * interval '1 second' - clock_timestamp());
    IF v_wait > 0 THEN
        RETURN v_wait;
    END IF;
    UPDATE siwa.ssf_streams s SET last_verification_at = clock_timestamp() WHERE s.id = p_stream;
    PERFORM siwa.enqueue_ssf_stream_event(p_stream, 'ssf.verification',
        CASE WHEN p_state IS NULL THEN '{}'::jsonb ELSE pg_catalog.jsonb_build_object('state', p_state) END);
    RETURN 0;
END;
$$;
COMMENT ON FUNCTION siwa.request_ssf_verification(bigint, text) IS
    'Enqueues a verification SET (with state) unless sooner than min_verification_interval: returns the seconds to wait, 0 when enqueued, NULL for no stream.';

-- Poll (RFC 8936) in one transaction: acknowledge p_acks (delivered), record p_errs ({jti: {err, …}}:
-- failed, the err code kept), then lease up to p_max SETs of the enabled stream for p_lease: per sub only
-- the earliest pending one (a sub's next SET is served once this one is acknowledged or failed), an
-- unacknowledged one served again when its lease has expired.
CREATE OR REPLACE FUNCTION siwa.poll_ssf_events(p_stream bigint, p_acks text[], p_errs jsonb, p_max integer,
                                                p_lease interval)
RETURNS TABLE (jti text, issued_at timestamptz, change_type text, sub text, old_sub text,
               event_time timestamptz, txn text, detail jsonb)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE siwa.ssf_events e SET state = 'delivered', delivered_at = now(), lease_owner = NULL, lease_expires_at = NULL
     WHERE e.stream_id = p_stream AND e.state = 'pending' AND e.jti = ANY (coalesce(p_acks, '{}'));
    UPDATE siwa.ssf_events e SET state = 'failed', lease_owner = NULL, lease_expires_at = NULL,
           last_error = left('setErr err=' || coalesce(
               CASE WHEN (x.value ->> 'err') ~ '^[A-Za-z0-9_]{1,64}$' THEN x.value ->> 'err' END, 'unknown'), 300)
      FROM pg_catalog.jsonb_each(coalesce(p_errs, '{}'::jsonb)) x
     WHERE e.stream_id = p_stream AND e.state = 'pending' AND e.jti = x.key;
    IF p_max <= 0 OR NOT EXISTS (SELECT 1 FROM siwa.ssf_streams s WHERE s.id = p_stream AND s.status = 'enabled') THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH heads AS (
        SELECT e.id FROM siwa.ssf_events e
         WHERE e.stream_id = p_stream AND e.state = 'pending'
           AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= clock_timestamp())
           AND e.id = (SELECT p.id FROM siwa.ssf_events p
                        WHERE p.stream_id = e.stream_id AND p.sub = e.sub AND p.state = 'pending'
                        ORDER BY p.id LIMIT 1)
         ORDER BY e.id
         LIMIT p_max
           FOR UPDATE SKIP LOCKED),
    leased AS (
        UPDATE siwa.ssf_events e
           SET lease_owner = 'poll', lease_expires_at = clock_timestamp() + p_lease, attempts = e.attempts + 1
          FROM heads h WHERE e.id = h.id
        RETURNING e.*)
    SELECT l.jti, l.issued_at, l.change_type, l.sub, l.old_sub, l.event_time, l.txn, l.detail
      FROM leased l ORDER BY l.id;
END;
$$;
COMMENT ON FUNCTION siwa.poll_ssf_events(bigint, text[], jsonb, integer, interval) IS
    'RFC 8936 poll of one stream in one transaction: acks, setErrs, then leases up to p_max SETs (per sub the earliest pending). Executable by siwa_ssf.';

-- Whether a poll would find more now (moreAvailable): a servable SET of the enabled stream.
CREATE OR REPLACE FUNCTION siwa.ssf_poll_has_more(p_stream bigint) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (
        SELECT 1 FROM siwa.ssf_events e JOIN siwa.ssf_streams s ON s.id = e.stream_id AND s.status = 'enabled'
         WHERE e.stream_id = p_stream AND e.state = 'pending'
           AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= clock_timestamp())
           AND e.id = (SELECT p.id FROM siwa.ssf_events p
                        WHERE p.stream_id = e.stream_id AND p.sub = e.sub AND p.state = 'pending'
                        ORDER BY p.id LIMIT 1))
$$;
COMMENT ON FUNCTION siwa.ssf_poll_has_more(bigint) IS 'Whether a poll of the stream would serve a SET now (RFC 8936 moreAvailable).';

CREATE OR REPLACE VIEW siwa.ssf_stream_overview AS
SELECT s.id, s.receiver, s.audience, s.delivery_method, s.endpoint_url, s.authorization_ref IS NOT NULL AS has_authorization,
       s.events_requested, s.status, s.status_reason, s.max_in_flight, s.created_at, s.updated_at,
       (SELECT count(*) FROM siwa.ssf_events e WHERE e.stream_id = s.id AND e.state = 'pending') AS pending,
       (SELECT count(*) FROM siwa.ssf_events e WHERE e.stream_id = s.id AND e.state = 'delivered') AS delivered,
       (SELECT count(*) FROM siwa.ssf_events e WHERE e.stream_id = s.id AND e.state IN ('failed', 'dead')) AS failed
  FROM siwa.ssf_streams s;
COMMENT ON VIEW siwa.ssf_stream_overview IS 'Shared Signals streams with their event counts; never an Authorization header.';
COMMENT ON COLUMN siwa.ssf_stream_overview.id IS 'The stream''s id (siwactl ssf streams --stream ID).';
COMMENT ON COLUMN siwa.ssf_stream_overview.receiver IS 'The receiver''s name, the operator''s label.';
COMMENT ON COLUMN siwa.ssf_stream_overview.audience IS 'The SETs'' aud.';
COMMENT ON COLUMN siwa.ssf_stream_overview.delivery_method IS 'urn:ietf:rfc:8935 (push).';
COMMENT ON COLUMN siwa.ssf_stream_overview.endpoint_url IS 'Where SETs are POSTed.';
COMMENT ON COLUMN siwa.ssf_stream_overview.has_authorization IS 'Whether an Authorization header is sent (its value is never shown).';
COMMENT ON COLUMN siwa.ssf_stream_overview.events_requested IS 'Event type URIs requested; NULL: all.';
COMMENT ON COLUMN siwa.ssf_stream_overview.status IS 'enabled, paused or disabled.';
COMMENT ON COLUMN siwa.ssf_stream_overview.status_reason IS 'Why it was last paused or disabled.';
COMMENT ON COLUMN siwa.ssf_stream_overview.max_in_flight IS 'Pushes in flight at once, across every worker.';
COMMENT ON COLUMN siwa.ssf_stream_overview.created_at IS 'When it was added.';
COMMENT ON COLUMN siwa.ssf_stream_overview.updated_at IS 'When its status last changed.';
COMMENT ON COLUMN siwa.ssf_stream_overview.pending IS 'SETs waiting or in flight.';
COMMENT ON COLUMN siwa.ssf_stream_overview.delivered IS 'SETs answered 202.';
COMMENT ON COLUMN siwa.ssf_stream_overview.failed IS 'SETs refused for good (a 400 of RFC 8935) or dead.';

-- A SET once issued names the subject as it was: a team transfer keeps it (its own SET announces the new sub);
-- a stream's subject list keeps the identifier the receiver gave.
INSERT INTO siwa.sub_columns (table_name, column_name, on_transfer, why) VALUES
    ('ssf_events', 'sub', 'keep', 'a SET once issued (fixed jti) names the sub as it was; the transfer''s own SET names the new one'),
    ('ssf_stream_subjects', 'sub', 'keep', 'the receiver added or removed that identifier; the transfer''s SET (matched on the old sub too) tells it the new one to add')
ON CONFLICT (table_name, column_name) DO UPDATE SET on_transfer = EXCLUDED.on_transfer, why = EXCLUDED.why;
