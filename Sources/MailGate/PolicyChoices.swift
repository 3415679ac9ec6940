import Foundation
public import RelayMail

/// The outcome of asking for one address's verdict within a deadline.
public enum Lookup: Sendable, Equatable {
    /// The database answered (now, or within the cache's age bound).
    case decided(RelayMailAnswer)
    /// The database did not answer within the deadline.
    case timedOut
    /// The database could not be asked (connection refused, lost, an error).
    case unavailable
}

/// How the policy service answers what it cannot decide, and an address that only looks like a relay.
public struct PolicyChoices: Sendable, Equatable {
    /// What an unanswered lookup (database down or slower than the deadline) answers.
    public enum OnDatabaseError: String, Sendable, Equatable {
        /// `DUNNO`: mail goes on (fail open, as postgrey and policyd-spf do).
        case dunno
        /// `DEFER_IF_PERMIT 4.3.0`: mail that would be accepted is deferred.
        case `defer`
    }

    /// What an address Apple did not give this app answers when its domain is a relay domain.
    public enum UnknownRelay: String, Sendable, Equatable {
        /// `DUNNO`.
        case dunno
        /// `550 5.1.1`.
        case reject
    }

    public var onDatabaseError: OnDatabaseError
    public var unknownRelay: UnknownRelay

    public init(onDatabaseError: OnDatabaseError = .dunno, unknownRelay: UnknownRelay = .dunno) {
        self.onDatabaseError = onDatabaseError
        self.unknownRelay = unknownRelay
    }

    /// The `action=` value for a recipient's `lookup`. Postfix replies `CODE DSN <recipient>: Recipient
    /// address rejected: TEXT`, so the text does not name the address again.
    public func action(for lookup: Lookup) -> String {
        switch lookup {
        case .timedOut, .unavailable:
            switch onDatabaseError {
            case .dunno: return "DUNNO"
            case .defer: return "DEFER_IF_PERMIT 4.3.0 relay address check unavailable, try again later"
            }
        case .decided(let verdict):
            switch verdict.decision {
            case .allow: return "DUNNO"
            case .block:
                switch verdict.reason {
                case .forwardingOff:
                    return "550 5.2.1 recipient turned off Apple relay forwarding"
                case .accountDeleted:
                    return "550 5.1.1 the Apple account behind this relay address is deleted"
                case .consentRevoked:
                    return "550 5.2.1 recipient stopped using Sign in with Apple with this app"
                default:
                    return "550 5.2.1 mail to this Apple relay address is turned off"
                }
            case .unknown:
                guard verdict.reason == .looksLikeRelay, unknownRelay == .reject else { return "DUNNO" }
                return "550 5.1.1 not a relay address Apple gave this sender"
            }
        }
    }
}
