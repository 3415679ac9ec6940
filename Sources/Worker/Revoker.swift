import AppleID
import Foundation
import Postgres
import ServiceSupport
import Synchronization
import TokenVault

/// The revocation outbox's consumer: claims due requests made by `siwa.request_revocation`
/// (`siwa.claim_revocation`: a committed lease, so several workers share the work and none holds a
/// lock), decrypts the user's stored refresh tokens, calls Apple's `/auth/revoke` for each with no
/// transaction open, then records the outcome in the ledger (`siwa.revocation_ledger`) with
/// `siwa.record_revocation`, which destroys exactly the ciphertexts Apple accepted (a token row that
/// changed meanwhile keeps its new token). Retryable failures (5xx, 429, timeouts, no connection) are
/// retried with exponential backoff and jitter; Apple's refusals and undecryptable tokens end as
/// `failed`; a user without a stored token ends as `no_token`; a token row held by another transaction
/// at record time puts the request off (`busy`) instead of waiting for it.
///
/// If the process dies after Apple's 200 but before the record, the lease expires and the next claim
/// takes the request over (exactly one claimer does): Apple answers 200 for a token already revoked, so
/// the second revoke is harmless, and the ledger ends complete.
public final class Revoker: Sendable {
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
        /// Attempts before a request whose failures were all retryable ends as `failed`.
        public var maxAttempts: Int
        /// When set, each stored refresh token is refreshed at Apple at most once per this interval (a
        /// day is the intended value); `invalid_grant` records a consent-revoked of our own. Nil: off.
        public var refreshCheckInterval: Duration?
        /// How long a claimed request stays leased: longer than its calls to Apple can take. A lease still
        /// held after that is taken over by another revoker.
        public var lease: Duration

