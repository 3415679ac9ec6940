import Foundation
import Postgres
import TeamTransfer
import TestSupport
import Testing

/// The test users: sub, email, whether the email is a relay address (every third).
private func users(_ count: Int) -> [(sub: String, email: String, isPrivate: Bool)] {
    (1...count).map { index in
        let isPrivate = index % 3 == 0
        return (
            String(format: "000100.%06d.old", index),
            isPrivate ? "u\(index)@privaterelay.appleid.com" : "u\(index)@example.com", isPrivate
        )
    }
}

/// The users in siwa.accounts, each with a session, and every tenth with a refresh token.
private func seed(_ database: TestDatabase, count: Int) throws {
    try database.query(
        """
        INSERT INTO siwa.accounts (sub, email, is_private_email)
        SELECT format('000100.%s.old', lpad(i::text, 6, '0')),
               CASE WHEN i % 3 = 0 THEN 'u' || i || '@privaterelay.appleid.com' ELSE 'u' || i || '@example.com' END,
               i % 3 = 0
          FROM generate_series(1, $1) AS i;
        """, [.int(Int64(count))])
    try database.query("INSERT INTO siwa.sessions (sub) SELECT sub FROM siwa.accounts")
    try database.query(
        """
        INSERT INTO siwa.refresh_tokens (sub, client_id, token_sha256)
        SELECT sub, 'com.example.app', sha256(sub::bytea) FROM siwa.accounts WHERE right(split_part(sub, '.', 2), 1) = '0'
        """)
}

/// The sub the local Apple gives the recipient for an old sub (its deterministic rule).
private func newSub(_ old: String) -> String {
    TransferRecipient.teamID.lowercased() + "." + old.utf8.map { String(format: "%02x", $0) }.joined()
}

/// The digest an export printed ("list digest for T (N users): HEX").
private func printedDigest(_ output: String) -> String? {
    output.split(separator: "\n").first { $0.hasPrefix("list digest for ") }?.split(separator: " ").last.map(
        String.init)
}

private func count(_ database: TestDatabase, _ sql: String, _ parameters: [PostgresData?] = []) throws -> Int
{
    try database.query(sql, parameters)[0][0, as: Int.self]
}

@Suite("siwactl transfer: moving users to another team against the local Apple", .serialized)
struct TransferTests {
    /// The options of the old team's side.
    func exportArguments(_ apple: LocalApple, _ database: TestDatabase) -> [String] {
        [
            "transfer", "export", "--target-team", TransferRecipient.teamID, "--database-url", database.url,
            "--apple-team-id", LocalApple.teamID, "--apple-key-id", LocalApple.keyID, "--apple-key-file",
            apple.teamKeyFile.path, "--client-id", LocalApple.clientID, "--apple-url", apple.baseURL,
            "--rate", "5000", "--concurrency", "8", "--retry-base-delay", "0.01", "--progress-interval", "1",
            "--max-attempts", "12", "--transfer-date",
            ISO8601DateFormatter().string(from: Date().addingTimeInterval(-3 * 86400)),
        ]
    }

    /// The options of the new team's side.
    func importArguments(_ apple: LocalApple, _ recipient: TransferRecipient, _ database: TestDatabase)
        -> [String]
    {
        [
            "transfer", "import", "--database-url", database.url, "--apple-team-id", TransferRecipient.teamID,
            "--apple-key-id", TransferRecipient.keyID, "--apple-key-file", recipient.keyFile.path,
            "--client-id",
            LocalApple.clientID, "--apple-url", apple.baseURL, "--rate", "5000", "--concurrency", "8",
            "--retry-base-delay", "0.01", "--progress-interval", "1", "--max-attempts", "12",
        ]
    }

