public import AppleID
public import Foundation
public import Postgres
public import QueueConsumer
public import ServiceSupport
import Synchronization
public import TokenVault

/// The revocation outbox's consumer: claims due requests made by `siwa.request_revocation`
/// (`siwa.claim_revocation`: a committed lease, so several workers share the work and none holds a
/// lock), decrypts the user's stored refresh tokens, calls Apple's `/auth/revoke` for each with no
/// transaction open, then records the outcome in the ledger (`siwa.revocation_ledger`) with
/// `siwa.record_revocation`, which destroys exactly the ciphertexts Apple accepted (a token row that
/// changed meanwhile keeps its new token). Only the tokens stored when the request was made are
/// revoked (a later sign-in's token is not the deleted account's). Retryable failures (5xx, 429,
/// timeouts, no connection) are retried with exponential backoff and jitter; a token it cannot revoke
/// (Apple refused it, it does not decrypt, no client is configured for it) is recorded per token and
/// the others are still revoked: the request ends `revoked` (all), `partially_revoked` or `failed`
/// (none); a user without a stored token ends as `no_token`; a token row held by another transaction
/// at record time puts the request off (`busy`) instead of waiting for it.
///
/// The claim counts the attempt and leases the request for its calls' deadlines plus a margin
/// (``CallLease``). If the process dies during the call or after Apple's 200 but before the record, the
/// lease expires within seconds of the call's deadline and the next claim takes the request over
/// (exactly one claimer does): Apple answers 200 for a token already revoked, so the second revoke is
/// harmless, and the ledger ends complete; Apple's echo, arriving meanwhile, is matched already.
/// A request whose calls stop the process every time ends `failed` at the claim after
/// ``Configuration/maxCrashes`` such take-overs, instead of being claimed after every lease.
public final class Revoker: Outbox {
    /// The revoker's settings.
    public struct Configuration: Sendable {
        /// The database (the role needs `siwa_worker`).
        public var database: PostgresConfiguration
        /// One client per client ID tokens were issued to.
        public var clients: [String: AppleIDClient]
        /// Decrypts stored refresh tokens (any key of the key file).
        public var cipher: TokenCipher
        /// Look for due requests at least this often (a NOTIFY from `siwa.request_revocation` wakes it sooner).
        public var pollInterval: Duration
        /// First retry delay; doubles per attempt, with jitter, at most ``maxRetryDelay``.
        public var retryBaseDelay: Duration
        /// The longest retry delay.
        public var maxRetryDelay: Duration
        /// The retries' delays: ``retryBaseDelay`` doubling to ``maxRetryDelay``, with jitter.
        public var retrySchedule: RetrySchedule {
            RetrySchedule(base: retryBaseDelay, maximum: maxRetryDelay)
        }
        /// Attempts before a request whose failures were all retryable ends as `failed`.
        public var maxAttempts: Int
        /// Leases that ran out unrecorded (the worker stopped during the call) before a request ends as
        /// `failed`, and in a row before a token's refresh checks stop (`worker_stopped`).
        public var maxCrashes: Int
        /// When set, each stored refresh token is refreshed at Apple at most once per this interval,
        /// never less than ``Revoker/minimumRefreshCheckInterval`` (a day: a shorter one given is raised
        /// to it, and ``requestedRefreshCheckInterval`` keeps what was asked); `invalid_grant` records a
        /// consent-revoked of our own. Nil: off.
        public var refreshCheckInterval: Duration?
        /// The interval given when it was below ``Revoker/minimumRefreshCheckInterval`` and raised (the
        /// revoker warns about it at start); nil otherwise.
        public var requestedRefreshCheckInterval: Duration?
        /// How long a claimed request stays leased per token, and a refresh check per token: the
        /// longest deadline of the clients' calls plus ``CallLease/margin`` (``CallLease``). A lease still
        /// held after that is taken over by another revoker.
        public var lease: Duration {
            CallLease.covering(clients.values.map(\.configuration.timeout).max() ?? .seconds(10))
        }

        /// The defaults of the settings (siwa-worker's flags show and use these).
        public static let defaultPollInterval: Duration = .seconds(5)
        public static let defaultRetryBaseDelay: Duration = .seconds(5)
        public static let defaultMaxRetryDelay: Duration = .seconds(3600)
        public static let defaultMaxAttempts = 20
        public static let defaultMaxCrashes = 5

