public import Foundation
import HTTPClient
public import Postgres
public import QueueConsumer
public import ServiceSupport
public import SharedSignals

/// Pushes the SETs of `siwa.ssf_events` to their streams (RFC 8935), at least once, in change order per
/// stream and subject.
///
/// An ``Outbox``: each lane (``OutboxLanes``) listens on `siwa_ssf` with its own connection: `siwa.claim_ssf_events`
/// commits leases on up to `batchSize` due events, the lane signs each SET (the jti and iat fixed at
/// fan-out, so every attempt sends the same token) and POSTs them one after another as
/// `application/secevent+jwt` with the stream's Authorization header (read from its file at send time)
/// and no transaction open, then `siwa.record_ssf_attempt` records each outcome, in one transaction, if
/// the lease is still its own (after a failure the rest are released unsent): 202 delivered; 400 with
/// one of RFC 8935's error codes failed for good; anything else retried with backoff, dead after
/// `maxAttempts`. A process killed mid-push leaves its lease to expire; another lane sends the same SET.
public final class SignalDispatcher: Outbox {
    /// The dispatcher's settings.
    public struct Configuration: Sendable {
        /// The database, the lanes (pushes in flight at once), the batch (SETs a lane pushes one after
        /// another), a push's deadline, the retries' delays, the poll interval, the HTTP client's
        /// environment.
        public var calls: OutboxCalls
        /// The SETs' `iss`.
        public var issuer: String
        /// The key that signs every SET.
        public var key: SETSigningKey
        /// Attempts before an event is dead.
        public var maxAttempts: Int
        /// How long a claimed event stays leased (``OutboxCalls/lease(callsPerRow:)``).
        public var lease: Duration { calls.lease() }

        /// Settings; durations positive, `concurrency` and `maxAttempts` at least 1.
        public init(
            database: PostgresConfiguration, issuer: String, key: SETSigningKey, concurrency: Int = 4,
            batchSize: Int = 8, timeout: Duration = .seconds(10), retryBaseDelay: Duration = .seconds(5),
            maxRetryDelay: Duration = .seconds(3600), maxAttempts: Int = 30,
            pollInterval: Duration = .seconds(1),
            environment: [String: String] = [:]
        ) throws {
            calls = try OutboxCalls(
                "the Shared Signals settings", database: database, concurrency: concurrency,
                batchSize: batchSize,
                timeout: timeout, retryBaseDelay: retryBaseDelay, maxRetryDelay: maxRetryDelay,
                pollInterval: pollInterval, environment: environment)
            guard maxAttempts >= 1, !issuer.isEmpty else {
                throw ConfigurationError(
                    "the Shared Signals issuer and attempts must be given (at least one)")
            }
            self.issuer = issuer
            self.key = key
            self.maxAttempts = maxAttempts
        }
    }

    /// What one push ended as.
    public struct Outcome: Sendable, Equatable {
        /// The event's id in `siwa.ssf_events`.
        public var event: Int
        /// What became of the SET.
        public var state: State
        /// The HTTP status answered, nil when none.
        public var status: Int?

        /// What one push left the SET as (the outcome `siwa.record_ssf_attempt` records, but `lost`).
        public enum State: String, Sendable, CaseIterable {
            /// A 202.
            case delivered
            /// A 400 with one of RFC 8935's error codes: never retried.
            case failed
            /// Anything else: pushed again later (dead after the last attempt).
            case retry
            /// The lease was taken over before the record: nothing written.
            case lost
        }
    }

    /// The channel the fan-out and `siwa.set_ssf_stream_status` notify.
    public static let channel = "siwa_ssf"
    /// RFC 8935 § 2.4's error codes: a 400 carrying one of them is not retried.
    public static let permanentErrors: Set<String> = [
        "invalid_request", "invalid_key", "invalid_issuer", "invalid_audience", "authentication_failed",
        "access_denied",
    ]

    /// The settings.
    public let configuration: Configuration
    /// The lanes (``Configuration/concurrency``), on `siwa_ssf`.
    public let lanes: OutboxLanes
    var logger: Logger { lanes.logger }
    /// One per lane: each keeps its connection to the receivers open between pushes.
    private let sessions: [OutboundHTTP.Session]

