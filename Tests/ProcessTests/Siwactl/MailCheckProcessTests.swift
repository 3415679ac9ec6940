import Foundation
import Postgres
import TestSupport
import Testing

/// A database where the gate knows four addresses: forwarding off, on, never turned off, and erased.
private func mailDatabase() throws -> TestDatabase {
    let database = try TestDatabase()
    let owner = try database.connect()
    defer { owner.close() }
    let now = Date()
    try owner.storeAsReceiver(
        [
            ("m1", "email-disabled", "001000.off", "off@privaterelay.appleid.com"),
            ("m2", "email-enabled", "001000.on", "on@privaterelay.appleid.com"),
            ("m3", "email-enabled", "001000.gone", "gone@privaterelay.appleid.com"),
            ("m4", "account-delete", "001000.gone", nil),
        ].enumerated().map { index, event in
            SeededNotification(
                jti: event.0, type: event.1, sub: event.2, email: event.3,
                eventTime: now.addingTimeInterval(Double(index) - 600))
        })
    let worker = try database.connect(asMemberOf: "siwa_worker")
    defer { worker.close() }
    try worker.transaction { connection in
        _ = try connection.query("SELECT * FROM siwa.process_due_notifications(100, 5, interval '1 ms')")
    }
    try owner.execute(
        "INSERT INTO siwa.accounts (sub, email, is_private_email) VALUES ('001000.quiet', 'Quiet@Example.com', false)"
    )
    return database
}

private func temporaryFile(_ name: String) -> URL {
    FileManager.default.temporaryDirectory.appendingPathComponent("mail-check-\(UUID().uuidString)-\(name)")
}

