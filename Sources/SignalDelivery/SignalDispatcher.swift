import Foundation
import HTTPClient
public import Postgres
import QueueConsumer
public import ServiceSupport
public import SharedSignals

/// Pushes the SETs of `siwa.ssf_events` to their streams (RFC 8935), at least once, in change order per
/// stream and subject.
///
/// Each lane is a ``ConsumerLoop`` listening on `siwa_ssf` with its own connection: `siwa.claim_ssf_events`
/// commits leases on up to `batchSize` due events, the lane signs each SET (the jti and iat fixed at
/// fan-out, so every attempt sends the same token) and POSTs them one after another as
/// `application/secevent+jwt` with the stream's Authorization header (read from its file at send time)
/// and no transaction open, then `siwa.record_ssf_attempt` records each outcome, in one transaction, if
/// the lease is still its own (after a failure the rest are released unsent): 202 delivered; 400 with
/// one of RFC 8935's error codes failed for good; anything else retried with backoff, dead after
/// `maxAttempts`. A process killed mid-push leaves its lease to expire; another lane sends the same SET.
public final class SignalDispatcher: Sendable {
    /// The dispatcher's settings.
    public struct Configuration: Sendable {
        /// The database (the role needs `siwa_worker`).
        public var database: PostgresConfiguration
        /// The SETs' `iss`.
        public var issuer: String
        /// The key that signs every SET.
        public var key: SETSigningKey
        /// Lanes: pushes in flight at once from this process.
        public var concurrency: Int
        /// SETs a lane claims at once and pushes one after another (one after a failure).
        public var batchSize: Int
        /// The deadline of one push.
        public var timeout: Duration
        /// First retry delay; doubles per attempt with jitter, at most ``maxRetryDelay``.
        public var retryBaseDelay: Duration
        /// The longest retry delay.
        public var maxRetryDelay: Duration
        /// Attempts before an event is dead.
        public var maxAttempts: Int
        /// Look for due events at least this often (NOTIFY wakes the lanes sooner).
        public var pollInterval: Duration
        /// Where `SSL_CERT_FILE` and `https_proxy`/`no_proxy` are read.
        public var environment: [String: String]
        /// How long a claimed event stays leased: the push's deadline plus ``CallLease/margin``, and
        /// ``CallLease/batchWindow`` when a lane claims batches.
        public var lease: Duration {
            batchSize > 1 ? CallLease.covering(batchOf: timeout) : CallLease.covering(timeout)
        }

