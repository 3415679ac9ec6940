-- ESP suppression lists in step with Apple's events: providers, the suppression outbox, what we added

-- Most apps send through an email service provider (ESP) whose suppression list decides what is sent.
-- siwa-worker keeps each configured provider's list in step with the relay events (docs/operations.md,
-- "Suppression lists"):
--  - siwa.suppression_providers: one row per provider (name, kind sendgrid|mailgun|ses|postmark,
--    enabled, how long an erasure waits for its rows). No credentials: the worker reads those from
--    secret files or its environment.
--  - siwa.suppression_outbox: one row per enabled provider and address, written by a statement trigger
--    on siwa.accounts in the transaction that applies the event: email-disabled and account-delete add
--    the address to the provider's list, email-enabled removes it. A remove of an address this service
--    did not add (siwa.suppressions_we_added) finishes as not_ours without a call: a user's own
--    unsubscribe or a real hard bounce is never undone. pending → done (outcome done, already_there,
--    not_there, not_ours) or dead (permanent, gave_up, erased).
-- Order: per provider and address, a row is not claimed while an earlier one (lower id) is pending.
-- Leases as the webhook claim: the claim takes a row for a while (lease_owner, lease_expires_at), no
-- lock or transaction is held across the provider's call, and a lease that runs out is taken over.
-- Retries: siwa.retry_delay from the row's attempts, never sooner than the provider's retry-after; dead
-- after the caller's bound of attempts.
-- Team transfer: sub is rewritten with the account's (siwa.sub_columns); the address stays the one the
-- provider holds. Erasure: rows no longer pending lose their address at once; a pending row keeps it
-- for the provider's erasure_wait at most, then is dead (outcome erased) without it; what we added is
-- forgotten. Every object here is new: created only when missing, functions replaced.

CREATE TABLE IF NOT EXISTS siwa.suppression_providers (
    name         text        PRIMARY KEY,
    kind         text        NOT NULL,
    enabled      boolean     NOT NULL DEFAULT true,
    erasure_wait interval    NOT NULL DEFAULT interval '1 hour',
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT suppression_providers_name_check CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    CONSTRAINT suppression_providers_kind_check CHECK (kind IN ('sendgrid', 'mailgun', 'ses', 'postmark')),
    CONSTRAINT suppression_providers_erasure_wait_check
        CHECK (erasure_wait BETWEEN interval '0' AND interval '7 days')
);
COMMENT ON TABLE siwa.suppression_providers IS
    'ESPs whose suppression list siwa-worker keeps in step with the relay events (siwa.suppression_outbox). No credentials: the worker reads them from secret files or its environment.';
COMMENT ON COLUMN siwa.suppression_providers.name IS 'The provider''s name, as the worker''s configuration names it (lower case, digits, - and _).';
COMMENT ON COLUMN siwa.suppression_providers.kind IS 'Its API: sendgrid, mailgun, ses or postmark.';
COMMENT ON COLUMN siwa.suppression_providers.enabled IS 'Whether new events write rows for it and its pending rows are claimed.';
COMMENT ON COLUMN siwa.suppression_providers.erasure_wait IS
    'How long an erased account''s pending rows keep their address for delivery (0 to 7 days; 1 hour by default); then they are dead, outcome erased, without it.';

CREATE TABLE IF NOT EXISTS siwa.suppression_outbox (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    provider         text        NOT NULL REFERENCES siwa.suppression_providers (name)
                                 ON UPDATE CASCADE ON DELETE CASCADE,
    sub              text        NOT NULL,
    event            text        NOT NULL,
    action           text        NOT NULL,
    address          text,
    address_key      text,
    state            text        NOT NULL DEFAULT 'pending',
    outcome          text,
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    last_attempt_at  timestamptz,
    finished_at      timestamptz,
    last_status      integer,
    last_error       text,
    erase_by         timestamptz,
    add_sent_at      timestamptz,
    lease_owner      text,
    lease_expires_at timestamptz,
    CONSTRAINT suppression_outbox_event_check CHECK (event IN ('email-disabled', 'email-enabled', 'account-delete', 'real-address')),
    CONSTRAINT suppression_outbox_action_check CHECK (action IN ('add', 'remove')),
    CONSTRAINT suppression_outbox_state_check CHECK (state IN ('pending', 'done', 'dead')),
    CONSTRAINT suppression_outbox_outcome_check CHECK (
        (state = 'pending' AND outcome IS NULL)
        OR (state = 'done' AND outcome IN ('done', 'already_there', 'not_there', 'not_ours'))
        OR (state = 'dead' AND outcome IN ('permanent', 'gave_up', 'erased'))),
    CONSTRAINT suppression_outbox_address_check CHECK (
        (address IS NULL) = (address_key IS NULL) AND (state <> 'pending' OR address_key IS NOT NULL)),
    CONSTRAINT suppression_outbox_lease_check CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CONSTRAINT suppression_outbox_error_check CHECK (length(last_error) <= 300)
);
COMMENT ON TABLE siwa.suppression_outbox IS
    'One row per enabled ESP and address an email-disabled, email-enabled or account-delete changed, written in the transaction that applied it; delivered by siwa-worker in order per provider and address (siwa.claim_suppressions, siwa.record_suppression_attempt).';
