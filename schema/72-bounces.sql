-- Bounces from Apple's relay: siwa.relay_bounces (keyed hashes, never an address), siwa.record_relay_bounce (role siwa_bounce), the ESP event ids seen, the admin views

-- One row per recipient of a bounce report (siwactl mail bounce) for a relay address: its class (the
-- Bounces module's BounceClassifier), the sending domain, and what the gate knew of the address then.
-- The address itself is kept only as the gate's keyed hash (the key of siwa.erased_mail_addresses),
-- so a row names an account through its sub alone, and an erasure leaves nothing readable.
CREATE TABLE IF NOT EXISTS siwa.relay_bounces (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    received_at    timestamptz NOT NULL DEFAULT now(),
    class          text        NOT NULL,
    recipient_hmac bytea       NOT NULL CHECK (octet_length(recipient_hmac) = 32),
    sending_domain text        CHECK (octet_length(sending_domain) <= 253),
    sub            text,
    gate_reason    text        NOT NULL,
    status         text        NOT NULL CHECK (status ~ '^[245]\.[0-9]{1,3}\.[0-9]{1,3}$'),
    action         text        NOT NULL,
    remote_mta     text        CHECK (octet_length(remote_mta) <= 255),
    source         text        NOT NULL DEFAULT 'dsn',
    CONSTRAINT relay_bounces_source_check CHECK (source IN ('dsn', 'mailgun', 'sendgrid', 'postmark', 'ses')),
    CONSTRAINT relay_bounces_class_check CHECK (class IN ('sender_unauthorized', 'relay_address_dead',
        'forwarding_off', 'auth_failure', 'transient', 'other')),
    CONSTRAINT relay_bounces_action_check CHECK (action IN ('failed', 'delayed', 'delivered', 'relayed', 'expanded'))
);
COMMENT ON TABLE siwa.relay_bounces IS
    'One row per relay-address recipient of a bounce report (siwactl mail bounce): its class, the sending domain, the account''s sub and what the gate answered then; the address only as HMAC-SHA-256 under siwa.mail_address_hash_key. Written by siwa.record_relay_bounce; read through siwa.relay_bounce_history and siwa.relay_bounce_counts.';
-- A database made before the column was added gains it (the constraint with it).
ALTER TABLE siwa.relay_bounces ADD COLUMN IF NOT EXISTS source text NOT NULL DEFAULT 'dsn'
    CONSTRAINT relay_bounces_source_check CHECK (source IN ('dsn', 'mailgun', 'sendgrid', 'postmark', 'ses'));
COMMENT ON COLUMN siwa.relay_bounces.source IS
    'Where the bounce came from: dsn (a delivery status notification, siwactl mail bounce) or the ESP whose webhook reported it (mailgun, sendgrid, postmark, ses; siwa-mailgate --esp-events-listen).';
COMMENT ON COLUMN siwa.relay_bounces.received_at IS 'When the report was recorded.';
COMMENT ON COLUMN siwa.relay_bounces.class IS
    'sender_unauthorized (the sender is not registered with Apple: never suppress the recipient), relay_address_dead (user not found), forwarding_off, auth_failure (SPF, DKIM, DMARC, 5.7.x), transient (4.x.x, delayed) or other.';
COMMENT ON COLUMN siwa.relay_bounces.recipient_hmac IS 'HMAC-SHA-256 of siwa.mail_address_key(recipient), as siwa.erased_mail_addresses keys it.';
COMMENT ON COLUMN siwa.relay_bounces.sending_domain IS 'The returned message''s envelope sender''s domain (lower case), when the report carries it.';
COMMENT ON COLUMN siwa.relay_bounces.sub IS 'The account whose current address the recipient was, when one was (rewritten by a team transfer).';
COMMENT ON COLUMN siwa.relay_bounces.gate_reason IS 'The relay-mail gate''s reason for the recipient when recorded (forwarding_on, forwarding_off, account_deleted, looks_like_relay, …).';
COMMENT ON COLUMN siwa.relay_bounces.status IS 'The report''s enhanced status code (RFC 3463), e.g. 5.1.1.';
COMMENT ON COLUMN siwa.relay_bounces.action IS 'The report''s Action: failed or delayed (delivered, relayed, expanded are accepted and rare).';
COMMENT ON COLUMN siwa.relay_bounces.remote_mta IS 'The server that answered (Remote-MTA), when given.';
CREATE INDEX IF NOT EXISTS relay_bounces_class_received_idx ON siwa.relay_bounces (class, received_at);
CREATE INDEX IF NOT EXISTS relay_bounces_sub_idx ON siwa.relay_bounces (sub) WHERE sub IS NOT NULL;

-- A team transfer rewrites the sub, as it does the account's.
INSERT INTO siwa.sub_columns (table_name, column_name, on_transfer, why) VALUES
    ('relay_bounces', 'sub', 'rewrite', 'the account a relay bounce was for')
ON CONFLICT (table_name, column_name) DO UPDATE SET on_transfer = EXCLUDED.on_transfer, why = EXCLUDED.why;

-- Records one recipient of a report when it is a relay address (its domain one of Apple's, or an address
-- the gate knows): the hash, the account matched as the gate matches it, the gate's reason. Returns one
-- row, never the sub: recorded false (and no id) for a foreign or malformed address. SECURITY DEFINER: siwa_bounce writes
-- no table and reads no key itself. Never raises for an address; the class and source are checked by the table.
-- The six-argument form (before p_source) is replaced by this one, whose p_source defaults to dsn.
DROP FUNCTION IF EXISTS siwa.record_relay_bounce(text, text, text, text, text, text);
CREATE OR REPLACE FUNCTION siwa.record_relay_bounce(
    p_class text, p_recipient text, p_sending_domain text, p_status text, p_action text, p_remote_mta text,
    p_source text DEFAULT 'dsn')
RETURNS TABLE (recorded boolean, id bigint, gate_reason text, account_matched boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_key    text := siwa.mail_address_key(p_recipient);
    v_reason text;
    v_sub    text;
    v_id     bigint;
BEGIN
    SELECT d.reason INTO v_reason FROM siwa.relay_mail_decision(p_recipient) AS d;
    IF v_key IS NULL OR v_reason IN ('not_ours', 'malformed') THEN
        RETURN QUERY SELECT false, NULL::bigint, v_reason, false;
        RETURN;
    END IF;
    SELECT a.sub INTO v_sub
      FROM siwa.accounts a
     WHERE siwa.mail_address_key(a.email) = v_key
     ORDER BY (a.deleted_at IS NOT NULL OR a.personal_data_erased_at IS NOT NULL),
              a.email_status = 'disabled' DESC NULLS LAST, a.updated_at DESC, a.sub
     LIMIT 1;
    INSERT INTO siwa.relay_bounces AS b (class, recipient_hmac, sending_domain, sub, gate_reason, status, action,
                                         remote_mta, source)
    SELECT p_class, siwa.hmac_sha256_padded(h.inner_pad, h.outer_pad, pg_catalog.convert_to(v_key, 'UTF8')),
           pg_catalog.lower(nullif(p_sending_domain, '') COLLATE "C"), v_sub, v_reason, p_status,
           pg_catalog.lower(p_action), nullif(p_remote_mta, ''), p_source
      FROM siwa.mail_address_hash_key h
    RETURNING b.id INTO v_id;
    RETURN QUERY SELECT true, v_id, v_reason, v_sub IS NOT NULL;
END;
$$;
COMMENT ON FUNCTION siwa.record_relay_bounce(text, text, text, text, text, text, text) IS
    'Records one bounced recipient (class, address, sending domain, status, action, remote MTA, source: dsn or the ESP) in siwa.relay_bounces when it is a relay address (Apple''s domain or one the gate knows), the address as its keyed hash; one row: recorded, id, the gate''s reason, whether an account held the address (never its sub). SECURITY DEFINER; executable by siwa_bounce (siwactl mail bounce, siwa-mailgate''s ESP bounce listener).';

-- The ESP events whose bounces were recorded, by the provider's id (SendGrid's sg_event_id, SNS's
-- MessageId, Postmark's ID), so a replayed or retried event is recorded once. Kept until no signature
-- carrying it could still be accepted (expires_at, set by the listener from its age bound), then pruned by siwa.prune.
CREATE TABLE IF NOT EXISTS siwa.esp_events_seen (
    provider   text        NOT NULL CHECK (provider IN ('mailgun', 'sendgrid', 'postmark', 'ses')),
    event_id   text        NOT NULL CHECK (octet_length(event_id) BETWEEN 1 AND 200),
    seen_at    timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (provider, event_id)
);
COMMENT ON TABLE siwa.esp_events_seen IS
    'The ESP events siwa-mailgate''s bounce listener took, by the provider''s event id: a duplicate is answered 200 and not recorded again. Written by siwa.record_esp_event in the transaction of the bounces; pruned by siwa.prune once expired.';
COMMENT ON COLUMN siwa.esp_events_seen.provider IS 'The ESP: sendgrid, ses or postmark (mailgun''s tokens are kept in the listener''s memory).';
COMMENT ON COLUMN siwa.esp_events_seen.event_id IS 'The provider''s id of the event (sg_event_id, the SNS MessageId, Postmark''s bounce ID).';
COMMENT ON COLUMN siwa.esp_events_seen.seen_at IS 'When the event was first recorded.';
COMMENT ON COLUMN siwa.esp_events_seen.expires_at IS
    'When no request carrying the event can be accepted any more (its signature''s time plus --esp-events-max-age, or for Postmark, which signs nothing, the time seen plus it): pruned after.';
CREATE INDEX IF NOT EXISTS esp_events_seen_expires_idx ON siwa.esp_events_seen (expires_at);

-- Takes one ESP event id: true when it was not seen before (its bounces are then recorded, in the same
-- transaction), false for a duplicate. A concurrent taker of the same id waits for the first's
-- transaction: a rolled-back one (the listener answered 503) leaves the id to the ESP's retry.
-- SECURITY DEFINER: siwa_bounce reads and writes no table itself.
CREATE OR REPLACE FUNCTION siwa.record_esp_event(p_provider text, p_event_id text, p_expires_at timestamptz)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_taken integer;
BEGIN
    INSERT INTO siwa.esp_events_seen AS s (provider, event_id, expires_at)
    VALUES (p_provider, p_event_id, p_expires_at)
    ON CONFLICT (provider, event_id) DO NOTHING;
    GET DIAGNOSTICS v_taken = ROW_COUNT;
    RETURN v_taken = 1;
END;
$$;
COMMENT ON FUNCTION siwa.record_esp_event(text, text, timestamptz) IS
    'Takes an ESP event id (provider, id, when it can be forgotten) in siwa.esp_events_seen: true when new, false for a duplicate (not to be recorded again). SECURITY DEFINER; executable by siwa_bounce (siwa-mailgate''s ESP bounce listener).';

-- The admins' view of the bounces, newest first by id: the class, what the gate said then and what the
-- account says now, and whether the two agree (a relay_address_dead for an account Apple still says
-- forwards is worth a look: docs/operations.md, "Bounces").
CREATE OR REPLACE VIEW siwa.relay_bounce_history AS
SELECT b.id, b.received_at, b.class, b.sending_domain, b.sub, b.gate_reason,
       CASE WHEN a.sub IS NULL THEN NULL
            WHEN a.deleted_at IS NOT NULL OR a.personal_data_erased_at IS NOT NULL THEN 'deleted'
            WHEN a.email_status = 'disabled' THEN 'forwarding_off'
            ELSE 'forwarding_on' END AS account_state,
       CASE b.class
           WHEN 'relay_address_dead' THEN b.gate_reason IN ('forwarding_off', 'account_deleted', 'consent_revoked')
           WHEN 'forwarding_off' THEN b.gate_reason IN ('forwarding_off', 'account_deleted')
       END AS matches_apple_events,
       b.status, b.action, b.remote_mta, b.source
  FROM siwa.relay_bounces b
  LEFT JOIN siwa.accounts a ON a.sub = b.sub;
COMMENT ON VIEW siwa.relay_bounce_history IS
    'Every recorded relay bounce (siwa.relay_bounces) with the account''s state now; never an address. For siwa_admin.';
COMMENT ON COLUMN siwa.relay_bounce_history.id IS 'The bounce''s number (siwa.relay_bounces.id), in the order recorded.';
COMMENT ON COLUMN siwa.relay_bounce_history.received_at IS 'When the report was recorded.';
COMMENT ON COLUMN siwa.relay_bounce_history.class IS
    'sender_unauthorized, relay_address_dead, forwarding_off, auth_failure, transient or other (docs/operations.md, "Bounces").';
COMMENT ON COLUMN siwa.relay_bounce_history.sending_domain IS 'The envelope sender''s domain, when the report carried it.';
COMMENT ON COLUMN siwa.relay_bounce_history.sub IS 'The account whose current address was bounced, when one was.';
COMMENT ON COLUMN siwa.relay_bounce_history.gate_reason IS 'The relay-mail gate''s reason for the address when the bounce was recorded.';
COMMENT ON COLUMN siwa.relay_bounce_history.status IS 'The enhanced status code (RFC 3463).';
COMMENT ON COLUMN siwa.relay_bounce_history.action IS 'The report''s Action (failed, delayed, …).';
COMMENT ON COLUMN siwa.relay_bounce_history.remote_mta IS 'The server that answered, when given.';
COMMENT ON COLUMN siwa.relay_bounce_history.source IS 'dsn (siwactl mail bounce) or the ESP that reported it (mailgun, sendgrid, postmark, ses).';
COMMENT ON COLUMN siwa.relay_bounce_history.account_state IS 'The account now: forwarding_on, forwarding_off, deleted; NULL when no account was matched.';
COMMENT ON COLUMN siwa.relay_bounce_history.matches_apple_events IS
    'For relay_address_dead and forwarding_off: whether Apple''s events had already said so (the gate blocked the address); NULL for the other classes.';

-- Counts by class: all, the last 24 hours, the last one, and the sending domains seen.
CREATE OR REPLACE VIEW siwa.relay_bounce_counts AS
SELECT c.class,
       pg_catalog.count(b.id) AS total,
       pg_catalog.count(b.id) FILTER (WHERE b.received_at > pg_catalog.now() - interval '24 hours') AS last_24h,
       pg_catalog.max(b.received_at) AS last_received_at,
       pg_catalog.count(DISTINCT b.sending_domain) AS sending_domains
  FROM pg_catalog.unnest(ARRAY['sender_unauthorized', 'relay_address_dead', 'forwarding_off', 'auth_failure',
                               'transient', 'other']) WITH ORDINALITY AS c(class, ord)
  LEFT JOIN siwa.relay_bounces b ON b.class = c.class
 GROUP BY c.class, c.ord
 ORDER BY c.ord;
COMMENT ON VIEW siwa.relay_bounce_counts IS
    'Relay bounces by class (every class, zero included): total, in the last 24 hours, the last one, and the number of sending domains. For siwa_admin.';
COMMENT ON COLUMN siwa.relay_bounce_counts.class IS 'The class; every class has a row, in the order of docs/operations.md, "Bounces".';
COMMENT ON COLUMN siwa.relay_bounce_counts.total IS 'Bounces of this class ever recorded.';
COMMENT ON COLUMN siwa.relay_bounce_counts.last_24h IS 'Bounces of this class recorded in the last 24 hours.';
COMMENT ON COLUMN siwa.relay_bounce_counts.last_received_at IS 'When the last one was recorded (NULL: never).';
COMMENT ON COLUMN siwa.relay_bounce_counts.sending_domains IS 'How many sending domains its bounces named.';
