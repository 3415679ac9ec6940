-- The relay-mail gate: may this address be mailed now (siwa.relay_mail_decision(s), role siwa_mail), erased addresses as keyed hashes

-- What Apple's notifications say about mail, answered per address: allow (forwarding on, or never
-- turned off), block (forwarding off, account deleted or erased, and consent revoked when
-- siwa.settings.relay_mail_after_consent_revoked = 'block'), unknown (not an address Apple gave this
-- app). The gate's callers (siwa-mailgate in Postfix, its HTTP check, siwactl mail check) are members of
-- siwa_mail, which may execute the two decision functions and nothing else (schema/85-privileges.sql).
-- docs/sql.md, "The relay-mail gate", says how to read the answers and why consent-revoked allows.

-- Apple's relay domains: the one list, for the looks_like_relay answer only (never to tell whether an
-- address is a relay address: is_private_email says that, and only for the addresses Apple gave us).
CREATE OR REPLACE FUNCTION siwa.apple_relay_domains() RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT ARRAY['privaterelay.appleid.com', 'private.icloud.com', 'icloud.com']::text[];
$$;
COMMENT ON FUNCTION siwa.apple_relay_domains() IS
    'Apple''s private relay domains (privaterelay.appleid.com; private.icloud.com, new addresses from 2026; icloud.com, as Apple''s page lists it), lower case: what makes an address the gate does not know answer looks_like_relay rather than not_ours.';