@Suite("siwactl mail check: a list through the relay-mail gate, allowed out, the others with reasons")
struct MailCheckProcessTests {
    @Test(
        "lines from standard input: allowed ones to standard output in order, the others as CSV, counts only")
    func linesFromStandardInput() throws {
        let database = try mailDatabase()
        let rejected = temporaryFile("rejected.csv")
        defer { try? FileManager.default.removeItem(at: rejected) }
        let list = """
            on@privaterelay.appleid.com
            off@privaterelay.appleid.com\r
              quiet@EXAMPLE.COM

            gone@privaterelay.appleid.com
            someone@example.org
            new@private.icloud.com
            not an address
            on@privaterelay.appleid.com
            """
        let result = try siwactl(
            [
                "mail", "check", "--database-url", try database.url(asMemberOf: "siwa_mail"), "--rejected",
                rejected.path,
            ],
            input: Data(list.utf8))
        #expect(result.status == 0, "\(result.standardError)")
        #expect(result.standardOutput == "on@privaterelay.appleid.com\non@privaterelay.appleid.com\n")
        let lines = try String(contentsOf: rejected, encoding: .utf8).split(separator: "\n").map {
            $0.split(separator: ",", omittingEmptySubsequences: false).map(String.init)
        }
        #expect(lines.first == ["address", "decision", "reason", "since"])
        #expect(
            lines.dropFirst().map { Array($0.prefix(3)) } == [
                ["off@privaterelay.appleid.com", "block", "forwarding_off"],
                ["quiet@EXAMPLE.COM", "unknown", "not_ours"],  // the local part is matched exactly
                ["gone@privaterelay.appleid.com", "block", "account_deleted"],
                ["someone@example.org", "unknown", "not_ours"],
                ["new@private.icloud.com", "unknown", "looks_like_relay"],
                ["not an address", "unknown", "malformed"],
            ])
        #expect(lines[1][3].hasPrefix("20") && lines[1][3].hasSuffix("Z"), "\(lines[1])")
        #expect(lines[4][3] == "")
        #expect(
            result.standardError == "siwactl mail check: 8 addresses: 2 allowed, 2 blocked, 4 unknown\n",
            "\(result.standardError)")
        #expect(!result.standardError.contains("@"))
    }

    @Test("a CSV column by name or position, files and SIWA_* variables instead of flags")
    func csvColumnFromFiles() throws {
        let database = try mailDatabase()
        let input = temporaryFile("list.csv")
        let allowed = temporaryFile("allowed.txt")
        let rejected = temporaryFile("rejected.csv")
        defer {
            for file in [input, allowed, rejected] { try? FileManager.default.removeItem(at: file) }
        }
        try Data(
            [
                #"name,"e-mail",note"#, #"Ann,on@privaterelay.appleid.com,"first, of two""#,
                #""Bob ""B""",Quiet@example.com,"#, #"Cid,"off@privaterelay.appleid.com",x"#, "",
            ].joined(separator: "\r\n").utf8
        ).write(to: input)
        for column in ["e-mail", "2"] {
            let result = try siwactl(
                ["mail", "check", "--csv-column", column],
                environment: [
                    "SIWA_DATABASE_URL": try database.url(asMemberOf: "siwa_mail"),
                    "SIWA_MAIL_CHECK_INPUT": input.path, "SIWA_MAIL_CHECK_ALLOWED": allowed.path,
                    "SIWA_MAIL_CHECK_REJECTED": rejected.path,
                ])
            #expect(result.status == 0, "\(result.standardError)")
            #expect(result.standardOutput == "")
            #expect(
                try String(contentsOf: allowed, encoding: .utf8)
                    == "on@privaterelay.appleid.com\nQuiet@example.com\n")
            let rows = try String(contentsOf: rejected, encoding: .utf8).split(separator: "\n")
            #expect(
                rows.count == 2 && rows[1].hasPrefix("off@privaterelay.appleid.com,block,forwarding_off,"))
            #expect(result.standardError.contains("3 addresses: 2 allowed, 1 blocked, 0 unknown"))
        }
        let missing = try siwactl(
            ["mail", "check", "--csv-column", "email", "--input", input.path, "--database-url", database.url])
        #expect(missing.status == 2)
        #expect(missing.standardError.contains("no CSV column is named 'email'"), "\(missing.standardError)")
    }

    @Test("more than 10,000 addresses are asked in chunks and answered in order")
    func chunks() throws {
        let database = try mailDatabase()
        var list = (1...10_500).map { "n\($0)@privaterelay.appleid.com" }
        list[10_200] = "off@privaterelay.appleid.com"
        list[3] = "on@privaterelay.appleid.com"
        let rejected = temporaryFile("rejected.csv")
        defer { try? FileManager.default.removeItem(at: rejected) }
        let result = try siwactl(
            [
                "mail", "check", "--database-url", try database.url(asMemberOf: "siwa_mail"), "--rejected",
                rejected.path,
            ],
            input: Data(list.joined(separator: "\n").utf8))
        #expect(result.status == 0, "\(result.standardError)")
        #expect(result.standardOutput == "on@privaterelay.appleid.com\n")
        let rows = try String(contentsOf: rejected, encoding: .utf8).split(separator: "\n")
        #expect(rows.count == 10_500)
        #expect(rows[10_200].hasPrefix("off@privaterelay.appleid.com,block,forwarding_off,"))
        #expect(rows[10_500 - 1].hasPrefix("n10500@privaterelay.appleid.com,unknown,looks_like_relay,"))
        #expect(result.standardError.contains("10500 addresses: 1 allowed, 1 blocked, 10498 unknown"))
    }

    @Test("a login outside siwa_mail without the grant fails with one line naming the call, exit 1")
    func refusedWithoutTheRole() throws {
        let database = try mailDatabase()
        let result = try siwactl(
            ["mail", "check", "--database-url", try database.url(asMemberOf: nil)],
            input: Data("on@privaterelay.appleid.com\n".utf8))
        #expect(result.status == 1)
        #expect(
            result.standardError.contains("asking siwa.relay_mail_decisions failed"),
            "\(result.standardError)")
        #expect(!result.standardError.contains("on@privaterelay"))
        #expect(result.standardOutput == "")
    }
}
