-- The notification log, its dedupe keys, the worker's queue, and the view of both (siwa.notifications)

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
-- still arrive, the worker's set-based pass finds the jti's earlier row and skips the second.
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
    claimed_event_time      timestamptz,
    origin                  text        NOT NULL DEFAULT 'apple',
    CONSTRAINT notification_log_pkey PRIMARY KEY (jti, issued_at),
    CONSTRAINT notification_log_state_check CHECK (state IN ('pending', 'applied', 'skipped', 'dead', 'rejected')),
    -- Who wrote the row: the receiver (apple: the worker verifies its token before applying it) or the
    -- worker's refresh check (siwa.record_consent_lost). The receiver's column grant leaves it out.
    CONSTRAINT notification_log_origin_check CHECK (origin IN ('apple', 'refresh-check')),
    CONSTRAINT notification_log_sub_check CHECK (sub <> ''),
    CONSTRAINT notification_log_jti_check CHECK (jti <> ''),
    -- Tied to the state: applied_at is set exactly when it is applied or skipped; a dead one says why;
    -- an erased one holds no email or token.
    CONSTRAINT notification_log_applied_at_check CHECK ((state IN ('applied', 'skipped')) = (applied_at IS NOT NULL)),
    CONSTRAINT notification_log_dead_error_check CHECK (state <> 'dead' OR last_error IS NOT NULL),
    CONSTRAINT notification_log_erased_check
        CHECK (personal_data_erased_at IS NULL OR (email IS NULL AND raw_token IS NULL)),
    -- A signed event_time that was not believed is kept beside the one used, which is earlier.
    CONSTRAINT notification_log_claimed_event_time_check
        CHECK (claimed_event_time IS NULL OR claimed_event_time > event_time)
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
COMMENT ON COLUMN siwa.notification_log.event_time IS
    'When the event happened at Apple (events.event_time), at the latest the token''s iat + the receiver''s leeway (60 s): the time every effect and ordering uses. See claimed_event_time.';
COMMENT ON COLUMN siwa.notification_log.issued_at IS 'The token''s iat claim: the partition key.';
COMMENT ON COLUMN siwa.notification_log.expires_at IS 'The token''s exp claim, when present.';
COMMENT ON COLUMN siwa.notification_log.raw_token IS
    'The signed token as received, for audit (re-verify with siwactl verify --at). NULL once pruned by retention or erased with the account''s personal data.';
COMMENT ON COLUMN siwa.notification_log.received_at IS 'When the receiver committed this row (the 200 to Apple follows the commit).';
COMMENT ON COLUMN siwa.notification_log.state IS
    'Processing state: pending (in siwa.notification_queue), applied (effects committed), skipped (verified but nothing to do, e.g. an unknown event type; see last_error), dead (gave up after the maximum attempts; see last_error, requeue with siwactl replay), rejected (its stored token did not verify when the worker claimed it: nothing was applied; see last_error).';
COMMENT ON COLUMN siwa.notification_log.origin IS
    'Who wrote the row: apple (stored by the receiver; the worker applies it only once its raw_token verifies against Apple''s keys and matches the columns) or refresh-check (a consent-revoked of the worker''s own, siwa.record_consent_lost, which has no token). The receiver''s role cannot write this column.';
COMMENT ON COLUMN siwa.notification_log.attempts IS 'How many times the worker tried to apply it (while pending: see siwa.notification_queue).';
COMMENT ON COLUMN siwa.notification_log.applied_at IS 'When it reached applied or skipped.';
COMMENT ON COLUMN siwa.notification_log.last_error IS
    'The last failure as SQLSTATE: message, with quoted values and email addresses masked (siwa.redact_error); only the SQLSTATE once the account''s personal data is erased. For a skipped notification, the reason. While pending: see siwa.notification_queue.';
COMMENT ON COLUMN siwa.notification_log.personal_data_erased_at IS
    'When email, raw token and error text were erased after an account deletion (or, for a notification that arrived after the erasure, when it was stored without them; a consent-revoked or account-delete without an address keeps its token until the worker has applied it).';
COMMENT ON COLUMN siwa.notification_log.claimed_event_time IS
    'The signed events.event_time when it was later than iat + the receiver''s leeway (an event dated after Apple signed the token about it: not believed, event_time holds iat + leeway instead); NULL otherwise. An anomaly to look into; never used for effects.';

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
    ON siwa.notification_log (state, received_at) WHERE state IN ('skipped', 'dead', 'rejected');

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

