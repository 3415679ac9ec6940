public import Foundation
public import Postgres

/// The operator's calls on `siwa.suppression_outbox` (`siwactl mail suppressions`): list, retry,
/// revive the dead, replay a provider's desired states. Connect as the owner. Never returns an address.
public struct SuppressionAdministration {
    /// One outbox row as listed: the user's sub, never the address.
    public struct Row: Sendable, Equatable {
        public var id: Int
        public var provider: String
        public var sub: String
        public var event: String
        public var action: String
        /// pending, done or dead.
        public var state: String
        public var outcome: String?
        public var attempts: Int
        public var lastStatus: Int?
        public var lastError: String?
        /// When a pending row is next due (nil once finished).
        public var due: Date?
        /// Whether a lane holds it now (a call in flight).
        public var leased: Bool
        public var createdAt: Date
    }

    /// Which rows to revive: one, or every dead one (of a provider).
    public enum Revival: Sendable, Equatable {
        case row(Int)
        case dead(provider: String?)
    }

    /// What a retry of one row did.
    public enum RetryResult: Sendable, Equatable {
        /// A pending row made due now.
        case dueNow
        /// A dead row made pending, due now.
        case revived
        /// Nothing: why, in words for the operator.
        case unchanged(String)
    }

    private let connection: PostgresConnection

    public init(_ connection: PostgresConnection) { self.connection = connection }

    /// The newest `limit` rows, of `provider` and in `state` when given, newest first.
    public func rows(provider: String? = nil, state: String? = nil, limit: Int = 50) throws -> [Row] {
        try connection.query(
            """
            SELECT id, provider, sub, event, action, state, outcome, attempts, last_status, last_error,
                   CASE WHEN state = 'pending' THEN extract(epoch FROM next_attempt_at)::float8 END,
                   coalesce(state = 'pending' AND lease_expires_at > clock_timestamp(), false),
                   extract(epoch FROM created_at)::float8
              FROM siwa.suppression_outbox
             WHERE ($1::text IS NULL OR provider = $1) AND ($2::text IS NULL OR state = $2)
             ORDER BY id DESC LIMIT $3
            """, [provider.map { .text($0) }, state.map { .text($0) }, .int(Int64(limit))]
        ).map { row in
            Row(
                id: try row[0, as: Int.self], provider: try row[1, as: String.self],
                sub: try row[2, as: String.self], event: try row[3, as: String.self],
                action: try row[4, as: String.self], state: try row[5, as: String.self],
                outcome: try row[6, as: String?.self], attempts: try row[7, as: Int.self],
                lastStatus: try row[8, as: Int?.self], lastError: try row[9, as: String?.self],
                due: try row[10, as: Double?.self].map { Date(timeIntervalSince1970: $0) },
                leased: try row[11, as: Bool.self],
                createdAt: Date(timeIntervalSince1970: try row[12, as: Double.self]))
        }
    }

    /// One row: pending → due now; dead → pending and due now (unless a later row of its address has
    /// finished since, or it was erased).
    public func retry(_ id: Int) throws -> RetryResult {
        let found = try connection.query(
            """
            SELECT state, address IS NOT NULL, lease_expires_at > clock_timestamp()
              FROM siwa.suppression_outbox WHERE id = $1
            """, [.int(Int64(id))]
        ).first
        guard let found else { return .unchanged("no suppression row \(id)") }
        let state = try found[0, as: String.self]
        switch state {
        case "pending":
            if try found[2, as: Bool?.self] == true {
                return .unchanged("row \(id) is being attempted now")
            }
            let count = try connection.value(
                "SELECT siwa.retry_suppressions(p_id => $1)", [.int(Int64(id))], as: Int.self)
            return count > 0 ? .dueNow : .unchanged("row \(id) is being attempted now")
        case "dead":
            if try !found[1, as: Bool.self] {
                return .unchanged("row \(id) was erased with its account: it has no address to send")
            }
            return try revive(.row(id)) > 0
                ? .revived
                : .unchanged("row \(id) is superseded: a later row of its address has finished since")
        default:
            return .unchanged("row \(id) is done: replay its provider to send its state again")
        }
    }

    /// Dead rows pending again, due now, attempts reset; returns how many (superseded and erased ones
    /// are left).
    public func revive(_ which: Revival) throws -> Int {
        switch which {
        case .row(let id):
            try connection.value(
                "SELECT siwa.revive_suppressions(p_id => $1)", [.int(Int64(id))], as: Int.self)
        case .dead(let provider):
            try connection.value(
                "SELECT siwa.revive_suppressions(p_provider => $1)", [provider.map { .text($0) }],
                as: Int.self)
        }
    }

    /// The latest desired state of each of `provider`'s addresses with a row since `since` (all when
    /// nil), written again as new pending rows in order; returns how many.
    public func replay(provider: String, since: Date? = nil) throws -> Int {
        try connection.value(
            "SELECT siwa.replay_suppressions($1, to_timestamp($2::float8))",
            [.text(provider), since.map { .double($0.timeIntervalSince1970) }], as: Int.self)
    }

    /// One suppression an earlier version added for an address that is not a relay address.
    public struct RealAddressSuppression: Sendable, Equatable {
        public var provider: String
        /// Whose address it is (never the address).
        public var sub: String
        public var addedAt: Date
    }

    /// What was added (of `provider`, or every provider) for addresses that are not relay addresses,
    /// which no suppression list should hold (docs/operations.md, "Suppression lists").
    public func realAddressSuppressions(provider: String? = nil) throws -> [RealAddressSuppression] {
        try connection.query(
            "SELECT provider, sub, added_at FROM siwa.real_address_suppressions($1)",
            [provider.map { .text($0) }]
        ).map { row throws -> RealAddressSuppression in
            RealAddressSuppression(provider: try row[0], sub: try row[1], addedAt: try row[2])
        }
    }

    /// Queues the removal of each of ``realAddressSuppressions(provider:)``; returns how many.
    public func removeRealAddressSuppressions(provider: String? = nil) throws -> Int {
        try connection.value(
            "SELECT siwa.remove_real_address_suppressions($1)", [provider.map { .text($0) }], as: Int.self)
    }

    /// Whether `provider` is a row of `siwa.suppression_providers`.
    public func providerExists(_ provider: String) throws -> Bool {
        try connection.value(
            "SELECT EXISTS (SELECT 1 FROM siwa.suppression_providers WHERE name = $1)", [.text(provider)],
            as: Bool.self)
    }
}
