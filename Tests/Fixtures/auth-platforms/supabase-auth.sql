-- TEST ONLY. Supabase Auth (GoTrue): the tables of schema `auth` that an adapter applying Apple's
-- events reads or changes, and every table that references a user or a session, so that a delete can be
-- checked for orphans.
--
-- Follows supabase/auth tag v2.196.0 (commit 0204331ca41a5b49f076b6fa3dc6c0d20b996590, 2026-08-18):
-- the end state of its migrations/*.up.sql up to 20260625000000_add_custom_claims_allowlist, written
-- here by hand as plain CREATE TABLE statements (not a copy of the migrations). Column names, types,
-- nullability, defaults, keys, unique constraints and row level security are as those migrations leave
-- them; the tables below come from:
--   users           00_init_auth_schema, 20210710035447_alter_users, 20210722035447_adds_confirmed_at,
--                   20210730183235_add_email_change_confirmed, 20220114185340_add_banned_until,
--                   20220323170000_add_user_reauthentication, 20220429102000_add_unique_idx,
--                   20221215195500_modify_users_email_unique_index, 20230116124310_alter_phone_type,
--                   20230116124412_add_deleted_at, 20240214120130_add_is_anonymous_column
--   identities      20210909172000_create_identities_table, 20221215195800_add_identities_email_column,
--                   20231117164230_add_id_pkey_identities (id became provider_id; a uuid id was added)
--   refresh_tokens  00_init_auth_schema, 20210927181326_add_refresh_token_parent,
--                   20220811173540_add_sessions_table, 20221114143410_remove_parent_foreign_key_refresh_tokens
--   sessions        20220811173540_add_sessions_table, 20221003041400_add_aal_and_factor_id_to_sessions,
--                   20221114143122_add_session_not_after_column, 20231027141322_add_session_refresh_columns,
--                   20231114161723_add_sessions_tag, 20250904133000_add_oauth_client_id_to_session,
--                   20251007112900_add_session_refresh_token_columns, 20251111201300_add_scopes_to_sessions
--   mfa_*           20221003041349_add_mfa_schema, 20221011041400_add_mfa_indexes,
--                   20240729123726_add_mfa_phone_config, 20240802193726_add_mfa_factors_column_last_challenged_at,
--                   20240806073726_drop_uniqueness_constraint_on_phone, 20241009103726_add_web_authn,
--                   20250925093508_add_last_webauthn_challenge_data
--   flow_state      20230322519590_add_flow_state_table, 20230402418590_add_authentication_method_to_flow_state_table,
--                   20240306115329_add_issued_at_to_flow_state, 20260115000000_add_flow_state_oauth_context
--   one_time_tokens 20240427152123_add_one_time_tokens_table
--   oauth_*         20250731150234_add_oauth_clients_table, 20250804100000_add_oauth_authorizations_consents,
--                   20250901200500_add_oauth_client_type, 20250903112500_remove_oauth_client_id_column,
--                   20260121000000_add_token_endpoint_auth_method
--   webauthn_*      20260302000000_add_passkeys
--   row security    20240612123726_enable_rls_update_grants
-- Left out (no reference to users or sessions): instances, audit_log_entries, sso_providers, sso_domains,
-- saml_providers, saml_relay_states (references flow_state ON DELETE CASCADE), custom_oauth_providers,
-- oauth_client_states; and the SQL functions auth.uid(), auth.role(), auth.email(), auth.jwt().
--
-- Foreign keys, exactly as upstream has them (every one is ON DELETE CASCADE; none is deferrable):
--   identities.user_id           -> users(id)          ON DELETE CASCADE
--   sessions.user_id             -> users(id)          ON DELETE CASCADE
--   sessions.oauth_client_id     -> oauth_clients(id)  ON DELETE CASCADE
--   refresh_tokens.session_id    -> sessions(id)       ON DELETE CASCADE
--   mfa_factors.user_id          -> users(id)          ON DELETE CASCADE
--   mfa_challenges.factor_id     -> mfa_factors(id)    ON DELETE CASCADE
--   mfa_amr_claims.session_id    -> sessions(id)       ON DELETE CASCADE
--   one_time_tokens.user_id      -> users(id)          ON DELETE CASCADE
--   oauth_authorizations.user_id -> users(id)          ON DELETE CASCADE
--   oauth_authorizations.client_id -> oauth_clients(id) ON DELETE CASCADE
--   oauth_consents.user_id       -> users(id)          ON DELETE CASCADE
--   oauth_consents.client_id     -> oauth_clients(id)  ON DELETE CASCADE
--   webauthn_credentials.user_id -> users(id)          ON DELETE CASCADE
--   webauthn_challenges.user_id  -> users(id)          ON DELETE CASCADE
-- Columns that hold a user's id with NO foreign key (a delete must clean them itself):
--   refresh_tokens.user_id  varchar(255), the user's uuid as text (its parent foreign key was dropped
--                           in 20221114143410; rows without a session_id are not cascaded at all)
--   flow_state.user_id      uuid (and flow_state.linking_target_id uuid)
--
-- Roles: GoTrue runs its migrations as `supabase_auth_admin`, the owner of schema `auth`
-- (hack/init_postgres.sql). This file creates that role only when it is missing (as NOLOGIN: tests log in
-- with roles of their own), creates the schema owned by it, and then creates everything as that role
-- (SET ROLE), so the tables are owned by it as on Supabase. Only the first two steps need a superuser or
-- CREATEROLE; nothing after them does. Row level security is enabled where upstream enables it, with no
-- policies: a login that is neither the owner nor BYPASSRLS sees no rows, as on Supabase, even with
-- SELECT and DELETE granted: its DELETE FROM auth.sessions deletes 0 rows without any error. The SELECT
-- grants upstream gives to `postgres` are given only when that role exists.
--
-- Load: psql -v ON_ERROR_STOP=1 -d <empty database> -f supabase-auth.sql (PostgreSQL 13 or later).

\set ON_ERROR_STOP 1
SET client_min_messages = warning;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'supabase_auth_admin') THEN
        CREATE ROLE supabase_auth_admin NOLOGIN NOINHERIT;
    END IF;
END
$$;

CREATE SCHEMA auth AUTHORIZATION supabase_auth_admin;

SET ROLE supabase_auth_admin;
SET search_path = auth;

CREATE TYPE auth.aal_level AS ENUM ('aal1', 'aal2', 'aal3');
CREATE TYPE auth.factor_type AS ENUM ('totp', 'webauthn', 'phone');
CREATE TYPE auth.factor_status AS ENUM ('unverified', 'verified');
CREATE TYPE auth.code_challenge_method AS ENUM ('s256', 'plain');
CREATE TYPE auth.one_time_token_type AS ENUM (
    'confirmation_token', 'reauthentication_token', 'recovery_token',
    'email_change_token_new', 'email_change_token_current', 'phone_change_token');
CREATE TYPE auth.oauth_registration_type AS ENUM ('dynamic', 'manual');
CREATE TYPE auth.oauth_client_type AS ENUM ('public', 'confidential');
CREATE TYPE auth.oauth_authorization_status AS ENUM ('pending', 'approved', 'denied', 'expired');
CREATE TYPE auth.oauth_response_type AS ENUM ('code');

-- GoTrue records each applied migration version here; the newest tells which layout a database has.
CREATE TABLE auth.schema_migrations (
    version varchar(255) NOT NULL,
    CONSTRAINT schema_migrations_pkey PRIMARY KEY (version)
);
INSERT INTO auth.schema_migrations (version) VALUES ('20260625000000');

CREATE TABLE auth.users (
    instance_id uuid,
    id uuid NOT NULL,
    aud varchar(255),
    role varchar(255),
    email varchar(255),
    encrypted_password varchar(255),
    email_confirmed_at timestamptz,
    invited_at timestamptz,
    confirmation_token varchar(255),
    confirmation_sent_at timestamptz,
    recovery_token varchar(255),
    recovery_sent_at timestamptz,
    email_change_token_new varchar(255),
    email_change varchar(255),
    email_change_sent_at timestamptz,
    last_sign_in_at timestamptz,
    raw_app_meta_data jsonb,
    raw_user_meta_data jsonb,
    is_super_admin boolean,
    created_at timestamptz,
    updated_at timestamptz,
    phone text DEFAULT NULL,
    phone_confirmed_at timestamptz,
    phone_change text DEFAULT '',
    phone_change_token varchar(255) DEFAULT '',
    phone_change_sent_at timestamptz,
    confirmed_at timestamptz GENERATED ALWAYS AS (LEAST(email_confirmed_at, phone_confirmed_at)) STORED,
    email_change_token_current varchar(255) DEFAULT '',
    email_change_confirm_status smallint DEFAULT 0
        CHECK (email_change_confirm_status >= 0 AND email_change_confirm_status <= 2),
    banned_until timestamptz,
    reauthentication_token varchar(255) DEFAULT '',
    reauthentication_sent_at timestamptz,
    is_sso_user boolean NOT NULL DEFAULT false,
    deleted_at timestamptz,
    is_anonymous boolean NOT NULL DEFAULT false,
    CONSTRAINT users_pkey PRIMARY KEY (id),
    CONSTRAINT users_phone_key UNIQUE (phone)
);
CREATE INDEX users_instance_id_idx ON auth.users (instance_id);
CREATE INDEX users_instance_id_email_idx ON auth.users (instance_id, lower(email));
CREATE INDEX users_is_anonymous_idx ON auth.users (is_anonymous);
CREATE UNIQUE INDEX users_email_partial_key ON auth.users (email) WHERE is_sso_user = false;
CREATE UNIQUE INDEX confirmation_token_idx ON auth.users (confirmation_token)
    WHERE confirmation_token !~ '^[0-9 ]*$';
CREATE UNIQUE INDEX recovery_token_idx ON auth.users (recovery_token) WHERE recovery_token !~ '^[0-9 ]*$';
CREATE UNIQUE INDEX email_change_token_current_idx ON auth.users (email_change_token_current)
    WHERE email_change_token_current !~ '^[0-9 ]*$';
CREATE UNIQUE INDEX email_change_token_new_idx ON auth.users (email_change_token_new)
    WHERE email_change_token_new !~ '^[0-9 ]*$';
CREATE UNIQUE INDEX reauthentication_token_idx ON auth.users (reauthentication_token)
    WHERE reauthentication_token !~ '^[0-9 ]*$';

-- provider_id is the provider's user id: for provider 'apple', Apple's `sub`.
CREATE TABLE auth.identities (
    provider_id text NOT NULL,
    user_id uuid NOT NULL,
    identity_data jsonb NOT NULL,
    provider text NOT NULL,
    last_sign_in_at timestamptz,
    created_at timestamptz,
    updated_at timestamptz,
    email text GENERATED ALWAYS AS (lower(identity_data ->> 'email')) STORED,
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    CONSTRAINT identities_pkey PRIMARY KEY (id),
    CONSTRAINT identities_provider_id_provider_unique UNIQUE (provider_id, provider),
    CONSTRAINT identities_user_id_fkey FOREIGN KEY (user_id) REFERENCES auth.users (id) ON DELETE CASCADE
);
CREATE INDEX identities_user_id_idx ON auth.identities (user_id);
CREATE INDEX identities_email_idx ON auth.identities (email text_pattern_ops);

CREATE TABLE auth.oauth_clients (
    id uuid NOT NULL,
    client_secret_hash text,
    registration_type auth.oauth_registration_type NOT NULL,
    redirect_uris text NOT NULL,
    grant_types text NOT NULL,
    client_name text,
    client_uri text,
    logo_uri text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    deleted_at timestamptz,
    client_type auth.oauth_client_type NOT NULL DEFAULT 'confidential',
    token_endpoint_auth_method text NOT NULL
        CHECK (token_endpoint_auth_method IN ('client_secret_basic', 'client_secret_post', 'none')),
    CONSTRAINT oauth_clients_pkey PRIMARY KEY (id),
    CONSTRAINT oauth_clients_client_name_length CHECK (char_length(client_name) <= 1024),
    CONSTRAINT oauth_clients_client_uri_length CHECK (char_length(client_uri) <= 2048),
    CONSTRAINT oauth_clients_logo_uri_length CHECK (char_length(logo_uri) <= 2048)
);
CREATE INDEX oauth_clients_deleted_at_idx ON auth.oauth_clients (deleted_at);

-- Deleting a user's rows here is how Supabase signs the user out everywhere.
CREATE TABLE auth.sessions (
    id uuid NOT NULL,
    user_id uuid NOT NULL,
    created_at timestamptz,
    updated_at timestamptz,
    factor_id uuid,
    aal auth.aal_level,
    not_after timestamptz,
    refreshed_at timestamp without time zone,
    user_agent text,
    ip inet,
    tag text,
    oauth_client_id uuid,
    refresh_token_hmac_key text,
    refresh_token_counter bigint,
    scopes text,
    CONSTRAINT sessions_pkey PRIMARY KEY (id),
    CONSTRAINT sessions_scopes_length CHECK (char_length(scopes) <= 4096),
    CONSTRAINT sessions_user_id_fkey FOREIGN KEY (user_id) REFERENCES auth.users (id) ON DELETE CASCADE,
    CONSTRAINT sessions_oauth_client_id_fkey FOREIGN KEY (oauth_client_id)
        REFERENCES auth.oauth_clients (id) ON DELETE CASCADE
);
CREATE INDEX sessions_user_id_idx ON auth.sessions (user_id);
CREATE INDEX user_id_created_at_idx ON auth.sessions (user_id, created_at);
CREATE INDEX sessions_not_after_idx ON auth.sessions (not_after DESC);
CREATE INDEX sessions_oauth_client_id_idx ON auth.sessions (oauth_client_id);

-- user_id is the user's uuid as text, with no foreign key.
CREATE TABLE auth.refresh_tokens (
    instance_id uuid,
    id bigserial NOT NULL,
    token varchar(255),
    user_id varchar(255),
    revoked boolean,
    created_at timestamptz,
    updated_at timestamptz,
    parent varchar(255),
    session_id uuid,
    CONSTRAINT refresh_tokens_pkey PRIMARY KEY (id),
    CONSTRAINT refresh_tokens_token_unique UNIQUE (token),
    CONSTRAINT refresh_tokens_session_id_fkey FOREIGN KEY (session_id)
        REFERENCES auth.sessions (id) ON DELETE CASCADE
);
CREATE INDEX refresh_tokens_instance_id_idx ON auth.refresh_tokens (instance_id);
CREATE INDEX refresh_tokens_instance_id_user_id_idx ON auth.refresh_tokens (instance_id, user_id);
CREATE INDEX refresh_tokens_parent_idx ON auth.refresh_tokens (parent);
CREATE INDEX refresh_tokens_session_id_revoked_idx ON auth.refresh_tokens (session_id, revoked);
CREATE INDEX refresh_tokens_updated_at_idx ON auth.refresh_tokens (updated_at DESC);

CREATE TABLE auth.mfa_factors (
    id uuid NOT NULL,
    user_id uuid NOT NULL,
    friendly_name text,
    factor_type auth.factor_type NOT NULL,
    status auth.factor_status NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    secret text,
    phone text DEFAULT NULL,
    last_challenged_at timestamptz DEFAULT NULL,
    web_authn_credential jsonb,
    web_authn_aaguid uuid,
    last_webauthn_challenge_data jsonb,
    CONSTRAINT mfa_factors_pkey PRIMARY KEY (id),
    CONSTRAINT mfa_factors_last_challenged_at_key UNIQUE (last_challenged_at),
    CONSTRAINT mfa_factors_user_id_fkey FOREIGN KEY (user_id) REFERENCES auth.users (id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX mfa_factors_user_friendly_name_unique ON auth.mfa_factors (friendly_name, user_id)
    WHERE trim(friendly_name) <> '';
CREATE UNIQUE INDEX unique_phone_factor_per_user ON auth.mfa_factors (user_id, phone);
CREATE INDEX factor_id_created_at_idx ON auth.mfa_factors (user_id, created_at);
CREATE INDEX mfa_factors_user_id_idx ON auth.mfa_factors (user_id);

CREATE TABLE auth.mfa_challenges (
    id uuid NOT NULL,
    factor_id uuid NOT NULL,
    created_at timestamptz NOT NULL,
    verified_at timestamptz,
    ip_address inet NOT NULL,
    otp_code text,
    web_authn_session_data jsonb,
    CONSTRAINT mfa_challenges_pkey PRIMARY KEY (id),
    CONSTRAINT mfa_challenges_auth_factor_id_fkey FOREIGN KEY (factor_id)
        REFERENCES auth.mfa_factors (id) ON DELETE CASCADE
);
CREATE INDEX mfa_challenge_created_at_idx ON auth.mfa_challenges (created_at DESC);

CREATE TABLE auth.mfa_amr_claims (
    session_id uuid NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    authentication_method text NOT NULL,
    id uuid NOT NULL,
    CONSTRAINT amr_id_pk PRIMARY KEY (id),
    CONSTRAINT mfa_amr_claims_session_id_authentication_method_pkey UNIQUE (session_id, authentication_method),
    CONSTRAINT mfa_amr_claims_session_id_fkey FOREIGN KEY (session_id)
        REFERENCES auth.sessions (id) ON DELETE CASCADE
);

CREATE TABLE auth.one_time_tokens (
    id uuid NOT NULL,
    user_id uuid NOT NULL,
    token_type auth.one_time_token_type NOT NULL,
    token_hash text NOT NULL CHECK (char_length(token_hash) > 0),
    relates_to text NOT NULL,
    created_at timestamp without time zone NOT NULL DEFAULT now(),
    updated_at timestamp without time zone NOT NULL DEFAULT now(),
    CONSTRAINT one_time_tokens_pkey PRIMARY KEY (id),
    CONSTRAINT one_time_tokens_user_id_fkey FOREIGN KEY (user_id) REFERENCES auth.users (id) ON DELETE CASCADE
);
CREATE INDEX one_time_tokens_token_hash_hash_idx ON auth.one_time_tokens USING hash (token_hash);
CREATE INDEX one_time_tokens_relates_to_hash_idx ON auth.one_time_tokens USING hash (relates_to);
CREATE UNIQUE INDEX one_time_tokens_user_id_token_type_key ON auth.one_time_tokens (user_id, token_type);

-- user_id and linking_target_id hold users' ids with no foreign key.
CREATE TABLE auth.flow_state (
    id uuid NOT NULL,
    user_id uuid,
    auth_code text,
    code_challenge_method auth.code_challenge_method,
    code_challenge text,
    provider_type text NOT NULL,
    provider_access_token text,
    provider_refresh_token text,
    created_at timestamptz,
    updated_at timestamptz,
    authentication_method text NOT NULL,
    auth_code_issued_at timestamptz,
    invite_token text,
    referrer text,
    oauth_client_state_id uuid,
    linking_target_id uuid,
    email_optional boolean NOT NULL DEFAULT false,
    CONSTRAINT flow_state_pkey PRIMARY KEY (id)
);
CREATE INDEX idx_auth_code ON auth.flow_state (auth_code);
CREATE INDEX idx_user_id_auth_method ON auth.flow_state (user_id, authentication_method);
CREATE INDEX flow_state_created_at_idx ON auth.flow_state (created_at DESC);

CREATE TABLE auth.oauth_authorizations (
    id uuid NOT NULL,
    authorization_id text NOT NULL,
    client_id uuid NOT NULL,
    user_id uuid,
    redirect_uri text NOT NULL,
    scope text NOT NULL,
    state text,
    resource text,
    code_challenge text,
    code_challenge_method auth.code_challenge_method,
    response_type auth.oauth_response_type NOT NULL DEFAULT 'code',
    status auth.oauth_authorization_status NOT NULL DEFAULT 'pending',
    authorization_code text,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL DEFAULT (now() + interval '3 minutes'),
    approved_at timestamptz,
    nonce text,
    CONSTRAINT oauth_authorizations_pkey PRIMARY KEY (id),
    CONSTRAINT oauth_authorizations_authorization_id_key UNIQUE (authorization_id),
    CONSTRAINT oauth_authorizations_authorization_code_key UNIQUE (authorization_code),
    CONSTRAINT oauth_authorizations_redirect_uri_length CHECK (char_length(redirect_uri) <= 2048),
    CONSTRAINT oauth_authorizations_scope_length CHECK (char_length(scope) <= 4096),
    CONSTRAINT oauth_authorizations_state_length CHECK (char_length(state) <= 4096),
    CONSTRAINT oauth_authorizations_resource_length CHECK (char_length(resource) <= 2048),
    CONSTRAINT oauth_authorizations_code_challenge_length CHECK (char_length(code_challenge) <= 128),
    CONSTRAINT oauth_authorizations_authorization_code_length CHECK (char_length(authorization_code) <= 255),
    CONSTRAINT oauth_authorizations_expires_at_future CHECK (expires_at > created_at),
    CONSTRAINT oauth_authorizations_nonce_length CHECK (char_length(nonce) <= 255),
    CONSTRAINT oauth_authorizations_client_id_fkey FOREIGN KEY (client_id)
        REFERENCES auth.oauth_clients (id) ON DELETE CASCADE,
    CONSTRAINT oauth_authorizations_user_id_fkey FOREIGN KEY (user_id)
        REFERENCES auth.users (id) ON DELETE CASCADE
);
CREATE INDEX oauth_auth_pending_exp_idx ON auth.oauth_authorizations (expires_at) WHERE status = 'pending';

CREATE TABLE auth.oauth_consents (
    id uuid NOT NULL,
    user_id uuid NOT NULL,
    client_id uuid NOT NULL,
    scopes text NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz,
    CONSTRAINT oauth_consents_pkey PRIMARY KEY (id),
    CONSTRAINT oauth_consents_user_client_unique UNIQUE (user_id, client_id),
    CONSTRAINT oauth_consents_scopes_length CHECK (char_length(scopes) <= 2048),
    CONSTRAINT oauth_consents_scopes_not_empty CHECK (char_length(trim(scopes)) > 0),
    CONSTRAINT oauth_consents_revoked_after_granted CHECK (revoked_at IS NULL OR revoked_at >= granted_at),
    CONSTRAINT oauth_consents_user_id_fkey FOREIGN KEY (user_id) REFERENCES auth.users (id) ON DELETE CASCADE,
    CONSTRAINT oauth_consents_client_id_fkey FOREIGN KEY (client_id)
        REFERENCES auth.oauth_clients (id) ON DELETE CASCADE
);
CREATE INDEX oauth_consents_active_user_client_idx ON auth.oauth_consents (user_id, client_id)
    WHERE revoked_at IS NULL;
CREATE INDEX oauth_consents_user_order_idx ON auth.oauth_consents (user_id, granted_at DESC);
CREATE INDEX oauth_consents_active_client_idx ON auth.oauth_consents (client_id) WHERE revoked_at IS NULL;

CREATE TABLE auth.webauthn_credentials (
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    user_id uuid NOT NULL,
    credential_id bytea NOT NULL,
    public_key bytea NOT NULL,
    attestation_type text NOT NULL DEFAULT '',
    aaguid uuid,
    sign_count bigint NOT NULL DEFAULT 0,
    transports jsonb NOT NULL DEFAULT '[]'::jsonb,
    backup_eligible boolean NOT NULL DEFAULT false,
    backed_up boolean NOT NULL DEFAULT false,
    friendly_name text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    CONSTRAINT webauthn_credentials_pkey PRIMARY KEY (id),
    CONSTRAINT webauthn_credentials_user_id_fkey FOREIGN KEY (user_id)
        REFERENCES auth.users (id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX webauthn_credentials_credential_id_key ON auth.webauthn_credentials (credential_id);
CREATE INDEX webauthn_credentials_user_id_idx ON auth.webauthn_credentials (user_id);

CREATE TABLE auth.webauthn_challenges (
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    user_id uuid,
    challenge_type text NOT NULL CHECK (challenge_type IN ('signup', 'registration', 'authentication')),
    session_data jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    CONSTRAINT webauthn_challenges_pkey PRIMARY KEY (id),
    CONSTRAINT webauthn_challenges_user_id_fkey FOREIGN KEY (user_id)
        REFERENCES auth.users (id) ON DELETE CASCADE
);
CREATE INDEX webauthn_challenges_user_id_idx ON auth.webauthn_challenges (user_id);
CREATE INDEX webauthn_challenges_expires_at_idx ON auth.webauthn_challenges (expires_at);

-- Row level security as upstream enables it (the oauth_* and webauthn_* tables have none), no policies.
ALTER TABLE auth.schema_migrations ENABLE ROW LEVEL SECURITY;
ALTER TABLE auth.users ENABLE ROW LEVEL SECURITY;
ALTER TABLE auth.identities ENABLE ROW LEVEL SECURITY;
ALTER TABLE auth.sessions ENABLE ROW LEVEL SECURITY;
ALTER TABLE auth.refresh_tokens ENABLE ROW LEVEL SECURITY;
ALTER TABLE auth.mfa_factors ENABLE ROW LEVEL SECURITY;
ALTER TABLE auth.mfa_challenges ENABLE ROW LEVEL SECURITY;
ALTER TABLE auth.mfa_amr_claims ENABLE ROW LEVEL SECURITY;
ALTER TABLE auth.one_time_tokens ENABLE ROW LEVEL SECURITY;
ALTER TABLE auth.flow_state ENABLE ROW LEVEL SECURITY;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'postgres') THEN
        GRANT SELECT ON auth.schema_migrations, auth.users, auth.identities, auth.sessions, auth.refresh_tokens,
            auth.mfa_factors, auth.mfa_challenges, auth.mfa_amr_claims, auth.one_time_tokens, auth.flow_state
            TO postgres WITH GRANT OPTION;
    END IF;
END
$$;

RESET ROLE;
RESET search_path;
