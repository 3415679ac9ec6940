public import Foundation
public import HTTPClient

/// What a suppression row asks of a provider: put the address on its suppression list, or take it off.
public enum SuppressionAction: String, Sendable, CaseIterable {
    /// Add the address to the provider's suppression list.
    case add
    /// Remove it (only ever sent for an address this service added: `siwa.suppressions_we_added`).
    case remove
}

/// What one call to a provider came to, as `siwa.record_suppression_attempt` records it.
public enum SuppressionOutcome: Sendable, Equatable {
    /// The provider did what was asked.
    case done
    /// An add of an address the list held already (not remembered as ours).
    case alreadyThere
    /// A remove of an address the list did not hold.
    case notThere
    /// A remove of an entry the provider's read says is no longer the one we added (SES: listed since
    /// for a message of its own, or for another reason): not made.
    case notOurs
    /// Try again, not before `after` when the provider said so (429's headers).
    case retryable(after: Duration?, reason: String)
    /// The provider refused: trying again would not help (a 4xx other than 429).
    case permanent(reason: String)

    /// The outcome's name in `siwa.record_suppression_attempt`.
    public var recordedName: String {
        switch self {
        case .done: "done"
        case .alreadyThere: "already_there"
        case .notThere: "not_there"
        case .notOurs: "not_ours"
        case .retryable: "retry"
        case .permanent: "permanent"
        }
    }
}

/// One ESP's suppression API: the request for an action, and what its answer means. The call itself is
/// the consumer's (``SuppressionDispatcher``), under the outbound policy, with no transaction open.
public protocol SuppressionProvider: Sendable {
    /// Its kind, as `siwa.suppression_providers.kind` names it.
    var kind: String { get }
    /// The request that performs `action` for `address`.
    func request(_ action: SuppressionAction, address: String) -> OutboundHTTP.Request
    /// What the provider's answer to that request means.
    func outcome(of action: SuppressionAction, response: OutboundHTTP.Response) -> SuppressionOutcome
    /// The read made before an add: does the list hold `address` already (the ESP's own suppression,
    /// a user's unsubscribe, a bounce)? Then the add is not made and the address is not ours to remove.
    func lookup(address: String) -> OutboundHTTP.Request
    /// Whether the lookup's answer says the list holds the address; nil when it does not say.
    func listed(_ response: OutboundHTTP.Response) -> Bool?
    /// The read made before a remove, for a provider whose entries say why they are listed (SES); nil
    /// (the default): the remove is made without one.
    func removalCheck(address: String) -> OutboundHTTP.Request?
    /// What that read says of the entry we added at `addedAt`; nil when it does not say.
    func entry(_ response: OutboundHTTP.Response, addedAt: Date?) -> SuppressionEntry?
}

/// What a provider's list holds for an address we added, as read before its remove.
public enum SuppressionEntry: Sendable, Equatable {
    /// Still the entry we added: remove it.
    case ours
    /// No entry: nothing to remove.
    case absent
    /// An entry of the provider's own or someone else's since: leave it.
    case notOurs
}

extension SuppressionProvider {
    public func removalCheck(address: String) -> OutboundHTTP.Request? { nil }
    public func entry(_ response: OutboundHTTP.Response, addedAt: Date?) -> SuppressionEntry? { nil }

    /// The REST answer most providers give (SendGrid, Mailgun): a 2xx done, 404 to a remove not there,
    /// else ``SuppressionAnswer/failure(_:now:)``.
    public func outcome(of action: SuppressionAction, response: OutboundHTTP.Response) -> SuppressionOutcome {
        if action == .remove, response.status == 404 { return .notThere }
        return SuppressionAnswer.failure(response) ?? .done
    }
}

/// The answers every provider shares: 429 and 5xx are retried (429 after the time its headers give),
/// any other status outside 2xx is permanent.
public enum SuppressionAnswer {
    /// The outcome of a status no adapter treats itself; nil for a 2xx (the adapter's to read).
    public static func failure(_ response: OutboundHTTP.Response, now: Date = Date()) -> SuppressionOutcome? {
        switch response.status {
        case 200...299: nil
        case 429: .retryable(after: response.retryAfter(now: now), reason: "HTTP 429")
        case 500...599: .retryable(after: response.retryAfter(now: now), reason: "HTTP \(response.status)")
        default: .permanent(reason: "HTTP \(response.status)")
        }
    }

    /// `address` as one path segment (everything but unreserved characters percent-encoded, `@` too).
    static func pathSegment(_ address: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return address.addingPercentEncoding(withAllowedCharacters: allowed) ?? address
    }

    /// JSON of `object` (dictionaries and arrays of strings only).
    static func json(_ object: Any) -> [UInt8] {
        Array((try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data())
    }
}
