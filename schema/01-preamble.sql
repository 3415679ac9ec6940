-- Session settings, schema siwa, siwa.schema_version, and the refusal of a database newer than this file

SET client_min_messages = warning;
DO $$
BEGIN
    PERFORM pg_catalog.set_config('siwa.schema_sql_saved_search_path',
                                  pg_catalog.current_setting('search_path'), false);
END;
$$;
SET search_path = pg_catalog, pg_temp;

CREATE SCHEMA IF NOT EXISTS siwa;

-- ---------------------------------------------------------------------------------------------------
-- Schema version
-- ---------------------------------------------------------------------------------------------------

CREATE TABLE IF NOT EXISTS siwa.schema_version (
    version     integer     PRIMARY KEY,
    description text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- A database newer than this file is refused before anything is changed: this file would put its older
-- functions in place of the newer ones. (Raise the version here with every new version.)
DO $$
DECLARE
    v_from integer := coalesce((SELECT pg_catalog.max(version) FROM siwa.schema_version), 0);
BEGIN
    IF v_from > 5 THEN
        RAISE EXCEPTION 'the database is at schema version %, newer than this schema.sql (version 5); not applying it', v_from
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Apply the schema.sql of the release that brought the database to that version, or a newer one.';
    END IF;
END;
$$;


COMMENT ON SCHEMA siwa IS
    'Sign in with Apple server-to-server notifications: the verified notification log, the queue the worker drains, and the account state it maintains.';

COMMENT ON TABLE siwa.schema_version IS 'One row per schema version applied to this database; the highest is current.';
COMMENT ON COLUMN siwa.schema_version.version IS 'Schema version number (increases by one per change to schema.sql).';
COMMENT ON COLUMN siwa.schema_version.description IS 'What this version added.';
COMMENT ON COLUMN siwa.schema_version.applied_at IS 'When this version was first applied here.';
