public import AppleID
import Foundation
public import Postgres

/// The old team's side of an app transfer: for every known sub (siwa.accounts, deleted ones excepted)
/// asks Apple for its transfer identifier to the target team and records it, or Apple's exact error, in
/// siwa.transfer_exports. Resumable: what is done is not asked again; a refusal only with
/// `TransferPacing.retryFailed`. Runs as the schema's owner, on one connection (`on:`, used from one
/// thread at a time).
public struct TransferExport {
    /// Where the export stands for the target team.
    public struct Status: Sendable, Equatable {
        /// Accounts not deleted.
        public var users: Int
        /// Accounts not listed for the target team yet.
        public var notAsked: Int
        /// Users with a transfer identifier.
        public var done: Int
        /// Users Apple refused.
        public var failed: Int
        /// Users listed but not answered yet (or failing transiently).
        public var pending: Int
        /// What a run would ask Apple for.
        public var toDo: Int
    }

    /// One user's transfer identifier, as the new team's list holds it.
    public struct Entry: Sendable, Equatable {
        /// The old team's sub.
        public var sub: String
        /// Apple's transfer identifier for the target team.
        public var transferSub: String

        /// One user's entry.
        public init(sub: String, transferSub: String) {
            self.sub = sub
            self.transferSub = transferSub
        }
    }

    /// What a run did.
    public struct Result: Sendable, Equatable {
        /// Accounts not deleted (what "done" counts towards).
        public var users: Int
        /// Users done before this run.
        public var alreadyDone: Int
        /// This run's calls to Apple.
        public var totals: TransferTotals
    }

    let client: AppleIDClient
    /// The recipient's team ID.
    public let targetTeam: String
    let pacing: TransferPacing

    /// An export to `targetTeam` with `client` (this team's credentials for the transferred app).
    /// Refuses a target that is not a team ID or is this team (`ownTeam`), and a closed window.
    public init(client: AppleIDClient, ownTeam: String, targetTeam: String, pacing: TransferPacing) throws {
        guard TransferWindow.isTeamID(targetTeam) else {
            throw TeamTransferError(
                "--target-team must be a ten-character team ID (upper-case letters and digits)")
        }
        guard targetTeam != ownTeam else {
            throw TeamTransferError("--target-team is this team: the recipient is the other team")
        }
        try TransferWindow.requireOpen(transferDate: pacing.transferDate)
        self.client = client
        self.targetTeam = targetTeam
        self.pacing = pacing
    }

    /// Checks that the database holds the transfer tables.
    public func requireSchema(on connection: PostgresConnection) throws {
        try requireTransferSchema(connection)
    }

    /// Where the export stands; changes nothing.
    public func status(on connection: PostgresConnection) throws -> Status {
        let counts = try database("counting users") {
            try connection.query(
                """
                SELECT (SELECT count(*) FROM siwa.accounts a WHERE a.deleted_at IS NULL)::bigint,
                       (SELECT count(*) FROM siwa.accounts a WHERE a.deleted_at IS NULL
                           AND NOT EXISTS (SELECT 1 FROM siwa.transfer_exports e
                                            WHERE e.target_team = $1 AND e.sub = a.sub))::bigint,
                       (SELECT count(*) FROM siwa.transfer_exports e WHERE e.target_team = $1 AND e.state = 'done')::bigint,
                       (SELECT count(*) FROM siwa.transfer_exports e WHERE e.target_team = $1 AND e.state = 'failed')::bigint,
                       (SELECT count(*) FROM siwa.transfer_exports e WHERE e.target_team = $1 AND e.state = 'pending')::bigint
                """, [.text(targetTeam)])[0]
        }
        let (users, new, done, failed, pending): (Int, Int, Int, Int, Int) = (
            try counts[0], try counts[1], try counts[2], try counts[3], try counts[4]
        )
        return Status(
            users: users, notAsked: new, done: done, failed: failed, pending: pending,
            toDo: new + pending + (pacing.retryFailed ? failed : 0))
    }

