import AuthPlatforms
import Postgres
import TestSupport
import Testing

extension AuthPlatformsTests {
    /// What only Supabase Auth has: its refresh tokens (no foreign key on user_id), app metadata,
    /// identity_data, and row-level security that silently hides every row from a login that does not
    /// bypass it.
    @Suite("Supabase Auth: refresh tokens, app metadata, identity_data, row-level security")
    struct SupabaseAuthTests {
        let platform = PlatformCase.supabase

        func tokens(_ database: TestDatabase) throws -> [String] {
            try database.query(
                "SELECT token || ':' || coalesce(revoked::text, 'null') FROM auth.refresh_tokens ORDER BY token"
            ).map { row throws(PostgresError) in try row[0, as: String.self] }
        }

        @Test(
            "consent revoked: A's session tokens go with the sessions, the one without a session is revoked")
        func refreshTokens() throws {
            let database = try platform.database()
            try SupabaseAuth().apply(
                .consentRevoked, sub: "001.a", policy: AuthPolicy(), on: database.connection)
            #expect(try tokens(database) == ["tok-a3:true", "tok-b1:false"])
        }

        @Test("forwarding is recorded in raw_app_meta_data with record, and other keys are kept")
        func forwarding() throws {
            let database = try platform.database()
            let policy = AuthPolicy(onForwardingChange: .record)
            let off = try SupabaseAuth().apply(
                .forwardingChanged(on: false), sub: "001.a", policy: policy, on: database.connection)
            #expect(off.counts.metadataRecorded == 1)
            let metadata = "SELECT raw_app_meta_data::text FROM auth.users WHERE id = $1::uuid"
            #expect(
                try database.value(metadata, [.text(PlatformCase.supabaseA)], as: String.self)
                    == #"{"provider": "apple", "apple_private_email_forwarding": false}"#)
            try SupabaseAuth().apply(
                .forwardingChanged(on: true), sub: "001.a", policy: policy, on: database.connection)
            #expect(
                try database.value(metadata, [.text(PlatformCase.supabaseA)], as: String.self)
                    == #"{"provider": "apple", "apple_private_email_forwarding": true}"#)
            #expect(
                try database.value(metadata, [.text(PlatformCase.supabaseB)], as: String.self)
                    == #"{"provider": "email"}"#)
        }

        @Test("a transfer rewrites identity_data's sub and provider_id, keeping the rest")
        func transferIdentityData() throws {
            let database = try platform.database()
            try SupabaseAuth().apply(
                .subTransferred(from: "001.a"), sub: "002.a", policy: AuthPolicy(), on: database.connection)
            #expect(
                try database.value(
                    "SELECT identity_data::text FROM auth.identities WHERE provider_id = '002.a'",
                    as: String.self)
                    == #"{"sub": "002.a", "email": "a@privaterelay.appleid.com", "provider_id": "002.a"}"#)
            #expect(
                try database.value(
                    "SELECT count(*)::int8 FROM auth.identities WHERE identity_data->>'sub' = '001.a'",
                    as: Int.self) == 0)
        }