        /// Settings; `clients` must not be empty.
        public init(
            database: PostgresConfiguration, clients: [String: AppleIDClient], cipher: TokenCipher,
            pollInterval: Duration = Configuration.defaultPollInterval,
            retryBaseDelay: Duration = Configuration.defaultRetryBaseDelay,
            maxRetryDelay: Duration = Configuration.defaultMaxRetryDelay,
            maxAttempts: Int = Configuration.defaultMaxAttempts,
            maxCrashes: Int = Configuration.defaultMaxCrashes,
            refreshCheckInterval: Duration? = nil
        ) throws {
            if let refreshCheckInterval, refreshCheckInterval <= .zero {
                throw ConfigurationError("the refresh-check interval must be positive")
            }
            self.refreshCheckInterval = refreshCheckInterval.map(Revoker.pacedRefreshCheckInterval)
            if let refreshCheckInterval, refreshCheckInterval < Revoker.minimumRefreshCheckInterval {
                requestedRefreshCheckInterval = refreshCheckInterval
            }
            guard !clients.isEmpty else {
                throw ConfigurationError("the revoker needs at least one client ID")
            }
            guard pollInterval > .zero, retryBaseDelay > .zero, maxRetryDelay >= retryBaseDelay,
                maxAttempts > 0, maxCrashes > 0
            else { throw ConfigurationError("the revoker's intervals and attempts must be positive") }
            self.database = database
            self.clients = clients
            self.cipher = cipher
            self.pollInterval = pollInterval
            self.retryBaseDelay = retryBaseDelay
            self.maxRetryDelay = maxRetryDelay
            self.maxAttempts = maxAttempts
            self.maxCrashes = maxCrashes
        }
    }

    /// What one handled request ended as.
    public struct Outcome: Sendable, Equatable {
        /// The request's id.
        public var id: Int
        /// `revoked`, `partially_revoked` (some tokens could not be revoked: the ledger's
        /// `token_outcomes` says which and why), `no_token`, `failed`, `retry`, `busy` (a token row was
        /// held by another transaction: put off), or `lost` (the lease expired and another revoker took
        /// the request over).
        public var state: String
        /// An outcome.
        public init(id: Int, state: String) {
            self.id = id
            self.state = state
        }
    }

    /// The settings.
    public let configuration: Configuration
    /// One lane, `revoker` (its lease owner's last part), on `siwa_revocations`.
    public let lanes: OutboxLanes
    var logger: Logger { lanes.logger }
    private let outcomes: MetricsRegistry?

    /// A revoker; `metrics`, when given, gets `siwa_revocations_total{outcome}`.
    public init(configuration: Configuration, logger: Logger, metrics: MetricsRegistry? = nil) {
        self.configuration = configuration
        lanes = OutboxLanes(
            name: "revoker", channel: Self.channel, database: configuration.database, lanes: ["revoker"],
            pollInterval: min(configuration.pollInterval, .seconds(1)), logger: logger)
        self.outcomes = metrics
    }

    /// The channel `siwa.request_revocation` notifies.
    public static let channel = "siwa_revocations"

    /// The shortest refresh-check interval: a day. Apple allows verifying a refresh token "up to once a
    /// day" and may throttle more frequent calls, which the revoker's revocations would share.
    public static let minimumRefreshCheckInterval: Duration = .seconds(86400)

    /// How often refresh-check passes run at most; each checks at most ``refreshCheckPassSize`` tokens.
    public static let refreshCheckPassInterval: Duration = .seconds(60)

    /// The most tokens one refresh-check pass checks.
    public static let refreshCheckPassSize = 100

    /// `interval`, or ``minimumRefreshCheckInterval`` when it is shorter: the one rule for the pacing.
    public static func pacedRefreshCheckInterval(_ interval: Duration) -> Duration {
        max(interval, minimumRefreshCheckInterval)
    }

    /// Warns when the refresh-check interval asked for was raised to a day.
    public func starting() {
        guard let requested = configuration.requestedRefreshCheckInterval else { return }
        logger.warning(
            "refresh check: --refresh-check-interval \(Int(requested.inSeconds)) s is below Apple's once a day; using \(Int(Self.minimumRefreshCheckInterval.inSeconds)) s",
            [
                "requested_seconds": .double(requested.inSeconds),
                "interval_seconds": .double(Self.minimumRefreshCheckInterval.inSeconds),
            ])
    }

    /// Its periodic tasks: sign-in code pruning, and the refresh checks when on (each token at most once
    /// per interval, a day or more, in passes at most once a minute, between revocations).
    public var maintenance: [PeriodicTask<PostgresConnection>] {
        var tasks = [signInCodePruning]
        if let interval = configuration.refreshCheckInterval {
            tasks.append(refreshCheckPass(interval: Self.pacedRefreshCheckInterval(interval)))
        }
        return tasks
    }

