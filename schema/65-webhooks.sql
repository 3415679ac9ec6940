-- Signed outbound webhooks: endpoints, secrets, deliveries, attempts, and their views

-- Every change in siwa.changes is sent to every enabled endpoint whose types it matches, by siwa-worker,
-- as a Standard Webhooks message (webhook-id msg_<change id>_<endpoint id>, webhook-timestamp,
-- webhook-signature v1,… with each of the endpoint's live secrets; docs/webhooks.md).
--  - siwa.webhook_endpoints: where to send (https, or http to a loopback IP literal), which types, whether
--    enabled, and how many attempts may be in flight at once (max_in_flight); and its state as the lanes
--    see it: its current run of failed attempts (consecutive_failures, failing_since, last_failure_at),
--    when it may be tried again as a whole (backoff_until), when a claim last took one of its
--    deliveries (last_claimed_at). The one home of "failing since": auto-disable, the gauges and the
--    isolation read it here.
--  - siwa.webhook_secrets: the endpoint's whsec_ secrets. A rotation gives the current one an expiry (the
--    overlap) and adds a new one; until the expiry both sign. Readable by siwa_worker and the owner only.
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
-- Isolation (docs/webhooks.md, "Isolation"): one endpoint never takes more than its share of the lanes.
-- A claim locks the endpoint's row (FOR NO KEY UPDATE, for its short transaction only) while it counts
-- the endpoint's live leases, and takes a delivery only while the endpoint has fewer than
--  - max_in_flight across every worker, or 1 while it is failing (its last attempt failed: one probe at
--    a time), and
--  - its share of the claiming process's own lanes (the rule: docs/webhooks.md, "Isolation"; computed
--    once, in siwa.claim_webhook_delivery): an endpoint that hangs leaves at least one lane to the others.
-- After 3 consecutive failed attempts an endpoint is backed off as a whole (backoff_until, growing with
-- each further failure, at most the worker's longest retry delay): its deliveries are not claimed
-- before then, and the first after it probes the endpoint for every user; a 2xx ends the run. Claims
-- rotate: of the endpoints with due work, the one least recently claimed goes first, so one endpoint's
-- backlog never starves another's. No lock or transaction is held across an attempt (leases).
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
            'siwa.consent_revoked', 'siwa.account_deleted', 'siwa.personal_data_erased', 'siwa.sub_transferred'])),
    CONSTRAINT webhook_endpoints_max_in_flight_check CHECK (max_in_flight BETWEEN 1 AND 64),
    -- auto-disable (numbered change 5 adds these to an existing table)
    failing_since   timestamptz,
    disabled_reason text CONSTRAINT webhook_endpoints_disabled_reason_check CHECK (length(disabled_reason) <= 300),
    -- The developer loop: set on a temporary endpoint only (siwactl webhooks listen --forward-to).
    expires_at    timestamptz,
    -- isolation (numbered change 5 adds these): the run of failures, the endpoint's backoff, rotation
    consecutive_failures integer NOT NULL DEFAULT 0,
    last_failure_at      timestamptz,
    backoff_until        timestamptz,
    last_claimed_at      timestamptz,
    CONSTRAINT webhook_endpoints_failures_check
        CHECK (consecutive_failures >= 0 AND (consecutive_failures = 0) = (failing_since IS NULL))
);
COMMENT ON TABLE siwa.webhook_endpoints IS
    'Webhook endpoints (siwactl webhooks add): where siwa-worker sends each change, signed (Standard Webhooks).';
COMMENT ON COLUMN siwa.webhook_endpoints.types IS 'The change types sent here; NULL: every type.';
COMMENT ON COLUMN siwa.webhook_endpoints.enabled IS 'Whether new changes fan out here and pending deliveries are attempted.';
COMMENT ON COLUMN siwa.webhook_endpoints.expires_at IS 'NULL: a permanent endpoint. Else a temporary one (siwactl webhooks listen --forward-to), renewed while its listener runs and removed by it on exit, or after this time by the worker or the next listener (siwa.remove_expired_webhook_endpoints).';
COMMENT ON COLUMN siwa.webhook_endpoints.max_in_flight IS 'Attempts to this endpoint at once, across all workers (1 to 64).';
COMMENT ON COLUMN siwa.webhook_endpoints.failing_since IS
    'When its current run of failed attempts began (NULL: the last attempt was delivered); failing for siwa.settings.webhook_auto_disable_after disables it.';
COMMENT ON COLUMN siwa.webhook_endpoints.consecutive_failures IS
    'Attempts failed (retry or dead) since its last delivered one; 0 when its last attempt was delivered. From 1 on, one attempt at a time; from 3 on, backed off as a whole.';
COMMENT ON COLUMN siwa.webhook_endpoints.last_failure_at IS 'When an attempt to it last failed (kept after a success).';
COMMENT ON COLUMN siwa.webhook_endpoints.backoff_until IS
    'Not before: after 3 consecutive failures none of its deliveries is claimed before this time (the next attempt probes the endpoint); NULL after a 2xx, an enable or a retry.';
COMMENT ON COLUMN siwa.webhook_endpoints.last_claimed_at IS
    'When a claim last took one of its deliveries while another endpoint had due work too: claims prefer the endpoint least recently claimed.';
COMMENT ON COLUMN siwa.webhook_endpoints.disabled_reason IS
    'Why it is disabled: manual (siwactl webhooks disable), or auto: … (a 410 Gone, or failing continuously); NULL while enabled.';

CREATE TABLE IF NOT EXISTS siwa.webhook_secrets (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id bigint      NOT NULL REFERENCES siwa.webhook_endpoints (id) ON DELETE CASCADE,
    secret      text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    public_key  text,
    -- HMAC (v1): whsec_ and the standard base64 of 24 to 64 random bytes. Ed25519 (v1a): whsk_ and the
    -- standard base64 of the 32-byte private key (RFC 8032 seed), with its public key whpk_ and the base64
    -- of its 32 bytes (Standard Webhooks).
    CONSTRAINT webhook_secrets_secret_check CHECK (
        (secret ~ '^whsec_[A-Za-z0-9+/]+={0,2}$' AND length(secret) BETWEEN 6 + 32 AND 6 + 88
         AND public_key IS NULL)
        OR (secret ~ '^whsk_[A-Za-z0-9+/]{43}=$' AND public_key IS NOT NULL AND public_key ~ '^whpk_[A-Za-z0-9+/]{43}=$'))
);
COMMENT ON TABLE siwa.webhook_secrets IS
    'Webhook signing secrets (whsec_…): every secret of an endpoint not past expires_at signs. Readable by siwa_worker and the owner only.';