COMMENT ON COLUMN siwa.suppression_outbox.sub IS 'The user''s sub; a team transfer rewrites it (siwa.sub_columns).';
COMMENT ON COLUMN siwa.suppression_outbox.event IS 'The event whose effect this is: email-disabled, email-enabled or account-delete; real-address for the removal of what an earlier version added for an address that is not a relay address (siwa.remove_real_address_suppressions).';
COMMENT ON COLUMN siwa.suppression_outbox.action IS 'add (to the provider''s suppression list) or remove (only if siwa.suppressions_we_added holds it).';
COMMENT ON COLUMN siwa.suppression_outbox.address IS 'The address as the provider is sent it; NULL once the account is erased and the row is no longer pending.';
COMMENT ON COLUMN siwa.suppression_outbox.address_key IS 'siwa.mail_address_key(address): the order is per provider and key.';
COMMENT ON COLUMN siwa.suppression_outbox.state IS 'pending, done (outcome done, already_there, not_there, not_ours) or dead (permanent, gave_up, erased).';
COMMENT ON COLUMN siwa.suppression_outbox.outcome IS
    'Once finished: done, already_there (an add the list held), not_there (a remove the list did not hold), not_ours (a remove of an address we did not add: no call; or, for SES, an entry its read showed listed since by SES itself), permanent (the provider refused), gave_up (the attempts ran out), erased (the account was erased and the provider''s erasure_wait passed).';
COMMENT ON COLUMN siwa.suppression_outbox.last_error IS 'Our own words about the last failure (never a credential, an address or the answer''s body).';
COMMENT ON COLUMN siwa.suppression_outbox.add_sent_at IS
    'When an attempt of this add was about to send it (written before the call): a later attempt that finds the address listed counts it as ours, since the earlier one may have added it and died before recording.';
