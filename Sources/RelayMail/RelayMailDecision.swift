import Foundation
import Postgres

/// What the relay-mail gate answers for an address (`siwa.relay_mail_decision`, docs/sql.md).
public struct RelayMailAnswer: Sendable, Equatable {
    /// Whether to mail the address now.
    public enum Decision: String, Sendable, CaseIterable {
        /// Forwarding is on, or was never turned off.
        case allow
        /// Forwarding is off, the account is deleted or erased, or (with the setting) consent was revoked.
        case block
        /// Not an address Apple gave this app.
        case unknown
    }

    /// Why, one word per case of `siwa.relay_mail_decisions`.
    public enum Reason: String, Sendable, CaseIterable {
        case forwardingOn = "forwarding_on"
        case neverTurnedOff = "never_turned_off"
        case forwardingOff = "forwarding_off"
        case accountDeleted = "account_deleted"
        case consentRevoked = "consent_revoked"
        case notOurs = "not_ours"
        case looksLikeRelay = "looks_like_relay"
        case malformed
    }

    public var decision: Decision
    public var reason: Reason
    /// The event time the answer rests on (email-disabled, email-enabled, the deletion, consent-revoked),
    /// nil when there is none.
    public var since: Date?

    public init(decision: Decision, reason: Reason, since: Date?) {
        self.decision = decision
        self.reason = reason
        self.since = since
    }

    init(row: PostgresRow) throws(PostgresError) {
        let decision: String = try row["decision"]
        let reason: String = try row["reason"]
        guard let decided = Decision(rawValue: decision), let why = Reason(rawValue: reason) else {
            throw PostgresError(code: .decoding, message: "the gate answered an unknown decision or reason")
        }
        self.decision = decided
        self.reason = why
        since = try row["since"]
    }
}

/// One address's answer: a row of `siwa.relay_mail_decision(address)`.
public struct RelayMailSingleDecision: PostgresRowDecodable, Sendable, Equatable {
    public static let statement = "SELECT decision, reason, since FROM siwa.relay_mail_decision($1::text)"
    public static let columns: PostgresColumns = "decision text, reason text, since timestamp with time zone"

    public var answer: RelayMailAnswer

    public init(row: PostgresRow) throws(PostgresError) {
        answer = try RelayMailAnswer(row: row)
    }
}

/// One element's answer: a row of `siwa.relay_mail_decisions(addresses)`.
public struct RelayMailDecision: PostgresRowDecodable, Sendable, Equatable {
    public static let statement = """
        SELECT ord, address, decision, reason, since FROM siwa.relay_mail_decisions($1::text[])
        """
    public static let columns: PostgresColumns = """
        ord integer, address text, decision text, reason text, since timestamp with time zone
        """

    /// The element's position in the list asked, from 1.
    public var ord: Int
    /// The element as asked (nil for a NULL element).
    public var address: String?
    public var answer: RelayMailAnswer

    public init(row: PostgresRow) throws(PostgresError) {
        ord = try row["ord"]
        address = try row["address"]
        answer = try RelayMailAnswer(row: row)
    }
}

/// Asks the relay-mail gate on one connection (a member of `siwa_mail`, or any role that may).
public struct RelayMailGate: Sendable {
    /// The most addresses asked in one call (what the HTTP check accepts in one request).
    public static let chunkSize = 10_000

    public let connection: PostgresConnection

    public init(_ connection: PostgresConnection) {
        self.connection = connection
    }

    /// The answer for one address.
    public func decision(_ address: String?) throws(PostgresError) -> RelayMailAnswer {
        let rows = try connection.rows(RelayMailSingleDecision.self, [address.map(PostgresData.text)])
        guard rows.count == 1, let row = rows.first else {
            throw PostgresError(
                code: .decoding, message: "siwa.relay_mail_decision answered \(rows.count) rows")
        }
        return row.answer
    }

    /// The answers for `addresses`, in their order, asked `chunkSize` at a time; `ord` counts across
    /// chunks from 1. `progress` hears each chunk's answers as they come.
    public func decisions(
        _ addresses: [String?], chunkSize: Int = RelayMailGate.chunkSize,
        progress: ([RelayMailDecision]) throws -> Void = { _ in }
    ) throws -> [RelayMailDecision] {
        precondition(chunkSize > 0)
        var all: [RelayMailDecision] = []
        all.reserveCapacity(addresses.count)
        var start = 0
        while start < addresses.count {
            let end = min(start + chunkSize, addresses.count)
            var rows = try connection.rows(
                RelayMailDecision.self, [.array(addresses[start..<end].map { $0.map(PostgresData.text) })])
            guard rows.count == end - start else {
                throw PostgresError(
                    code: .decoding,
                    message:
                        "siwa.relay_mail_decisions answered \(rows.count) rows for \(end - start) addresses")
            }
            for index in rows.indices { rows[index].ord += start }
            try progress(rows)
            all += rows
            start = end
        }
        return all
    }
}
