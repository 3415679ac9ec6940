import AuthPlatforms
import Postgres
import TestSupport
import Testing

extension AuthPlatformsTests {
    /// Policies a platform cannot express are refused when the adapter is configured, and a configured
    /// name is a plain identifier or nothing.
    @Suite("validate, naming, ambiguity")
    struct PolicyValidationTests {
        @Test("Auth.js (pg and Prisma) refuses disable, unlink's disable fallback and record; keep passes")
        func authJS() throws {
            for platform: any AuthPlatform in [try AuthJS(), try AuthJSPrisma()] {
                let fallback = #expect(throws: AuthPlatformError.self) { try platform.validate(AuthPolicy()) }
                #expect(fallback?.kind == .policyNotSupported)
                #expect(fallback?.cause.contains("whenUnlinkLeavesNoLogin disable") == true)
                let disable = #expect(throws: AuthPlatformError.self) {
                    try platform.validate(
                        AuthPolicy(onAccountDeleted: .disable, whenUnlinkLeavesNoLogin: .keep))
                }
                #expect(disable?.cause.contains("onAccountDeleted disable") == true)
                let record = #expect(throws: AuthPlatformError.self) {
                    try platform.validate(
                        AuthPolicy(whenUnlinkLeavesNoLogin: .keep, onForwardingChange: .record))
                }
                #expect(record?.cause.contains("onForwardingChange record") == true)
                try platform.validate(AuthPolicy(whenUnlinkLeavesNoLogin: .keep))
                try platform.validate(AuthPolicy(onAccountDeleted: .delete))
                try platform.validate(AuthPolicy(onAccountDeleted: .sessionsOnly))
            }
        }

        @Test("Better Auth disables only with the admin plugin's ban columns, and never records")
        func betterAuth() throws {
            let plain = try BetterAuth()
            let fallback = #expect(throws: AuthPlatformError.self) { try plain.validate(AuthPolicy()) }
            #expect(fallback?.cause.contains("naming.ban") == true)
            #expect(throws: AuthPlatformError.self) {
                try plain.validate(AuthPolicy(onAccountDeleted: .disable, whenUnlinkLeavesNoLogin: .keep))
            }
            try plain.validate(AuthPolicy(whenUnlinkLeavesNoLogin: .keep))
            let admin = try BetterAuth(naming: .init(ban: .init()))
            try admin.validate(AuthPolicy())
            try admin.validate(AuthPolicy(onAccountDeleted: .disable))
            #expect(throws: AuthPlatformError.self) {
                try admin.validate(AuthPolicy(onForwardingChange: .record))
            }
            try SupabaseAuth().validate(AuthPolicy(onAccountDeleted: .disable, onForwardingChange: .record))
        }

        @Test("a refused policy changes nothing at apply either")
        func refusedAtApply() throws {
            let platform = PlatformCase.authJS
            let database = try platform.database()
            let before = try platform.snapshot(database, of: platform.a)
            let error = #expect(throws: AuthPlatformError.self) {
                try platform.adapter.apply(
                    .accountDeleted, sub: "001.a", policy: AuthPolicy(), on: database.connection)
            }
            #expect(error?.kind == .policyNotSupported)
            #expect(try platform.snapshot(database, of: platform.a) == before)
        }

        @Test("names: only [A-Za-z_][A-Za-z0-9_]*, quoted by one helper")
        func names() throws {
            #expect(try SQLName.quoted("providerId", platform: "x") == "\"providerId\"")
            for bad in ["", "1user", "user\"; DROP TABLE account; --", "a b", "user.x", "ü"] {
                #expect(!SQLName.isValid(bad))
                #expect(throws: AuthPlatformError.self) { try SQLName.quoted(bad, platform: "x") }
            }
            var naming = BetterAuth.Naming()
            naming.account = "account\"; DROP TABLE \"user"
            let error = #expect(throws: AuthPlatformError.self) { try BetterAuth(naming: naming) }
            #expect(error?.kind == .invalidName)
            var idType = BetterAuth.Naming()
            idType.idType = "text; DROP"
            #expect(throws: AuthPlatformError.self) { try BetterAuth(naming: idType) }
            #expect(throws: AuthPlatformError.self) { try AuthJS(schema: "public\"") }
        }

        @Test(
            "Better Auth with configured names: the renamed tables are used, the defaults are named missing")
        func betterAuthNaming() throws {
            let platform = PlatformCase.betterAuth
            let database = try platform.database()
            try database.connection.simpleQuery(
                """
                ALTER TABLE "user" RENAME TO users;
                ALTER TABLE account RENAME TO accounts;
                ALTER TABLE accounts RENAME COLUMN "accountId" TO account_id;
                ALTER TABLE accounts RENAME COLUMN "providerId" TO provider_id;
                ALTER TABLE session RENAME TO sessions;
                ALTER TABLE sessions RENAME COLUMN "userId" TO user_id;
                ALTER TABLE users RENAME COLUMN banned TO is_banned;
                """)
            var naming = BetterAuth.Naming(ban: .init())
            naming.user = "users"
            naming.account = "accounts"
            naming.accountAccountID = "account_id"
            naming.accountProviderID = "provider_id"
            naming.session = "sessions"
            naming.sessionUserID = "user_id"
            naming.ban?.banned = "is_banned"
            let renamed = try BetterAuth(naming: naming)
            #expect(try renamed.check(on: database.connection) == [])
            let defaults = try BetterAuth(naming: .init(ban: .init()))
            #expect(
                try defaults.check(on: database.connection) == [
                    AuthPlatformProblem(.missingTable, table: "public.user"),
                    AuthPlatformProblem(.missingTable, table: "public.session"),
                    AuthPlatformProblem(.missingTable, table: "public.account"),
                ])
            let moved = try renamed.apply(
                .subTransferred(from: "001.a"), sub: "002.a", policy: AuthPolicy(), on: database.connection)
            #expect(moved.counts.identitiesMoved == 1)
            let deleted = try renamed.apply(
                .accountDeleted, sub: "002.a", policy: AuthPolicy(), on: database.connection)
            #expect(
                deleted.counts.identitiesUnlinked == 1 && deleted.counts.usersDisabled == 1
                    && deleted.counts.sessionsEnded == 2)
            #expect(
                try database.value(
                    "SELECT is_banned AND \"banReason\" IS NOT NULL FROM users WHERE id = 'user-a'",
                    as: Bool.self))
        }

        @Test("Auth.js pg: a sub linked to two users (nothing makes it unique) is refused, nothing changed")
        func ambiguous() throws {
            let platform = PlatformCase.authJS
            let database = try platform.database()
            try database.query(
                "INSERT INTO accounts (\"userId\", type, provider, \"providerAccountId\") VALUES (202, 'oidc', 'apple', '001.a')"
            )
            let a = try platform.snapshot(database, of: platform.a)
            let error = #expect(throws: AuthPlatformError.self) {
                try platform.adapter.apply(
                    .consentRevoked, sub: "001.a", policy: platform.policy, on: database.connection)
            }
            #expect(error?.kind == .ambiguous)
            #expect(error?.table == "\"public\".\"accounts\"")
            #expect(try platform.snapshot(database, of: platform.a) == a)
        }
    }
}
