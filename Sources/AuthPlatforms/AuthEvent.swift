/// One of Apple's events, as the outbox hands it to an adapter: what happened to the Apple account
/// behind a `sub`. The `sub` itself is passed beside it (``AuthPlatform/apply(_:sub:policy:on:)``).
public enum AuthEvent: Sendable, Hashable {
    /// The user stopped using Sign in with Apple with this app (`consent-revoked`).
    case consentRevoked
    /// The user deleted their Apple account (`account-delete`).
    case accountDeleted
    /// The user turned email forwarding through Apple's private relay on (`on: true`) or off.
    case forwardingChanged(on: Bool)
    /// A team transfer moved the user from `oldSub` (the old team's `sub`) to the `sub` given beside
    /// the event (the new team's).
    case subTransferred(from: String)
    /// siwa erased its own copy of the user's personal data. Nothing in the platform changes: the
    /// platform's rows are the app's, not siwa's (docs/adapters.md, "What is never touched").
    case personalDataErased
}

/// What an adapter does for each event; the defaults are issue 47's safe choices.
public struct AuthPolicy: Sendable, Hashable {
    /// On `consent-revoked`.
    public enum ConsentRevoked: String, Sendable, Hashable, CaseIterable {
        /// End the user's sessions and refresh tokens (default).
        case endSessions = "end-sessions"
        /// Change nothing.
        case none
    }

    /// On `account-delete`.
    public enum AccountDeleted: String, Sendable, Hashable, CaseIterable {
        /// Remove the Apple identity and end the user's sessions (default); see
        /// ``AuthPolicy/whenUnlinkLeavesNoLogin``.
        case unlink
        /// Delete the user and every row of theirs the platform keeps.
        case delete
        /// Mark the user disabled (banned) and end their sessions.
        case disable
        /// Only end the user's sessions.
        case sessionsOnly = "sessions-only"
    }

    /// What `unlink` does when the Apple identity is the user's only way to sign in (no other
    /// identity or account, no password).
    public enum UnlinkLeavesNoLogin: String, Sendable, Hashable, CaseIterable {
        /// Unlink and disable the user (default).
        case disable
        /// Unlink and keep the user as it is, with no way to sign in.
        case keep
    }

    /// On `email-enabled` / `email-disabled`.
    public enum ForwardingChange: String, Sendable, Hashable, CaseIterable {
        /// Change nothing (default).
        case ignore
        /// Record the state where the platform keeps app metadata.
        case record
    }

    /// On a team transfer.
    public enum SubTransferred: String, Sendable, Hashable, CaseIterable {
        /// Move the identity from the old `sub` to the new one (default).
        case move
        /// Change nothing.
        case ignore
    }

    /// On `consent-revoked`; default ``ConsentRevoked/endSessions``.
    public var onConsentRevoked: ConsentRevoked
    /// On `account-delete`; default ``AccountDeleted/unlink``.
    public var onAccountDeleted: AccountDeleted
    /// When `unlink` leaves no way to sign in; default ``UnlinkLeavesNoLogin/disable``.
    public var whenUnlinkLeavesNoLogin: UnlinkLeavesNoLogin
    /// On forwarding off/on; default ``ForwardingChange/ignore``.
    public var onForwardingChange: ForwardingChange
    /// On a team transfer; default ``SubTransferred/move``.
    public var onSubTransferred: SubTransferred

    /// A policy; every argument defaults to the safe choice.
    public init(
        onConsentRevoked: ConsentRevoked = .endSessions, onAccountDeleted: AccountDeleted = .unlink,
        whenUnlinkLeavesNoLogin: UnlinkLeavesNoLogin = .disable,
        onForwardingChange: ForwardingChange = .ignore,
        onSubTransferred: SubTransferred = .move
    ) {
        self.onConsentRevoked = onConsentRevoked
        self.onAccountDeleted = onAccountDeleted
        self.whenUnlinkLeavesNoLogin = whenUnlinkLeavesNoLogin
        self.onForwardingChange = onForwardingChange
        self.onSubTransferred = onSubTransferred
    }

    /// Whether some event may disable a user under this policy (`disable`, or `unlink` falling back to it).
    var mayDisable: Bool {
        onAccountDeleted == .disable || (onAccountDeleted == .unlink && whenUnlinkLeavesNoLogin == .disable)
    }
}

/// What one event changed in the platform's database.
public enum AuthChange: Sendable, Hashable {
    /// The `sub` links no user: nothing to do (recorded as such, never retried).
    case noUser
    /// The event was applied (the counts may all be zero: nothing was left to change).
    case applied(AuthCounts)

    /// The counts, zero for ``noUser``.
    public var counts: AuthCounts {
        if case .applied(let counts) = self { return counts }
        return AuthCounts()
    }
}

/// Rows changed by one event, by kind.
public struct AuthCounts: Sendable, Hashable, CustomStringConvertible {
    /// Users deleted.
    public var usersDeleted = 0
    /// Users disabled (banned) that were not already.
    public var usersDisabled = 0
    /// Identities (accounts) of the provider removed.
    public var identitiesUnlinked = 0
    /// Identities moved from an old `sub` to a new one.
    public var identitiesMoved = 0
    /// Sessions ended (deleted).
    public var sessionsEnded = 0
    /// The platform's own refresh tokens revoked or deleted (Supabase).
    public var refreshTokensRevoked = 0
    /// Users whose app metadata recorded the forwarding state.
    public var metadataRecorded = 0

    /// All zero.
    public init() {}

    /// The counts as `key=value` pairs, zeros left out (`none` when all are zero).
    public var description: String {
        let pairs = [
            ("users_deleted", usersDeleted), ("users_disabled", usersDisabled),
            ("identities_unlinked", identitiesUnlinked), ("identities_moved", identitiesMoved),
            ("sessions_ended", sessionsEnded), ("refresh_tokens_revoked", refreshTokensRevoked),
            ("metadata_recorded", metadataRecorded),
        ].filter { $0.1 != 0 }.map { "\($0.0)=\($0.1)" }
        return pairs.isEmpty ? "none" : pairs.joined(separator: " ")
    }
}