    /// The revocations due by `dueBy`, one request after another on `connection` (between refresh checks).
    func drain(on connection: PostgresConnection) throws -> [Outcome] {
        try lanes.drain(self, lane: lanes.lanes[0], on: connection).outcomes
    }

    /// Leases the first due request with the user's stored refresh tokens (`siwa.claim_revocation`); a
    /// request the claim ended (no token, too many crashes) comes back ended.
    public func claim(on connection: PostgresConnection, lane: OutboxLane, dueBy: Date) throws
        -> OutboxClaim<ClaimedRevocation>
    {
        let rows = try connection.rows(
            RevocationClaim.self,
            [
                .text(lane.owner), .double(configuration.lease.inSeconds), .date(dueBy),
                .int(Int64(configuration.maxCrashes)),
            ])
        return rows.isEmpty ? .nothing : .leased([ClaimedRevocation(rows: rows)])
    }

    /// Nothing but the poll interval and NOTIFY wakes the revoker (a retry is due within it).
    public func nextDue(on connection: PostgresConnection, lane: OutboxLane) throws -> Duration? { nil }

    /// What one token became in an attempt, when it was not revoked.
    struct NotRevoked {
        var id: Int
        /// `undecryptable`, `not_service_format`, `no_client`, `refused`, `apple_unavailable`.
        var outcome: String
        var detail: String
    }

    /// What the calls for one request came to, as `siwa.record_revocation` takes it.
    public struct Attempt {
        var request: ClaimedRevocation
        var revoked: [(id: Int, ciphertext: Data)] = []
        var notRevoked: [NotRevoked] = []
        /// `retry`, `revoked` or `failed` (the record decides between revoked and partially_revoked).
        var state = "revoked"
        /// Apple's answer that decided it, when one did.
        var answer: String?
        var error: String?
    }

    /// Calls Apple's `/auth/revoke` for each of the request's tokens, with no transaction open. A token
    /// it cannot revoke (no client, undecryptable, refused by Apple) is recorded as such and the others
    /// are still revoked; a retryable failure at Apple stops the attempt (Apple is unavailable), to be
    /// retried while attempts remain.
    public func call(_ request: ClaimedRevocation, lane: OutboxLane, on _: PostgresConnection) -> Attempt {
        var attempt = Attempt(request: request)
        guard request.outcome == "claimed" else { return attempt }
        var unhandled: [Int] = []
        var refusal: String?
        var unavailable: (answer: String, error: String)?
        for claimed in request.rows {
            guard let token = claimed.token else { continue }
            if unavailable != nil {
                unhandled.append(token.id)
                continue
            }
            guard let clientID = token.resolvedClientID(among: configuration.clients),
                let client = configuration.clients[clientID]
            else {
                attempt.notRevoked.append(
                    NotRevoked(
                        id: token.id, outcome: "no_client",
                        detail: "no Apple client is configured for the token's client ID"))
                continue
            }
            let plain: String
            do {
                plain = try token.decrypt(with: configuration.cipher, clientID: clientID)
            } catch {
                attempt.notRevoked.append(
                    claimed.serviceFormat
                        ? NotRevoked(
                            id: token.id, outcome: "undecryptable",
                            detail: "cannot decrypt the stored token: \(error.description)")
                        : NotRevoked(
                            id: token.id, outcome: "not_service_format",
                            detail:
                                "the row is not in the service's format (the app stored it) and does not decrypt: "
                                + error.description))
                continue
            }
            do {
                try client.revoke(token: plain, hint: .refreshToken)
            } catch {
                let answer = error.status.map { "\(error.code) (HTTP \($0))" } ?? error.code.rawValue
                if error.isRetryable {
                    unavailable = (answer, error.description)
                    unhandled.append(token.id)
                } else {
                    refusal = answer
                    attempt.notRevoked.append(
                        NotRevoked(id: token.id, outcome: "refused", detail: error.description))
                }
                continue
            }
            attempt.revoked.append((token.id, token.ciphertext))
        }
        // The verdict: retry while Apple is unavailable and attempts remain; otherwise final, and
        // siwa.record_revocation ends the request revoked, partially_revoked or failed from the outcomes.
        let retry = unavailable != nil && request.attempt < configuration.maxAttempts
        attempt.state = retry ? "retry" : unavailable == nil ? "revoked" : "failed"
        if !retry, let unavailable {
            attempt.notRevoked += unhandled.map {
                NotRevoked(id: $0, outcome: "apple_unavailable", detail: unavailable.error)
            }
        }
        attempt.answer = unavailable?.answer ?? refusal
        attempt.error =
            unavailable.map { $0.error }
            ?? attempt.notRevoked.first.map {
                "\(attempt.notRevoked.count) of \(request.rows.count) tokens not revoked; token \($0.id): \($0.outcome): \($0.detail)"
            }
        return attempt
    }