    @Test(
        "10,000 users round trip with injected errors and a killed export resumed: each mapped exactly once")
    func roundTrip() throws {
        let total = 10_000
        let scratch = try scratchDirectory()
        defer { try? FileManager.default.removeItem(at: scratch) }
        let recipient = try TransferRecipient(directory: scratch)
        let people = users(total)
        let usersFile = scratch.appendingPathComponent("users.jsonl")
        try people.map { jsonLine(["sub": $0.sub, "email": $0.email, "is_private_email": $0.isPrivate]) }
            .joined()
            .write(to: usersFile, atomically: true, encoding: .utf8)
        let apple = try LocalApple(transferTeams: [recipient.transferTeam], migrationUsers: usersFile)
        let old = try TestDatabase()
        try seed(old, count: total)

        // Apple refuses 25 users for good (as for a user who revoked consent before the transfer), and
        // fails every 7th call with 503 and every 11th with 429.
        let refusedUsers = stride(from: 400, to: total, by: 400).map { people[$0].sub }
        let subjects = scratch.appendingPathComponent("refused")
        try refusedUsers.joined(separator: "\n").write(to: subjects, atomically: true, encoding: .utf8)
        try apple.fault([
            "--endpoint", "migration", "--fail-with", "invalid_request", "--subjects", subjects.path,
        ])
        try apple.fault(["--endpoint", "migration", "--fail-with", "503", "--every", "7", "--add"])
        try apple.fault(["--endpoint", "migration", "--fail-with", "429", "--every", "11", "--add"])

        // The export, killed part way.
        let started = Date()
        let killed = try Subprocess(
            ExecutableLocator.url(named: "siwactl").path, exportArguments(apple, old),
            environment: ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") },
            standardOutput: scratch.appendingPathComponent("export-1.out").path,
            standardError: scratch.appendingPathComponent("export-1.err").path)
        let reached = try waitUntil(timeout: .seconds(60)) {
            try count(old, "SELECT count(*)::bigint FROM siwa.transfer_exports WHERE state = 'done'") >= 3000
                || !killed.isRunning
        }
        killed.send(SIGKILL)
        _ = killed.wait()
        #expect(reached)
        let doneBeforeResume = try count(
            old, "SELECT count(*)::bigint FROM siwa.transfer_exports WHERE state = 'done'")
        #expect(doneBeforeResume >= 3000 && doneBeforeResume < total - refusedUsers.count)

        // Resumed to the end, writing the list for the new team.
        let list = scratch.appendingPathComponent("transfer.jsonl")
        let resumed = try siwactl(exportArguments(apple, old) + ["--output", list.path])
        let exportSeconds = Date().timeIntervalSince(started)
        #expect(resumed.status == 0, "\(resumed.standardError)")
        #expect(resumed.standardError.contains("left of Apple's 60-day window"))
        #expect(resumed.standardError.contains("of \(total) done"))
        #expect(try count(old, "SELECT count(*)::bigint FROM siwa.transfer_exports") == total)
        #expect(
            try count(
                old,
                "SELECT count(DISTINCT transfer_sub)::bigint FROM siwa.transfer_exports WHERE state = 'done'")
                == total - refusedUsers.count)
        let failed = try old.query(
            "SELECT sub, apple_error, apple_status FROM siwa.transfer_exports WHERE state = 'failed' ORDER BY sub"
        )
        #expect(try failed.map { row throws -> String in try row[0] } == refusedUsers)
        #expect(
            try failed.allSatisfy { row throws in
                try row[1, as: String.self] == "invalid_request" && row[2, as: Int.self] == 400
            })
        // Transient failures were retried, and counted.
        #expect(try count(old, "SELECT count(*)::bigint FROM siwa.transfer_exports WHERE attempts > 1") > 0)
        let lines = try String(contentsOf: list, encoding: .utf8).split(separator: "\n")
        #expect(lines.count == 1 + total - refusedUsers.count)
        let digest = try #require(printedDigest(resumed.standardOutput), "\(resumed.standardOutput)")

        // The new team's database: the same data, then the import.
        let new = try TestDatabase()
        try seed(new, count: total)
        try apple.fault(["--endpoint", "migration", "--fail-with", "500", "--every", "9"])
        let importStarted = Date()
        let imported = try siwactl(
            importArguments(apple, recipient, new) + ["--input", list.path, "--list-digest", digest])
        let importSeconds = Date().timeIntervalSince(importStarted)
        #expect(imported.status == 0, "\(imported.standardError)")
        let moved = total - refusedUsers.count
        #expect(
            try count(new, "SELECT count(*)::bigint FROM siwa.transfer_imports WHERE state = 'applied'")
                == moved)
        #expect(try count(new, "SELECT count(*)::bigint FROM siwa.sub_aliases") == moved)
        #expect(try count(new, "SELECT count(DISTINCT new_sub)::bigint FROM siwa.sub_aliases") == moved)
        #expect(
            try count(new, "SELECT count(*)::bigint FROM siwa.accounts WHERE sub LIKE '%.old'")
                == refusedUsers.count)
        #expect(
            try count(new, "SELECT count(*)::bigint FROM siwa.sessions WHERE sub LIKE '%.old'")
                == refusedUsers.count)
        #expect(try count(new, "SELECT count(*)::bigint FROM siwa.accounts") == total)
        #expect(try count(new, "SELECT count(*)::bigint FROM siwa.sessions") == total)
        // Every alias is the local Apple's answer for that user, and the tables follow it.
        #expect(
            try new.query("SELECT old_sub, new_sub FROM siwa.sub_aliases").allSatisfy { row throws in
                try newSub(row[0, as: String.self]) == row[1, as: String.self]
            })
        #expect(
            try count(
                new,
                "SELECT count(*)::bigint FROM siwa.refresh_tokens t JOIN siwa.sub_aliases a ON a.new_sub = t.sub"
            ) == total / 10
                - refusedUsers.filter { $0.hasSuffix("0.old") }.count)
        // Relay addresses are the new team's; other addresses stay.
        #expect(
            try count(
                new,
                "SELECT count(*)::bigint FROM siwa.accounts a JOIN siwa.sub_aliases s ON s.new_sub = a.sub WHERE a.is_private_email AND a.email LIKE 'u%'"
            ) == 0)
        #expect(
            try count(
                new,
                "SELECT count(*)::bigint FROM siwa.accounts a JOIN siwa.sub_aliases s ON s.new_sub = a.sub WHERE NOT a.is_private_email AND a.email LIKE 'u%@example.com'"
            ) == moved - people.filter { $0.isPrivate }.count
                + refusedUsers.filter { sub in people.first { $0.sub == sub }!.isPrivate }.count)
        #expect(try count(new, "SELECT sum(users)::bigint FROM siwa.sub_transfer_batches") == moved)
        #expect(
            try count(new, "SELECT count(*)::bigint FROM siwa.transfer_imports WHERE email IS NOT NULL") == 0)
        // Running it again changes nothing.
        let again = try siwactl(
            importArguments(apple, recipient, new) + ["--input", list.path, "--list-digest", digest])
        #expect(again.status == 0, "\(again.standardError)")
        #expect(try count(new, "SELECT count(*)::bigint FROM siwa.sub_aliases") == moved)
        print(
            String(
                format: "transfer of %d users: export %.1f s (killed once, resumed), import %.1f s", total,
                exportSeconds, importSeconds))
        // About 45 s alone on 2 cores (docs/operations.md § 14); a regression guard, not a benchmark: the
        // suite runs other tests beside it.
        #expect(exportSeconds + importSeconds < 120)
    }

    @Test("--stop-after stops a run that the next one resumes, and the import reads the same database")
    func stopAfterAndSameDatabase() throws {
        let scratch = try scratchDirectory()
        defer { try? FileManager.default.removeItem(at: scratch) }
        let recipient = try TransferRecipient(directory: scratch)
        let apple = try LocalApple(transferTeams: [recipient.transferTeam])
        let database = try TestDatabase()
        try seed(database, count: 30)
        let stopped = try siwactl(
            exportArguments(apple, database) + ["--stop-after", "7"])
        #expect(stopped.status == 0, "\(stopped.standardError)")
        #expect(stopped.standardOutput.contains("stopped by --stop-after"))
        #expect(
            try count(database, "SELECT count(*)::bigint FROM siwa.transfer_exports WHERE state = 'done'")
                == 7)
        #expect(
            try count(database, "SELECT count(*)::bigint FROM siwa.transfer_exports WHERE state = 'pending'")
                == 23)
        let resumed = try siwactl(exportArguments(apple, database))
        #expect(resumed.status == 0, "\(resumed.standardError)")
        #expect(resumed.standardOutput.contains("30 of 30 done; this run: 23 done"))
        let digest = try #require(printedDigest(resumed.standardOutput), "\(resumed.standardOutput)")
        let imported = try siwactl(
            importArguments(apple, recipient, database) + [
                "--from-target-team", TransferRecipient.teamID, "--list-digest", digest,
            ])
        #expect(imported.status == 0, "\(imported.standardError)")
        #expect(try count(database, "SELECT count(*)::bigint FROM siwa.sub_aliases") == 30)
        #expect(try count(database, "SELECT count(*)::bigint FROM siwa.accounts WHERE sub LIKE '%.old'") == 0)
        // The old team's progress keeps its own subs.
        #expect(
            try count(database, "SELECT count(*)::bigint FROM siwa.transfer_exports WHERE sub LIKE '%.old'")
                == 30)
    }

    @Test("a dry run changes nothing on either side")
    func dryRun() throws {
        let scratch = try scratchDirectory()
        defer { try? FileManager.default.removeItem(at: scratch) }
        let recipient = try TransferRecipient(directory: scratch)
        let apple = try LocalApple(transferTeams: [recipient.transferTeam])
        let old = try TestDatabase()
        try seed(old, count: 20)
        let dry = try siwactl(exportArguments(apple, old) + ["--dry-run"])
        #expect(dry.status == 0, "\(dry.standardError)")
        #expect(dry.standardOutput.contains("would ask Apple for 20"))
        #expect(try count(old, "SELECT count(*)::bigint FROM siwa.transfer_exports") == 0)
        #expect(!apple.log.contains("/auth/usermigrationinfo"))
        let list = scratch.appendingPathComponent("list.jsonl")
        let exported = try siwactl(exportArguments(apple, old) + ["--output", list.path])
        #expect(exported.status == 0)
        let digest = try #require(printedDigest(exported.standardOutput), "\(exported.standardOutput)")
        let new = try TestDatabase()
        try seed(new, count: 20)
        let before = try new.query("SELECT string_agg(sub, ',' ORDER BY sub) FROM siwa.accounts")[0][
            0, as: String.self]
        let dryImport = try siwactl(
            importArguments(apple, recipient, new) + [
                "--input", list.path, "--list-digest", digest, "--dry-run",
            ])
        #expect(dryImport.status == 0, "\(dryImport.standardError)")
        #expect(
            dryImport.standardOutput.contains("the list holds 20 users; its 20 pairs match --list-digest"))
        #expect(try count(new, "SELECT count(*)::bigint FROM siwa.transfer_imports") == 0)
        #expect(try count(new, "SELECT count(*)::bigint FROM siwa.sub_aliases") == 0)
        #expect(
            try new.query("SELECT string_agg(sub, ',' ORDER BY sub) FROM siwa.accounts")[0][
                0, as: String.self] == before)
    }

    @Test("wrong transfer identifiers (two users exchanged for one new sub) are refused and recorded")
    func wrongIdentifiers() throws {
        let scratch = try scratchDirectory()
        defer { try? FileManager.default.removeItem(at: scratch) }
        let recipient = try TransferRecipient(directory: scratch)
        let apple = try LocalApple(transferTeams: [recipient.transferTeam])
        let new = try TestDatabase()
        try seed(new, count: 3)
        let people = users(3)
        func hex(_ text: String) -> String { text.utf8.map { String(format: "%02x", $0) }.joined() }
        // A buggy export gave user 2 the transfer identifier of user 1 (through another source team,
        // so the identifiers differ but Apple answers the same new sub).
        let entries = [
            TransferExport.Entry(
                sub: people[0].sub,
                transferSub: "\(TransferRecipient.teamID).\(LocalApple.teamID).\(hex(people[0].sub))"),
            TransferExport.Entry(
                sub: people[1].sub,
                transferSub: "\(TransferRecipient.teamID).TEAMC00000.\(hex(people[0].sub))"),
            TransferExport.Entry(
                sub: people[2].sub,
                transferSub: "\(TransferRecipient.teamID).\(LocalApple.teamID).\(hex(people[2].sub))"),
            // And user 3 listed twice: the second pairing is not loaded, and said so.
            TransferExport.Entry(
                sub: people[2].sub,
                transferSub: "\(TransferRecipient.teamID).TEAMD00000.\(hex(people[2].sub))"),
        ]
        let list = scratch.appendingPathComponent("list.jsonl")
        try TransferList(targetTeam: TransferRecipient.teamID, entries: entries).write(to: list.path)
        let digest = try TransferList.digest(targetTeam: TransferRecipient.teamID, entries: entries)
        let result = try siwactl(
            importArguments(apple, recipient, new) + ["--input", list.path, "--list-digest", digest])
        #expect(result.status == 0, "\(result.standardError)")
        #expect(result.standardError.contains("2 users got a new sub that Apple also gave another user"))
        #expect(result.standardError.contains("1 lines of the list were not loaded"))
        let states = try new.query("SELECT old_sub, state FROM siwa.transfer_imports ORDER BY old_sub").map {
            row throws -> String in "\(try row[0, as: String.self]) \(try row[1, as: String.self])"
        }
        #expect(
            states == [
                "\(people[0].sub) duplicate", "\(people[1].sub) duplicate", "\(people[2].sub) applied",
            ])
        #expect(
            try count(
                new, "SELECT count(*)::bigint FROM siwa.accounts WHERE sub = $1", [.text(people[0].sub)]) == 1
        )
        #expect(
            try count(
                new, "SELECT count(*)::bigint FROM siwa.accounts WHERE sub = $1",
                [.text(newSub(people[2].sub))]) == 1)
    }

    @Test(
        "a list with two users' transfer identifiers swapped is refused, loading nothing; it holds no sub or email, and its digest is sha256sum of the pairs as psql lists them"
    )
    func swappedPairsRefused() throws {
        let scratch = try scratchDirectory()
        defer { try? FileManager.default.removeItem(at: scratch) }
        let recipient = try TransferRecipient(directory: scratch)
        let apple = try LocalApple(transferTeams: [recipient.transferTeam])
        let old = try TestDatabase()
        try seed(old, count: 6)
        let list = scratch.appendingPathComponent("list.jsonl")
        let exported = try siwactl(exportArguments(apple, old) + ["--output", list.path])
        #expect(exported.status == 0, "\(exported.standardError)")
        let digest = try #require(printedDigest(exported.standardOutput), "\(exported.standardOutput)")
        // What is handed over holds no team-scoped identifier and no address (Apple's transfer guide).
        let text = try String(contentsOf: list, encoding: .utf8)
        for person in users(6) {
            #expect(!text.contains(person.sub) && !text.contains(person.email))
        }
        // The digest, made the way docs/operations.md § 14 tells either team to check it.
        let canonical = try old.query(
            """
            SELECT 'siwa-transfer-list 2 ' || $1 || E'\\n'
                   || string_agg(sub || E'\\t' || transfer_sub || E'\\n', '' ORDER BY sub COLLATE "C", transfer_sub COLLATE "C")
              FROM siwa.transfer_exports WHERE target_team = $1 AND state = 'done'
            """, [.text(TransferRecipient.teamID)])[0][0, as: String.self]
        let canonicalFile = scratch.appendingPathComponent("pairs.txt")
        try canonical.write(to: canonicalFile, atomically: true, encoding: .utf8)
        let summed = try Subprocess.run("/usr/bin/sha256sum", [canonicalFile.path], timeout: .seconds(30))
        #expect(summed.standardOutput.split(separator: " ").first.map(String.init) == digest)

        // Two users' transfer identifiers swapped in the file.
        var rows = text.split(separator: "\n").map { line -> [String: Any] in
            (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]) ?? [:]
        }
        (rows[1]["transfer_sub"], rows[2]["transfer_sub"]) = (
            rows[2]["transfer_sub"], rows[1]["transfer_sub"]
        )
        let swapped = scratch.appendingPathComponent("swapped.jsonl")
        try rows.map(jsonLine).joined().write(to: swapped, atomically: true, encoding: .utf8)
        let new = try TestDatabase()
        try seed(new, count: 6)
        let refused = try siwactl(
            importArguments(apple, recipient, new) + ["--input", swapped.path, "--list-digest", digest])
        #expect(refused.status == 1)
        #expect(
            refused.standardError.contains("not the --list-digest the old team gave"),
            "\(refused.standardError)")
        #expect(refused.standardError.contains("nothing was loaded"))
        #expect(try count(new, "SELECT count(*)::bigint FROM siwa.transfer_imports") == 0)
        #expect(try count(new, "SELECT count(*)::bigint FROM siwa.sub_aliases") == 0)
        // Without a digest the import does not start.
        let undigested = try siwactl(importArguments(apple, recipient, new) + ["--input", list.path])
        #expect(undigested.status != 0)
        #expect(undigested.standardError.contains("--list-digest"))
        // The list as written moves every user to the new sub Apple gives for that user.
        let imported = try siwactl(
            importArguments(apple, recipient, new) + ["--input", list.path, "--list-digest", digest])
        #expect(imported.status == 0, "\(imported.standardError)")
        #expect(
            try new.query("SELECT old_sub, new_sub FROM siwa.sub_aliases").map { row throws -> Bool in
                try newSub(row[0, as: String.self]) == row[1, as: String.self]
            } == Array(repeating: true, count: 6))
    }

    @Test("credentials Apple refuses stop the run without marking any user failed")
    func refusedCredentials() throws {
        let apple = try LocalApple()
        let old = try TestDatabase()
        try seed(old, count: 5)
        var arguments = exportArguments(apple, old)
        arguments[arguments.firstIndex(of: LocalApple.keyID)!] = "WRONGKEY00"
        let result = try siwactl(arguments)
        #expect(result.status == 1)
        #expect(result.standardError.contains("invalid_client"))
        #expect(
            try count(old, "SELECT count(*)::bigint FROM siwa.transfer_exports WHERE state = 'failed'") == 0)
    }
}

/// One JSON object per line, keys sorted.
private func jsonLine(_ object: [String: Any]) -> String {
    let data =
        (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{}".utf8)
    return String(decoding: data, as: UTF8.self) + "\n"
}
