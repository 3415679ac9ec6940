-- TEST ONLY. Better Auth: the core schema (user, session, account, verification) with the default
-- camelCase names, plus the admin plugin's columns, as `npx @better-auth/cli migrate` creates them on
-- PostgreSQL with string ids (the default; no useNumberId, no generateId "uuid").
--
-- Follows better-auth/better-auth tag v1.7.1 (commit 2344536054f9164ca5d1670c270d299049ee233e), written
-- here by hand from:
--   docs/content/docs/concepts/database.mdx  (Core Schema: the tables, columns, keys and uniques)
--   docs/content/docs/plugins/admin.mdx and packages/better-auth/src/plugins/admin/schema.ts
--                                            (user.role, banned, banReason, banExpires; session.impersonatedBy)
--   packages/core/src/db/get-tables.ts       (field order, required, unique, index, references)
--   packages/better-auth/src/db/get-migration.ts (PostgreSQL types: string -> text, boolean -> boolean,
--                                            date -> timestamptz, id text primary key; NOT NULL for required
--                                            fields; DEFAULT CURRENT_TIMESTAMP only for dates with a default;
--                                            other defaults such as banned=false and emailVerified=false
--                                            are applied by Better Auth, not by the database)
--   packages/core/src/db/database-index.ts   (index names <table>_<columns>_idx / _uidx)
-- New in 1.7: account.issuer and the unique (issuer, accountId). Better Auth 1.6 and earlier have no
-- issuer column: an Apple account is found by providerId = 'apple' and accountId = Apple's `sub`, in
-- every version; in 1.7 its issuer is 'https://appleid.apple.com'.
-- Table and column names are configurable in Better Auth (modelName, fields); these are the defaults.
--
-- Foreign keys, exactly as Better Auth creates them:
--   session.userId -> user(id)  ON DELETE CASCADE
--   account.userId -> user(id)  ON DELETE CASCADE
-- verification has no foreign key (identifier is free text, e.g. an email address or a token key);
-- session.impersonatedBy holds an admin's user id with no foreign key.
--
-- Load: psql -v ON_ERROR_STOP=1 -d <empty database> -f better-auth.sql

\set ON_ERROR_STOP 1
SET client_min_messages = warning;

CREATE TABLE "user" (
    "id" text NOT NULL PRIMARY KEY,
    "name" text NOT NULL,
    "email" text NOT NULL UNIQUE,
    "emailVerified" boolean NOT NULL,
    "image" text,
    "createdAt" timestamptz NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" timestamptz NOT NULL DEFAULT CURRENT_TIMESTAMP,
    -- admin plugin
    "role" text,
    "banned" boolean,
    "banReason" text,
    "banExpires" timestamptz
);

CREATE TABLE "session" (
    "id" text NOT NULL PRIMARY KEY,
    "expiresAt" timestamptz NOT NULL,
    "token" text NOT NULL UNIQUE,
    "createdAt" timestamptz NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" timestamptz NOT NULL,
    "ipAddress" text,
    "userAgent" text,
    "userId" text NOT NULL REFERENCES "user" ("id") ON DELETE CASCADE,
    -- admin plugin
    "impersonatedBy" text
);

CREATE TABLE "account" (
    "id" text NOT NULL PRIMARY KEY,
    "issuer" text NOT NULL,
    "accountId" text NOT NULL,
    "providerId" text NOT NULL,
    "userId" text NOT NULL REFERENCES "user" ("id") ON DELETE CASCADE,
    "accessToken" text,
    "refreshToken" text,
    "idToken" text,
    "accessTokenExpiresAt" timestamptz,
    "refreshTokenExpiresAt" timestamptz,
    "scope" text,
    "password" text,
    "createdAt" timestamptz NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" timestamptz NOT NULL
);

CREATE TABLE "verification" (
    "id" text NOT NULL PRIMARY KEY,
    "identifier" text NOT NULL,
    "value" text NOT NULL,
    "expiresAt" timestamptz NOT NULL,
    "createdAt" timestamptz NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" timestamptz NOT NULL DEFAULT CURRENT_TIMESTAMP
);

CREATE INDEX "session_userId_idx" ON "session" ("userId");
CREATE INDEX "account_userId_idx" ON "account" ("userId");
CREATE UNIQUE INDEX "account_issuer_accountId_uidx" ON "account" ("issuer", "accountId");
CREATE INDEX "verification_identifier_idx" ON "verification" ("identifier");
