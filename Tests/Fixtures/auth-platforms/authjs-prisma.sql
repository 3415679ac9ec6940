-- TEST ONLY. Auth.js (NextAuth.js) with @auth/prisma-adapter on PostgreSQL: the tables `prisma migrate`
-- makes from the models Auth.js documents, under Prisma's own names (the model names, quoted:
-- "User", "Account", "Session", "VerificationToken", "Authenticator").
--
-- Follows nextauthjs/next-auth tag @auth/prisma-adapter@2.11.3 (commit
-- 5af7357fb40c82e0c66f940319321260ddfd44dc, 2026-07-20): the PostgreSQL models in
-- docs/pages/getting-started/adapters/prisma.mdx ("Schema", PostgreSQL), written here by hand as the DDL
-- Prisma Migrate produces for them on PostgreSQL: String -> text, DateTime -> timestamp(3) (without time
-- zone), Int -> integer, Boolean -> boolean; @default(now()) -> DEFAULT CURRENT_TIMESTAMP; @updatedAt and
-- @default(cuid()) are filled in by Prisma Client, not by the database; @id -> "<Model>_pkey";
-- @unique -> unique index "<Model>_<field>_key"; a relation -> "<Model>_<field>_fkey" with ON UPDATE
-- CASCADE (Prisma's default) and the documented onDelete. "Authenticator" is the documented optional
-- model for WebAuthn; it references "User" too, so it is here.
-- "Session" has no primary key in the documented PostgreSQL model (Prisma identifies it by the unique
-- "sessionToken"), and "Account" is keyed by (provider, "providerAccountId").
--
-- Foreign keys, as Prisma creates them from the documented relations:
--   "Account"."userId"       -> "User"(id)  ON DELETE CASCADE ON UPDATE CASCADE
--   "Session"."userId"       -> "User"(id)  ON DELETE CASCADE ON UPDATE CASCADE
--   "Authenticator"."userId" -> "User"(id)  ON DELETE CASCADE ON UPDATE CASCADE
-- "VerificationToken" has none (identifier is the email address the token was sent to).
-- An Apple account: provider = 'apple', "providerAccountId" = Apple's `sub`.
--
-- Load: psql -v ON_ERROR_STOP=1 -d <empty database> -f authjs-prisma.sql

\set ON_ERROR_STOP 1
SET client_min_messages = warning;

CREATE TABLE "User" (
    "id" text NOT NULL,
    "name" text,
    "email" text NOT NULL,
    "emailVerified" timestamp(3),
    "image" text,
    "createdAt" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" timestamp(3) NOT NULL,
    CONSTRAINT "User_pkey" PRIMARY KEY ("id")
);

CREATE TABLE "Account" (
    "userId" text NOT NULL,
    "type" text NOT NULL,
    "provider" text NOT NULL,
    "providerAccountId" text NOT NULL,
    "refresh_token" text,
    "access_token" text,
    "expires_at" integer,
    "token_type" text,
    "scope" text,
    "id_token" text,
    "session_state" text,
    "createdAt" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" timestamp(3) NOT NULL,
    CONSTRAINT "Account_pkey" PRIMARY KEY ("provider", "providerAccountId")
);

CREATE TABLE "Session" (
    "sessionToken" text NOT NULL,
    "userId" text NOT NULL,
    "expires" timestamp(3) NOT NULL,
    "createdAt" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    "updatedAt" timestamp(3) NOT NULL
);

CREATE TABLE "VerificationToken" (
    "identifier" text NOT NULL,
    "token" text NOT NULL,
    "expires" timestamp(3) NOT NULL,
    CONSTRAINT "VerificationToken_pkey" PRIMARY KEY ("identifier", "token")
);

CREATE TABLE "Authenticator" (
    "credentialID" text NOT NULL,
    "userId" text NOT NULL,
    "providerAccountId" text NOT NULL,
    "credentialPublicKey" text NOT NULL,
    "counter" integer NOT NULL,
    "credentialDeviceType" text NOT NULL,
    "credentialBackedUp" boolean NOT NULL,
    "transports" text,
    CONSTRAINT "Authenticator_pkey" PRIMARY KEY ("userId", "credentialID")
);

CREATE UNIQUE INDEX "User_email_key" ON "User" ("email");
CREATE UNIQUE INDEX "Session_sessionToken_key" ON "Session" ("sessionToken");
CREATE UNIQUE INDEX "Authenticator_credentialID_key" ON "Authenticator" ("credentialID");

ALTER TABLE "Account" ADD CONSTRAINT "Account_userId_fkey"
    FOREIGN KEY ("userId") REFERENCES "User" ("id") ON DELETE CASCADE ON UPDATE CASCADE;
ALTER TABLE "Session" ADD CONSTRAINT "Session_userId_fkey"
    FOREIGN KEY ("userId") REFERENCES "User" ("id") ON DELETE CASCADE ON UPDATE CASCADE;
ALTER TABLE "Authenticator" ADD CONSTRAINT "Authenticator_userId_fkey"
    FOREIGN KEY ("userId") REFERENCES "User" ("id") ON DELETE CASCADE ON UPDATE CASCADE;