COMMENT ON COLUMN siwa.webhook_secrets.expires_at IS 'NULL: the current secret; else the end of its rotation overlap.';
COMMENT ON COLUMN siwa.webhook_secrets.public_key IS
    'For an ed25519 key (whsk_, signing v1a): its public key whpk_…, what the app verifies with; NULL for an HMAC secret (whsec_, v1).';
CREATE INDEX IF NOT EXISTS webhook_secrets_endpoint_idx ON siwa.webhook_secrets (endpoint_id);

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
-- The due queue heads of each endpoint: a claim looks at each endpoint's first (rotation), the lanes'
-- wait at each endpoint's earliest.
CREATE INDEX IF NOT EXISTS webhook_deliveries_due_idx
    ON siwa.webhook_deliveries (endpoint_id, next_attempt_at, id) WHERE state = 'pending' AND ready;
CREATE INDEX IF NOT EXISTS webhook_deliveries_order_idx
    ON siwa.webhook_deliveries (endpoint_id, sub, change_id) WHERE state = 'pending';
-- The leased deliveries of an endpoint (at most its lanes' worth), counted by every claim against
-- max_in_flight: without it the count reads every pending delivery of the endpoint.
CREATE INDEX IF NOT EXISTS webhook_deliveries_leased_idx
    ON siwa.webhook_deliveries (endpoint_id) WHERE state = 'pending' AND lease_expires_at IS NOT NULL;

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
    -- No enabled endpoint (most deployments, and every drain before the first one is added): nothing to
    -- fan out: one probe instead of the two joins below. The probe takes its snapshot after the INSERT
    -- that fired this trigger began, like the joins below: an endpoint committed before that INSERT
    -- began is seen, and one committed later gets the changes inserted after it, as before (a replay of
    -- a window creates what it missed).
    IF NOT EXISTS (SELECT 1 FROM siwa.webhook_endpoints e WHERE e.enabled) THEN
        RETURN NULL;
    END IF;
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

-- Adds an endpoint with its secret; returns its id. For siwactl webhooks add (the owner).
-- p_secret is whsec_… (HMAC, v1) or whsk_… (ed25519, v1a) with p_public_key its whpk_… (siwactl derives it).
CREATE OR REPLACE FUNCTION siwa.add_webhook_endpoint(p_url text, p_secret text, p_types text[] DEFAULT NULL,
                                                     p_max_in_flight integer DEFAULT 4,
                                                     p_public_key text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO siwa.webhook_endpoints AS e (url, types, max_in_flight)
    VALUES (p_url, p_types, p_max_in_flight) RETURNING e.id INTO v_id;
    INSERT INTO siwa.webhook_secrets (endpoint_id, secret, public_key) VALUES (v_id, p_secret, p_public_key);
    RETURN v_id;
END;
$$;
COMMENT ON FUNCTION siwa.add_webhook_endpoint(text, text, text[], integer, text) IS
    'Adds a webhook endpoint with its first secret, whsec_ (v1) or whsk_ with its whpk_ (v1a) (siwactl webhooks add); returns its id.';

-- Rotates an endpoint's secret: the live ones expire after p_overlap (they sign until then), the new one
-- signs from now on; secrets already expired are deleted. Returns false for an unknown endpoint. The new
-- one may be of the other scheme (whsk_ with p_public_key, or whsec_): during the overlap both sign.
CREATE OR REPLACE FUNCTION siwa.rotate_webhook_secret(p_endpoint bigint, p_secret text, p_overlap interval,
                                                      p_public_key text DEFAULT NULL)
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
    INSERT INTO siwa.webhook_secrets (endpoint_id, secret, public_key) VALUES (p_endpoint, p_secret, p_public_key);
    RETURN true;
END;
$$;
COMMENT ON FUNCTION siwa.rotate_webhook_secret(bigint, text, interval, text) IS
    'Adds a new signing secret; the live ones keep signing for the overlap (siwactl webhooks rotate-secret).';

-- Enables or disables an endpoint (siwactl webhooks enable/disable): a disabled endpoint gets no new
-- deliveries and its pending ones wait; enabling wakes the webhook lanes. Returns false for an unknown
-- endpoint.
CREATE OR REPLACE FUNCTION siwa.set_webhook_endpoint_enabled(p_endpoint bigint, p_enabled boolean)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_enabled IS NULL THEN
        RAISE EXCEPTION 'enabled must be true or false' USING ERRCODE = '22004';
    END IF;
    UPDATE siwa.webhook_endpoints e
       SET enabled = p_enabled, disabled_at = CASE WHEN p_enabled THEN NULL ELSE now() END,
           -- auto-disable: enabling clears the reason and the run of failures (and the endpoint's backoff)
           disabled_reason = CASE WHEN p_enabled THEN NULL ELSE coalesce(e.disabled_reason, 'manual') END,
           failing_since = CASE WHEN p_enabled THEN NULL ELSE e.failing_since END,
           consecutive_failures = CASE WHEN p_enabled THEN 0 ELSE e.consecutive_failures END,
           backoff_until = CASE WHEN p_enabled THEN NULL ELSE e.backoff_until END
     WHERE e.id = p_endpoint;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_enabled THEN
        PERFORM pg_catalog.pg_notify('siwa_webhooks', '');
    END IF;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION siwa.set_webhook_endpoint_enabled(bigint, boolean) IS
    'Enables or disables a webhook endpoint (siwactl webhooks enable/disable); enabling wakes the webhook lanes. Returns false for an unknown endpoint.';

-- ==== replay with a state selector ====
-- Puts deliveries back to pending with a fresh retry schedule (same webhook-id: receivers dedupe on it,
-- attempts from 1 and the give-up window from the next attempt): one delivery; every delivery of one
-- change; or a window: the changes applied in [p_since, p_until), to one endpoint (p_endpoint) or to
-- every endpoint. p_state chooses which (docs/webhooks.md, "Recovery"):
--  - dead: given up after the retry schedule ran out;
--  - failed: dead, and pending ones whose last attempt failed (in backoff: due now, schedule fresh);
--  - all (the default): failed, and delivered ones too; a window of one endpoint also creates the
--    deliveries it never had (an endpoint added later, or disabled meanwhile).
-- A pending delivery not yet attempted (it waits its turn) or in flight (a live lease) is left as it is.
-- Returns how many were queued.
CREATE OR REPLACE FUNCTION siwa.replay_webhook_deliveries(
    p_delivery bigint DEFAULT NULL, p_change bigint DEFAULT NULL, p_endpoint bigint DEFAULT NULL,
    p_since timestamptz DEFAULT NULL, p_until timestamptz DEFAULT NULL, p_state text DEFAULT 'all')
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_count     integer;
    v_created   integer := 0;
    v_endpoints bigint[];
BEGIN
    IF num_nonnulls(p_delivery, p_change) + (num_nonnulls(p_endpoint, p_since, p_until) > 0)::integer <> 1 THEN
        RAISE EXCEPTION 'give exactly one of a delivery, a change, or an endpoint and/or a time range'
            USING ERRCODE = '22023';
    END IF;
    IF p_state IS NULL OR p_state NOT IN ('dead', 'failed', 'all') THEN
        RAISE EXCEPTION 'the state is dead, failed or all' USING ERRCODE = '22023';
    END IF;
    WITH replayed AS (
        UPDATE siwa.webhook_deliveries d
           SET state = 'pending', attempts = 0, next_attempt_at = now(), first_attempt_at = NULL,
               delivered_at = NULL
          FROM siwa.changes c
         WHERE c.id = d.change_id
           AND (d.id = p_delivery OR d.change_id = p_change
                OR (p_delivery IS NULL AND p_change IS NULL
                    AND (p_endpoint IS NULL OR d.endpoint_id = p_endpoint)
                    AND c.applied_at >= coalesce(p_since, '-infinity')
                    AND c.applied_at < coalesce(p_until, 'infinity')))
           AND (d.state = 'dead'
                OR (p_state <> 'dead' AND d.state = 'pending' AND d.attempts > 0
                    AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= clock_timestamp()))
                OR (p_state = 'all' AND d.state = 'delivered'))
        RETURNING d.endpoint_id)
    SELECT count(*), array_agg(DISTINCT r.endpoint_id) INTO v_count, v_endpoints FROM replayed r;
    IF p_endpoint IS NOT NULL AND p_state = 'all' THEN
        INSERT INTO siwa.webhook_deliveries (change_id, endpoint_id, sub)
        SELECT c.id, e.id, c.sub
          FROM siwa.webhook_endpoints e
          JOIN siwa.changes c ON (e.types IS NULL OR c.type = ANY (e.types))
         WHERE e.id = p_endpoint
           AND c.applied_at >= coalesce(p_since, '-infinity') AND c.applied_at < coalesce(p_until, 'infinity')
         ORDER BY c.id
        ON CONFLICT (change_id, endpoint_id) DO NOTHING;
        GET DIAGNOSTICS v_created = ROW_COUNT;
        v_count := v_count + v_created;
        v_endpoints := ARRAY[p_endpoint];
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
COMMENT ON FUNCTION siwa.replay_webhook_deliveries(bigint, bigint, bigint, timestamptz, timestamptz, text) IS
    'Queues deliveries again (siwactl webhooks replay): by delivery, by change, or by applied_at range (of one endpoint or all), choosing dead, failed or all.';
-- ==== end replay with a state selector ====

-- What admins read: endpoints without their secrets, and every attempt.
CREATE OR REPLACE VIEW siwa.webhook_endpoint_overview AS
SELECT e.id, e.url, e.types, e.enabled, e.max_in_flight, e.created_at, e.disabled_at,
       (SELECT count(*) FROM siwa.webhook_secrets s
         WHERE s.endpoint_id = e.id AND (s.expires_at IS NULL OR s.expires_at > now())) AS live_secrets,
       (SELECT count(*) FROM siwa.webhook_deliveries d WHERE d.endpoint_id = e.id AND d.state = 'pending') AS pending,
       (SELECT count(*) FROM siwa.webhook_deliveries d WHERE d.endpoint_id = e.id AND d.state = 'dead') AS dead,
       (SELECT max(d.delivered_at) FROM siwa.webhook_deliveries d WHERE d.endpoint_id = e.id) AS last_delivered_at,
       -- auto-disable
       e.disabled_reason, e.failing_since,
       -- isolation
       e.consecutive_failures, e.backoff_until
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

-- ---- ed25519 signatures (v1a): the endpoints' signing keys without their secret part ----
CREATE OR REPLACE VIEW siwa.webhook_signing_keys AS
SELECT s.id, s.endpoint_id, CASE WHEN s.public_key IS NULL THEN 'v1' ELSE 'v1a' END AS scheme, s.public_key,
       s.created_at, s.expires_at, (s.expires_at IS NULL OR s.expires_at > now()) AS live
  FROM siwa.webhook_secrets s;
COMMENT ON VIEW siwa.webhook_signing_keys IS
    'Every webhook signing key: its scheme (v1 HMAC, v1a ed25519) and, for ed25519, the public key apps verify with; never a secret.';
COMMENT ON COLUMN siwa.webhook_signing_keys.id IS 'The key''s id (newest signs first).';
COMMENT ON COLUMN siwa.webhook_signing_keys.endpoint_id IS 'The endpoint it signs for.';
COMMENT ON COLUMN siwa.webhook_signing_keys.scheme IS 'v1 (HMAC-SHA256, a whsec_ secret) or v1a (ed25519, a whsk_ key).';
COMMENT ON COLUMN siwa.webhook_signing_keys.public_key IS 'For v1a: whpk_ and the base64 of the 32-byte public key; NULL for v1.';
COMMENT ON COLUMN siwa.webhook_signing_keys.created_at IS 'When the key was added.';
COMMENT ON COLUMN siwa.webhook_signing_keys.expires_at IS 'NULL: the current key; else the end of its rotation overlap.';
COMMENT ON COLUMN siwa.webhook_signing_keys.live IS 'Whether it signs now.';
-- ---- end of ed25519 signatures ----
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
COMMENT ON COLUMN siwa.webhook_endpoint_overview.disabled_reason IS 'Why it is disabled: manual, or auto: … (410 Gone, failing continuously); NULL while enabled.';
COMMENT ON COLUMN siwa.webhook_endpoint_overview.failing_since IS 'When its current run of failed attempts began; NULL after a 2xx.';
COMMENT ON COLUMN siwa.webhook_endpoint_overview.consecutive_failures IS 'Attempts failed since its last delivered one (from 1: one attempt at a time; from 3: backed off).';
COMMENT ON COLUMN siwa.webhook_endpoint_overview.backoff_until IS 'Backed off as a whole until then (after 3 consecutive failures): nothing is attempted before it; NULL when not backed off.';
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
COMMENT ON COLUMN siwa.webhook_delivery_status.attempts IS 'Attempts made (since the last replay), each counted when a lane claimed it: one in flight, or cut short by a lane that died, included.';
COMMENT ON COLUMN siwa.webhook_delivery_status.next_attempt_at IS 'When a pending delivery is next due.';
COMMENT ON COLUMN siwa.webhook_delivery_status.created_at IS 'When the change fanned out to this endpoint.';
COMMENT ON COLUMN siwa.webhook_delivery_status.first_attempt_at IS 'When the first attempt (since the last replay) was made; the retry schedule runs from here.';
COMMENT ON COLUMN siwa.webhook_delivery_status.last_attempt_at IS 'When the last attempt began.';
COMMENT ON COLUMN siwa.webhook_delivery_status.delivered_at IS 'When the endpoint answered 2xx.';
COMMENT ON COLUMN siwa.webhook_delivery_status.last_status IS 'The last HTTP status answered; NULL when there was no answer.';
COMMENT ON COLUMN siwa.webhook_delivery_status.last_error IS 'The last failure, in our own words; never a secret, a body or an email.';

-- Leases for the webhook lanes: see the comment above siwa.claim_revocation (schema/55-sign-in.sql).

-- The endpoint's row is locked (FOR NO KEY UPDATE) while its lanes in flight are counted, so two claims
-- cannot both take the last place; endpoints another lane is claiming are tried after the others.
-- A lane may lease several deliveries at once and send them one after another: an endpoint's attempts
-- in flight are its distinct lease owners. A batch is the lane's part of the due heads (their count
-- read up to p_limit per lane), so a short queue still spreads over the endpoint's lanes.
CREATE OR REPLACE FUNCTION siwa.claim_webhook_deliveries(p_owner text, p_lease interval, p_limit integer,
                                                         p_due_by timestamptz DEFAULT NULL,
                                                         p_lanes integer DEFAULT 1,
                                                         p_skip bigint[] DEFAULT '{}')
RETURNS TABLE (outcome text, delivery_id bigint, change_id bigint, endpoint_id bigint, attempt integer,
               first_attempt_at timestamptz, url text, secrets text[], type text, sub text,
               event_time timestamptz, applied_at timestamptz, jti text, audience text,
               sessions_revoked integer, refresh_tokens_revoked integer, email text, is_private_email boolean,
               old_sub text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_due        timestamptz := coalesce(p_due_by, pg_catalog.now());
    v_process    text := pg_catalog.substring(p_owner, '^(.*:)[^:]*$');
    v_endpoints  integer;
    v_candidates bigint[];
    v_busy       bigint[] := '{}';
    v_held       boolean := false;
    v_id         bigint;
    v_wait       boolean;
    v_endpoint   siwa.webhook_endpoints%ROWTYPE;
    v_in_flight  integer;
    v_mine       integer;
    v_share      integer;
    v_cap        integer;
    v_take       integer;
BEGIN
    IF p_owner IS NULL OR p_lease IS NULL OR p_lease <= interval '0' OR p_lanes IS NULL OR p_lanes < 1
       OR p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'a claim needs an owner, a positive lease, at least one lane and a limit of 1 to 1000'
            USING ERRCODE = '22023';
    END IF;
    -- The endpoints with due work (E), the process's share of its lanes (the one place it is computed:
    -- never all of them, about 1/E each), and the endpoints under their caps as read without a lock,
    -- least recently claimed first.
    SELECT pg_catalog.count(*)::integer, pg_catalog.min(c.share),
           pg_catalog.array_agg(c.id ORDER BY c.last_claimed_at NULLS FIRST, c.id)
               FILTER (WHERE c.in_flight < c.cap AND c.mine < c.share)
      INTO v_endpoints, v_share, v_candidates
      FROM (SELECT e.id, e.last_claimed_at, l.in_flight, l.mine,
                   greatest(1, least(p_lanes - 1, ceil(p_lanes::numeric / pg_catalog.count(*) OVER ())::integer))
                       AS share,
                   -- a failing endpoint gets one attempt at a time (a probe), across every worker
                   CASE WHEN e.consecutive_failures > 0 THEN 1 ELSE e.max_in_flight END AS cap
              FROM siwa.webhook_endpoints e
             CROSS JOIN LATERAL (
                   SELECT pg_catalog.count(DISTINCT d.lease_owner) AS in_flight,
                          pg_catalog.count(DISTINCT d.lease_owner)
                              FILTER (WHERE d.lease_owner = p_owner
                                         OR pg_catalog.starts_with(d.lease_owner, v_process)) AS mine
                     FROM siwa.webhook_deliveries d
                    WHERE d.endpoint_id = e.id AND d.state = 'pending'
                      AND d.lease_expires_at IS NOT NULL AND d.lease_expires_at > pg_catalog.clock_timestamp()) l
             WHERE e.enabled AND (e.backoff_until IS NULL OR e.backoff_until <= pg_catalog.clock_timestamp())
               AND e.id <> ALL (coalesce(p_skip, '{}'))
               -- A due head: the first in the due index's order (a scalar subquery with ORDER BY, not
               -- EXISTS, whose ORDER BY and LIMIT the planner drops: it then scans the table from its
               -- start, where the delivered rows gather, so every claim read more rows as the
               -- deliveries went out).
               AND (SELECT d.id FROM siwa.webhook_deliveries d
                     WHERE d.endpoint_id = e.id AND d.state = 'pending' AND d.ready
                       AND d.next_attempt_at <= v_due
                       AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= pg_catalog.clock_timestamp())
                     ORDER BY d.next_attempt_at, d.id LIMIT 1) IS NOT NULL) c;
    IF v_endpoints = 0 THEN
        RETURN;
    END IF;
    -- Each candidate's row is locked (FOR NO KEY UPDATE) and its leases counted again under the lock.
    -- First pass: rows no other claim holds (SKIP LOCKED); second pass: one of those, waited for, and
    -- only while this claim holds no other endpoint's row (two claims never wait for each other).
    FOREACH v_wait IN ARRAY ARRAY[false, true] LOOP
        FOREACH v_id IN ARRAY CASE WHEN NOT v_wait THEN coalesce(v_candidates, '{}')
                                   WHEN v_held THEN '{}' ELSE v_busy END LOOP
            IF v_wait THEN
                SELECT e.* INTO v_endpoint FROM siwa.webhook_endpoints e WHERE e.id = v_id FOR NO KEY UPDATE;
            ELSE
                SELECT e.* INTO v_endpoint FROM siwa.webhook_endpoints e WHERE e.id = v_id
                   FOR NO KEY UPDATE SKIP LOCKED;
                IF NOT FOUND THEN
                    v_busy := v_busy || v_id;
                    CONTINUE;
                END IF;
            END IF;
            IF FOUND AND v_endpoint.enabled
               AND (v_endpoint.backoff_until IS NULL OR v_endpoint.backoff_until <= pg_catalog.clock_timestamp()) THEN
                SELECT pg_catalog.count(DISTINCT d.lease_owner),
                       pg_catalog.count(DISTINCT d.lease_owner)
                           FILTER (WHERE d.lease_owner = p_owner OR pg_catalog.starts_with(d.lease_owner, v_process))
                  INTO v_in_flight, v_mine
                  FROM siwa.webhook_deliveries d
                 WHERE d.endpoint_id = v_id AND d.state = 'pending'
                   AND d.lease_expires_at IS NOT NULL AND d.lease_expires_at > pg_catalog.clock_timestamp();
                v_cap := CASE WHEN v_endpoint.consecutive_failures > 0 THEN 1 ELSE v_endpoint.max_in_flight END;
                IF v_in_flight < v_cap AND v_mine < v_share THEN
                    SELECT CASE WHEN v_endpoint.consecutive_failures > 0 THEN 1
                                ELSE least(p_limit, ceil(pg_catalog.count(*) / least(v_cap, v_share)::numeric))::integer
                           END
                      INTO v_take
                      FROM (SELECT 1 FROM siwa.webhook_deliveries d
                             WHERE d.endpoint_id = v_id AND d.state = 'pending' AND d.ready AND d.next_attempt_at <= v_due
                               AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= pg_catalog.clock_timestamp())
                             LIMIT p_limit * least(v_cap, v_share)) due;
                    -- The endpoint's first due heads that are still first in their sub's queue (per-user
                    -- order: the hint `ready` is re-checked; a sub has one head, so one delivery each),
                    -- up to p_limit (one while it is failing), leased, and returned with what the POSTs
                    -- need, in one statement.
                    RETURN QUERY
                    WITH picked AS (
                        SELECT d.id, d.next_attempt_at FROM siwa.webhook_deliveries d
                         WHERE d.endpoint_id = v_id AND d.state = 'pending' AND d.ready AND d.next_attempt_at <= v_due
                           AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= pg_catalog.clock_timestamp())
                           -- The order check as a scalar subquery: a probe of the order index per candidate.
                           -- (As NOT EXISTS the planner makes it an anti join, and with a table that has no
                           -- statistics yet it read every pending delivery of the endpoint per claim.)
                           AND d.change_id = (SELECT p.change_id FROM siwa.webhook_deliveries p
                                               WHERE p.endpoint_id = d.endpoint_id AND p.sub = d.sub
                                                 AND p.state = 'pending'
                                               ORDER BY p.change_id LIMIT 1)
                         ORDER BY d.next_attempt_at, d.id
                         LIMIT v_take
                           FOR UPDATE OF d SKIP LOCKED),
                    numbered AS (
                        SELECT p.id, pg_catalog.row_number() OVER (ORDER BY p.next_attempt_at, p.id) AS n FROM picked p),
                    leased AS (
                        UPDATE siwa.webhook_deliveries d
                           SET attempts = d.attempts + 1,
                               first_attempt_at = coalesce(d.first_attempt_at, pg_catalog.clock_timestamp()),
                               last_attempt_at = pg_catalog.clock_timestamp(),
                               lease_owner = p_owner,
                               lease_expires_at = pg_catalog.clock_timestamp() + p_lease
                          FROM numbered WHERE d.id = numbered.id
                        RETURNING d.id, d.change_id, d.endpoint_id, d.attempts, d.first_attempt_at, numbered.n)
                    SELECT 'claimed'::text, l.id, l.change_id, l.endpoint_id, l.attempts, l.first_attempt_at,
                           v_endpoint.url,
                           ARRAY(SELECT s.secret FROM siwa.webhook_secrets s
                                  WHERE s.endpoint_id = v_id
                                    AND (s.expires_at IS NULL OR s.expires_at > pg_catalog.now())
                                  ORDER BY s.id DESC),
                           c.type, c.sub, c.event_time, c.applied_at, c.jti, c.audience, c.sessions_revoked,
                           c.refresh_tokens_revoked, c.email, c.is_private_email, c.old_sub
                      FROM leased l JOIN siwa.changes c ON c.id = l.change_id
                     ORDER BY l.n;
                    IF FOUND THEN
                        -- Rotation needs the time only while another endpoint has due work too (the
                        -- healthy path of a single endpoint writes nothing here).
                        IF v_endpoints > 1 THEN
                            UPDATE siwa.webhook_endpoints e SET last_claimed_at = pg_catalog.clock_timestamp()
                             WHERE e.id = v_id;
                        END IF;
                        -- The claim's commit need not wait for the disk: a claim lost in a crash of the
                        -- server only makes the delivery claimable again, which is what a lease that
                        -- expired does (at-least-once, the same webhook-id; that attempt uncounted); the attempt's record is
                        -- committed durably. Transaction-local: the lanes call this function alone in
                        -- its transaction.
                        PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
                        RETURN;
                    END IF;
                END IF;
            END IF;
            -- This row is held to the transaction's end now: wait for no other.
            v_held := true;
            EXIT WHEN v_wait;
        END LOOP;
    END LOOP;
    -- Due work, but every endpoint with some is at its cap (or being claimed): nothing written.
    RETURN QUERY SELECT 'saturated'::text, NULL::bigint, NULL::bigint, NULL::bigint, NULL::integer,
                        NULL::timestamptz, NULL::text, NULL::text[], NULL::text, NULL::text,
                        NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::text, NULL::integer,
                        NULL::integer, NULL::text, NULL::boolean, NULL::text;
