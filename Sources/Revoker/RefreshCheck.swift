import AppleID
import Foundation
import Postgres
import QueueConsumer
import ServiceSupport
import TokenVault

extension Revoker {
    /// The revoker's periodic refresh-check pass: the tokens due, ``refreshCheckPassSize`` at most, with
    /// the revocations due handled between two checks (revocations first).
    func refreshCheckPass(interval: Duration) -> PeriodicTask<PostgresConnection> {
        PeriodicTask("refresh check", every: Self.refreshCheckPassInterval) { [self] connection in
            var checked = 0
            while checked < Self.refreshCheckPassSize, !isStopping,
                try checkOne(on: connection, interval: interval) != nil
            {
                checked += 1
                _ = try drain(on: connection)
            }
            return ["refresh_checks": checked]
        }
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

    /// Checks every stored refresh token due for a check (not checked within `interval`, at least
    /// ``minimumRefreshCheckInterval``), one transaction each; returns what each check found.
    public func checkRefreshTokensOnce(interval: Duration) throws -> [CheckOutcome] {
        let connection = try PostgresConnection(configuration: configuration.database)
        defer { connection.close() }
        var checked: [CheckOutcome] = []
        let interval = Self.pacedRefreshCheckInterval(interval)
        while let outcome = try checkOne(on: connection, interval: interval) { checked.append(outcome) }
        return checked
    }

    /// Refreshes one due token at Apple (claimed and committed first: no lock is held during the call);
    /// nil when none is due.
    func checkOne(on connection: PostgresConnection, interval: Duration) throws -> CheckOutcome? {
        guard
            let claim = try connection.rows(
                RefreshCheckClaim.self,
                [
                    .double(interval.inSeconds), .double(configuration.lease.inSeconds),
                    .int(Int64(configuration.maxCrashes)),
                ]
            ).first
        else { return nil }
        guard let token = claim.token else {
            logger.error(
                "refresh check: the worker stopped during this token's check \(configuration.maxCrashes) times in a row; it is not checked again (delete its siwa.refresh_token_checks row to check it again)",
                ["token": .int(claim.tokenID)])
            return CheckOutcome(tokenID: claim.tokenID, outcome: claim.outcome)
        }
        var outcome = "valid"
        if let clientID = token.resolvedClientID(among: configuration.clients),
            let client = configuration.clients[clientID]
        {
            do {
                _ = try client.refresh(
                    token: try token.decrypt(with: configuration.cipher, clientID: clientID))
            } catch let error as AppleIDError {
                outcome = error.code.rawValue
            } catch {
                outcome = "undecryptable"
            }
        } else {
            outcome = "no_client"
        }
        // invalid_grant: consent is gone; the token is destroyed and a consent-revoked recorded.
        if let jti = try connection.value(
            RevocationQueries.recordRefreshCheck,
            [.int(Int64(token.id)), .bytes(token.ciphertext), .text(outcome)], as: String?.self)
        {
            logger.warning(
                "refresh check: Apple says consent is gone; recorded consent-revoked",
                ["token": .int(token.id), "jti": .string(jti)])
        }
        return CheckOutcome(tokenID: token.id, outcome: outcome)
    }
}
