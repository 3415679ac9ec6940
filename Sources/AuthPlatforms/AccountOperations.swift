/// What one platform can do to its accounts — in its database (one transaction) or through its admin
/// API — from which ``apply(_:sub:policy:)`` makes each event's effects: the one policy table
/// (docs/adapters.md "The policy"), for every platform.
public protocol AccountOperations {
    /// What an operation throws.
    associatedtype Failure: Error

    /// The user linked to the provider's `sub`, or nil.
    func findUser(sub: String) throws(Failure) -> String?
    /// Whether the user can sign in without the identity of `sub` (a password, another identity).
    func hasOtherLogin(user: String, sub: String) throws(Failure) -> Bool
    /// Ends the user's sessions and refresh tokens.
    func endSessions(user: String, into counts: inout AuthCounts) throws(Failure)
    /// Removes the identity of `sub` from the user.
    func unlink(user: String, sub: String, into counts: inout AuthCounts) throws(Failure)
    /// Disables (bans, blocks) the user.
    func disable(user: String, into counts: inout AuthCounts) throws(Failure)
    /// Deletes the user with everything the platform keeps of them.
    func delete(user: String, into counts: inout AuthCounts) throws(Failure)
    /// Moves the user's identity from `oldSub` to `newSub`.
    func move(user: String, from oldSub: String, to newSub: String, into counts: inout AuthCounts)
        throws(Failure)
    /// Records email forwarding on or off in the user's app metadata.
    func recordForwarding(user: String, on: Bool, into counts: inout AuthCounts) throws(Failure)
    /// The error of a transfer whose new `sub` is linked to another user.
    func newSubTaken() -> Failure
}

extension AccountOperations {
    /// Applies `event` for `sub` under `policy`: what changed, or ``AuthChange/noUser``.
    ///
    /// What needs the user found by `sub` runs before the unlink, which comes last: an event retried
    /// after half its effects (a platform without transactions) finds the user again and finishes.
    public func apply(_ event: AuthEvent, sub: String, policy: AuthPolicy) throws(Failure) -> AuthChange {
        var lookup = sub
        if case .subTransferred(let oldSub) = event { lookup = oldSub }
        guard let user = try findUser(sub: lookup) else {
            // A transfer applied before (at least once): the old sub is gone and the new one is linked.
            if case .subTransferred = event, policy.onSubTransferred == .move, try findUser(sub: sub) != nil {
                return .applied(AuthCounts())
            }
            return .noUser
        }
        var counts = AuthCounts()
        switch event {
        case .consentRevoked:
            if policy.onConsentRevoked == .endSessions { try endSessions(user: user, into: &counts) }
        case .accountDeleted:
            switch policy.onAccountDeleted {
            case .sessionsOnly:
                try endSessions(user: user, into: &counts)
            case .disable:
                try disable(user: user, into: &counts)
                try endSessions(user: user, into: &counts)
            case .delete:
                try delete(user: user, into: &counts)
            case .unlink:
                var disabling = false
                if policy.whenUnlinkLeavesNoLogin == .disable {
                    disabling = !(try hasOtherLogin(user: user, sub: sub))
                }
                if disabling { try disable(user: user, into: &counts) }
                try endSessions(user: user, into: &counts)
                try unlink(user: user, sub: sub, into: &counts)
            }
        case .forwardingChanged(let on):
            if policy.onForwardingChange == .record {
                try recordForwarding(user: user, on: on, into: &counts)
            }
        case .subTransferred(let oldSub):
            guard policy.onSubTransferred == .move, oldSub != sub else { break }
            if let owner = try findUser(sub: sub), owner != user { throw newSubTaken() }
            try move(user: user, from: oldSub, to: sub, into: &counts)
        case .personalDataErased:
            break
        }
        return .applied(counts)
    }
}
