public import Postgres

/// Supabase Auth (GoTrue) in schema `auth`, as supabase/auth v2.196.0's migrations leave it:
/// `users`, `identities` (`provider`, `provider_id` = the `sub`, `identity_data`), `sessions`,
/// `refresh_tokens` (`user_id` as text, no foreign key) and `flow_state` (no foreign key). A user still
/// has a way to sign in without Apple with another identity, a password or a passkey (`webauthn_credentials`).
///
/// Disable is a ban (`banned_until` 100 years ahead, as GoTrue's own `ban_duration` does it); forwarding
/// is recorded in `raw_app_meta_data.apple_private_email_forwarding`. Row-level security is enabled on
/// these tables: the login must own them (be a member of `supabase_auth_admin`) or have BYPASSRLS, which
/// ``check(on:policy:)`` verifies, or its statements see 0 rows.
public struct SupabaseAuth: AuthPlatform {
    /// `supabase-auth`.
    public let name = "supabase-auth"
    /// The identity provider (`apple` by default).
    public let provider: String

    /// An adapter for `provider`'s identities.
    public init(provider: String = "apple") { self.provider = provider }

    /// Every policy is supported.
    public func validate(_ policy: AuthPolicy) throws(AuthPlatformError) {}

    /// The tables, columns and grants `policy` needs, and row-level security.
    public func check(on connection: PostgresConnection, policy: AuthPolicy) throws(AuthPlatformError)
        -> [AuthPlatformProblem]
    {
        try PolicyEngine.check(statements.requirements(for: policy), platform: name, connection: connection)
    }

    /// One transaction; see ``AuthPlatform/apply(_:sub:policy:on:)``.
    public func apply(_ event: AuthEvent, sub: String, policy: AuthPolicy, on connection: PostgresConnection)
        throws(AuthPlatformError) -> AuthChange
    {
        try PolicyEngine.run(
            statements, validate: validate, event: event, sub: sub, policy: policy, connection: connection,
            dryRun: false)
    }

    /// Rolled back; see ``AuthPlatform/dryRun(_:sub:policy:on:)``.
    public func dryRun(_ event: AuthEvent, sub: String, policy: AuthPolicy, on connection: PostgresConnection)
        throws(AuthPlatformError) -> AuthChange
    {
        try PolicyEngine.run(
            statements, validate: validate, event: event, sub: sub, policy: policy, connection: connection,
            dryRun: true)
    }

    var statements: SupabaseStatements { SupabaseStatements(name: name, provider: provider) }
}

struct SupabaseStatements: AccountStatements {
    let name: String
    let provider: String

    func findUser(sub: String, _ run: Runner) throws(AuthPlatformError) -> String? {
        try run.texts(
            """
            SELECT u.id::text FROM auth.identities i JOIN auth.users u ON u.id = i.user_id
             WHERE i.provider = $1 AND i.provider_id = $2
               FOR UPDATE OF i
            """, [.text(provider), .text(sub)], table: "auth.identities"
        ).first
    }

    func hasOtherLogin(user: String, sub: String, _ run: Runner) throws(AuthPlatformError) -> Bool {
        try run.flag(
            """
            SELECT EXISTS (SELECT 1 FROM auth.identities
                            WHERE user_id = $1::uuid AND NOT (provider = $2 AND provider_id = $3))
                OR EXISTS (SELECT 1 FROM auth.users
                            WHERE id = $1::uuid AND coalesce(encrypted_password, '') <> '')
                OR EXISTS (SELECT 1 FROM auth.webauthn_credentials WHERE user_id = $1::uuid)
            """, [.text(user), .text(provider), .text(sub)], table: "auth.identities")
    }

    func endSessions(user: String, _ run: Runner, into counts: inout AuthCounts) throws(AuthPlatformError) {
        counts.refreshTokensRevoked += try run.count(
            """
            UPDATE auth.refresh_tokens SET revoked = true, updated_at = now()
             WHERE user_id = $1 AND revoked IS NOT TRUE
            """, [.text(user)], table: "auth.refresh_tokens")
        counts.sessionsEnded += try run.count(
            "DELETE FROM auth.sessions WHERE user_id = $1::uuid", [.text(user)], table: "auth.sessions")
    }

    func unlink(user: String, sub: String, _ run: Runner, into counts: inout AuthCounts)
        throws(AuthPlatformError)
    {
        counts.identitiesUnlinked += try run.count(
            "DELETE FROM auth.identities WHERE provider = $1 AND provider_id = $2",
            [.text(provider), .text(sub)], table: "auth.identities")
    }

