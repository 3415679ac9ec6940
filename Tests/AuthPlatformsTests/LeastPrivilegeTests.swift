import AuthPlatforms
import Postgres
import TestSupport
import Testing

extension AuthPlatformsTests {
    /// The grants docs/adapters.md lists are enough, and check finds nothing to report with them.
    @Suite("least privilege: the documented grants suffice")
    struct LeastPrivilegeTests {
        @Test("Auth.js pg: a login with only the documented grants applies keep, transfer and delete")
        func authJS() throws {
            let platform = PlatformCase.authJS
            let database = try platform.database()
            try SupabaseAuthTests.group("authplatforms_authjs_adapter", in: database)
            try database.connection.simpleQuery(
                """
                GRANT SELECT, DELETE ON sessions TO authplatforms_authjs_adapter;
                GRANT SELECT, UPDATE, DELETE ON accounts TO authplatforms_authjs_adapter;
                GRANT SELECT, DELETE ON users TO authplatforms_authjs_adapter;
                """)
            let login = try database.connect(asMemberOf: "authplatforms_authjs_adapter")
            defer { login.close() }
            let delete = AuthPolicy(onAccountDeleted: .delete, whenUnlinkLeavesNoLogin: .keep)
            #expect(try platform.adapter.check(on: login, policy: delete) == [])
            let moved = try platform.adapter.apply(
                .subTransferred(from: "001.a"), sub: "002.a", policy: platform.policy, on: login)
            #expect(moved.counts.identitiesMoved == 1)
            let unlinked = try platform.adapter.apply(
                .accountDeleted, sub: "001.b", policy: platform.policy, on: login)
            #expect(unlinked.counts.identitiesUnlinked == 1)
            let deleted = try platform.adapter.apply(.accountDeleted, sub: "002.a", policy: delete, on: login)
            #expect(deleted.counts.usersDeleted == 1)
            // Without DELETE on users, check names it before the first event.
            try database.query("REVOKE DELETE ON users FROM authplatforms_authjs_adapter")
            #expect(
                try platform.adapter.check(on: login, policy: delete) == [
                    AuthPlatformProblem(.missingPrivilege, table: "public.users", detail: "DELETE")
                ])
        }

        @Test("Supabase: a BYPASSRLS login with only the documented grants applies the default policy")
        func supabase() throws {
            let platform = PlatformCase.supabase
            let database = try platform.database()
            try SupabaseAuthTests.group("authplatforms_supabase_adapter", in: database)
            let name = try database.loginRole(memberOf: "authplatforms_supabase_adapter")
            try database.connection.simpleQuery(
                """
                ALTER ROLE \(name) BYPASSRLS;
                GRANT USAGE ON SCHEMA auth TO authplatforms_supabase_adapter;
                GRANT SELECT, UPDATE ON auth.users TO authplatforms_supabase_adapter;
                GRANT SELECT, UPDATE, DELETE ON auth.identities TO authplatforms_supabase_adapter;
                GRANT SELECT, DELETE ON auth.sessions TO authplatforms_supabase_adapter;
                GRANT SELECT, UPDATE ON auth.refresh_tokens TO authplatforms_supabase_adapter;
                GRANT SELECT ON auth.webauthn_credentials TO authplatforms_supabase_adapter;
                """)
            let login = try database.connect(asMemberOf: "authplatforms_supabase_adapter")
            defer { login.close() }
            #expect(try SupabaseAuth().check(on: login) == [])
            let change = try SupabaseAuth().apply(
                .accountDeleted, sub: "001.a", policy: AuthPolicy(), on: login)
            #expect(change.counts.identitiesUnlinked == 1 && change.counts.usersDisabled == 1)
            #expect(change.counts.sessionsEnded == 2 && change.counts.refreshTokensRevoked == 3)
            #expect(
                try SupabaseAuth().check(on: login, policy: AuthPolicy(onAccountDeleted: .delete)) == [
                    AuthPlatformProblem(.missingPrivilege, table: "auth.users", detail: "DELETE"),
                    AuthPlatformProblem(.missingPrivilege, table: "auth.refresh_tokens", detail: "DELETE"),
                    AuthPlatformProblem(.missingPrivilege, table: "auth.flow_state", detail: "SELECT"),
                    AuthPlatformProblem(.missingPrivilege, table: "auth.flow_state", detail: "DELETE"),
                ])
        }
    }
}
