import AppleID
import Foundation
import Postgres
import ServiceSupport
import Synchronization
import TokenVault

/// The revocation outbox's consumer: claims due requests made by `siwa.request_revocation` (FOR UPDATE
/// SKIP LOCKED, so several workers share the work), decrypts the user's stored refresh tokens, calls
/// Apple's `/auth/revoke` for each, destroys each ciphertext Apple accepted, and records the outcome in
/// the ledger (`siwa.revocation_ledger`). Retryable failures (5xx, 429, timeouts, no connection) are
/// retried with exponential backoff and jitter; Apple's refusals and undecryptable tokens end as
/// `failed`; a user without a stored token ends as `no_token`.
///
/// One request is handled per transaction, which stays open during the calls to Apple (each bounded by
/// the client's deadline). If the process dies after Apple's 200 but before the commit, the request is
/// handled again: Apple answers 200 for a token already revoked, so the second revoke is harmless, and
/// the ledger ends complete.
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

        /// Settings; `clients` must not be empty.
        public init(
            database: PostgresConfiguration, clients: [String: AppleIDClient], cipher: TokenCipher,
            pollInterval: Duration = .seconds(5), retryBaseDelay: Duration = .seconds(5),
            maxRetryDelay: Duration = .seconds(3600), maxAttempts: Int = 20,
            refreshCheckInterval: Duration? = nil
        ) throws {
            if let refreshCheckInterval, refreshCheckInterval <= .zero {
                throw ConfigurationError("the refresh-check interval must be positive")
            }
            self.refreshCheckInterval = refreshCheckInterval
            guard !clients.isEmpty else {
                throw ConfigurationError("the revoker needs at least one client ID")
            }
            guard pollInterval > .zero, retryBaseDelay > .zero, maxRetryDelay >= retryBaseDelay,
                maxAttempts > 0
            else { throw ConfigurationError("the revoker's intervals and attempts must be positive") }
            self.database = database
            self.clients = clients
            self.cipher = cipher
            self.pollInterval = pollInterval
            self.retryBaseDelay = retryBaseDelay
            self.maxRetryDelay = maxRetryDelay
            self.maxAttempts = maxAttempts
        }
    }

    /// What one handled request ended as.
    public struct Outcome: Sendable, Equatable {
        /// The request's id.
        public var id: Int
        /// `revoked`, `no_token`, `failed`, or `retry`.
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
    private let stopRequested = Atomic<Bool>(false)
    private let outcomes: MetricsRegistry?

    /// A revoker; `metrics`, when given, gets `siwa_revocations_total{outcome}`.
    public init(configuration: Configuration, logger: Logger, metrics: MetricsRegistry? = nil) {
        self.configuration = configuration
        self.logger = logger
        self.outcomes = metrics
    }

    /// Handles due requests until ``stop()``; reconnects after a database failure.
    public func run() {
        logger.info("revoker started", ["clients": .int(configuration.clients.count)])
        while !stopRequested.load(ordering: .sequentiallyConsistent) {
            do {
                let connection = try PostgresConnection(configuration: configuration.database)
                defer { connection.close() }
                try connection.listen("siwa_revocations")
                var lastCheck: ContinuousClock.Instant?
                var lastPrune: ContinuousClock.Instant?
                while !stopRequested.load(ordering: .sequentiallyConsistent) {
                    while !stopRequested.load(ordering: .sequentiallyConsistent),
                        try handleOne(on: connection) != nil
                    {}
                    if lastPrune.map({ ContinuousClock.now - $0 >= .seconds(3600) }) ?? true {
                        lastPrune = ContinuousClock.now
                        _ = try pruneSignInCodes(on: connection)
                    }
                    // Refresh checks: a pass at most once a minute (or per interval, if shorter), each
                    // checking the tokens due, 100 at most, between revocation requests.
                    if let interval = configuration.refreshCheckInterval,
                        lastCheck.map({ ContinuousClock.now - $0 >= min(interval, .seconds(60)) }) ?? true
                    {
                        lastCheck = ContinuousClock.now
                        var checked = 0
                        while checked < 100, !stopRequested.load(ordering: .sequentiallyConsistent),
                            try checkOne(on: connection, interval: interval) != nil
                        {
                            checked += 1
                            while try handleOne(on: connection) != nil {}  // revocations first
                        }
                    }
                    _ = try connection.waitForNotifications(
                        timeout: min(configuration.pollInterval, .seconds(1)))
                }
            } catch {
                let code = (error as? PostgresError).map { $0.sqlState ?? $0.code.description } ?? "unknown"
                var fields: [String: Logger.Value] = ["error": .string(code)]
                if let reason = (error as? PostgresError)?.connectionFailureReason {
                    fields["reason"] = .string(reason)
                }
                logger.warning("revoker: database failure; reconnecting", fields)
                let deadline = ContinuousClock.now + .seconds(1)
                while !stopRequested.load(ordering: .sequentiallyConsistent), ContinuousClock.now < deadline {
                    Thread.sleep(forTimeInterval: 0.05)
                }
            }
        }
        logger.info("revoker stopped")
    }

    /// Asks ``run()`` to return after the request in hand.
    public func stop() { stopRequested.store(true, ordering: .sequentiallyConsistent) }

    /// Handles every request due now, one transaction each; returns what each ended as.
    public func drainOnce() throws -> [Outcome] {
        let connection = try PostgresConnection(configuration: configuration.database)
        defer { connection.close() }
        var handled: [Outcome] = []
        while let outcome = try handleOne(on: connection) { handled.append(outcome) }
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
        try connection.execute(
            "DELETE FROM siwa.sign_in_codes WHERE created_at < now() - make_interval(secs => $1)",
            [.double(age.inSeconds)])
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

    /// Refreshes one due token at Apple; nil when none is due.
    func checkOne(on connection: PostgresConnection, interval: Duration) throws -> CheckOutcome? {
        try connection.transaction { connection -> CheckOutcome? in
            let due = try connection.query(
                """
                SELECT t.id, t.sub, t.client_id, t.token_ciphertext
                  FROM siwa.refresh_tokens t LEFT JOIN siwa.refresh_token_checks c ON c.token_id = t.id
                 WHERE t.token_ciphertext IS NOT NULL AND t.revoked_at IS NULL
                   AND (c.checked_at IS NULL OR c.checked_at <= now() - make_interval(secs => $1))
                 ORDER BY c.checked_at NULLS FIRST, t.id LIMIT 1 FOR UPDATE OF t SKIP LOCKED
                """, [.double(interval.inSeconds)])
            guard let row = due.first else { return nil }
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
                    if error.code == .invalidGrant {
                        // Consent is gone: the token is dead; record and apply it as consent-revoked.
                        try connection.execute(
                            "UPDATE siwa.refresh_tokens SET token_ciphertext = NULL WHERE id = $1",
                            [.int(Int64(tokenID))])
                        let jti = try connection.query(
                            "SELECT siwa.record_consent_lost($1, $2)", [.text(sub), .text(clientID)]
                        )[0][0, as: String.self]
                        logger.warning(
                            "refresh check: Apple says consent is gone; recorded consent-revoked",
                            ["token": .int(tokenID), "jti": .string(jti)])
                    }
                } catch {
                    outcome = "undecryptable"
                }
            } else {
                outcome = "no_client"
            }
            try connection.execute(
                """
                INSERT INTO siwa.refresh_token_checks (token_id, checked_at, outcome) VALUES ($1, now(), $2)
                ON CONFLICT (token_id) DO UPDATE SET checked_at = EXCLUDED.checked_at, outcome = EXCLUDED.outcome
                """, [.int(Int64(tokenID)), .text(outcome)])
            return CheckOutcome(tokenID: tokenID, outcome: outcome)
        }
    }

    /// Claims and handles one due request; nil when none is due.
    func handleOne(on connection: PostgresConnection) throws -> Outcome? {
        try connection.transaction { connection -> Outcome? in
            let claimed = try connection.query(
                """
                SELECT id, sub, attempts, tokens_revoked FROM siwa.revocation_requests
                 WHERE state = 'pending' AND next_attempt_at <= now()
                 ORDER BY next_attempt_at, id LIMIT 1 FOR UPDATE SKIP LOCKED
                """)
            guard let request = claimed.first else { return nil }
            let id = try request[0, as: Int.self]
            let sub = try request[1, as: String.self]
            let attempts = try request[2, as: Int.self] + 1
            let earlier = try request[3, as: Int.self]
            let tokens = try connection.query(
                """
                SELECT id, client_id, token_ciphertext FROM siwa.refresh_tokens
                 WHERE sub = $1 AND token_ciphertext IS NOT NULL ORDER BY id FOR UPDATE
                """, [.text(sub)])
            if tokens.isEmpty {
                let state = earlier > 0 ? "revoked" : "no_token"
                try connection.execute(
                    """
                    UPDATE siwa.revocation_requests
                       SET state = $2, completed_at = now(), last_attempt_at = now(), last_error = NULL
                     WHERE id = $1
                    """, [.int(Int64(id)), .text(state)])
                return record(Outcome(id: id, state: state))
            }
            var revoked = 0
            var failure: (answer: String?, error: String, retryable: Bool)?
            for token in tokens {
                let tokenID = try token[0, as: Int.self]
                let storedClient = try token[1, as: String?.self]
                let ciphertext = try token[2, as: Data.self]
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
                    plain = try configuration.cipher.decrypt(
                        [UInt8](ciphertext), sub: sub, clientID: clientID)
                } catch let error as TokenCipherError {
                    failure = (nil, "cannot decrypt the stored token: \(error.description)", false)
                    break
                }
                do {
                    try client.revoke(token: plain, hint: .refreshToken)
                } catch let error as AppleIDError {
                    let answer = error.status.map { "\(error.code) (HTTP \($0))" } ?? error.code.rawValue
                    failure = (answer, error.description, error.isRetryable)
                    break
                }
                try connection.execute(
                    """
                    UPDATE siwa.refresh_tokens
                       SET token_ciphertext = NULL, revoked_at = coalesce(revoked_at, now()),
                           revoke_reason = coalesce(revoke_reason, 'revocation-requested')
                     WHERE id = $1
                    """, [.int(Int64(tokenID))])
                revoked += 1
            }
            guard let failure else {
                try connection.execute(
                    """
                    UPDATE siwa.revocation_requests
                       SET state = 'revoked', attempts = $2, last_attempt_at = now(), completed_at = now(),
                           apple_answer = '200', tokens_revoked = tokens_revoked + $3, last_error = NULL
                     WHERE id = $1
                    """, [.int(Int64(id)), .int(Int64(attempts)), .int(Int64(revoked))])
                logger.info("revoked a user's Apple tokens", ["request": .int(id), "tokens": .int(revoked)])
                return record(Outcome(id: id, state: "revoked"))
            }
            let retry = failure.retryable && attempts < configuration.maxAttempts
            let delay = retry ? backoff(attempt: attempts) : 0
            try connection.execute(
                """
                UPDATE siwa.revocation_requests
                   SET state = $2, attempts = $3, last_attempt_at = now(),
                       next_attempt_at = now() + make_interval(secs => $4),
                       apple_answer = coalesce($5, apple_answer), tokens_revoked = tokens_revoked + $6,
                       last_error = $7, completed_at = CASE WHEN $2 = 'failed' THEN now() END
                 WHERE id = $1
                """,
                [
                    .int(Int64(id)), .text(retry ? "pending" : "failed"), .int(Int64(attempts)),
                    .double(delay),
                    failure.answer.map { .text($0) }, .int(Int64(revoked)),
                    .text(String(failure.error.prefix(500))),
                ])
            logger.warning(
                retry ? "revocation failed; will retry" : "revocation failed for good",
                ["request": .int(id), "error": .string(failure.answer ?? "local"), "attempt": .int(attempts)])
            return record(Outcome(id: id, state: retry ? "retry" : "failed"))
        }
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