    /// Records the request's attempt with `siwa.record_revocation`, which destroys exactly the ciphertexts
    /// Apple accepted; a request the claim ended is only counted and logged.
    public func record(
        _ attempts: [Attempt], unsent _: [ClaimedRevocation], lane: OutboxLane,
        on connection: PostgresConnection
    ) throws -> [Outcome] {
        try attempts.map { try record($0, lane: lane, on: connection) }
    }

    private func record(_ attempt: Attempt, lane: OutboxLane, on connection: PostgresConnection) throws
        -> Outcome
    {
        let request = attempt.request
        let id = request.id
        guard request.outcome == "claimed" else {
            if ["failed", "partially_revoked"].contains(request.outcome) {
                logger.warning(
                    "revocation ended at its claim without a call; the ledger's last_error says why",
                    ["request": .int(id), "state": .string(request.outcome)])
            }
            return count(Outcome(id: id, state: request.outcome))
        }
        let recorded: String
        do {
            recorded = try connection.value(
                RevocationQueries.record,
                [
                    .int(Int64(id)), .text(lane.owner), .array(attempt.revoked.map { .int(Int64($0.id)) }),
                    .array(attempt.revoked.map { .bytes($0.ciphertext) }), .text(attempt.state),
                    attempt.answer.map { .text($0) }, attempt.error.map { .text(String($0.prefix(500))) },
                    .double(configuration.retrySchedule.delay(afterAttempt: request.attempt).inSeconds),
                    .text(Self.json(attempt.notRevoked)),
                ], as: String.self)
        } catch {
            // Not recorded, but this process lives on: give the request back rather than wait for the
            // lease (the revoke at Apple is repeated, harmlessly).
            if !error.isConnectionError {
                _ = try? connection.query(RevocationQueries.release, [.int(Int64(id)), .text(lane.owner)])
            }
            throw error as any Error
        }
        let fields: [String: Logger.Value] = ["request": .int(id), "attempt": .int(request.attempt)]
        switch recorded {
        case "revoked":
            logger.info(
                "revoked a user's Apple tokens", ["request": .int(id), "tokens": .int(attempt.revoked.count)])
        case "partially_revoked":
            logger.warning(
                "revoked some of a user's Apple tokens; the others are recorded in the ledger",
                [
                    "request": .int(id), "tokens": .int(attempt.revoked.count),
                    "not_revoked": .int(attempt.notRevoked.count),
                ])
        case "busy":
            logger.info("revocation put off: another transaction holds one of the user's token rows", fields)
        case "lost":
            logger.warning(
                "revocation not recorded: its lease expired and another revoker took the request over", fields
            )
        default:
            logger.warning(
                attempt.state == "retry" ? "revocation failed; will retry" : "revocation failed for good",
                fields.merging(
                    ["error": .string(attempt.answer ?? attempt.notRevoked.first?.outcome ?? "local")]) { $1 }
            )
        }
        return count(Outcome(id: id, state: recorded))
    }

    /// The tokens not revoked as `siwa.record_revocation` takes them: [{id, outcome, detail}].
    static func json(_ notRevoked: [NotRevoked]) -> String {
        let objects = notRevoked.map {
            ["id": $0.id, "outcome": $0.outcome, "detail": $0.detail] as [String: Any]
        }
        let data =
            (try? JSONSerialization.data(withJSONObject: objects, options: [.sortedKeys])) ?? Data("[]".utf8)
        return String(decoding: data, as: UTF8.self)
    }

    private func count(_ outcome: Outcome) -> Outcome {
        outcomes?.counter(
            "siwa_revocations_total", help: "Revocation requests handled, by outcome.",
            labels: [("outcome", outcome.state)]
        ).increment()
        return outcome
    }
}

/// A revocation request as `siwa.claim_revocation` leased it, with the user's stored refresh tokens, or
/// as the claim ended it.
public struct ClaimedRevocation: Sendable {
    let rows: [RevocationClaim]
    /// The request's id.
    public var id: Int { rows[0].requestID }
    /// `claimed`, or the state the claim ended the request in.
    var outcome: String { rows[0].outcome }
    /// The attempt the claim counted.
    var attempt: Int { rows[0].attempt }
}