COMMENT ON COLUMN siwa.suppression_outbox.erase_by IS 'Set when the account is erased while this row is pending: the row keeps its address until then at most.';
CREATE INDEX IF NOT EXISTS suppression_outbox_queue_idx
    ON siwa.suppression_outbox (provider, address_key, id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS suppression_outbox_due_idx
    ON siwa.suppression_outbox (next_attempt_at, id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS suppression_outbox_sub_idx ON siwa.suppression_outbox (sub);
-- Every row of a provider and address in order (the pruning's and the replay's "a later row"), and
-- the finished rows by age (the pruning's scan).
CREATE INDEX IF NOT EXISTS suppression_outbox_address_idx ON siwa.suppression_outbox (provider, address_key, id);
CREATE INDEX IF NOT EXISTS suppression_outbox_finished_idx
    ON siwa.suppression_outbox (finished_at) WHERE state <> 'pending';
-- What each claim looks at first, kept small: the erased accounts' pending rows and the pending removes.
CREATE INDEX IF NOT EXISTS suppression_outbox_erase_idx
    ON siwa.suppression_outbox (erase_by) WHERE state = 'pending' AND erase_by IS NOT NULL;
CREATE INDEX IF NOT EXISTS suppression_outbox_remove_idx
    ON siwa.suppression_outbox (provider, id) WHERE state = 'pending' AND action = 'remove';

-- What this service added to each provider's list (and the provider did not hold already): only these
-- are removed on email-enabled.
CREATE TABLE IF NOT EXISTS siwa.suppressions_we_added (
    provider    text        NOT NULL REFERENCES siwa.suppression_providers (name)
                            ON UPDATE CASCADE ON DELETE CASCADE,
    address_key text        NOT NULL,
    sub         text        NOT NULL,
    added_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, address_key)
);
COMMENT ON TABLE siwa.suppressions_we_added IS
    'The addresses siwa-worker added to a provider''s suppression list itself (the provider answered done, not already_there): the only ones an email-enabled removes. Forgotten when the address is removed or the account erased.';
COMMENT ON COLUMN siwa.suppressions_we_added.address_key IS 'siwa.mail_address_key of the address added.';
COMMENT ON COLUMN siwa.suppressions_we_added.sub IS 'Whose address it is; a team transfer rewrites it, an erasure deletes the row.';
CREATE INDEX IF NOT EXISTS suppressions_we_added_sub_idx ON siwa.suppressions_we_added (sub);

INSERT INTO siwa.sub_columns (table_name, column_name, on_transfer, why) VALUES
    ('suppression_outbox', 'sub', 'rewrite', 'the rows follow the user''s current sub'),
    ('suppressions_we_added', 'sub', 'rewrite', 'what we added follows the user''s current sub, for its erasure')
ON CONFLICT (table_name, column_name) DO UPDATE SET on_transfer = EXCLUDED.on_transfer, why = EXCLUDED.why;

-- The fan-out and the erasure, once per UPDATE statement on siwa.accounts (the set-based pass updates a
-- batch's accounts in one): with no provider at all (most deployments) one probe and nothing else.
-- An account newly deleted adds its address (an email event of the same statement is then moot); else a
-- new email status adds (disabled) or removes (enabled) it. Only a relay address Apple gave this app
-- (is_private_email true): a real address on a global list would outlive our erasure and stop every later mail. An account newly erased: its finished rows
-- lose their address, its pending ones get erase_by, what we added for it is forgotten. SECURITY
-- INVOKER: the updating role (the worker, the owner) needs the grants of schema/85-privileges.sql.
CREATE OR REPLACE FUNCTION siwa.suppression_fan_out() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM siwa.suppression_providers) THEN
        RETURN NULL;
    END IF;
    INSERT INTO siwa.suppression_outbox (provider, sub, event, action, address, address_key)
    SELECT p.name, n.sub, x.event, x.action, x.address, siwa.mail_address_key(x.address)
      FROM new_accounts n
      JOIN old_accounts o ON o.sub = n.sub
      CROSS JOIN LATERAL (
          SELECT 'account-delete' AS event, 'add' AS action, coalesce(o.email, n.email) AS address,
                 CASE WHEN o.email IS NOT NULL THEN o.is_private_email ELSE n.is_private_email END AS relay
           WHERE o.deleted_at IS NULL AND n.deleted_at IS NOT NULL
          UNION ALL
          SELECT 'email-' || n.email_status, CASE n.email_status WHEN 'disabled' THEN 'add' ELSE 'remove' END,
                 coalesce(n.email, o.email),
                 CASE WHEN n.email IS NOT NULL THEN n.is_private_email ELSE o.is_private_email END
           WHERE n.email_status IS DISTINCT FROM o.email_status AND n.email_status IS NOT NULL
             AND n.deleted_at IS NULL) AS x
      JOIN siwa.suppression_providers p ON p.enabled
     WHERE x.relay AND siwa.mail_address_key(x.address) IS NOT NULL
     ORDER BY n.sub, p.name;
    IF FOUND THEN
        PERFORM pg_catalog.pg_notify('siwa_suppressions', '');
    END IF;
    IF EXISTS (SELECT 1 FROM new_accounts n JOIN old_accounts o ON o.sub = n.sub
                WHERE o.personal_data_erased_at IS NULL AND n.personal_data_erased_at IS NOT NULL) THEN
        UPDATE siwa.suppression_outbox AS r
           SET address = CASE WHEN r.state = 'pending' THEN r.address END,
               address_key = CASE WHEN r.state = 'pending' THEN r.address_key END,
               erase_by = CASE WHEN r.state = 'pending'
                               THEN coalesce(r.erase_by, pg_catalog.clock_timestamp() + p.erasure_wait) END
          FROM new_accounts n JOIN old_accounts o ON o.sub = n.sub, siwa.suppression_providers p
         WHERE o.personal_data_erased_at IS NULL AND n.personal_data_erased_at IS NOT NULL
           AND r.sub = n.sub AND p.name = r.provider AND (r.address IS NOT NULL OR r.state = 'pending');
        DELETE FROM siwa.suppressions_we_added AS w
         USING new_accounts n JOIN old_accounts o ON o.sub = n.sub
         WHERE o.personal_data_erased_at IS NULL AND n.personal_data_erased_at IS NOT NULL AND w.sub = n.sub;
    END IF;
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION siwa.suppression_fan_out() IS
    'Statement trigger after UPDATE on siwa.accounts: one siwa.suppression_outbox row per enabled provider and address whose suppression the statement changed (deleted or email-disabled: add; email-enabled: remove); for accounts newly erased, the erasure of their rows'' addresses (pending ones after the provider''s erasure_wait) and of what we added.';
DROP TRIGGER IF EXISTS accounts_suppression_fan_out ON siwa.accounts;
CREATE TRIGGER accounts_suppression_fan_out
    AFTER UPDATE ON siwa.accounts REFERENCING OLD TABLE AS old_accounts NEW TABLE AS new_accounts
    FOR EACH STATEMENT EXECUTE FUNCTION siwa.suppression_fan_out();

-- Pending rows of erased accounts past their erase_by: dead (outcome erased), their address gone, even
-- one in flight (its record then finds it finished). Returns how many. The claim calls it first.
CREATE OR REPLACE FUNCTION siwa.expire_suppression_erasures() RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH gone AS (
        UPDATE siwa.suppression_outbox AS r
           SET state = 'dead', outcome = 'erased', address = NULL, address_key = NULL,
               finished_at = pg_catalog.clock_timestamp(), lease_owner = NULL, lease_expires_at = NULL,
               last_error = 'the account''s personal data was erased and the provider''s erasure_wait passed'
         WHERE r.state = 'pending' AND r.erase_by <= pg_catalog.clock_timestamp()
        RETURNING 1)
    SELECT pg_catalog.count(*)::integer FROM gone
$$;
COMMENT ON FUNCTION siwa.expire_suppression_erasures() IS
    'Makes dead (outcome erased, address NULL) the pending suppression rows of erased accounts past their erase_by; returns how many. Executable by siwa_worker.';

-- A row ends (done or dead): the next pending one of its provider and address may be claimed. An
-- erased account's row loses its address as it ends.
CREATE OR REPLACE FUNCTION siwa.finish_suppression(p_id bigint, p_state text, p_outcome text) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    UPDATE siwa.suppression_outbox AS r
       SET state = p_state, outcome = p_outcome, finished_at = pg_catalog.clock_timestamp(),
           lease_owner = NULL, lease_expires_at = NULL,
           address = CASE WHEN r.erase_by IS NULL THEN r.address END,
           address_key = CASE WHEN r.erase_by IS NULL THEN r.address_key END
     WHERE r.id = p_id AND r.state = 'pending';
$$;
COMMENT ON FUNCTION siwa.finish_suppression(bigint, text, text) IS
    'Ends one pending suppression row with p_state and p_outcome, its lease released (and its address dropped when its account is erased). Executable by siwa_worker.';

-- One claim: up to p_limit due rows of p_provider (NULL: any) at the heads of their provider-and-address
-- queues, leased to p_owner for p_lease (a lane per provider: one that hangs holds up no other). Expired erasures end first; a remove at a head whose address we did not add ends
-- as not_ours (no call), and the queue behind it moves up. Returns the rows with their provider's kind.
CREATE OR REPLACE FUNCTION siwa.claim_suppressions(p_owner text, p_lease interval, p_limit integer DEFAULT 1,
                                                   p_provider text DEFAULT NULL)
RETURNS TABLE (id bigint, provider text, kind text, action text, address text, attempts integer)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_unowned bigint[];
BEGIN
    PERFORM siwa.expire_suppression_erasures();
    FOR i IN 1 .. 8 LOOP
        v_unowned := ARRAY(
            SELECT r.id FROM siwa.suppression_outbox r
             WHERE r.state = 'pending' AND r.action = 'remove' AND (p_provider IS NULL OR r.provider = p_provider)
               AND (r.lease_expires_at IS NULL OR r.lease_expires_at <= pg_catalog.clock_timestamp())
               AND NOT EXISTS (SELECT 1 FROM siwa.suppression_outbox q
                                WHERE q.provider = r.provider AND q.address_key = r.address_key
                                  AND q.state = 'pending' AND q.id < r.id)
               AND NOT EXISTS (SELECT 1 FROM siwa.suppressions_we_added w
                                WHERE w.provider = r.provider AND w.address_key = r.address_key)
             ORDER BY r.id
               FOR UPDATE OF r SKIP LOCKED);
        EXIT WHEN pg_catalog.cardinality(v_unowned) = 0;
        UPDATE siwa.suppression_outbox AS r
           SET state = 'done', outcome = 'not_ours', finished_at = pg_catalog.clock_timestamp(),
               address = CASE WHEN r.erase_by IS NULL THEN r.address END,
               address_key = CASE WHEN r.erase_by IS NULL THEN r.address_key END
         WHERE r.id = ANY (v_unowned);
    END LOOP;
    RETURN QUERY
    WITH due AS (
        SELECT r.id FROM siwa.suppression_outbox r
          JOIN siwa.suppression_providers p ON p.name = r.provider AND p.enabled
         WHERE r.state = 'pending' AND (p_provider IS NULL OR r.provider = p_provider)
           AND r.next_attempt_at <= pg_catalog.clock_timestamp()
           AND (r.lease_expires_at IS NULL OR r.lease_expires_at <= pg_catalog.clock_timestamp())
           AND NOT EXISTS (SELECT 1 FROM siwa.suppression_outbox q
                            WHERE q.provider = r.provider AND q.address_key = r.address_key
                              AND q.state = 'pending' AND q.id < r.id)
         ORDER BY r.next_attempt_at, r.id
         LIMIT greatest(p_limit, 1)
           FOR UPDATE OF r SKIP LOCKED),
    leased AS (
        UPDATE siwa.suppression_outbox AS r
           SET lease_owner = p_owner, lease_expires_at = pg_catalog.clock_timestamp() + p_lease,
               attempts = r.attempts + 1, last_attempt_at = pg_catalog.clock_timestamp()
          FROM due WHERE r.id = due.id
        RETURNING r.id, r.provider, r.action, r.address, r.attempts)
    SELECT l.id, l.provider, p.kind, l.action, l.address, l.attempts
      FROM leased l JOIN siwa.suppression_providers p ON p.name = l.provider
     ORDER BY l.id;
END;
$$;
COMMENT ON FUNCTION siwa.claim_suppressions(text, interval, integer, text) IS
    'Leases up to p_limit due suppression rows (of p_provider, or any) at the heads of their provider-and-address queues to p_owner for p_lease, each attempt counted; first ends expired erasures and removes of addresses we did not add (not_ours). Executable by siwa_worker.';

-- Records a lane's batch in one statement, each row only while its lease is p_owner's; returns the ids
-- recorded. Per row (p_ids[i], p_outcomes[i], p_statuses[i], p_errors[i], p_retry_afters[i]):
-- done, already_there, not_there, not_ours (a remove the provider's read showed is no longer our entry,
-- as SES's can): finished done; permanent: dead; retry: again after siwa.retry_delay(attempts,
-- p_retry_base, p_retry_cap), never before the provider's own retry-after, dead (gave_up) once attempts
-- reach p_max_attempts; released: claimed and never called, given back with its attempt uncounted.
-- An add done is remembered as ours; a remove done, not_there or not_ours forgets it. A finished row of
-- an erased account loses its address (as siwa.finish_suppression ends one).
CREATE OR REPLACE FUNCTION siwa.record_suppression_attempts(
    p_owner text, p_ids bigint[], p_outcomes text[], p_statuses integer[], p_errors text[],
    p_retry_afters double precision[], p_max_attempts integer, p_retry_base interval, p_retry_cap interval)
RETURNS SETOF bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF pg_catalog.cardinality(p_ids) IS DISTINCT FROM pg_catalog.cardinality(p_outcomes) THEN
        RAISE EXCEPTION 'one outcome per id' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_outcomes) AS o(outcome)
                WHERE o.outcome IS NULL OR o.outcome NOT IN ('done', 'already_there', 'not_there', 'not_ours',
                                                             'permanent', 'retry', 'released')) THEN
        RAISE EXCEPTION 'unknown suppression outcome' USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    WITH attempt AS (
        SELECT a.* FROM unnest(p_ids, p_outcomes, p_statuses, p_errors, p_retry_afters)
                        AS a(id, outcome, status, error, retry_after)),
    mine AS (
        SELECT r.id, r.action, r.provider, r.address_key, r.sub, r.erase_by, r.attempts, a.outcome, a.status,
               a.error, a.retry_after,
               CASE WHEN a.outcome = 'released' THEN 'released'
                    WHEN a.outcome = 'retry' AND r.attempts < p_max_attempts THEN 'pending'
                    WHEN a.outcome IN ('done', 'already_there', 'not_there', 'not_ours') THEN 'done'
                    ELSE 'dead' END AS next
          FROM siwa.suppression_outbox AS r JOIN attempt AS a ON a.id = r.id
         WHERE r.state = 'pending' AND r.lease_owner = p_owner
         ORDER BY r.id
           FOR UPDATE OF r),
    remembered AS (
        INSERT INTO siwa.suppressions_we_added AS w (provider, address_key, sub)
        SELECT m.provider, m.address_key, m.sub FROM mine AS m
         WHERE m.action = 'add' AND m.outcome = 'done' AND m.erase_by IS NULL
        ON CONFLICT (provider, address_key) DO UPDATE SET sub = EXCLUDED.sub, added_at = pg_catalog.now()),
    forgotten AS (
        DELETE FROM siwa.suppressions_we_added AS w USING mine AS m
         WHERE m.action = 'remove' AND m.outcome IN ('done', 'not_there', 'not_ours')
           AND w.provider = m.provider AND w.address_key = m.address_key),
    recorded AS (
        UPDATE siwa.suppression_outbox AS r
           SET lease_owner = NULL, lease_expires_at = NULL,
               attempts = CASE WHEN m.next = 'released' THEN r.attempts - 1 ELSE r.attempts END,
               last_status = CASE WHEN m.next = 'released' THEN r.last_status ELSE m.status END,
               last_error = CASE WHEN m.next = 'released' THEN r.last_error ELSE pg_catalog.left(m.error, 300) END,
               next_attempt_at = CASE WHEN m.next = 'pending'
                                      THEN pg_catalog.clock_timestamp()
                                           + greatest(siwa.retry_delay(m.attempts, p_retry_base, p_retry_cap),
                                                      pg_catalog.make_interval(secs => coalesce(m.retry_after, 0)))
                                      ELSE r.next_attempt_at END,
               state = CASE WHEN m.next IN ('done', 'dead') THEN m.next ELSE r.state END,
               outcome = CASE WHEN m.next NOT IN ('done', 'dead') THEN r.outcome
                              WHEN m.outcome = 'retry' THEN 'gave_up' ELSE m.outcome END,
               finished_at = CASE WHEN m.next IN ('done', 'dead') THEN pg_catalog.clock_timestamp() END,
               address = CASE WHEN m.next IN ('done', 'dead') AND r.erase_by IS NOT NULL THEN NULL
                              ELSE r.address END,
               address_key = CASE WHEN m.next IN ('done', 'dead') AND r.erase_by IS NOT NULL THEN NULL
                                  ELSE r.address_key END
          FROM mine AS m
         WHERE r.id = m.id
        RETURNING r.id)
    SELECT recorded.id FROM recorded;