    /// A dispatcher.
    public init(configuration: Configuration, logger: Logger) {
        self.configuration = configuration
        lanes = OutboxLanes(
            name: "shared signals", channel: Self.channel, database: configuration.calls.database,
            count: configuration.calls.concurrency,
            pollInterval: min(configuration.calls.pollInterval, .milliseconds(500)),
            logger: logger)
        let client = OutboundHTTP.Client(
            policy: OutboundHTTP.Policy(
                timeout: configuration.calls.timeout, maxResponseBodyBytes: 16 << 10,
                allowsPlainHTTPToLoopback: true,
                userAgent: "siwa-notifications-ssf"),
            environment: configuration.calls.environment)
        sessions = (0..<configuration.calls.concurrency).map { _ in OutboundHTTP.Session(client: client) }
    }

    /// Leases up to ``Configuration/batchSize`` due SETs to the lane (`siwa.claim_ssf_events`).
    public func claim(on connection: PostgresConnection, lane: OutboxLane, dueBy _: Date) throws
        -> OutboxClaim<ClaimedSET>
    {
        let events = try connection.rows(
            ClaimedSET.self,
            [
                .text(lane.owner), .double(configuration.lease.inSeconds),
                .int(Int64(configuration.calls.batchSize)),
            ])
        return events.isEmpty ? .nothing : .leased(events)
    }

    public func failed(_ push: Push) -> Bool { push.failure != nil }

    /// How soon to look again: shortly when a due head nobody holds is not claimable (its stream is at
    /// max_in_flight, or another lane holds its row); else when the next event of an enabled push
    /// stream is due (a poll stream's pending SETs are the API's, never a reason to wake).
    public func nextDue(on connection: PostgresConnection, lane: OutboxLane) throws -> Duration? {
        if try connection.value(SignalQueries.saturated, as: Bool.self) { return OutboxLanes.saturatedWait }
        return try connection.value(SignalQueries.nextDue, as: Double?.self).map { .untilDue(seconds: $0) }
    }

    /// Records the pushes and releases `unsent` in one statement (`siwa.record_ssf_attempts`), each if its
    /// lease is still the lane's.
    public func record(
        _ pushes: [Push], unsent: [ClaimedSET], lane: OutboxLane, on connection: PostgresConnection
    )
        throws -> [Outcome]
    {
        let rows =
            pushes.map { ($0.event.id, $0.outcome.rawValue, $0.status, $0.failure) }
            + unsent.map { ($0.id, "released", Int?.none, String?.none) }
        let recorded = Set(
            try connection.query(
                SignalQueries.recordAttempts,
                [
                    .text(lane.owner), .array(rows.map { .int(Int64($0.0)) }),
                    .array(rows.map { .text($0.1) }),
                    .array(rows.map { $0.2.map { .int(Int64($0)) } }),
                    .array(rows.map { $0.3.map { .text(String($0.prefix(300))) } }),
                    .int(Int64(configuration.maxAttempts)),
                    .double(configuration.calls.retrySchedule.base.inSeconds),
                    .double(configuration.calls.retrySchedule.maximum.inSeconds),
                ]
            ).map { row throws(PostgresError) in try row[0, as: Int.self] })
        return pushes.map { report($0, recorded: recorded.contains($0.event.id)) }
    }

    /// What one push came to.
    public struct Push {
        var event: ClaimedSET
        var status: Int?
        var failure: String?
        var permanent: Bool
        var outcome: Outcome.State { failure == nil ? .delivered : permanent ? .failed : .retry }
    }