-- The receiver stores a batch of verified notifications with one call of siwa.store_notifications
-- (Sources/Receiver/NotificationStore.swift): the dedupe keys, the log rows and their queue rows in one
-- statement, and NOTIFY siwa_notifications once if it queued anything. NOTIFY is sent at commit (never
-- for work rolled back); a redelivered jti inserts nothing and wakes nobody. A notification of an
-- account whose personal data is already erased (Apple may send an email event after the deletion, or
-- redeliver one) is stored without email, and without raw token unless it is a consent-revoked or an
-- account-delete without an address (such a token holds nothing but the sub the account keeps: the
-- worker verifies and applies it like any other, and its marking clears the token, see
-- siwa.apply_claimed_batch); the same statement decides it (one primary-key probe of siwa.accounts per
-- row, of the account's current sub: a late notification for a sub a team transfer replaced is checked
-- against the account it became, siwa.current_sub, called only for a sub siwa.sub_aliases has). A row
-- stored while the erasure commits concurrently is caught when the worker applies it
-- (siwa.apply_claimed_batch) or records its failure (siwa.record_failure). There is no trigger on
-- either table: version 2's row trigger cost ~30 µs per row, a statement trigger with a transition
-- table ~20. The NOTIFY has a price of its own: PostgreSQL holds its notify lock from the
-- start of the commit until the commit is flushed, so transactions that NOTIFY commit one at a time,
-- cluster-wide, and never share a WAL flush (one-row calls from 64 sessions: ~5× slower than without
-- it, docs/performance.md). The receiver's batches pay it once per batch.
CREATE OR REPLACE FUNCTION siwa.store_notifications(
    p_jti text[], p_event_type text[], p_sub text[], p_audience text[], p_email text[],
    p_is_private_email boolean[], p_event_time timestamptz[], p_issued_at timestamptz[],
    p_expires_at timestamptz[], p_raw_token text[], p_claimed_event_time timestamptz[])
RETURNS SETOF text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    -- PL/pgSQL keeps the statement's plan for the session, as the receiver's prepared statement did:
    -- one generic plan (plan_cache_mode), never a custom one planned per call for the batch's length.
    -- siwa.current_sub (a recursive query behind a SET clause: ~30 µs a call) runs only for a sub that
    -- has an alias: the probe of siwa.sub_aliases' primary key finds none for almost every row.
    RETURN QUERY
    WITH batch AS (
        SELECT * FROM unnest(p_jti, p_event_type, p_sub, p_audience, p_email, p_is_private_email,
                             p_event_time, p_issued_at, p_expires_at, p_raw_token, p_claimed_event_time)
               AS b(jti, event_type, sub, audience, email, is_private_email, event_time, issued_at,
                    expires_at, raw_token, claimed_event_time)),
    fresh AS (
        INSERT INTO siwa.notification_jtis AS k (jti, issued_at, expires_at)
        SELECT b.jti, b.issued_at, b.expires_at FROM batch b
        ON CONFLICT (jti) DO NOTHING
        RETURNING k.jti, k.issued_at),
    stored AS (
        INSERT INTO siwa.notification_log AS l
            (jti, event_type, sub, audience, email, is_private_email, event_time, issued_at, expires_at,
             raw_token, personal_data_erased_at, claimed_event_time)
        SELECT b.jti, b.event_type, b.sub, b.audience,
               CASE WHEN a.sub IS NULL THEN b.email END, b.is_private_email, b.event_time, b.issued_at,
               b.expires_at,
               CASE WHEN a.sub IS NULL
                      OR (b.event_type IN ('consent-revoked', 'account-delete') AND b.email IS NULL)
                    THEN b.raw_token END,
               CASE WHEN a.sub IS NOT NULL
                     AND NOT (b.event_type IN ('consent-revoked', 'account-delete') AND b.email IS NULL)
                    THEN pg_catalog.clock_timestamp() END,
               b.claimed_event_time
          FROM batch b
          JOIN fresh f ON f.jti = b.jti AND f.issued_at = b.issued_at
          LEFT JOIN siwa.sub_aliases x ON x.old_sub = b.sub
          LEFT JOIN siwa.accounts a
                 ON a.sub = CASE WHEN x.old_sub IS NULL THEN b.sub ELSE siwa.current_sub(b.sub) END
                AND a.personal_data_erased_at IS NOT NULL
        ON CONFLICT (jti, issued_at) DO NOTHING
        RETURNING l.id, l.jti, l.issued_at),
    queued AS (
        INSERT INTO siwa.notification_queue (id, jti, issued_at)
        SELECT s.id, s.jti, s.issued_at FROM stored s
        RETURNING 1)
    SELECT s.jti FROM stored s
     WHERE (SELECT pg_catalog.count(pg_catalog.pg_notify('siwa_notifications', ''))
              FROM (SELECT 1 FROM queued LIMIT 1) AS w) >= 0;
END;
$$;
COMMENT ON FUNCTION siwa.store_notifications(text[], text[], text[], text[], text[], boolean[], timestamptz[], timestamptz[], timestamptz[], text[], timestamptz[]) IS
    'The receiver''s store: a batch of verified notifications (one array per column, same length) into the dedupe keys, the log and the queue, in one statement; returns the jti of each row stored now (a duplicate returns nothing). event_time is the effective one the receiver''s verifier decided (at the latest iat + leeway), claimed_event_time the signed one it did not believe (NULL when it did). Runs with the caller''s rights: the receiver''s column grants (schema/85-privileges.sql).';

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