END;
$$;
COMMENT ON FUNCTION siwa.claim_webhook_deliveries(text, interval, integer, timestamptz, integer, bigint[]) IS
    'The webhook lanes'' claim. Of the enabled endpoints with a due queue head (ready, due by p_due_by — a drain passes its start, so it never retries what it just tried —, not leased or its lease expired), not backed off and not in p_skip, least recently claimed first, it takes the first under its caps (max_in_flight lanes in flight, 1 while failing, the process''s share of its p_lanes lanes: docs/webhooks.md, "Isolation") and leases its part of the endpoint''s due heads — their count (read up to p_limit per lane) over its lanes under the caps, at most p_limit, 1 while it is failing —, each with no earlier pending delivery of its sub, in due order, each for p_lease: the lane sends them one after another, starting none that could outlast its lease. p_owner is <process>:<lane> (leases whose owner shares the part up to its last colon are the process''s; an endpoint''s lanes in flight are its distinct live lease owners). ''claimed'' rows, in the order to send: the attempt counted, the lease written, and what the POST needs (URL, live secrets newest first, the change''s columns; an erased email is gone). One ''saturated'' row: due work, every endpoint with some at its cap, nothing written. No row: nothing claimable. Executable by siwa_worker.';

-- One delivery at a time (workers before the batched claim).
CREATE OR REPLACE FUNCTION siwa.claim_webhook_delivery(p_owner text, p_lease interval,
                                                       p_skip bigint[] DEFAULT '{}',
                                                       p_due_by timestamptz DEFAULT NULL,
                                                       p_lanes integer DEFAULT 1)