        @Test("disable bans for a century and is counted once")
        func disable() throws {
            let database = try platform.database()
            let policy = AuthPolicy(onAccountDeleted: .disable)
            let first = try SupabaseAuth().apply(
                .accountDeleted, sub: "001.a", policy: policy, on: database.connection)
            #expect(first.counts.usersDisabled == 1 && first.counts.sessionsEnded == 2)
            #expect(
                try database.value(
                    "SELECT banned_until > now() + interval '99 years' FROM auth.users WHERE id = $1::uuid",
                    [.text(PlatformCase.supabaseA)], as: Bool.self))
            let again = try SupabaseAuth().apply(
                .accountDeleted, sub: "001.a", policy: policy, on: database.connection)
            #expect(again == .applied(AuthCounts()))
        }

        /// A group role, cluster-wide, created once (concurrent creation is harmless).
        static func group(_ name: String, in database: TestDatabase, memberOf parent: String? = nil) throws {
            let membership = parent.map { " IN ROLE \($0)" } ?? ""
            try database.connection.simpleQuery(
                """
                DO $$ BEGIN CREATE ROLE \(name) NOLOGIN\(membership);
                EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$
                """)
        }

        @Test(
            "row-level security: a login without BYPASSRLS silently sees 0 rows, and check names each table")
        func rowLevelSecurity() throws {
            let database = try platform.database()
            try Self.group("authplatforms_supabase_plain", in: database)
            try database.connection.simpleQuery(
                """
                GRANT USAGE ON SCHEMA auth TO authplatforms_supabase_plain;
                GRANT SELECT, UPDATE, DELETE ON ALL TABLES IN SCHEMA auth TO authplatforms_supabase_plain;
                """)
            let login = try database.connect(asMemberOf: "authplatforms_supabase_plain")
            defer { login.close() }
            #expect(
                try login.value(
                    "SELECT rolbypassrls FROM pg_roles WHERE rolname = current_user", as: Bool.self) == false)
            let problems = try SupabaseAuth().check(on: login)
            #expect(
                problems
                    == ["auth.users", "auth.identities", "auth.sessions", "auth.refresh_tokens"].map {
                        AuthPlatformProblem(.rowLevelSecurity, table: $0)
                    })
            // What check prevents: no error, nothing found, nothing changed.
            #expect(
                try SupabaseAuth().apply(.consentRevoked, sub: "001.a", policy: AuthPolicy(), on: login)
                    == .noUser)
            #expect(try platform.counts(database, of: platform.a)["auth.sessions"] == 2)

            // A member of the tables' owner bypasses it: nothing to report, and the event is applied.
            try Self.group("authplatforms_supabase_admin", in: database, memberOf: "supabase_auth_admin")
            let admin = try database.connect(asMemberOf: "authplatforms_supabase_admin")
            defer { admin.close() }
            #expect(try SupabaseAuth().check(on: admin) == [])
            let change = try SupabaseAuth().apply(
                .consentRevoked, sub: "001.a", policy: AuthPolicy(), on: admin)
            #expect(change.counts.sessionsEnded == 2)
        }

        @Test(
            "short grants: check names each missing privilege, apply fails naming the table and never the sub"
        )
        func shortGrants() throws {
            let database = try platform.database()
            let reader = try database.connect(asMemberOf: nil)
            defer { reader.close() }
            let problems = try SupabaseAuth().check(on: reader, policy: AuthPolicy(onAccountDeleted: .delete))
            #expect(
                problems.contains(
                    AuthPlatformProblem(.missingPrivilege, table: "auth.users", detail: "DELETE")))
            #expect(
                problems.contains(
                    AuthPlatformProblem(.missingPrivilege, table: "auth.refresh_tokens", detail: "UPDATE")))
            #expect(
                problems.contains(
                    AuthPlatformProblem(.missingPrivilege, table: "auth.flow_state", detail: "DELETE")))
            let error = #expect(throws: AuthPlatformError.self) {
                try SupabaseAuth().apply(.accountDeleted, sub: "001.a", policy: AuthPolicy(), on: reader)
            }
            #expect(error?.kind == .statementFailed)
            #expect(error?.sqlState == "42501")
            #expect(error?.table == "auth.identities")
            #expect(error?.description.contains("001.a") == false)
            #expect(error?.description.contains("permission denied") == true)
        }

        @Test("another provider drives the same effects")
        func otherProvider() throws {
            let database = try platform.database()
            let email = SupabaseAuth(provider: "email")
            let change = try email.apply(
                .consentRevoked, sub: PlatformCase.supabaseB, policy: AuthPolicy(), on: database.connection)
            #expect(change.counts.sessionsEnded == 1)
            #expect(
                try SupabaseAuth().apply(
                    .consentRevoked, sub: PlatformCase.supabaseB, policy: AuthPolicy(),
                    on: database.connection) == .noUser)
        }
    }
}
