import Foundation
import Postgres
import TestSupport
import Testing

/// Test values for the psql variables the cookbook uses.
let cookbookVariables = ["sub": Seed.alice, "jti": "jti-bob-1"]

@Suite("The SQL cookbook in docs/sql.md")
struct CookbookTests {
    /// Runs `query` as the admin role on the shared seeded database.
    func run(_ query: CookbookQuery) throws -> PostgresRows {
        let database = try Seed.shared.get()
        let connection = try database.connect(as: .admin)
        defer { connection.close() }
        let results = try connection.simpleQuery(query.substituting(cookbookVariables))
        return try #require(results.last)
    }

    func column(_ name: String, of rows: PostgresRows) throws -> [String?] {
        let position = try #require(rows.columns.firstIndex(of: name), "no column \(name)")
        return try rows.map { try $0.text(at: position) }
    }

    @Test("has at least 12 queries")
    func atLeastTwelve() throws {
        #expect(try CookbookQuery.all().count >= 12)
    }

    @Test("a missing cookbook, or one without queries, is an error rather than nothing to test")
    func emptyIsAnError() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "cookbook-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let file = directory.appendingPathComponent("sql.md")
        #expect(throws: (any Error).self) { try CookbookQuery.load(file) }
        try Data("# SQL\n\nNo queries here.\n".utf8).write(to: file)
        #expect(throws: CookbookQuery.Unreadable.self) { try CookbookQuery.load(file) }
        #expect(throws: CookbookQuery.Unreadable.self) {
            try CookbookQuery.parse("## A\n```sql\nSELECT 1;\n")
        }
    }

    @Test("every query is plain SQL without psql meta-commands")
    func plainSQL() throws {
        for query in try CookbookQuery.all() {
            #expect(!query.sql.contains("\\"), "\(query.heading) contains a backslash command")
            #expect(!query.sql.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty, "\(query.heading)")
        }
    }

    @Test("every query runs as siwa_admin", arguments: try CookbookQuery.all())
    func runsAsAdmin(query: CookbookQuery) throws {
        _ = try run(query)
    }

    @Test("the timeline lists one user's events in the order they happened")
    func timeline() throws {
        let rows = try run(CookbookQuery.under("What happened to user X, and when?"))
        #expect(
            try column("event_type", of: rows)
                == ["email-disabled", "email-enabled", "consent-revoked", "email-disabled"])
        #expect(try column("state", of: rows) == ["applied", "applied", "applied", "pending"])
    }

    @Test("the current state of one user is their account row")
    func currentState() throws {
        let rows = try run(CookbookQuery.under("What is user X's current state?"))
        #expect(try column("sub", of: rows) == [Seed.alice])
        #expect(try column("email_status", of: rows) == ["enabled"])
    }

    @Test("one notification is found by its jti")
    func byJTI() throws {
        let rows = try run(CookbookQuery.under("What happened to one notification?"))
        #expect(try column("sub", of: rows) == [Seed.bob])
    }

    @Test("the disabled-email query returns exactly the user whose relay email is disabled")
    func disabledEmail() throws {
        let rows = try run(CookbookQuery.under("Which users' relay email is disabled right now?"))
        #expect(try column("sub", of: rows) == [Seed.bob])
    }

    @Test("dead notifications come with the reason")
    func dead() throws {
        let rows = try run(CookbookQuery.under("Which notifications are dead, and why?"))
        #expect(try column("jti", of: rows) == ["jti-erin-1"])
        #expect(try column("last_error", of: rows).first??.contains("hook refused") == true)
    }

    @Test("pending notifications are listed oldest first, with the failure of the retrying one")
    func pending() throws {
        let rows = try run(
            CookbookQuery.under("Which notifications are still pending, and how late are they?"))
        #expect(try column("jti", of: rows) == ["jti-frank-1", "jti-alice-4"])
        #expect(try column("last_error", of: rows) == ["P0001: simulated failure", nil])
    }

    @Test("unknown event types are listed")
    func unknownTypes() throws {
        let rows = try run(CookbookQuery.under("Which unknown event types has Apple sent?"))
        #expect(try column("event_type", of: rows) == ["email-forwarding-changed"])
    }

    @Test("revoked sessions are counted by reason")
    func sessionsByReason() throws {
        let rows = try run(CookbookQuery.under("Why were sessions revoked?"))
        #expect(try column("reason", of: rows) == ["consent-revoked", "account-delete"])
        #expect(try column("sessions", of: rows) == ["2", "1"])
    }

    @Test("users who signed in again after revoking consent are found")
    func signedInAgain() throws {
        let rows = try run(CookbookQuery.under("Who revoked consent but signed in again later?"))
        #expect(try column("sub", of: rows) == [Seed.alice])
        #expect(try column("open_sessions", of: rows) == ["1"])
    }

    @Test("deleted accounts show their erasure")
    func erasure() throws {
        let rows = try run(CookbookQuery.under("Has the personal data of deleted accounts been erased?"))
        #expect(try column("sub", of: rows) == [Seed.carol])
        #expect(try column("erasure", of: rows) == ["erased"])
        #expect(try column("still_has_email", of: rows) == ["f"])
    }

    @Test("notifications are counted per client ID")
    func perAudience() throws {
        let rows = try run(CookbookQuery.under("How many notifications came for each client ID?"))
        let audiences = Set(try column("audience", of: rows).compactMap { $0 })
        #expect(audiences == ["com.example.app", "com.example.web"])
    }

    @Test("queue health is one row")
    func queueHealth() throws {
        let rows = try run(CookbookQuery.under("Is the worker keeping up right now?"))
        #expect(rows.count == 1)
        #expect(try column("pending", of: rows) == ["2"])
    }
}