RETURNS TABLE (outcome text, delivery_id bigint, change_id bigint, endpoint_id bigint, attempt integer,
               first_attempt_at timestamptz, url text, secrets text[], type text, sub text,
               event_time timestamptz, applied_at timestamptz, jti text, audience text,
               sessions_revoked integer, refresh_tokens_revoked integer, email text, is_private_email boolean,
               old_sub text)
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM siwa.claim_webhook_deliveries(p_owner, p_lease, 1, p_due_by, p_lanes, p_skip);
$$;
COMMENT ON FUNCTION siwa.claim_webhook_delivery(text, interval, bigint[], timestamptz, integer) IS
    'siwa.claim_webhook_deliveries with a limit of 1: one delivery claimed, leased for p_lease. Executable by siwa_worker.';

-- Locks the deliveries in change order, then the next heads: the fan-out's order (siwa.webhook_fan_out),
-- so the two never deadlock and `ready` is never left stale.
CREATE OR REPLACE FUNCTION siwa.record_webhook_attempts(p_owner text, p_deliveries bigint[],
                                                        p_started timestamptz[], p_latency_ms integer[],
                                                        p_status integer[], p_outcome text[],
                                                        p_retry_in double precision[], p_error text[],
                                                        p_backoff_base double precision DEFAULT 5,
                                                        p_backoff_max double precision DEFAULT 3600)