END;
$$;
COMMENT ON FUNCTION siwa.record_suppression_attempts(text, bigint[], text[], integer[], text[], double precision[], integer, interval, interval) IS
    'Records a lane''s batch of suppression attempts in one statement: done, already_there, not_there, not_ours (done), permanent (dead), retry after siwa.retry_delay and at least the provider''s retry-after (dead, gave_up, at p_max_attempts), released (given back, its attempt uncounted); keeps siwa.suppressions_we_added. Returns the ids whose lease was still p_owner''s. Executable by siwa_worker.';

-- Records the attempt of a row the caller leased, as siwa.record_suppression_attempts records a batch of
-- one. False, nothing written, when the lease is no longer the caller's.
CREATE OR REPLACE FUNCTION siwa.record_suppression_attempt(
    p_id bigint, p_owner text, p_outcome text, p_status integer, p_error text,
    p_retry_after double precision DEFAULT NULL, p_max_attempts integer DEFAULT 12,
    p_retry_base interval DEFAULT interval '5 seconds', p_retry_cap interval DEFAULT interval '1 hour')
RETURNS boolean
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.count(*) > 0
      FROM siwa.record_suppression_attempts(p_owner, ARRAY[p_id], ARRAY[p_outcome], ARRAY[p_status],
                                            ARRAY[p_error], ARRAY[p_retry_after], p_max_attempts, p_retry_base,
                                            p_retry_cap);
