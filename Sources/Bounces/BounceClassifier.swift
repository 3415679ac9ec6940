import Foundation

/// What a bounce from Apple's relay means, and so what to do about it (docs/operations.md, "Bounces").
public enum BounceClass: String, Sendable, CaseIterable, Equatable {
    /// The envelope sender is not registered with Apple (`550 5.1.1 <sender>: unauthorized sender`):
    /// a configuration error of the team; never suppress the recipient.
    case senderUnauthorized = "sender_unauthorized"
    /// Apple knows no such relay address (user not found, 5.1.1 for the recipient).
    case relayAddressDead = "relay_address_dead"
    /// The user turned forwarding off (expected after email-disabled; no action).
    case forwardingOff = "forwarding_off"
    /// SPF, DKIM or DMARC failed, or another 5.7.x refusal.
    case authFailure = "auth_failure"
    /// A 4.x.x status or a delayed report: the MTA tries again.
    case transient
    /// Anything else.
    case other
}

/// Classifies one recipient of a report: the first rule of ``rules`` that matches decides.
public enum BounceClassifier {
    /// Apple's relay domains, lower case (as siwa.apple_relay_domains() lists them).
    public static let relayDomains: Set<String> = [
        "privaterelay.appleid.com", "private.icloud.com", "icloud.com",
    ]

    /// One rule: texts any of which the diagnostic contains (lower case), status prefixes any of
    /// which the status starts with, or an action; a rule with several kinds needs one of each.
    public struct Rule: Sendable {
        public var bounceClass: BounceClass
        public var texts: [String]
        public var statuses: [String]
        public var actions: [String]

        public init(
            _ bounceClass: BounceClass, texts: [String] = [], statuses: [String] = [], actions: [String] = []
        ) {
            self.bounceClass = bounceClass
            self.texts = texts
            self.statuses = statuses
            self.actions = actions
        }

        func matches(diagnostic: String, status: String, action: String) -> Bool {
            guard !texts.isEmpty || !statuses.isEmpty || !actions.isEmpty else { return false }
            return (texts.isEmpty || texts.contains { diagnostic.contains($0) })
                && (statuses.isEmpty || statuses.contains { status.hasPrefix($0) })
                && (actions.isEmpty || actions.contains(action))
        }
    }

    /// In order. "unauthorized sender" comes first: its 5.1.1 names the sender, never the recipient.
    /// Forwarding off before the 5.7.x rule: Apple answers it `550 5.7.1 Relay not permitted`.
    public static let rules: [Rule] = [
        Rule(
            .senderUnauthorized,
            texts: ["unauthorized sender", "sender not authorized", "sender is not registered"]),
        Rule(.transient, actions: ["delayed"]),
        Rule(.transient, statuses: ["4."]),
        Rule(
            .forwardingOff,
            texts: [
                "relay not permitted", "forwarding is disabled", "forwarding disabled", "forwarding is off",
                "forwarding has been turned off", "address is deactivated", "address has been deactivated",
            ]),
        Rule(.authFailure, texts: ["spf", "dkim", "dmarc", "authentication", "not authenticated"]),
        Rule(.authFailure, statuses: ["5.7."]),
        Rule(
            .relayAddressDead,
            texts: [
                "user not found", "user unknown", "unknown user", "no such user", "does not exist",
                "mailbox unavailable", "invalid recipient", "recipient not found",
            ]),
        Rule(.relayAddressDead, statuses: ["5.1.1", "5.1.10", "5.1.6"]),
    ]

    /// The class of one recipient's bounce.
    public static func classify(_ recipient: DeliveryStatusReport.Recipient) -> BounceClass {
        classify(
            diagnostic: recipient.diagnosticCode ?? "", status: recipient.status, action: recipient.action)
    }

    /// The class of a bounce given its parts: the server's reply, the enhanced status, the action.
    public static func classify(diagnostic: String, status: String, action: String = "failed") -> BounceClass
    {
        let diagnostic = diagnostic.lowercased()
        let action = action.lowercased()
        return rules.first { $0.matches(diagnostic: diagnostic, status: status, action: action) }?.bounceClass
            ?? .other
    }

    /// Whether an address's domain is one of Apple's relay domains (ASCII case-insensitive).
    public static func isRelayDomain(_ address: String) -> Bool {
        guard let domain = domain(of: address) else { return false }
        return relayDomains.contains(domain)
    }

    /// The lower-cased domain of an address (after its last @), nil when there is none.
    public static func domain(of address: String) -> String? {
        guard let at = address.lastIndex(of: "@") else { return nil }
        let domain = address[address.index(after: at)...].trimmingCharacters(
            in: CharacterSet(charactersIn: " <>"))
        guard !domain.isEmpty, domain.count <= 253 else { return nil }
        return domain.lowercased()
    }
}
