import AppleID
import Foundation
import Postgres
import Synchronization
import TeamTransfer
import TestSupport
import Testing

/// The transfer as a library, in process: the calls siwactl transfer makes, without the command.
@Suite("TeamTransfer in process: export, import and the wrong-identifier guard against the local Apple")
struct TeamTransferLibraryTests {
    let pacing = TransferPacing(rate: 5000, concurrency: 4, maxAttempts: 5, retryBaseDelay: 0.01)

    func seed(_ database: TestDatabase, count: Int) throws {
        try database.query(
            """
            INSERT INTO siwa.accounts (sub, email, is_private_email)
            SELECT format('000200.%s.old', lpad(i::text, 4, '0')), 'u' || i || '@example.com', false
              FROM generate_series(1, $1) AS i
            """, [.int(Int64(count))])
    }

    @Test(
        "an export then an import from the same database moves every user once, and a rerun changes nothing")
    func exportThenImport() throws {
        let scratch = try scratchDirectory()
        defer { try? FileManager.default.removeItem(at: scratch) }
        let recipient = try TransferRecipient(directory: scratch)
        let apple = try LocalApple(transferTeams: [recipient.transferTeam])
        let database = try TestDatabase()
        try seed(database, count: 12)
        let connection = try database.connect()
        defer { connection.close() }

        let progress = Lines()
        let export = try TransferExport(
            client: apple.client(), ownTeam: LocalApple.teamID, targetTeam: TransferRecipient.teamID,
            pacing: pacing)
        #expect(try export.status(on: connection).toDo == 12)
        let exported = try export.run(on: connection) { progress.append($0) }
        #expect(exported.totals == TransferTotals(done: 12, refused: 0, transient: 0, stoppedEarly: false))
        #expect(progress.all.last?.hasPrefix("12 of 12 done") == true)
        #expect(try export.entries(on: connection).count == 12)

        let recipientClient = try apple.client(
            apple.provider(
                teamID: TransferRecipient.teamID, keyID: TransferRecipient.keyID,
                signingKey: String(contentsOf: recipient.keyFile, encoding: .utf8)))
        let transfer = try TransferImport(
            client: recipientClient, transferID: "library-test", batchSize: 5,
            source: .exports(targetTeam: TransferRecipient.teamID),
            listDigest: try export.digest(on: connection).digest, pacing: pacing)
        let imported = try transfer.run(on: connection)
        #expect(imported.skipped == 0)
        #expect(imported.exchange.done == 12)
        #expect(imported.duplicates == 0)
        #expect(imported.outcomes == ["applied": 12])
        #expect(imported.states.map(\.state) == ["applied"])
        #expect(try database.query("SELECT count(*)::bigint FROM siwa.sub_aliases")[0][0, as: Int.self] == 12)
        // Three batches of at most five, each in the audit trail.
        #expect(
            try database.query("SELECT count(*)::bigint FROM siwa.sub_transfer_batches")[0][0, as: Int.self]
                == 3)