$$;
COMMENT ON FUNCTION siwa.record_suppression_attempt(bigint, text, text, integer, text, double precision, integer, interval, interval) IS
    'Records the attempt of a suppression row p_owner leased (siwa.record_suppression_attempts for one row). False when the lease is no longer the caller''s. Executable by siwa_worker.';

-- Before an add's call: when the provider's list already holds the address (p_listed), whether an earlier
-- attempt of this row sent the add (then it is ours); otherwise marks the row as sent by this attempt and
-- returns false. Only for the lease's owner; the mark does not wait for the WAL flush (a mark a crash of
-- the server loses only makes the retry's answer already_there, as without it).
CREATE OR REPLACE FUNCTION siwa.suppression_add_sent(p_id bigint, p_owner text, p_listed boolean)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_listed THEN
        RETURN coalesce((SELECT r.add_sent_at IS NOT NULL FROM siwa.suppression_outbox r WHERE r.id = p_id), false);
    END IF;
    PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    UPDATE siwa.suppression_outbox AS r SET add_sent_at = coalesce(r.add_sent_at, pg_catalog.clock_timestamp())
     WHERE r.id = p_id AND r.lease_owner = p_owner;
    RETURN false;
END;
$$;
COMMENT ON FUNCTION siwa.suppression_add_sent(bigint, text, boolean) IS
    'Before an add''s call: whether an earlier attempt sent it (when the list holds the address), else marks the row sent by this attempt (false). Executable by siwa_worker.';