    /// Signs and POSTs one claimed SET on the lane's session.
    public func call(_ event: ClaimedSET, lane: OutboxLane, on _: PostgresConnection) -> Push {
        var status: Int?
        var failure: String?
        var permanent = false
        do {
            let token = try event.event.sign(
                with: configuration.key, issuer: configuration.issuer, audience: event.audience)
            var headers: [OutboundHTTP.Header] = [
                .init("Content-Type", SecurityEventToken.mediaType), .init("Accept", "application/json"),
            ]
            if let reference = event.authorizationReference {
                headers.append(.init("Authorization", try Self.authorization(reference)))
            }
            let request = OutboundHTTP.Request(
                method: "POST", url: event.endpointURL, headers: headers, body: Array(token.utf8))
            do {
                let response = try sessions[lane.index % sessions.count].perform(request)
                status = response.status
                if response.status != 202 {
                    let code = Self.errorCode(response)
                    permanent = response.status == 400 && code.map(Self.permanentErrors.contains) == true
                    failure = "HTTP \(response.status)" + (code.map { " err=\($0)" } ?? "")
                }
            } catch {
                failure = "\(error.code): \(error.description)"
            }
        } catch {
            failure = (error as? ToolError)?.message ?? "cannot sign the SET"
        }
        return Push(event: event, status: status, failure: failure, permanent: permanent)
    }

    /// Logs one push (or one whose lease was lost); its outcome.
    private func report(_ push: Push, recorded: Bool) -> Outcome {
        let event = push.event
        guard recorded else {
            logger.warning(
                "ssf push not recorded: its lease expired and another lane took the event over",
                ["event": .int(event.id), "stream": .int(event.stream)])
            return Outcome(event: event.id, state: .lost, status: push.status)
        }
        if let failure = push.failure {
            logger.warning(
                push.permanent ? "ssf push refused for good" : "ssf push failed; will retry",
                [
                    "event": .int(event.id), "stream": .int(event.stream), "attempt": .int(event.attempt),
                    "status": push.status.map { .int($0) } ?? .string("none"), "error": .string(failure),
                ])
        }
        return Outcome(event: event.id, state: push.outcome, status: push.status)
    }

    /// A failure of our own making, in words that never hold a secret.
    struct ToolError: Error {
        var message: String
    }

    /// The Authorization header's value from its `file:PATH` reference (the file's first line).
    static func authorization(_ reference: String) throws -> String {
        guard reference.hasPrefix("file:"),
            let text = try? String(contentsOfFile: String(reference.dropFirst(5)), encoding: .utf8),
            let line = text.split(whereSeparator: \.isNewline).first, !line.isEmpty
        else { throw ToolError(message: "cannot read the authorization header's file (\(reference))") }
        return String(line)
    }

    /// The `err` member of an RFC 8935 error answer, when it is one (a JSON object, `err` a short token).
    static func errorCode(_ response: OutboundHTTP.Response) -> String? {
        guard let object = try? JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any],
            let code = object["err"] as? String, code.count <= 64,
            code.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "_") })
        else { return nil }
        return code
    }
}

/// One event `siwa.claim_ssf_events` leased: what its SET says and where it goes.
public struct ClaimedSET: PostgresRowDecodable, Sendable {
    var id: Int
    var stream: Int
    var event: StoredEvent
    var attempt: Int
    var audience: String
    var endpointURL: String
    var authorizationReference: String?

    public static let statement = """
        SELECT id, stream_id, jti, issued_at, change_type, sub, old_sub, event_time, txn, attempts, audience,
               endpoint_url, authorization_ref, detail::text AS detail
          FROM siwa.claim_ssf_events($1, $2::float8 * interval '1 second', $3::integer)
        """
    public static let columns: PostgresColumns = """
        id bigint, stream_id bigint, jti text, issued_at timestamp with time zone, change_type text, sub text, \
        old_sub text, event_time timestamp with time zone, txn text, attempts integer, audience text, \
        endpoint_url text, authorization_ref text, detail text
        """

    public init(row: PostgresRow) throws(PostgresError) {
        id = try row[0, as: Int.self]
        stream = try row[1, as: Int.self]
        event = StoredEvent(
            changeType: try row[4, as: String.self], subject: try row[5, as: String.self],
            previousSubject: try row[6, as: String?.self], eventTime: try row[7, as: Date.self],
            notificationJTI: try row[8, as: String.self],
            detail: StoredEvent.detail(fromJSON: try row[13, as: String?.self]),
            jti: try row[2, as: String.self],
            issuedAt: try row[3, as: Date.self])
        attempt = try row[9, as: Int.self]
        audience = try row[10, as: String.self]
        endpointURL = try row[11, as: String.self]
        authorizationReference = try row[12, as: String?.self]
    }
}
