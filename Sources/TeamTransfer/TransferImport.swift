public import AppleID
import Foundation
public import Postgres

/// The new team's side of an app transfer: verifies the old team's list against the digest both teams
/// compared (``TransferList``) and loads it, asks Apple for each user's sub in this team, checks the
/// answers (the wrong-identifier guard: one new sub per old sub), then rewrites every table holding a sub
/// in batches (siwa.apply_sub_transfer), keeping each old sub in siwa.sub_aliases. Resumable. Runs as the
/// schema's owner.
///
/// The steps are public so that a caller can report between them: ``verifiedEntries(on:)``,
/// ``load(on:)``, ``exchange(on:progress:)``,
/// ``refuseDuplicates(on:)``, ``rewrite(on:)``, ``states(on:)``; ``run(on:progress:)`` takes them all.
public struct TransferImport {
    /// Where the old team's list comes from.
    public enum Source: Sendable, Equatable {
        /// The list the old team wrote (`TransferExport.writeList`, read with ``TransferImport/readList(path:)``).
        case list(TransferList)
        /// siwa.transfer_exports of this same database, for this target team.
        case exports(targetTeam: String)
    }

    /// What a whole run did.
    public struct Result: Sendable, Equatable {
        /// Lines of the list not loaded: their sub or transfer_sub is already listed with another pairing.
        public var skipped: Int
        /// This run's calls to Apple.
        public var exchange: TransferTotals
        /// Users whose new sub Apple also gave another user: not applied (state duplicate).
        public var duplicates: Int
        /// This run's rewrite: users per outcome of siwa.apply_sub_transfer.
        public var outcomes: [String: Int]
        /// The transfer's rows per state, in state order.
        public var states: [(state: String, count: Int)]

        public static func == (lhs: Result, rhs: Result) -> Bool {
            lhs.skipped == rhs.skipped && lhs.exchange == rhs.exchange && lhs.duplicates == rhs.duplicates
                && lhs.outcomes == rhs.outcomes && lhs.states.map(\.state) == rhs.states.map(\.state)
                && lhs.states.map(\.count) == rhs.states.map(\.count)
        }
    }

    let client: AppleIDClient
    /// Names this transfer in the audit trail.
    public let transferID: String
    /// Users rewritten per transaction.
    public let batchSize: Int
    /// The old team's list.
    public let source: Source
    /// The digest of the list as the old team printed it (``TransferList/digest(targetTeam:entries:)``).
    public let listDigest: String
    let pacing: TransferPacing

    /// An import of `source` with `client` (this team's credentials for the transferred app), of a list
    /// whose digest must be `listDigest` (what the old team's export printed, compared by another channel
    /// than the one that carried the list).
    public init(
        client: AppleIDClient, transferID: String, batchSize: Int, source: Source, listDigest: String,
        pacing: TransferPacing
    ) throws {
        guard !transferID.isEmpty, transferID.count <= 200 else {
            throw TeamTransferError("--transfer-id must be 1 to 200 characters")
        }
        guard (1...10_000).contains(batchSize) else {
            throw TeamTransferError("--batch-size must be a whole number from 1 to 10000")
        }
        guard TransferList.isDigest(listDigest) else {
            throw TeamTransferError(
                "--list-digest must be the 64 hex digits the old team's 'siwactl transfer export' printed")
        }
        try TransferWindow.requireOpen(transferDate: pacing.transferDate)
        self.client = client
        self.listDigest = listDigest.lowercased()
        self.transferID = transferID
        self.batchSize = batchSize
        self.source = source
        self.pacing = pacing
    }

    /// The old team's list from the file its export wrote (``TransferList/read(path:)``).
    public static func readList(path: String) throws -> TransferList {
        try TransferList.read(path: path)
    }