-- When we recorded adding p_address to p_provider's list (NULL: we hold no record of it).
CREATE OR REPLACE FUNCTION siwa.suppression_added_at(p_provider text, p_address text)
RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT w.added_at FROM siwa.suppressions_we_added w
     WHERE w.provider = p_provider AND w.address_key = siwa.mail_address_key(p_address);
$$;
COMMENT ON FUNCTION siwa.suppression_added_at(text, text) IS
    'When we recorded adding p_address to p_provider''s suppression list, or NULL. Executable by siwa_worker.';

-- siwactl mail suppressions retry: pending rows due now (one row, or every row of a provider); a
-- replay: a finished row with its address again pending as a new row at the end of its queue.
CREATE OR REPLACE FUNCTION siwa.retry_suppressions(p_id bigint DEFAULT NULL, p_provider text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_count integer;
BEGIN
    IF num_nonnulls(p_id, p_provider) <> 1 THEN
        RAISE EXCEPTION 'give exactly one of a row or a provider' USING ERRCODE = '22023';
    END IF;
    UPDATE siwa.suppression_outbox AS r SET next_attempt_at = pg_catalog.now(), attempts = 0
     WHERE r.state = 'pending' AND (r.id = p_id OR r.provider = p_provider)
       AND (r.lease_expires_at IS NULL OR r.lease_expires_at <= pg_catalog.clock_timestamp());
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        PERFORM pg_catalog.pg_notify('siwa_suppressions', '');
    END IF;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION siwa.retry_suppressions(bigint, text) IS
    'Makes pending suppression rows due now with their attempts reset: one row or a provider''s. Returns how many. The owner''s.';

CREATE OR REPLACE FUNCTION siwa.replay_suppression(p_id bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM siwa.suppression_outbox r JOIN siwa.suppression_outbox q
                 ON q.provider = r.provider AND q.address_key = r.address_key AND q.id > r.id
                WHERE r.id = p_id) THEN
        RAISE EXCEPTION 'suppression row % is superseded by a later row of its provider and address', p_id
            USING ERRCODE = '22023', HINT = 'replay the latest row, or siwactl mail suppressions replay --provider';
    END IF;
    INSERT INTO siwa.suppression_outbox (provider, sub, event, action, address, address_key)
    SELECT r.provider, r.sub, r.event, r.action, r.address, r.address_key
      FROM siwa.suppression_outbox r WHERE r.id = p_id AND r.state <> 'pending' AND r.address IS NOT NULL
    RETURNING id INTO v_id;
    RETURN v_id;
END;
$$;
COMMENT ON FUNCTION siwa.replay_suppression(bigint) IS
    'Writes a finished suppression row again as a new pending row (same provider, address, action); returns its id, NULL when the row is pending, unknown or erased; 22023 when a later row of its provider and address supersedes it (replaying it would undo a newer state). The owner''s.';

-- What an earlier version added for real addresses (not relay: is_private_email not true), which no
-- suppression list should hold (siwa.suppression_fan_out): per provider, whose and since when.
CREATE OR REPLACE FUNCTION siwa.real_address_suppressions(p_provider text DEFAULT NULL)
RETURNS TABLE (provider text, sub text, added_at timestamptz)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT w.provider, w.sub, w.added_at
      FROM siwa.suppressions_we_added w
      JOIN siwa.accounts a ON a.sub = w.sub AND siwa.mail_address_key(a.email) = w.address_key
     WHERE a.is_private_email IS NOT TRUE AND (p_provider IS NULL OR w.provider = p_provider)
     ORDER BY w.provider, w.added_at
$$;
COMMENT ON FUNCTION siwa.real_address_suppressions(text) IS
    'The suppressions siwa-worker added (siwa.suppressions_we_added) for addresses that are not relay addresses, of p_provider or all: provider, sub, added_at (never the address). The owner''s (siwactl mail suppressions real-addresses).';

-- siwactl mail suppressions real-addresses --remove: each of them queued for removal, after any pending
-- row of its provider and address.
CREATE OR REPLACE FUNCTION siwa.remove_real_address_suppressions(p_provider text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_count integer;
BEGIN
    INSERT INTO siwa.suppression_outbox (provider, sub, event, action, address, address_key)
    SELECT w.provider, w.sub, 'real-address', 'remove', a.email, w.address_key
      FROM siwa.suppressions_we_added w
      JOIN siwa.accounts a ON a.sub = w.sub AND siwa.mail_address_key(a.email) = w.address_key
     WHERE a.is_private_email IS NOT TRUE AND (p_provider IS NULL OR w.provider = p_provider)
     ORDER BY w.provider, w.added_at;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        PERFORM pg_catalog.pg_notify('siwa_suppressions', '');
    END IF;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION siwa.remove_real_address_suppressions(text) IS
    'Queues the removal of every suppression siwa.real_address_suppressions lists (of p_provider or all) from its provider''s list; returns how many. The owner''s.';

-- siwactl mail suppressions retry ID|--dead: dead rows pending again, due now, attempts reset. A dead
-- row superseded by a later finished row of its provider and address is left (its state would undo a
-- newer one), as is an erased one (no address).
CREATE OR REPLACE FUNCTION siwa.revive_suppressions(p_id bigint DEFAULT NULL, p_provider text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_count integer;
BEGIN
    UPDATE siwa.suppression_outbox AS r
       SET state = 'pending', outcome = NULL, attempts = 0, next_attempt_at = pg_catalog.now(),
           finished_at = NULL, lease_owner = NULL, lease_expires_at = NULL
     WHERE r.state = 'dead' AND r.address IS NOT NULL
       AND (p_id IS NULL OR r.id = p_id) AND (p_provider IS NULL OR r.provider = p_provider)
       AND NOT EXISTS (SELECT 1 FROM siwa.suppression_outbox q
                        WHERE q.provider = r.provider AND q.address_key = r.address_key
                          AND q.id > r.id AND q.state <> 'pending');
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        PERFORM pg_catalog.pg_notify('siwa_suppressions', '');
    END IF;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION siwa.revive_suppressions(bigint, text) IS
    'Makes dead suppression rows (one, a provider''s, or all) pending and due now, attempts reset; leaves those a later finished row of their address supersedes and the erased. Returns how many. The owner''s.';

-- siwactl mail suppressions replay --provider P [--since]: for every address of the provider with a row
-- created since p_since (all when NULL), its latest desired state written again as a new pending row,
-- in the order of the rows it repeats. An address with a pending row already is skipped (its queue
-- will reach that state anyway), as is an erased one.
CREATE OR REPLACE FUNCTION siwa.replay_suppressions(p_provider text, p_since timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_count integer;
BEGIN
    INSERT INTO siwa.suppression_outbox (provider, sub, event, action, address, address_key)
    SELECT l.provider, l.sub, l.event, l.action, l.address, l.address_key
      FROM (SELECT DISTINCT ON (r.address_key) r.*
              FROM siwa.suppression_outbox r
             WHERE r.provider = p_provider AND r.address_key IS NOT NULL
             ORDER BY r.address_key, r.id DESC) AS l
     WHERE EXISTS (SELECT 1 FROM siwa.suppression_outbox s
                    WHERE s.provider = p_provider AND s.address_key = l.address_key
                      AND (p_since IS NULL OR s.created_at >= p_since))
       AND NOT EXISTS (SELECT 1 FROM siwa.suppression_outbox s
                        WHERE s.provider = p_provider AND s.address_key = l.address_key
                          AND s.state = 'pending')
     ORDER BY l.id;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        PERFORM pg_catalog.pg_notify('siwa_suppressions', '');
    END IF;
    RETURN v_count;
END;
$$;
COMMENT ON FUNCTION siwa.replay_suppressions(text, timestamptz) IS
    'Writes again, as new pending rows in order, the latest desired state of every address of p_provider with a row created since p_since (all when NULL), skipping addresses with a pending row and erased ones; returns how many. The owner''s.';

-- Retention: finished rows (done or dead) that finished longer ago than p_older_than, at most p_batch a
-- call, oldest first; each provider-and-address's latest row is kept (the record of its desired state,
-- which replay sends again) unless it has no address (erased). Returns how many were deleted.
CREATE OR REPLACE FUNCTION siwa.prune_suppressions(p_older_than interval, p_batch integer DEFAULT 10000)
RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH doomed AS (
        SELECT r.id FROM siwa.suppression_outbox r
         WHERE r.state <> 'pending' AND r.finished_at < pg_catalog.clock_timestamp() - p_older_than
           AND (r.address_key IS NULL
                OR EXISTS (SELECT 1 FROM siwa.suppression_outbox q
                            WHERE q.provider = r.provider AND q.address_key = r.address_key AND q.id > r.id))
         ORDER BY r.finished_at
         LIMIT greatest(p_batch, 1)
           FOR UPDATE OF r SKIP LOCKED),
    pruned AS (DELETE FROM siwa.suppression_outbox r USING doomed d WHERE r.id = d.id RETURNING 1)
    SELECT pg_catalog.count(*)::integer FROM pruned
$$;
COMMENT ON FUNCTION siwa.prune_suppressions(interval, integer) IS
    'Deletes up to p_batch finished suppression rows older than p_older_than, keeping each provider-and-address''s latest row unless erased; returns how many. Executable by siwa_worker.';