        /// Settings; durations positive, `concurrency` and `maxAttempts` at least 1.
        public init(
            database: PostgresConfiguration, issuer: String, key: SETSigningKey, concurrency: Int = 4,
            batchSize: Int = 8, timeout: Duration = .seconds(10), retryBaseDelay: Duration = .seconds(5),
            maxRetryDelay: Duration = .seconds(3600), maxAttempts: Int = 30,
            pollInterval: Duration = .seconds(1),
            environment: [String: String] = [:]
        ) throws {
            guard concurrency >= 1, (1...1000).contains(batchSize), maxAttempts >= 1, timeout > .zero,
                retryBaseDelay > .zero,
                maxRetryDelay >= retryBaseDelay, pollInterval > .zero, !issuer.isEmpty
            else {
                throw ConfigurationError(
                    "the Shared Signals settings must be positive (max delay ≥ base delay, a batch of 1 to 1,000)"
                )
            }
            self.database = database
            self.issuer = issuer
            self.key = key
            self.concurrency = concurrency
            self.batchSize = batchSize
            self.timeout = timeout
            self.retryBaseDelay = retryBaseDelay
            self.maxRetryDelay = maxRetryDelay
            self.maxAttempts = maxAttempts
            self.pollInterval = pollInterval
            self.environment = environment
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

    public let configuration: Configuration
    let logger: Logger
    private let stopSignal = StopSignal()
    private let sessions: [OutboundHTTP.Session]
    private let owner = "\(ProcessInfo.processInfo.hostName):\(getpid()):\(UUID().uuidString.prefix(8))"

    public init(configuration: Configuration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
        let client = OutboundHTTP.Client(
            policy: OutboundHTTP.Policy(
                timeout: configuration.timeout, maxResponseBodyBytes: 16 << 10,
                allowsPlainHTTPToLoopback: true,
                userAgent: "siwa-notifications-ssf"),
            environment: configuration.environment)
        sessions = (0..<configuration.concurrency).map { _ in OutboundHTTP.Session(client: client) }
    }

    /// Runs every lane until ``stop()``; each finishes the push in hand.
    public func run() {
        logger.info("shared signals started", ["concurrency": .int(configuration.concurrency)])
        let lanes = (0..<configuration.concurrency).map { index in
            JoinableThread(name: "siwa-ssf-\(index)") { [self] in runLane(index) }
        }
        for lane in lanes { lane.join() }
        logger.info("shared signals stopped")
    }

    /// Asks ``run()`` to return once the pushes in hand are recorded. Safe from any thread.
    /// How soon a lane looks again when a due event's stream is at its cap or being claimed by another
    /// lane (the lanes holding it claim their next event themselves).
    static let saturatedWait: Duration = .milliseconds(100)

    public func stop() { stopSignal.stop() }

    /// Pushes every event due now, one after another on one connection; returns the outcomes.
    public func drainOnce() throws -> [Outcome] {
        let connection = try PostgresConnection(configuration: configuration.database)
        defer { connection.close() }
        var outcomes: [Outcome] = []
        _ = try drain(on: connection, lane: 0, into: &outcomes)
        return outcomes
    }

    private func runLane(_ index: Int) {
        var loop = ConsumerLoop.listening(
            on: Self.channel, database: configuration.database,
            state: ConsumerLoopState(pollInterval: min(configuration.pollInterval, .milliseconds(500))),
            stop: stopSignal, logger: logger, failure: "shared signals: database failure; connecting again",
            fields: ["lane": .int(index)]
        ) { [self] connection in
            var outcomes: [Outcome] = []
            return try drain(on: connection, lane: index, into: &outcomes)
        }
        try? loop.run()
    }

    /// Pushes until nothing is claimable; returns how soon the next event of an enabled push stream is due
    /// (a poll stream's pending SETs are the API's, never a reason to wake).
    private func drain(on connection: PostgresConnection, lane: Int, into outcomes: inout [Outcome]) throws
        -> Duration?
    {
        while !stopSignal.isStopped, let batch = try pushBatch(on: connection, lane: lane) {
            outcomes += batch
        }
        // A due head nobody holds, yet no claim: its stream is at max_in_flight or another lane holds its
        // row. Look again shortly, without the scan below (which reads every pending event).
        let saturated = try connection.value(
            """
            SELECT EXISTS (
                SELECT 1 FROM siwa.ssf_streams s
                 WHERE s.status = 'enabled' AND s.delivery_method = 'urn:ietf:rfc:8935'
                   AND (SELECT e.id FROM siwa.ssf_events e
                         WHERE e.stream_id = s.id AND e.state = 'pending' AND e.next_attempt_at <= now()
                           AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= clock_timestamp())
                         ORDER BY e.id LIMIT 1) IS NOT NULL)
            """, as: Bool.self)
        if saturated { return Self.saturatedWait }
        let due = try connection.value(
            """
            SELECT extract(epoch FROM min(CASE WHEN e.lease_expires_at > clock_timestamp() THEN e.lease_expires_at
                                               ELSE e.next_attempt_at END) - clock_timestamp())::float8
              FROM siwa.ssf_events e JOIN siwa.ssf_streams s ON s.id = e.stream_id AND s.status = 'enabled'
                   AND s.delivery_method = 'urn:ietf:rfc:8935'
             WHERE e.state = 'pending'
            """, as: Double?.self)
        return due.map { .milliseconds(max(0, Int64(($0 * 1000).rounded(.up)))) }
    }

    /// One batch: up to ``Configuration/batchSize`` SETs claimed (committed), each signed and POSTed with no
    /// transaction open, one after another, then recorded in one transaction. After a failed push, past
    /// ``CallLease/batchWindow`` or once stopping, the rest are released unsent. Nil: nothing to claim.
    func pushBatch(on connection: PostgresConnection, lane: Int) throws -> [Outcome]? {
        let owner = "\(owner):\(lane)"
        let claimed = ContinuousClock.now
        let events = try connection.rows(
            ClaimedSET.self,
            [.text(owner), .double(configuration.lease.inSeconds), .int(Int64(configuration.batchSize))])
        guard !events.isEmpty else { return nil }
        let (pushes, unsent) = CallLease.callInTurn(
            events, claimed: claimed, isStopping: { stopSignal.isStopped }, call: { push($0, lane: lane) },
            failed: { $0.failure != nil })
        return try connection.transaction { connection in
            for event in unsent { _ = try record(event.id, owner: owner, push: nil, on: connection) }
            return try pushes.map { push in
                try report(push, recorded: record(push.event.id, owner: owner, push: push, on: connection))
            }
        }
    }

    /// What one push came to.
    private struct Push {
        var event: ClaimedSET
        var status: Int?
        var failure: String?
        var permanent: Bool
        var outcome: Outcome.State { failure == nil ? .delivered : permanent ? .failed : .retry }
    }

    /// Signs and POSTs one claimed SET.
    private func push(_ event: ClaimedSET, lane: Int) -> Push {
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
                let response = try sessions[lane % sessions.count].perform(request)
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

    /// Records a push (or, with none, the release of `id` unsent); whether the lease was still this lane's.
    private func record(_ id: Int, owner: String, push: Push?, on connection: PostgresConnection) throws
        -> Bool
    {
        try connection.value(
            """
            SELECT siwa.record_ssf_attempt($1, $2, $3, $4::integer, $5, $6::integer,
                                           $7::float8 * interval '1 second', $8::float8 * interval '1 second')
            """,
            [
                .int(Int64(id)), .text(owner), .text(push?.outcome.rawValue ?? "released"),
                push?.status.map { .int(Int64($0)) }, push?.failure.map { .text(String($0.prefix(300))) },
                .int(Int64(configuration.maxAttempts)), .double(configuration.retryBaseDelay.inSeconds),
                .double(configuration.maxRetryDelay.inSeconds),
            ], as: Bool.self)
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
struct ClaimedSET: PostgresRowDecodable {
    var id: Int
    var stream: Int
    var event: StoredEvent
    var attempt: Int
    var audience: String
    var endpointURL: String
    var authorizationReference: String?

    static let statement = """
        SELECT id, stream_id, jti, issued_at, change_type, sub, old_sub, event_time, txn, attempts, audience,
               endpoint_url, authorization_ref, detail::text AS detail
          FROM siwa.claim_ssf_events($1, $2::float8 * interval '1 second', $3::integer)
        """
    static let columns: PostgresColumns = """
        id bigint, stream_id bigint, jti text, issued_at timestamp with time zone, change_type text, sub text, \
        old_sub text, event_time timestamp with time zone, txn text, attempts integer, audience text, \
        endpoint_url text, authorization_ref text, detail text
        """

    init(row: PostgresRow) throws(PostgresError) {
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