    /// Checks that the database holds the transfer tables.
    public func requireSchema(on connection: PostgresConnection) throws {
        try requireTransferSchema(connection)
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

    /// The users in the source list; changes nothing.
    public func sourceCount(on connection: PostgresConnection) throws -> Int {
        switch source {
        case .list(let list): return list.lines.count
        case .exports(let team):
            return try database("counting the list") {
                try connection.query(
                    "SELECT count(*)::bigint FROM siwa.transfer_exports WHERE target_team = $1 AND state = 'done'",
                    [.text(team)])[0][0]
            }
        }
    }

    /// 1a. The list's pairs, verified: a file's account references found among this database's subs
    /// (accounts, and subs an earlier run already replaced), or the export's done rows of this same
    /// database; then the digest of that pairing compared with ``listDigest``. Refuses a reference that
    /// matches no sub here and a pairing whose digest differs (two identifiers swapped, a line changed,
    /// added or dropped, a list for another team): nothing is loaded then. Changes nothing.
    public func verifiedEntries(on connection: PostgresConnection) throws -> [TransferExport.Entry] {
        let entries: [TransferExport.Entry]
        let team: String
        switch source {
        case .list(let list):
            let subs = try database("reading this database's subs") {
                try connection.query(
                    "SELECT a.sub FROM siwa.accounts a UNION SELECT s.old_sub FROM siwa.sub_aliases s"
                ).map { row throws -> String in try row[0] }
            }
            let resolved = list.resolve(subs: subs)
            guard resolved.unresolved == 0 else {
                throw TeamTransferError(
                    "\(resolved.unresolved) of the list's \(list.lines.count) users match no account of this database (a list for another database, or an altered one): nothing was loaded"
                )
            }
            entries = resolved.entries
            team = list.targetTeam
        case .exports(let targetTeam):
            entries = try TransferExport.doneEntries(on: connection, targetTeam: targetTeam)
            team = targetTeam
        }
        let digest = try TransferList.digest(targetTeam: team, entries: entries)
        guard digest == listDigest else {
            throw TeamTransferError(
                "the list's digest is \(digest), not the --list-digest the old team gave: its pairs are not the ones the old team exported (identifiers swapped, lines changed, added or dropped, or a list for another team); nothing was loaded. Ask the old team for the list and its digest again, by two different channels"
            )
        }
        return entries
    }

    /// 1b. Verifies the list (``verifiedEntries(on:)``) and loads it (a pair already loaded is no
    /// conflict). Returns the lines not loaded because their sub or transfer_sub is already listed for
    /// this transfer with another pairing.
    public func load(on connection: PostgresConnection) throws -> Int {
        let list = try verifiedEntries(on: connection)
        return try database("loading the list") {
            var skipped = 0
            for start in stride(from: 0, to: list.count, by: 5000) {
                let slice = list[start..<min(start + 5000, list.count)]
                let json = slice.map { ["sub": $0.sub, "transfer_sub": $0.transferSub] }
                let data = try JSONSerialization.data(withJSONObject: Array(json))
                let loaded = try connection.query(
                    "SELECT loaded, already FROM siwa.transfer_import_load($1, $2::jsonb)",
                    [.text(transferID), .text(String(decoding: data, as: UTF8.self))])[0]
                let inserted: Int = try loaded[0]
                let already: Int = try loaded[1]
                skipped += slice.count - inserted - already
            }
            return skipped
        }
    }

    /// 2. Asks Apple for the new sub of every pending transfer identifier (and each refused one with
    /// `retryFailed`), recording answers in batches.
    public func exchange(
        on connection: PostgresConnection, progress: @escaping @Sendable (String) -> Void = { _ in }
    ) throws -> TransferTotals {
        let transfer = transferID
        let keys = try database("reading the identifiers to exchange") {
            try connection.query(
                """
                SELECT i.transfer_sub FROM siwa.transfer_imports i
                 WHERE i.transfer_id = $1 AND (i.state = 'pending' OR ($2 AND i.state = 'failed'))
                 ORDER BY i.transfer_sub
                """, [.text(transfer), .bool(pacing.retryFailed)]
            ).map { row throws -> String in try row[0] }
        }
        let total: Int = try database("counting") {
            try connection.query(
                "SELECT count(*)::bigint FROM siwa.transfer_imports WHERE transfer_id = $1",
                [.text(transfer)])[0][0]
        }
        let client = self.client
        let runner = TransferRunner(client: client, pacing: pacing)
        return try runner.run(
            keys: keys, total: total, alreadyDone: total - keys.count, progress: progress,
            call: { (transferSub, token) throws(AppleIDError) in
                let user = try client.exchange(transferSub: transferSub, token: token)
                return .done(user.sub, user)
            },
            record: { batch in
                try database("recording progress") {
                    _ = try connection.query(
                        "SELECT siwa.transfer_import_record($1, $2::jsonb)",
                        [.text(transfer), .text(outcomesJSON(batch))])
                }
            })
    }

    /// 3. The wrong-identifier guard: a new sub Apple gave for two old subs is applied to neither.
    /// Returns the users marked duplicate.
    public func refuseDuplicates(on connection: PostgresConnection) throws -> Int {
        try database("checking for duplicate new subs") {
            try connection.query(
                "SELECT siwa.transfer_import_refuse_duplicates($1)", [.text(transferID)])[0][0]
        }
    }

    /// 4. The rewrite, batch by batch, each in one transaction. Returns the users per outcome.
    public func rewrite(on connection: PostgresConnection) throws -> [String: Int] {
        var outcomes: [String: Int] = [:]
        while true {
            let rows = try database("rewriting a batch") {
                try connection.query(
                    "SELECT outcome, users FROM siwa.transfer_import_apply_batch($1, $2::integer)",
                    [.text(transferID), .int(Int64(batchSize))])
            }
            if rows.isEmpty { break }
            for row in rows {
                let outcome: String = try row[0]
                let count: Int = try row[1]
                outcomes[outcome, default: 0] += count
            }
        }
        return outcomes
    }

    /// The transfer's rows per state, in state order; changes nothing.
    public func states(on connection: PostgresConnection) throws -> [(state: String, count: Int)] {
        try database("counting") {
            try connection.query(
                "SELECT state, count(*)::bigint FROM siwa.transfer_imports WHERE transfer_id = $1 GROUP BY state ORDER BY state",
                [.text(transferID)]
            ).map { row throws -> (state: String, count: Int) in (try row[0], try row[1]) }
        }
    }

    /// Every step in order: load, exchange, the guard, the rewrite; then the states.
    public func run(
        on connection: PostgresConnection, progress: @escaping @Sendable (String) -> Void = { _ in }
    ) throws -> Result {
        let skipped = try load(on: connection)
        let exchange = try exchange(on: connection, progress: progress)
        let duplicates = try refuseDuplicates(on: connection)
        let outcomes = try rewrite(on: connection)
        return Result(
            skipped: skipped, exchange: exchange, duplicates: duplicates, outcomes: outcomes,
            states: try states(on: connection))
    }
}