    /// Asks Apple for a migration access token (the dry run's check of the credentials).
    public func checkCredentials() throws {
        do {
            _ = try client.migrationToken()
        } catch {
            throw TeamTransferError(
                "dry run: Apple refused the client credentials: \(error.appleError ?? error.code.rawValue)")
        }
    }

    /// Lists every account for the target team, then asks Apple for each pending user (and each
    /// refused one with `retryFailed`), recording answers in batches. `progress` gets a line now and
    /// then (from this thread).
    public func run(
        on connection: PostgresConnection, progress: @escaping @Sendable (String) -> Void = { _ in }
    ) throws -> Result {
        let status = try status(on: connection)
        let team = targetTeam
        try database("recording the users to export") {
            _ = try connection.query("SELECT siwa.transfer_export_enlist($1)", [.text(team)])
        }
        let keys = try database("reading the users to export") {
            try connection.query(
                """
                SELECT e.sub FROM siwa.transfer_exports e
                 WHERE e.target_team = $1 AND (e.state = 'pending' OR ($2 AND e.state = 'failed'))
                 ORDER BY e.sub
                """, [.text(team), .bool(pacing.retryFailed)]
            ).map { row throws -> String in try row[0] }
        }
        let client = self.client
        let runner = TransferRunner(client: client, pacing: pacing)
        let totals = try runner.run(
            keys: keys, total: status.users, alreadyDone: status.done, progress: progress,
            call: { (sub, token) throws(AppleIDError) in
                .done(try client.transferIdentifier(sub: sub, targetTeam: team, token: token), nil)
            },
            record: { batch in
                try database("recording progress") {
                    _ = try connection.query(
                        "SELECT siwa.transfer_export_record($1, $2::jsonb)",
                        [.text(team), .text(outcomesJSON(batch))])
                }
            })
        return Result(users: status.users, alreadyDone: status.done, totals: totals)
    }

    /// Every user done, in sub order: the list for the new team.
    public func entries(on connection: PostgresConnection) throws -> [Entry] {
        try Self.doneEntries(on: connection, targetTeam: targetTeam)
    }

    /// Every user done for `targetTeam` in siwa.transfer_exports, in sub order.
    static func doneEntries(on connection: PostgresConnection, targetTeam: String) throws -> [Entry] {
        try database("reading the transfer identifiers") {
            try connection.query(
                """
                SELECT e.sub, e.transfer_sub FROM siwa.transfer_exports e
                 WHERE e.target_team = $1 AND e.state = 'done' ORDER BY e.sub
                """, [.text(targetTeam)]
            ).map { row throws -> Entry in Entry(sub: try row[0], transferSub: try row[1]) }
        }
    }

    /// What the new team needs: the users listed and the list's digest (``TransferList``).
    public struct ListDigest: Sendable, Equatable {
        /// Users in the list.
        public var users: Int
        /// The digest the new team's import requires.
        public var digest: String
    }

    /// The digest of the list of every user done (``entries(on:)``), without writing it: what the new
    /// team's import from this same database (`--from-target-team`) requires.
    public func digest(on connection: PostgresConnection) throws -> ListDigest {
        let rows = try entries(on: connection)
        return ListDigest(
            users: rows.count, digest: try TransferList.digest(targetTeam: targetTeam, entries: rows))
    }

    /// Writes the list of every user done to `path` (``TransferList``: account references and transfer
    /// identifiers, no sub and no email), replacing the file at once (mode 600). Returns the users written
    /// and the list's digest.
    @discardableResult
    public func writeList(from connection: PostgresConnection, to path: String) throws -> ListDigest {
        let rows = try entries(on: connection)
        let list = try TransferList(targetTeam: targetTeam, entries: rows)
        try list.write(to: path)
        return ListDigest(
            users: rows.count, digest: try TransferList.digest(targetTeam: targetTeam, entries: rows))
    }
}