    func disable(user: String, _ run: Runner, into counts: inout AuthCounts) throws(AuthPlatformError) {
        counts.usersDisabled += try run.count(
            """
            UPDATE auth.users SET banned_until = now() + interval '876000 hours', updated_at = now()
             WHERE id = $1::uuid AND (banned_until IS NULL OR banned_until < now() + interval '87600 hours')
            """, [.text(user)], table: "auth.users")
    }

    func delete(user: String, _ run: Runner, into counts: inout AuthCounts) throws(AuthPlatformError) {
        // refresh_tokens.user_id and flow_state have no foreign key: nothing cascades to them.
        counts.refreshTokensRevoked += try run.count(
            """
            DELETE FROM auth.refresh_tokens
             WHERE user_id = $1 OR session_id IN (SELECT id FROM auth.sessions WHERE user_id = $1::uuid)
            """, [.text(user)], table: "auth.refresh_tokens")
        counts.sessionsEnded += try run.count(
            "DELETE FROM auth.sessions WHERE user_id = $1::uuid", [.text(user)], table: "auth.sessions")
        counts.identitiesUnlinked += try run.count(
            "DELETE FROM auth.identities WHERE user_id = $1::uuid", [.text(user)], table: "auth.identities")
        try run.count(
            "DELETE FROM auth.flow_state WHERE user_id = $1::uuid OR linking_target_id = $1::uuid",
            [.text(user)],
            table: "auth.flow_state")
        // The rest (mfa_*, one_time_tokens, oauth_authorizations, oauth_consents, webauthn_*) cascades.
        counts.usersDeleted += try run.count(
            "DELETE FROM auth.users WHERE id = $1::uuid", [.text(user)], table: "auth.users")
    }

    func move(
        user: String, from oldSub: String, to newSub: String, _ run: Runner, into counts: inout AuthCounts
    )
        throws(AuthPlatformError)
    {
        counts.identitiesMoved += try run.count(
            """
            UPDATE auth.identities
               SET provider_id = $3,
                   identity_data = CASE WHEN identity_data ? 'provider_id'
                                        THEN jsonb_set(identity_data, '{provider_id}', to_jsonb($3::text))
                                        ELSE identity_data END
                                   || jsonb_build_object('sub', $3::text),
                   updated_at = now()
             WHERE provider = $1 AND provider_id = $2
            """, [.text(provider), .text(oldSub), .text(newSub)], table: "auth.identities")
    }

    func recordForwarding(user: String, on: Bool, _ run: Runner, into counts: inout AuthCounts)
        throws(AuthPlatformError)
    {
        counts.metadataRecorded += try run.count(
            """
            UPDATE auth.users
               SET raw_app_meta_data = coalesce(raw_app_meta_data, '{}'::jsonb)
                                       || jsonb_build_object('apple_private_email_forwarding', $2::boolean),
                   updated_at = now()
             WHERE id = $1::uuid
            """, [.text(user), .bool(on)], table: "auth.users")
    }

    func requirements(for policy: AuthPolicy) -> [TableRequirement] {
        let deletes = policy.onAccountDeleted == .delete
        let updatesUsers = policy.mayDisable || policy.onForwardingChange == .record
        var users = TableRequirement(
            schema: "auth", table: "users", columns: ["id", "encrypted_password", "updated_at"],
            privileges: ["SELECT"])
        if policy.mayDisable { users.columns.append("banned_until") }
        if policy.onForwardingChange == .record { users.columns.append("raw_app_meta_data") }
        if updatesUsers { users.privileges.append("UPDATE") }
        if deletes { users.privileges.append("DELETE") }
        var identities = TableRequirement(
            schema: "auth", table: "identities",
            columns: ["id", "user_id", "provider", "provider_id", "identity_data", "updated_at"],
            privileges: ["SELECT", "UPDATE"])  // UPDATE: the lookup locks the row (FOR UPDATE)
        if policy.onAccountDeleted == .unlink || deletes { identities.privileges.append("DELETE") }
        var requirements = [
            users, identities,
            TableRequirement(
                schema: "auth", table: "sessions", columns: ["id", "user_id"],
                privileges: ["SELECT", "DELETE"]),
            TableRequirement(
                schema: "auth", table: "refresh_tokens",
                columns: ["user_id", "session_id", "revoked", "updated_at"],
                privileges: ["SELECT", "UPDATE"] + (deletes ? ["DELETE"] : [])),
        ]
        if policy.mayDisable {
            // A passkey is a way to sign in too.
            requirements.append(
                TableRequirement(
                    schema: "auth", table: "webauthn_credentials", columns: ["user_id"],
                    privileges: ["SELECT"]))
        }
        if deletes {
            requirements.append(
                TableRequirement(
                    schema: "auth", table: "flow_state", columns: ["user_id", "linking_target_id"],
                    privileges: ["SELECT", "DELETE"]))
        }
        return requirements
    }
}