-- The form an address is matched in: the local part exact, the domain lower-cased (DNS names compare
-- case-insensitively, local parts need not); NULL for what is not one address (no or several @, an empty
-- side, white space or control characters, over 320 bytes). Collation "C": ASCII case only, the same in
-- every database whatever its locale, as an index expression must be.
CREATE OR REPLACE FUNCTION siwa.mail_address_key(p_address text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN pg_catalog.octet_length(p_address) <= 320
                     AND (p_address COLLATE "C") ~ '^[^@[:space:][:cntrl:]]+@[^@[:space:][:cntrl:]]+$'
                THEN pg_catalog.split_part(p_address, '@', 1) || '@'
                     || pg_catalog.lower(pg_catalog.split_part(p_address, '@', 2) COLLATE "C") END;
$$;
COMMENT ON FUNCTION siwa.mail_address_key(text) IS
    'An address as the relay-mail gate matches it: the local part exact, the domain lower-cased (ASCII); NULL when the text is not one address (malformed). siwa.accounts is indexed on it.';

-- The gate's lookups: one index probe per address on the stored address in its matching form. Every
-- role that writes siwa.accounts computes it, so needs EXECUTE on siwa.mail_address_key (siwa_worker).
CREATE INDEX IF NOT EXISTS accounts_mail_address_key_idx ON siwa.accounts (siwa.mail_address_key(email));

-- HMAC-SHA-256 (RFC 2104) with pg_catalog.sha256 alone (no extension): the key padded to SHA-256's
-- 64-byte block (hashed first when longer) and XORed with the pad byte (0x36 inner, 0x5c outer).
CREATE OR REPLACE FUNCTION siwa.hmac_sha256_pad(p_key bytea, p_pad integer) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.decode(pg_catalog.string_agg(
               pg_catalog.lpad(pg_catalog.to_hex(
                   CASE WHEN i < pg_catalog.octet_length(k.key) THEN pg_catalog.get_byte(k.key, i) ELSE 0 END
                   # p_pad), 2, '0'), '' ORDER BY i), 'hex')
      FROM (SELECT CASE WHEN pg_catalog.octet_length(p_key) > 64 THEN pg_catalog.sha256(p_key) ELSE p_key END) AS k(key),
           pg_catalog.generate_series(0, 63) AS i;
$$;
COMMENT ON FUNCTION siwa.hmac_sha256_pad(bytea, integer) IS
    'HMAC-SHA-256''s padded key: p_key (hashed when over 64 bytes) zero-filled to 64 bytes, each byte XORed with p_pad (54 inner, 92 outer).';

-- HMAC-SHA-256 of p_message under the padded keys (siwa.hmac_sha256_pad), computed once per key.
CREATE OR REPLACE FUNCTION siwa.hmac_sha256_padded(p_inner bytea, p_outer bytea, p_message bytea) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.sha256(p_outer || pg_catalog.sha256(p_inner || p_message));
$$;
COMMENT ON FUNCTION siwa.hmac_sha256_padded(bytea, bytea, bytea) IS
    'HMAC-SHA-256 of p_message given the padded inner and outer keys (siwa.hmac_sha256_pad of the key with 54 and 92).';

CREATE OR REPLACE FUNCTION siwa.hmac_sha256(p_key bytea, p_message bytea) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT siwa.hmac_sha256_padded(siwa.hmac_sha256_pad(p_key, 54), siwa.hmac_sha256_pad(p_key, 92), p_message);
$$;
COMMENT ON FUNCTION siwa.hmac_sha256(bytea, bytea) IS 'HMAC-SHA-256 (RFC 2104, RFC 4231) of p_message under p_key.';

-- The key erased addresses are remembered under: 64 random bytes made once per database (four
-- gen_random_uuid(), 488 random bits from the server's strong random source), kept only as its two
-- padded forms. The owner's alone: no role is granted anything on it. A database copied with CREATE
-- DATABASE … TEMPLATE shares its template's key.
CREATE TABLE IF NOT EXISTS siwa.mail_address_hash_key (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    inner_pad  bytea       NOT NULL CHECK (octet_length(inner_pad) = 64),
    outer_pad  bytea       NOT NULL CHECK (octet_length(outer_pad) = 64),
    created_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE siwa.mail_address_hash_key IS
    'The per-database HMAC-SHA-256 key of siwa.erased_mail_addresses, as its padded inner and outer keys; made once, never readable by any role but the owner.';
COMMENT ON COLUMN siwa.mail_address_hash_key.singleton IS 'Always true: keeps this table to a single row.';
COMMENT ON COLUMN siwa.mail_address_hash_key.inner_pad IS 'The key XOR 0x36 (siwa.hmac_sha256_pad).';
COMMENT ON COLUMN siwa.mail_address_hash_key.outer_pad IS 'The key XOR 0x5c (siwa.hmac_sha256_pad).';
COMMENT ON COLUMN siwa.mail_address_hash_key.created_at IS 'When the key was made.';
INSERT INTO siwa.mail_address_hash_key (inner_pad, outer_pad)
SELECT siwa.hmac_sha256_pad(k.key, 54), siwa.hmac_sha256_pad(k.key, 92)
  FROM (SELECT pg_catalog.decode(pg_catalog.string_agg(
                   pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', ''), ''), 'hex')
          FROM pg_catalog.generate_series(1, 4)) AS k(key)
ON CONFLICT (singleton) DO NOTHING;

-- The addresses of erased accounts, as HMAC-SHA-256 of their matching form (siwa.mail_address_key)
-- under the key above: the gate still answers block for them, and nothing readable keeps the address.
-- Keyed, because an unkeyed hash of an address is the address to anyone holding a list of candidates.
CREATE TABLE IF NOT EXISTS siwa.erased_mail_addresses (
    address_hmac bytea       PRIMARY KEY CHECK (octet_length(address_hmac) = 32),
    deleted_at   timestamptz NOT NULL,
    erased_at    timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE siwa.erased_mail_addresses IS
    'Every address an erasure removed (an account''s, its notifications'' and changes'', an import''s), as HMAC-SHA-256 under siwa.mail_address_hash_key: the relay-mail gate answers block/account_deleted for it. The owner''s alone.';
COMMENT ON COLUMN siwa.erased_mail_addresses.address_hmac IS 'HMAC-SHA-256 of siwa.mail_address_key(address).';
COMMENT ON COLUMN siwa.erased_mail_addresses.deleted_at IS 'The account''s deletion (its first, when the address was erased again): the gate''s since.';
COMMENT ON COLUMN siwa.erased_mail_addresses.erased_at IS 'When the address was first remembered.';

-- Remembers p_addresses (each with the deletion p_deleted_at at the same position) as erased. Called
-- by the erasure (siwa.erase_personal_data_of) as the worker or the owner: SECURITY DEFINER, so that the
-- caller writes hashes without reading the key or the table. A malformed text is not an address: skipped.
CREATE OR REPLACE FUNCTION siwa.remember_erased_mail_addresses(p_addresses text[], p_deleted_at timestamptz[])
RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO siwa.erased_mail_addresses (address_hmac, deleted_at)
    SELECT siwa.hmac_sha256_padded(h.inner_pad, h.outer_pad, pg_catalog.convert_to(x.key, 'UTF8')),
           pg_catalog.min(x.deleted_at)
      FROM (SELECT siwa.mail_address_key(a.address) AS key,
                   coalesce(a.deleted_at, pg_catalog.clock_timestamp()) AS deleted_at
              FROM ROWS FROM (pg_catalog.unnest(p_addresses), pg_catalog.unnest(p_deleted_at)) AS a(address, deleted_at)) AS x,
           siwa.mail_address_hash_key h
     WHERE x.key IS NOT NULL
     GROUP BY 1
    ON CONFLICT (address_hmac) DO NOTHING;
$$;
COMMENT ON FUNCTION siwa.remember_erased_mail_addresses(text[], timestamptz[]) IS
    'Records the addresses an erasure removes (with the account''s deletion time) in siwa.erased_mail_addresses as keyed hashes. SECURITY DEFINER; executable by siwa_worker (the erasure runs as it).';

-- The decision for each element of p_addresses, in order (ord, 1-based), NULLs and duplicates kept.
-- An address matches the account whose current email has the same siwa.mail_address_key (one index
-- probe); when several do (a shared, non-relay address), a live account before a deleted one, and a
-- forwarding-off one first. An address no account holds is looked up among the erased (one hash, one
-- primary-key probe). SECURITY DEFINER: siwa_mail reads no table itself. Without JIT: compiling the
-- plan cost more than running it for 10,000 addresses (measured: 300 of 480 ms).
CREATE OR REPLACE FUNCTION siwa.relay_mail_decisions(p_addresses text[])
RETURNS TABLE (ord integer, address text, decision text, reason text, since timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
    WITH input AS MATERIALIZED (
        SELECT i.ord::integer AS ord, i.address, siwa.mail_address_key(i.address) AS key
          FROM pg_catalog.unnest(p_addresses) WITH ORDINALITY AS i(address, ord)
    )
    SELECT i.ord, i.address, v.decision, v.reason, v.since
      FROM input i
      CROSS JOIN siwa.settings s
      LEFT JOIN LATERAL (
          SELECT a.sub, a.email_status, a.email_status_at, a.consent_revoked_at,
                 coalesce(a.deleted_at, a.personal_data_erased_at) AS deleted_at
            FROM siwa.accounts a
           WHERE siwa.mail_address_key(a.email) = i.key
           ORDER BY (a.deleted_at IS NOT NULL OR a.personal_data_erased_at IS NOT NULL),
                    a.email_status = 'disabled' DESC NULLS LAST, a.updated_at DESC, a.sub
           LIMIT 1) AS m ON true
      -- OFFSET 0 keeps each lateral a subquery computed once per address: flattened, its expressions
      -- would be copied into every use (and the erased lookup run for addresses an account matched).
      CROSS JOIN LATERAL (
          SELECT CASE WHEN m.sub IS NULL AND i.key IS NOT NULL THEN
                     (SELECT e.deleted_at
                        FROM siwa.erased_mail_addresses e, siwa.mail_address_hash_key h
                       WHERE e.address_hmac = siwa.hmac_sha256_padded(h.inner_pad, h.outer_pad,
                                                                      pg_catalog.convert_to(i.key, 'UTF8')))
                 END AS deleted_at
          OFFSET 0) AS erased
      CROSS JOIN LATERAL (
          SELECT CASE
                     WHEN m.sub IS NULL THEN
                         CASE WHEN i.key IS NULL THEN 'malformed'
                              WHEN erased.deleted_at IS NOT NULL THEN 'account_deleted'
                              WHEN pg_catalog.split_part(i.key, '@', 2) = ANY (siwa.apple_relay_domains())
                                  THEN 'looks_like_relay'
                              ELSE 'not_ours' END
                     WHEN m.deleted_at IS NOT NULL THEN 'account_deleted'
                     WHEN m.email_status = 'disabled' THEN 'forwarding_off'
                     -- Consent revoked, and neither an email-enabled nor a sign-in (the user came back) since.
                     WHEN s.relay_mail_after_consent_revoked = 'block' AND m.consent_revoked_at IS NOT NULL
                          AND (m.email_status_at IS NULL OR m.email_status_at <= m.consent_revoked_at)
                          AND NOT EXISTS (SELECT 1 FROM siwa.sign_ins g
                                           WHERE g.sub = m.sub AND g.last_signed_in_at > m.consent_revoked_at)
                         THEN 'consent_revoked'
                     WHEN m.email_status = 'enabled' THEN 'forwarding_on'
                     ELSE 'never_turned_off' END AS reason
          OFFSET 0) AS r
      CROSS JOIN LATERAL (
          SELECT CASE WHEN r.reason IN ('forwarding_on', 'never_turned_off') THEN 'allow'
                      WHEN r.reason IN ('forwarding_off', 'account_deleted', 'consent_revoked') THEN 'block'
                      ELSE 'unknown' END AS decision,
                 r.reason,
                 CASE r.reason WHEN 'account_deleted' THEN coalesce(m.deleted_at, erased.deleted_at)
                               WHEN 'consent_revoked' THEN m.consent_revoked_at
                               WHEN 'forwarding_off' THEN m.email_status_at
                               WHEN 'forwarding_on' THEN m.email_status_at
                               WHEN 'never_turned_off' THEN m.email_status_at END AS since
          ) AS v
     ORDER BY i.ord;
$$;
COMMENT ON FUNCTION siwa.relay_mail_decisions(text[]) IS
    'The relay-mail gate for a list: one row per element of p_addresses in order (ord from 1; NULLs and duplicates kept): decision allow (reason forwarding_on, never_turned_off), block (forwarding_off, account_deleted, consent_revoked when siwa.settings.relay_mail_after_consent_revoked = block) or unknown (not_ours, looks_like_relay, malformed), and since (the event_time the answer rests on, or NULL). Matches an account''s current address, the domain case-insensitively. SECURITY DEFINER; executable by siwa_mail (docs/sql.md).';

-- The decision for one address: siwa.relay_mail_decisions of a list of one.
CREATE OR REPLACE FUNCTION siwa.relay_mail_decision(p_address text)
RETURNS TABLE (decision text, reason text, since timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT d.decision, d.reason, d.since FROM siwa.relay_mail_decisions(ARRAY[p_address]) AS d;
$$;
COMMENT ON FUNCTION siwa.relay_mail_decision(text) IS
    'The relay-mail gate for one address: exactly one row (decision, reason, since), as siwa.relay_mail_decisions answers it. SECURITY DEFINER; executable by siwa_mail (docs/sql.md).';