        let again = try transfer.run(on: connection)
        #expect(again.exchange.done == 0)
        #expect(again.outcomes.isEmpty)
    }

    @Test("the guard marks both users of a new sub Apple gave twice as duplicate, and drops their emails")
    func wrongIdentifierGuard() throws {
        let scratch = try scratchDirectory()
        defer { try? FileManager.default.removeItem(at: scratch) }
        let recipient = try TransferRecipient(directory: scratch)
        let apple = try LocalApple(transferTeams: [recipient.transferTeam])
        let database = try TestDatabase()
        try seed(database, count: 2)
        let connection = try database.connect()
        defer { connection.close() }
        func hex(_ text: String) -> String { text.utf8.map { String(format: "%02x", $0) }.joined() }
        let first = "000200.0001.old"
        // A buggy list: the second user carries the first one's identifier through another source team.
        let list = [
            TransferExport.Entry(
                sub: first, transferSub: "\(TransferRecipient.teamID).\(LocalApple.teamID).\(hex(first))"),
            TransferExport.Entry(
                sub: "000200.0002.old", transferSub: "\(TransferRecipient.teamID).TEAMC00000.\(hex(first))"),
        ]
        let client = try apple.client(
            apple.provider(
                teamID: TransferRecipient.teamID, keyID: TransferRecipient.keyID,
                signingKey: String(contentsOf: recipient.keyFile, encoding: .utf8)))
        let transfer = try TransferImport(
            client: client, transferID: "guard-test", batchSize: 100,
            source: .list(try TransferList(targetTeam: TransferRecipient.teamID, entries: list)),
            listDigest: try TransferList.digest(targetTeam: TransferRecipient.teamID, entries: list),
            pacing: pacing)
        #expect(try transfer.load(on: connection) == 0)
        #expect(try transfer.exchange(on: connection).done == 2)
        #expect(try transfer.refuseDuplicates(on: connection) == 2)
        #expect(try transfer.refuseDuplicates(on: connection) == 0)
        #expect(try transfer.rewrite(on: connection).isEmpty)
        #expect(try transfer.states(on: connection).map { "\($0.state) \($0.count)" } == ["duplicate 2"])
        #expect(
            try database.query(
                "SELECT count(*)::bigint FROM siwa.transfer_imports WHERE email IS NOT NULL OR detail IS NULL"
            )[0][
                0, as: Int.self] == 0)
        #expect(try database.query("SELECT count(*)::bigint FROM siwa.sub_aliases")[0][0, as: Int.self] == 0)
    }

    @Test(
        "a list whose pairs differ from the digest the old team printed is refused whole, and holds no sub or email"
    )
    func swappedPairsRefused() throws {
        let scratch = try scratchDirectory()
        defer { try? FileManager.default.removeItem(at: scratch) }
        let recipient = try TransferRecipient(directory: scratch)
        let apple = try LocalApple(transferTeams: [recipient.transferTeam])
        let database = try TestDatabase()
        try seed(database, count: 4)
        let connection = try database.connect()
        defer { connection.close() }
        let export = try TransferExport(
            client: apple.client(), ownTeam: LocalApple.teamID, targetTeam: TransferRecipient.teamID,
            pacing: pacing)
        _ = try export.run(on: connection)
        let path = scratch.appendingPathComponent("list.jsonl").path
        let written = try export.writeList(from: connection, to: path)
        #expect(written.users == 4)
        let text = try String(contentsOfFile: path, encoding: .utf8)
        #expect(!text.contains("000200.") && !text.contains("@"))
        // Two users' transfer identifiers swapped in the file.
        var swapped = try TransferImport.readList(path: path)
        (swapped.lines[0].transferSub, swapped.lines[1].transferSub) =
            (swapped.lines[1].transferSub, swapped.lines[0].transferSub)
        let client = try apple.client(
            apple.provider(
                teamID: TransferRecipient.teamID, keyID: TransferRecipient.keyID,
                signingKey: String(contentsOf: recipient.keyFile, encoding: .utf8)))
        let refused = try TransferImport(
            client: client, transferID: "swap-test", batchSize: 100, source: .list(swapped),
            listDigest: written.digest, pacing: pacing)
        #expect(throws: TeamTransferError.self) { try refused.run(on: connection) }
        #expect(
            try database.query("SELECT count(*)::bigint FROM siwa.transfer_imports")[0][0, as: Int.self] == 0)
        // The list as written is accepted, and moves each user to the new sub Apple gives for it.
        let accepted = try TransferImport(
            client: client, transferID: "swap-test", batchSize: 100,
            source: .list(try TransferImport.readList(path: path)), listDigest: written.digest, pacing: pacing
        )
        #expect(try accepted.run(on: connection).outcomes == ["applied": 4])
    }

    @Test("settings the run cannot use are refused before any call")
    func refusals() throws {
        let apple = try LocalApple()
        #expect(throws: TeamTransferError.self) {
            try TransferExport(
                client: apple.client(), ownTeam: LocalApple.teamID, targetTeam: LocalApple.teamID,
                pacing: pacing)
        }
        #expect(throws: TeamTransferError.self) {
            try TransferImport(
                client: apple.client(), transferID: "", batchSize: 10,
                source: .list(try TransferList(targetTeam: "TEAMB00000", entries: [])),
                listDigest: try TransferList.digest(targetTeam: "TEAMB00000", entries: []), pacing: pacing)
        }
        #expect(throws: TeamTransferError.self) {
            try TransferImport(
                client: apple.client(), transferID: "t", batchSize: 10,
                source: .list(try TransferList(targetTeam: "TEAMB00000", entries: [])), listDigest: "not hex",
                pacing: pacing)
        }
        var closed = pacing
        closed.transferDate = Date().addingTimeInterval(-61 * 86400)
        #expect(throws: TeamTransferError.self) {
            try TransferExport(
                client: apple.client(), ownTeam: LocalApple.teamID, targetTeam: "TEAMB00000", pacing: closed)
        }
    }
}

/// Progress lines collected from the runner's threads.
private final class Lines: Sendable {
    private let lines = Mutex<[String]>([])
    func append(_ line: String) { lines.withLock { $0.append(line) } }
    var all: [String] { lines.withLock { $0 } }
}
