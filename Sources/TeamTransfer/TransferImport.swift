import AppleID
import Foundation
import Postgres

/// The new team's side of an app transfer: loads the old team's list, asks Apple for each user's sub
/// in this team, checks the answers (the wrong-identifier guard: one new sub per old sub), then rewrites
/// every table holding a sub in batches (siwa.apply_sub_transfer), keeping each old sub in
/// siwa.sub_aliases. Resumable. Runs as the schema's owner.
///
/// The steps are public so that a caller can report between them: ``load(on:)``, ``exchange(on:progress:)``,
/// ``refuseDuplicates(on:)``, ``rewrite(on:)``, ``states(on:)``; ``run(on:progress:)`` takes them all.
public struct TransferImport {
    /// Where the old team's list comes from.
    public enum Source: Sendable, Equatable {
        /// The list the old team wrote (`TransferExport.writeList`).
        case list([TransferExport.Entry])
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
    let pacing: TransferPacing

    /// An import of `source` with `client` (this team's credentials for the transferred app).
    public init(
        client: AppleIDClient, transferID: String, batchSize: Int, source: Source, pacing: TransferPacing
    ) throws {
        guard !transferID.isEmpty, transferID.count <= 200 else {
            throw TeamTransferError("--transfer-id must be 1 to 200 characters")
        }
        guard (1...10_000).contains(batchSize) else {
            throw TeamTransferError("--batch-size must be a whole number from 1 to 10000")
        }
        try TransferWindow.requireOpen(transferDate: pacing.transferDate)
        self.client = client
        self.transferID = transferID
        self.batchSize = batchSize
        self.source = source
        self.pacing = pacing
    }

    /// The old team's list from a file of `{"sub": …, "transfer_sub": …}` lines.
    public static func readList(path: String) throws -> [TransferExport.Entry] {
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw TeamTransferError("cannot read \(path)")
        }
        var entries: [TransferExport.Entry] = []
        for (number, line) in text.split(separator: "\n").enumerated() where !line.isEmpty {
            guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                let sub = object["sub"] as? String, let transferSub = object["transfer_sub"] as? String,
                !sub.isEmpty, !transferSub.isEmpty
            else {
                throw TeamTransferError(
                    "\(path) line \(number + 1): expected {\"sub\": …, \"transfer_sub\": …}")
            }
            entries.append(TransferExport.Entry(sub: sub, transferSub: transferSub))
        }
        return entries
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
        case .list(let entries): return entries.count
        case .exports(let team):
            return try database("counting the list") {
                try connection.query(
                    "SELECT count(*)::bigint FROM siwa.transfer_exports WHERE target_team = $1 AND state = 'done'",
                    [.text(team)])[0][0]
            }
        }
    }

    /// 1. Loads the list (a pair already loaded is no conflict). Returns the lines not loaded because
    /// their sub or transfer_sub is already listed with another pairing.
    public func load(on connection: PostgresConnection) throws -> Int {
        try database("loading the list") {
            switch source {
            case .list(let list):
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
            case .exports(let team):
                _ = try connection.query(
                    "SELECT siwa.transfer_import_load_exports($1, $2)", [.text(transferID), .text(team)])
                return 0
            }
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