RETURNS bigint[]
-- Generic plans, made once per session: every statement is a probe by key, whatever the statistics
-- (enable_seqscan off: the deliveries by `id = ANY (…)` through the primary key even on a table the
-- planner thinks empty).
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off AS $$
DECLARE
    v_count     integer := coalesce(pg_catalog.cardinality(p_deliveries), 0);
    v_ids       bigint[];
    v_endpoints bigint[];
    v_subs      text[];
    v_outcomes  text[];
    v_started   timestamptz[];
    v_status    integer[];
BEGIN
    IF p_owner IS NULL
       OR v_count <> coalesce(pg_catalog.cardinality(p_started), 0)
       OR v_count <> coalesce(pg_catalog.cardinality(p_latency_ms), 0)
       OR v_count <> coalesce(pg_catalog.cardinality(p_status), 0)
       OR v_count <> coalesce(pg_catalog.cardinality(p_outcome), 0)
       OR v_count <> coalesce(pg_catalog.cardinality(p_retry_in), 0)
       OR v_count <> coalesce(pg_catalog.cardinality(p_error), 0)
       OR EXISTS (SELECT 1 FROM unnest(p_outcome, p_started) AS a(outcome, started)
                   WHERE a.outcome IS NULL OR a.outcome NOT IN ('delivered', 'retry', 'dead', 'released')
                      OR (a.started IS NULL AND a.outcome <> 'released'))
       OR (SELECT pg_catalog.count(DISTINCT a.id) FROM unnest(p_deliveries) AS a(id)) <> v_count THEN
        RAISE EXCEPTION 'attempts are recorded with an owner, one element per distinct delivery in every array, '
            'and each ends delivered, retry or dead (with its start) or released' USING ERRCODE = '22023';
    END IF;
    -- No predicate here or in the UPDATE below names the state, which would let a generic plan read a
    -- partial index of every pending delivery: a lease is only ever on a pending delivery (the claim
    -- leases pending ones, every end clears it).
    PERFORM 1 FROM siwa.webhook_deliveries d WHERE d.id = ANY (p_deliveries) ORDER BY d.change_id FOR UPDATE;
    -- Each delivery's new state, if its lease is still the caller's (`attempts` counts the attempt since
    -- its claim; a released one was never attempted: uncounted), and its attempt row.
    WITH a AS (
        SELECT * FROM unnest(p_deliveries, p_started, p_latency_ms, p_status, p_outcome, p_retry_in, p_error)
                      WITH ORDINALITY AS a(id, started, latency_ms, status, outcome, retry_in, error, n)),
    written AS (
        UPDATE siwa.webhook_deliveries d
           SET state = CASE WHEN a.outcome IN ('retry', 'released') THEN 'pending' ELSE a.outcome END,
               attempts = d.attempts - (a.outcome = 'released')::integer,
               first_attempt_at = CASE WHEN a.outcome <> 'released' THEN coalesce(d.first_attempt_at, a.started)
                                       WHEN d.attempts > 1 THEN d.first_attempt_at END,
               last_attempt_at = CASE WHEN a.outcome <> 'released' THEN a.started
                                      WHEN d.attempts > 1 THEN d.last_attempt_at END,
               next_attempt_at = CASE WHEN a.outcome = 'retry'
                                      THEN pg_catalog.clock_timestamp()
                                           + pg_catalog.make_interval(secs => coalesce(a.retry_in, 0))
                                      ELSE d.next_attempt_at END,
               delivered_at = CASE WHEN a.outcome = 'delivered' THEN pg_catalog.clock_timestamp() END,
               last_status = CASE WHEN a.outcome = 'released' THEN d.last_status ELSE a.status END,
               last_error = CASE WHEN a.outcome = 'released' THEN d.last_error ELSE pg_catalog.left(a.error, 300) END,
               lease_owner = NULL, lease_expires_at = NULL
          FROM a
         WHERE d.id = a.id AND d.id = ANY (p_deliveries) AND d.lease_owner = p_owner
        RETURNING d.id, d.attempts, d.endpoint_id, d.sub, d.next_attempt_at, a.outcome, a.started,
                  a.latency_ms, a.status, a.error, a.n),
    logged AS (
        INSERT INTO siwa.webhook_attempts
            (delivery_id, attempt, started_at, latency_ms, status, outcome, next_attempt_at, error)
        SELECT w.id, w.attempts, w.started, w.latency_ms, w.status, w.outcome,
               CASE WHEN w.outcome = 'retry' THEN w.next_attempt_at END, pg_catalog.left(w.error, 300)
          FROM written w WHERE w.outcome <> 'released' ORDER BY w.n)
    SELECT pg_catalog.array_agg(w.id ORDER BY w.n), pg_catalog.array_agg(w.endpoint_id ORDER BY w.n),
           pg_catalog.array_agg(w.sub ORDER BY w.n), pg_catalog.array_agg(w.outcome ORDER BY w.n),
           pg_catalog.array_agg(w.started ORDER BY w.n), pg_catalog.array_agg(w.status ORDER BY w.n)
      INTO v_ids, v_endpoints, v_subs, v_outcomes, v_started, v_status
      FROM written w;
    -- The endpoints' runs of failures, attempt by attempt: a 2xx ends it (and its backoff; one statement
    -- per run of 2xx, writing nothing to an endpoint not failing); a failure extends it, backs the
    -- endpoint off from the 3rd on, and may disable it (auto-disable).
    FOR i IN 1 .. coalesce(pg_catalog.cardinality(v_ids), 0) LOOP
        CONTINUE WHEN v_outcomes[i] = 'released';
        IF v_outcomes[i] = 'delivered' THEN
            CONTINUE WHEN i > 1 AND v_outcomes[i - 1] = 'delivered' AND v_endpoints[i - 1] = v_endpoints[i];
            UPDATE siwa.webhook_endpoints e SET consecutive_failures = 0, failing_since = NULL, backoff_until = NULL
             WHERE e.id = v_endpoints[i] AND (e.consecutive_failures > 0 OR e.backoff_until IS NOT NULL);
            CONTINUE;
        END IF;
        UPDATE siwa.webhook_endpoints e
           SET consecutive_failures = e.consecutive_failures + 1,
               failing_since = coalesce(e.failing_since, v_started[i]),
               last_failure_at = greatest(e.last_failure_at, v_started[i]),
               backoff_until = CASE WHEN e.consecutive_failures + 1 >= 3
                                    THEN pg_catalog.clock_timestamp() + siwa.retry_delay(
                                        e.consecutive_failures + 1 - 2,
                                        pg_catalog.make_interval(secs => coalesce(p_backoff_base, 5)),
                                        pg_catalog.make_interval(secs => coalesce(p_backoff_max, 3600)))
                                    ELSE e.backoff_until END
         WHERE e.id = v_endpoints[i];
        -- ==== auto-disable ====
        -- A 410 Gone, or a run longer than siwa.settings.webhook_auto_disable_after, disables the
        -- endpoint (its pending deliveries wait; its new changes do not fan out), recorded in
        -- disabled_at and disabled_reason.
        UPDATE siwa.webhook_endpoints e
           SET enabled = false, disabled_at = pg_catalog.clock_timestamp(),
               disabled_reason = CASE WHEN v_status[i] = 410 THEN 'auto: the endpoint answered 410 Gone'
                                      ELSE 'auto: failing continuously since '
                                           || pg_catalog.to_char(e.failing_since AT TIME ZONE 'UTC',
                                                                 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                                           || ' (siwa.settings.webhook_auto_disable_after: '
                                           || s.webhook_auto_disable_after::text || ')' END
          FROM siwa.settings s
         WHERE e.id = v_endpoints[i] AND e.enabled
           AND (v_status[i] = 410
                OR e.failing_since <= pg_catalog.clock_timestamp() - s.webhook_auto_disable_after);
        -- ==== end auto-disable ====
    END LOOP;
    -- The next change of each ended delivery's sub to its endpoint heads the queue now.
    UPDATE siwa.webhook_deliveries d SET ready = true
      FROM (SELECT DISTINCT x.endpoint_id, x.sub FROM unnest(v_endpoints, v_subs, v_outcomes) AS x(endpoint_id, sub, outcome)
             WHERE x.outcome IN ('delivered', 'dead')) x
     CROSS JOIN LATERAL (SELECT q.id FROM siwa.webhook_deliveries q
                          WHERE q.endpoint_id = x.endpoint_id AND q.sub = x.sub AND q.state = 'pending'
                          ORDER BY q.change_id LIMIT 1) h
     WHERE d.id = h.id AND NOT d.ready;
    RETURN coalesce(v_ids, '{}');
END;
$$;
COMMENT ON FUNCTION siwa.record_webhook_attempts(text, bigint[], timestamptz[], integer[], integer[], text[], double precision[], text[], double precision, double precision) IS
    'Records the attempts of deliveries the caller (p_owner) leased, element by element of the arrays, in the order they were made: the attempt row, numbered as its claim counted it (a lane that died leaves a gap); the delivery''s new state (delivered, retry after p_retry_in seconds, or dead; released: never attempted, its claim uncounted, pending as before); the lease released; each endpoint''s run of failures (a 2xx ends it; from the 3rd consecutive failure the endpoint is backed off as a whole for siwa.retry_delay(failures − 2, p_backoff_base s, p_backoff_max s); auto-disable on 410 or after siwa.settings.webhook_auto_disable_after); and, once a delivery ended, `ready` passed on to the next pending delivery of its endpoint and sub. A 2xx to an endpoint not failing writes nothing to the endpoint''s row. Returns the deliveries recorded: one whose lease is no longer the caller''s is left out, nothing of it written. Executable by siwa_worker.';

-- One attempt (workers before the batched record).
CREATE OR REPLACE FUNCTION siwa.record_webhook_attempt(p_delivery bigint, p_owner text, p_started timestamptz,
                                                       p_latency_ms integer, p_status integer, p_outcome text,
                                                       p_retry_in double precision, p_error text,
                                                       p_backoff_base double precision DEFAULT 5,
                                                       p_backoff_max double precision DEFAULT 3600)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_outcome IS NULL OR p_outcome NOT IN ('delivered', 'retry', 'dead') THEN
        RAISE EXCEPTION 'an attempt ends delivered, retry or dead' USING ERRCODE = '22023';
    END IF;
    RETURN coalesce(p_delivery = ANY (siwa.record_webhook_attempts(
        p_owner, ARRAY[p_delivery], ARRAY[p_started], ARRAY[p_latency_ms], ARRAY[p_status], ARRAY[p_outcome],
        ARRAY[p_retry_in], ARRAY[p_error], p_backoff_base, p_backoff_max)), false);
END;
$$;
COMMENT ON FUNCTION siwa.record_webhook_attempt(bigint, text, timestamptz, integer, integer, text, double precision, text, double precision, double precision) IS
    'siwa.record_webhook_attempts for one attempt: true when recorded, false (nothing written) when the lease is no longer the caller''s. Executable by siwa_worker.';

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

-- ==== retry now (siwactl webhooks retry) ====
-- Makes pending deliveries due now: one delivery (p_delivery), or every pending delivery of one
-- endpoint (p_endpoint). The backoff starts again (attempts = 0: the next failure waits the base delay;
-- the attempt history numbers the next attempt 1, as after a replay), the retry makes no attempt row,
-- and the give-up window still runs from the first attempt (a replay starts that again). A delivery in
-- flight (a live lease) is left to its attempt. Delivered and dead ones are not touched (replay them).
-- The endpoint's backoff as a whole ends too (its run of failures is kept: the next attempt probes it).
-- Returns how many were made due.
CREATE OR REPLACE FUNCTION siwa.retry_webhook_deliveries(p_delivery bigint DEFAULT NULL,
                                                         p_endpoint bigint DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_count integer;
BEGIN
    IF num_nonnulls(p_delivery, p_endpoint) <> 1 THEN
        RAISE EXCEPTION 'give exactly one of a delivery or an endpoint' USING ERRCODE = '22023';
    END IF;
    WITH retried AS (
        UPDATE siwa.webhook_deliveries d
           SET next_attempt_at = pg_catalog.now(), attempts = 0
         WHERE d.state = 'pending' AND (d.id = p_delivery OR d.endpoint_id = p_endpoint)
           AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= pg_catalog.clock_timestamp())
        RETURNING d.endpoint_id),
    unblocked AS (
        UPDATE siwa.webhook_endpoints e SET backoff_until = NULL
         WHERE e.id IN (SELECT r.endpoint_id FROM retried r) AND e.backoff_until IS NOT NULL)
    SELECT pg_catalog.count(*) INTO v_count FROM retried;
    IF v_count > 0 THEN
        PERFORM pg_catalog.pg_notify('siwa_webhooks', '');
    END IF;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION siwa.retry_webhook_deliveries(bigint, bigint) IS
    'Makes pending webhook deliveries due now with their backoff reset (siwactl webhooks retry): one delivery or an endpoint''s; not an attempt. Returns how many.';
-- ==== end retry now ====

-- ==== remove an endpoint (siwactl webhooks remove) ====
-- Deletes an endpoint with its secrets, deliveries and their attempts (ON DELETE CASCADE): its
-- delivery history goes with it. While it has pending deliveries it is refused (55006, with how many)
-- unless p_force, when they are deleted too (a lane attempting one then finds its lease gone and logs
-- the attempt as not recorded). siwactl disables the endpoint first, in a transaction of its own, so
-- that no change fans out to it while it is deleted. Returns how many pending deliveries were deleted;
-- NULL for an unknown endpoint.
CREATE OR REPLACE FUNCTION siwa.remove_webhook_endpoint(p_endpoint bigint, p_force boolean DEFAULT false)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_pending integer;
BEGIN
    PERFORM 1 FROM siwa.webhook_endpoints e WHERE e.id = p_endpoint FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT pg_catalog.count(*) INTO v_pending
      FROM siwa.webhook_deliveries d WHERE d.endpoint_id = p_endpoint AND d.state = 'pending';
    IF v_pending > 0 AND NOT coalesce(p_force, false) THEN
        RAISE EXCEPTION 'endpoint % has % pending deliveries', p_endpoint, v_pending
            USING ERRCODE = '55006', HINT = 'wait for them, or remove it with force (siwactl webhooks remove --force)';
    END IF;
    DELETE FROM siwa.webhook_endpoints e WHERE e.id = p_endpoint;
    RETURN v_pending;
END;
$$;
COMMENT ON FUNCTION siwa.remove_webhook_endpoint(bigint, boolean) IS
    'Deletes a webhook endpoint with its secrets, deliveries and attempts (siwactl webhooks remove); refused (55006) while deliveries are pending unless forced. Returns the pending deliveries deleted; NULL for an unknown endpoint.';
-- ==== end remove an endpoint ====

-- ===== The developer loop: temporary endpoints (siwactl webhooks listen --forward-to) =====
-- A listener registers itself as a temporary endpoint (expires_at set): plain http to a loopback IP
-- literal only (the worker posts to a listener on its own machine), renewed while the listener runs,
-- removed by it when it stops; one left by a listener that crashed is recognisable by expires_at and is
-- removed once expired, by the worker (once a minute) or the next listener. SECURITY DEFINER and executable by siwa_admin: an admin
-- reads the changefeed already, and these functions touch temporary endpoints only.

-- Removes every temporary endpoint past its expiry (with its secrets and deliveries); returns how
-- many. The next listener calls it, and the worker's webhook lanes once a minute.
CREATE OR REPLACE FUNCTION siwa.remove_expired_webhook_endpoints() RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH gone AS (
        DELETE FROM siwa.webhook_endpoints e WHERE e.expires_at IS NOT NULL AND e.expires_at <= pg_catalog.now()
        RETURNING 1)
    SELECT pg_catalog.count(*)::integer FROM gone
$$;
COMMENT ON FUNCTION siwa.remove_expired_webhook_endpoints() IS
    'The developer loop: removes temporary webhook endpoints past their expiry (left by a listener that crashed); returns how many. Executable by siwa_admin and siwa_worker.';

-- Adds a temporary endpoint for a listener: http to a loopback IP literal, expiring after p_lifetime (1
-- minute to 1 hour) unless renewed; removes the expired ones first. Returns its id.
CREATE OR REPLACE FUNCTION siwa.add_temporary_webhook_endpoint(p_url text, p_secret text, p_types text[],
                                                               p_lifetime interval) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_url IS NULL OR p_url !~* '^http://(127\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}|\[::1\])(:[0-9]{1,5})?([/?#]|$)' THEN
        RAISE EXCEPTION 'a temporary endpoint is plain http to a loopback IP literal' USING ERRCODE = '22023';
    END IF;
    IF p_lifetime IS NULL OR p_lifetime < interval '1 minute' OR p_lifetime > interval '1 hour' THEN
        RAISE EXCEPTION 'a temporary endpoint lives 1 minute to 1 hour between renewals' USING ERRCODE = '22023';
    END IF;
    PERFORM siwa.remove_expired_webhook_endpoints();
    INSERT INTO siwa.webhook_endpoints AS e (url, types, expires_at)
    VALUES (p_url, p_types, pg_catalog.now() + p_lifetime) RETURNING e.id INTO v_id;
    INSERT INTO siwa.webhook_secrets (endpoint_id, secret) VALUES (v_id, p_secret);
    RETURN v_id;
END;
$$;
COMMENT ON FUNCTION siwa.add_temporary_webhook_endpoint(text, text, text[], interval) IS
    'The developer loop: adds a temporary webhook endpoint (loopback http, expiring unless renewed) for siwactl webhooks listen --forward-to; returns its id. Executable by siwa_admin.';

-- Pushes a temporary endpoint's expiry to now + p_lifetime; false when there is no such temporary
-- endpoint (never touches a permanent one).
CREATE OR REPLACE FUNCTION siwa.renew_temporary_webhook_endpoint(p_endpoint bigint, p_lifetime interval)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_lifetime IS NULL OR p_lifetime < interval '1 minute' OR p_lifetime > interval '1 hour' THEN
        RAISE EXCEPTION 'a temporary endpoint lives 1 minute to 1 hour between renewals' USING ERRCODE = '22023';
    END IF;
    UPDATE siwa.webhook_endpoints e SET expires_at = pg_catalog.now() + p_lifetime
     WHERE e.id = p_endpoint AND e.expires_at IS NOT NULL;
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION siwa.renew_temporary_webhook_endpoint(bigint, interval) IS
    'The developer loop: renews a temporary webhook endpoint''s expiry; false for an unknown or permanent endpoint. Executable by siwa_admin.';

-- Removes a temporary endpoint (its listener stops); false when there is no such temporary endpoint
-- (never removes a permanent one).
CREATE OR REPLACE FUNCTION siwa.remove_temporary_webhook_endpoint(p_endpoint bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM siwa.webhook_endpoints e WHERE e.id = p_endpoint AND e.expires_at IS NOT NULL;
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION siwa.remove_temporary_webhook_endpoint(bigint) IS
    'The developer loop: removes a temporary webhook endpoint with its secrets and deliveries; false for an unknown or permanent endpoint. Executable by siwa_admin.';
-- ===== end of the developer loop =====
