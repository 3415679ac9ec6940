-- TEST ONLY. Auth.js (NextAuth.js) with @auth/pg-adapter: the four tables the adapter reads and writes.
--
-- Follows nextauthjs/next-auth tag @auth/pg-adapter@1.11.3 (commit 5af7357fb40c82e0c66f940319321260ddfd44dc,
-- 2026-07-20), written here by hand after the layout of packages/adapter-pg/schema.sql (the same schema that
-- docs/pages/getting-started/adapters/pg.mdx documents under "Schema") and the statements in
-- packages/adapter-pg/src/index.ts: serial integer ids, camelCase columns quoted ("userId",
-- "providerAccountId", "sessionToken", "emailVerified"), the OAuth token columns in snake_case.
--
-- Foreign keys: NONE. The documented schema declares no foreign key, no ON DELETE and no unique
-- constraint besides the primary keys: accounts."userId" and sessions."userId" are plain integers,
-- nothing makes (provider, "providerAccountId") or "sessionToken" unique, and the adapter's deleteUser
-- deletes from users, sessions and accounts itself. So a delete of a user must delete that user's
-- sessions and accounts explicitly, or they stay behind as orphans; and a lookup by
-- (provider, "providerAccountId") may in principle find more than one row.
-- An Apple account: provider = 'apple', "providerAccountId" = Apple's `sub`, type = 'oidc' (Auth.js's
-- Apple provider is an OIDC provider).
--
-- Load: psql -v ON_ERROR_STOP=1 -d <empty database> -f authjs-pg.sql

\set ON_ERROR_STOP 1
SET client_min_messages = warning;

CREATE TABLE users (
    id serial PRIMARY KEY,
    name varchar(255),
    email varchar(255),
    "emailVerified" timestamptz,
    image text
);

CREATE TABLE accounts (
    id serial PRIMARY KEY,
    "userId" integer NOT NULL,
    type varchar(255) NOT NULL,
    provider varchar(255) NOT NULL,
    "providerAccountId" varchar(255) NOT NULL,
    refresh_token text,
    access_token text,
    expires_at bigint,
    id_token text,
    scope text,
    session_state text,
    token_type text
);

CREATE TABLE sessions (
    id serial PRIMARY KEY,
    "userId" integer NOT NULL,
    expires timestamptz NOT NULL,
    "sessionToken" varchar(255) NOT NULL
);

CREATE TABLE verification_token (
    identifier text NOT NULL,
    expires timestamptz NOT NULL,
    token text NOT NULL,
    PRIMARY KEY (identifier, token)
);