        /// Settings; `clients` must not be empty.
        public init(
            database: PostgresConfiguration, clients: [String: AppleIDClient], cipher: TokenCipher,
            pollInterval: Duration = .seconds(5), retryBaseDelay: Duration = .seconds(5),
            maxRetryDelay: Duration = .seconds(3600), maxAttempts: Int = 20,
            refreshCheckInterval: Duration? = nil, lease: Duration = .seconds(300)
        ) throws {
            if let refreshCheckInterval, refreshCheckInterval <= .zero {
                throw ConfigurationError("the refresh-check interval must be positive")
            }
            self.refreshCheckInterval = refreshCheckInterval
            guard !clients.isEmpty else {
                throw ConfigurationError("the revoker needs at least one client ID")
            }
            guard pollInterval > .zero, retryBaseDelay > .zero, maxRetryDelay >= retryBaseDelay,
                maxAttempts > 0, lease > .zero
            else { throw ConfigurationError("the revoker's intervals and attempts must be positive") }
            self.database = database
            self.clients = clients
            self.cipher = cipher
            self.pollInterval = pollInterval
            self.retryBaseDelay = retryBaseDelay
            self.maxRetryDelay = maxRetryDelay
            self.maxAttempts = maxAttempts
            self.lease = lease
        }
    }

    /// What one handled request ended as.
    public struct Outcome: Sendable, Equatable {
        /// The request's id.
        public var id: Int
        /// `revoked`, `no_token`, `failed`, `retry`, `busy` (a token row was held by another transaction:
        /// put off), or `lost` (the lease expired and another revoker took the request over).
        public var state: String
        /// An outcome.
        public init(id: Int, state: String) {
            self.id = id
            self.state = state
        }
    }

    /// The settings.
    public let configuration: Configuration
    private let logger: Logger
    private let stopSignal = StopSignal()
    private let outcomes: MetricsRegistry?
    /// This revoker's lease owner: host, process and a random part.
    private let owner =
        "\(ProcessInfo.processInfo.hostName):\(getpid()):\(UUID().uuidString.prefix(8)):revoker"

    /// A revoker; `metrics`, when given, gets `siwa_revocations_total{outcome}`.
    public init(configuration: Configuration, logger: Logger, metrics: MetricsRegistry? = nil) {
        self.configuration = configuration
        self.logger = logger
        self.outcomes = metrics
    }

    /// The channel `siwa.request_revocation` notifies.
    public static let channel = "siwa_revocations"

    /// Handles due requests until ``stop()`` (a ``ConsumerLoop``); reconnects after a database failure.
    public func run() {
        logger.info("revoker started", ["clients": .int(configuration.clients.count)])
        var prune = Every(.seconds(3600))
        // Refresh checks: a pass at most once a minute (or per interval, if shorter), each checking the
        // tokens due, 100 at most, between revocation requests.
        var check = configuration.refreshCheckInterval.map { Every(min($0, .seconds(60))) }
        var loop = ConsumerLoop.listening(
            on: Self.channel, database: configuration.database,
            state: ConsumerLoopState(pollInterval: min(configuration.pollInterval, .seconds(1))),
            stop: stopSignal, logger: logger, failure: "revoker: database failure; reconnecting"
        ) { [self] connection in
            _ = try drain(on: connection)
            if prune.take(now: .now) { _ = try pruneSignInCodes(on: connection) }
            if let interval = configuration.refreshCheckInterval, check?.take(now: .now) == true {
                var checked = 0
                while checked < 100, !stopSignal.isStopped,
                    try checkOne(on: connection, interval: interval) != nil
                {
                    checked += 1
                    _ = try drain(on: connection)  // revocations first
                }
            }
            return [prune.remaining(now: .now), check?.remaining(now: .now)].compactMap { $0 }.min()
        }
        try? loop.run()
        logger.info("revoker stopped")
    }

    /// Asks ``run()`` to return after the request in hand; wakes it at once if it waits.
    public func stop() { stopSignal.stop() }

    /// Handles every request due now (not what this drain schedules for later); returns what each ended
    /// as.
    public func drainOnce() throws -> [Outcome] {
        let connection = try PostgresConnection(configuration: configuration.database)
        defer { connection.close() }
        return try drain(on: connection)
    }

    /// One drain: the requests due by its start, one claim after another.
    private func drain(on connection: PostgresConnection) throws -> [Outcome] {
        let start = try connection.query("SELECT now()")[0][0, as: Date.self]
        var handled: [Outcome] = []
        while !stopSignal.isStopped, let outcome = try handleOne(on: connection, dueBy: start) {
            handled.append(outcome)
        }
        return handled
    }

    /// Forgets sign-in codes claimed over a day ago (done, or left `exchanging` by a process that died):
    /// Apple's codes expire after five minutes, so none of them can be exchanged again. Returns how many.
    @discardableResult
    public func pruneSignInCodes(olderThan age: Duration = .seconds(86400)) throws -> Int {
        let connection = try PostgresConnection(configuration: configuration.database)
        defer { connection.close() }
        return try pruneSignInCodes(on: connection, olderThan: age)
    }

    func pruneSignInCodes(on connection: PostgresConnection, olderThan age: Duration = .seconds(86400)) throws
        -> Int
    {
        try connection.query(
            "SELECT siwa.prune_sign_in_codes($1::float8 * interval '1 second')", [.double(age.inSeconds)]
        )[0][0, as: Int.self]
    }

    /// What one refresh check found.
    public struct CheckOutcome: Sendable, Equatable {
        /// The token's row (`siwa.refresh_tokens.id`).
        public var tokenID: Int
        /// `valid`, `invalid_grant` (consent gone: a consent-revoked of our own was recorded), or the
        /// failure kind (checked again after the interval).
        public var outcome: String
        /// An outcome.
        public init(tokenID: Int, outcome: String) {
            self.tokenID = tokenID
            self.outcome = outcome
        }
    }

    /// Checks every stored refresh token due for a check (not checked within `interval`), one
    /// transaction each; returns what each check found.
    public func checkRefreshTokensOnce(interval: Duration) throws -> [CheckOutcome] {
        let connection = try PostgresConnection(configuration: configuration.database)
        defer { connection.close() }
        var checked: [CheckOutcome] = []
        while let outcome = try checkOne(on: connection, interval: interval) { checked.append(outcome) }
        return checked
    }

    /// Refreshes one due token at Apple (claimed and committed first: no lock is held during the call);
    /// nil when none is due.
    func checkOne(on connection: PostgresConnection, interval: Duration) throws -> CheckOutcome? {
        guard
            let row = try connection.query(
                """
                SELECT token_id, sub, client_id, token_ciphertext
                  FROM siwa.claim_refresh_check($1::float8 * interval '1 second')
                """, [.double(interval.inSeconds)]
            ).first
        else { return nil }
        let tokenID = try row[0, as: Int.self]
        let sub = try row[1, as: String.self]
        let storedClient = try row[2, as: String?.self]
        let ciphertext = try row[3, as: Data.self]
        var outcome = "valid"
        if let clientID = storedClient
            ?? (configuration.clients.count == 1 ? configuration.clients.keys.first : nil),
            let client = configuration.clients[clientID]
        {
            do {
                let token = try configuration.cipher.decrypt(
                    [UInt8](ciphertext), sub: sub, clientID: clientID)
                _ = try client.refresh(token: token)
            } catch let error as AppleIDError {
                outcome = error.code.rawValue
            } catch {
                outcome = "undecryptable"
            }
        } else {
            outcome = "no_client"
        }
        // invalid_grant: consent is gone; the token is destroyed and a consent-revoked recorded.
        if let jti = try connection.query(
            "SELECT siwa.record_refresh_check($1, $2, $3)",
            [.int(Int64(tokenID)), .bytes(ciphertext), .text(outcome)]
        )[0][0, as: String?.self] {
            logger.warning(
                "refresh check: Apple says consent is gone; recorded consent-revoked",
                ["token": .int(tokenID), "jti": .string(jti)])
        }
        return CheckOutcome(tokenID: tokenID, outcome: outcome)
    }

    /// Claims one due request (a committed lease), calls Apple for each of its tokens with no
    /// transaction open, and records the result; nil when none is due by `dueBy`.
    func handleOne(on connection: PostgresConnection, dueBy: Date) throws -> Outcome? {
        let rows = try connection.query(
            """
            SELECT outcome, request_id, sub, attempt, token_id, client_id, token_ciphertext
              FROM siwa.claim_revocation($1, $2::float8 * interval '1 second', $3)
            """, [.text(owner), .double(configuration.lease.inSeconds), .date(dueBy)])
        guard let request = rows.first else { return nil }
        let id = try request[1, as: Int.self]
        let claimed = try request[0, as: String.self]
        guard claimed == "claimed" else { return record(Outcome(id: id, state: claimed)) }
        let sub = try request[2, as: String.self]
        let attempts = try request[3, as: Int.self]
        var revoked: [(id: Int, ciphertext: Data)] = []
        var failure: (answer: String?, error: String, retryable: Bool)?
        for token in rows {
            let tokenID = try token[4, as: Int.self]
            let storedClient = try token[5, as: String?.self]
            let ciphertext = try token[6, as: Data.self]
            guard
                let clientID = storedClient
                    ?? (configuration.clients.count == 1 ? configuration.clients.keys.first : nil),
                let client = configuration.clients[clientID]
            else {
                failure = (nil, "no Apple client is configured for the token's client ID", false)
                break
            }
            let plain: String
            do {
                plain = try configuration.cipher.decrypt([UInt8](ciphertext), sub: sub, clientID: clientID)
            } catch {
                failure = (nil, "cannot decrypt the stored token: \(error.description)", false)
                break
            }
            do {
                try client.revoke(token: plain, hint: .refreshToken)
            } catch {
                let answer = error.status.map { "\(error.code) (HTTP \($0))" } ?? error.code.rawValue
                failure = (answer, error.description, error.isRetryable)
                break
            }
            revoked.append((tokenID, ciphertext))
        }
        let state =
            failure.map { $0.retryable && attempts < configuration.maxAttempts ? "retry" : "failed" }
            ?? "revoked"
        let recorded: String
        do {
            recorded = try connection.query(
                "SELECT siwa.record_revocation($1, $2, $3::bigint[], $4::bytea[], $5, $6, $7, $8::float8)",
                [
                    .int(Int64(id)), .text(owner), .array(revoked.map { .int(Int64($0.id)) }),
                    .array(revoked.map { .bytes($0.ciphertext) }), .text(state),
                    failure?.answer.map { .text($0) },
                    failure.map { .text(String($0.error.prefix(500))) }, .double(backoff(attempt: attempts)),
                ])[0][0, as: String.self]
        } catch {
            // Not recorded, but this process lives on: give the request back rather than wait for the
            // lease (the revoke at Apple is repeated, harmlessly).
            let lost = error.isConnectionError
            if !lost {
                _ = try? connection.query(
                    "SELECT siwa.release_revocation($1, $2)", [.int(Int64(id)), .text(owner)])
            }
            throw error as any Error
        }
        switch recorded {
        case "revoked":
            logger.info(
                "revoked a user's Apple tokens", ["request": .int(id), "tokens": .int(revoked.count)])
        case "busy":
            logger.info(
                "revocation put off: another transaction holds one of the user's token rows",
                ["request": .int(id), "attempt": .int(attempts)])
        case "lost":
            logger.warning(
                "revocation not recorded: its lease expired and another revoker took the request over",
                ["request": .int(id), "attempt": .int(attempts)])
        default:
            logger.warning(
                state == "retry" ? "revocation failed; will retry" : "revocation failed for good",
                [
                    "request": .int(id), "error": .string(failure?.answer ?? "local"),
                    "attempt": .int(attempts),
                ])
        }
        return record(Outcome(id: id, state: recorded))
    }

    /// The delay before attempt `attempt + 1`: base × 2^(attempt-1), at most the maximum, times a random
    /// factor in [0.5, 1] so that many failures do not retry in step.
    func backoff(attempt: Int) -> Double {
        let base = configuration.retryBaseDelay.inSeconds
        let delay = min(base * pow(2, Double(min(attempt - 1, 30))), configuration.maxRetryDelay.inSeconds)
        return delay * Double.random(in: 0.5...1.0)
    }

    private func record(_ outcome: Outcome) -> Outcome {
        outcomes?.counter(
            "siwa_revocations_total", help: "Revocation requests handled, by outcome.",
            labels: [("outcome", outcome.state)]
        ).increment()
        return outcome
    }
}
