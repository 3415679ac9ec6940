-- How errors are stored: siwa.redact_error, siwa.erased_error (change 2 uses them: before the numbered changes)

-- What the worker stores as a notification's last_error: 'SQLSTATE: message' with the parts of the
-- message that may carry user data masked. PostgreSQL quotes the offending input in its messages
-- (invalid input syntax for type integer: "john.doe"), and a hook's RAISE may say anything: every
-- single-quoted text, every double-quoted text except an object's name (relation "users", column
-- "email", constraint "…"), and every email-shaped word becomes …. The message's words stay.
CREATE OR REPLACE FUNCTION siwa.redact_error(p_error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
SELECT pg_catalog.replace(pg_catalog.replace(
         pg_catalog.regexp_replace(
           pg_catalog.regexp_replace(
             pg_catalog.regexp_replace(
               pg_catalog.regexp_replace(
                 pg_catalog.replace(pg_catalog.replace(p_error, chr(1), ''), chr(2), ''),
                 -- names of objects: protect them from the next step
                 '(relation|column|constraint|table|schema|type|function|procedure|index|sequence|view|trigger|operator|domain|extension|role|database|cursor|variable|parameter|field|key) "([^"]*)"',
                 '\1 ' || chr(1) || '\2' || chr(2), 'g'),
               '"[^"]*("|$)', '"…"', 'g'),
             '''[^'']*(''|$)', '''…''', 'g'),
           '[^[:space:]"''(),;:<>' || chr(1) || chr(2) || ']+@[^[:space:]"''(),;:<>' || chr(1) || chr(2) || ']+',
           '…@…', 'g'),
         chr(1), '"'), chr(2), '"')
$$;
COMMENT ON FUNCTION siwa.redact_error(text) IS
    'Masks what may carry user data in an error text (quoted values, email addresses) and keeps the SQLSTATE, the message''s words and quoted object names. What siwa.record_failure stores in last_error.';

-- What is left of a failure's last_error once the account's personal data is erased: its SQLSTATE.
-- Skip reasons (state skipped) are the worker's own words about the event type and stay.
CREATE OR REPLACE FUNCTION siwa.erased_error(p_error text, p_state text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
SELECT CASE
         WHEN p_error IS NULL OR p_state = 'skipped' THEN p_error
         WHEN p_error ~ '^[0-9A-Z]{5}: ' THEN pg_catalog.left(p_error, 5) || ': (erased with the account''s personal data)'
         ELSE '(erased with the account''s personal data)'
       END
$$;
COMMENT ON FUNCTION siwa.erased_error(text, text) IS
    'The last_error of a notification of an erased account: only the SQLSTATE of a failure is kept; a skip reason (state skipped) is kept as it is.';
