import Foundation
import Postgres
import Suppressions
import TestSupport
import Testing

/// A database with provider `sg` and outbox rows written as the fan-out writes them.
private final class Outbox {
    let database: TestDatabase

    init() throws {
        database = try TestDatabase()
        try database.connection.execute(
            "INSERT INTO siwa.suppression_providers (name, kind) VALUES ('sg', 'sendgrid'), ('pm', 'postmark')"
        )
    }

    /// Writes one row; returns its id.
    @discardableResult
    func row(
        _ sub: String, _ address: String, _ action: String, state: String = "pending", outcome: String? = nil,
        provider: String = "sg"
    ) throws -> Int {
        let event = action == "add" ? "email-disabled" : "email-enabled"
        return try database.value(
            """
            INSERT INTO siwa.suppression_outbox (provider, sub, event, action, address, address_key, state, outcome,
                                                 attempts, next_attempt_at, last_status, last_error, finished_at)
            VALUES ($1, $2, $3, $4, $5, siwa.mail_address_key($5), $6, $7,
                    CASE WHEN $6 = 'dead' THEN 30 ELSE 0 END, now() + interval '1 hour',
                    CASE WHEN $6 = 'dead' THEN 503 END, CASE WHEN $6 = 'dead' THEN 'HTTP 503' END,
                    CASE WHEN $6 = 'pending' THEN NULL ELSE now() END)
            RETURNING id
            """,
            [
                .text(provider), .text(sub), .text(event), .text(action), .text(address), .text(state),
                outcome.map { .text($0) },
            ], as: Int.self)
    }

    /// (id, action, state, outcome) of a provider's rows, in id order.
    func rows(_ provider: String = "sg") throws -> [String] {
        try database.query(
            """
            SELECT id, sub, action, state, coalesce(outcome, '-'), attempts FROM siwa.suppression_outbox
             WHERE provider = $1 ORDER BY id
            """, [.text(provider)]
        ).map {
            "\(try $0[0, as: Int.self]) \(try $0[1, as: String.self]) \(try $0[2, as: String.self]) "
                + "\(try $0[3, as: String.self]) \(try $0[4, as: String.self]) \(try $0[5, as: Int.self])"
        }
    }

    func siwactlMail(_ arguments: [String]) throws -> ExecutableLocator.Result {
        try siwactl(["mail", "suppressions"] + arguments + ["--database-url", database.url])
    }
}

private let a = "a@privaterelay.appleid.com"
private let b = "b@privaterelay.appleid.com"
private let c = "c@privaterelay.appleid.com"

@Suite("siwactl mail suppressions: list, retry, replay", .serialized)
struct MailSuppressionsTests {
    @Test("list: the sub stands for the address, never printed; filters; JSON lines")
    func list() throws {
        let outbox = try Outbox()
        try outbox.row("sub.a", a, "add", state: "done", outcome: "done")
        try outbox.row("sub.b", b, "add", state: "dead", outcome: "gave_up")
        try outbox.row("sub.a", a, "remove")
        let table = try outbox.siwactlMail(["list"])
        #expect(table.status == 0, "\(table.standardError)")
        #expect(!table.standardOutput.contains("@") && !table.standardOutput.contains("privaterelay"))
        let lines = table.standardOutput.split(separator: "\n")
        try #require(lines.count == 4)
        #expect(lines[0].hasPrefix("ID  PROVIDER  SUB"))
        #expect(lines[1].contains("sub.a") && lines[1].contains("pending") && lines[1].contains("remove"))
        #expect(lines[2].contains("dead") && lines[2].contains("gave_up") && lines[2].contains("HTTP 503"))
        let dead = try jsonLines(
            try outbox.siwactlMail(["list", "--state", "dead", "--json"]).standardOutput)
        #expect(dead.count == 1)
        #expect(dead.first?["sub"] as? String == "sub.b" && dead.first?["last_status"] as? Int == 503)
        #expect(dead.first?["address"] == nil)
        #expect(try outbox.siwactlMail(["list", "--state", "gone"]).status == 2)
        #expect(
            try outbox.siwactlMail(["list", "--provider", "pm"]).standardOutput.split(separator: "\n").count
                == 1)
    }

    @Test("retry ID: pending due now, dead pending again; done, superseded, unknown refused; --dead all")
    func retry() throws {
        let outbox = try Outbox()
        let pending = try outbox.row("sub.a", a, "add")
        let dead = try outbox.row("sub.b", b, "add", state: "dead", outcome: "gave_up")
        let superseded = try outbox.row("sub.c", c, "add", state: "dead", outcome: "permanent")
        let done = try outbox.row("sub.c", c, "remove", state: "done", outcome: "not_ours")
        let first = try outbox.siwactlMail(["retry", String(pending)])
        #expect(
            first.status == 0 && first.standardOutput == "row \(pending): due now\n", "\(first.standardError)"
        )
        #expect(
            try outbox.database.value(
                "SELECT next_attempt_at <= now() FROM siwa.suppression_outbox WHERE id = $1",
                [.int(Int64(pending))], as: Bool.self))
        let revived = try outbox.siwactlMail(["retry", String(dead)])
        #expect(revived.status == 0 && revived.standardOutput.contains("pending again"))
        let refused = try outbox.siwactlMail(["retry", String(superseded)])
        #expect(refused.status == 1 && refused.standardError.contains("superseded"))
        #expect(try outbox.siwactlMail(["retry", String(done)]).status == 1)
        #expect(try outbox.siwactlMail(["retry", "999999"]).status == 1)
        #expect(try outbox.siwactlMail(["retry"]).status == 2)
        #expect(try outbox.siwactlMail(["retry", "1", "--dead"]).status == 2)
        #expect(
            try outbox.rows() == [
                "\(pending) sub.a add pending - 0", "\(dead) sub.b add pending - 0",
                "\(superseded) sub.c add dead permanent 30", "\(done) sub.c remove done not_ours 0",
            ])
        // --dead: every dead row of the provider but the superseded one.
        let other = try outbox.row(
            "sub.d", "d@privaterelay.appleid.com", "add", state: "dead", outcome: "gave_up")
        let all = try outbox.siwactlMail(["retry", "--dead", "--provider", "sg"])
        #expect(all.status == 0 && all.standardOutput == "pending again, due now: 1 row\n")
        #expect(try outbox.rows().last == "\(other) sub.d add pending - 0")
        #expect(try outbox.siwactlMail(["retry", "--dead", "--provider", "nope"]).status == 1)
    }

    @Test("replay --provider: each address's latest state again, in order; pending ones skipped; --since")
    func replay() throws {
        let outbox = try Outbox()
        try outbox.row("sub.a", a, "add", state: "done", outcome: "done")
        try outbox.row("sub.b", b, "add", state: "done", outcome: "done")
        try outbox.row("sub.a", a, "remove", state: "done", outcome: "done")
        try outbox.row("sub.c", c, "add")  // pending: skipped
        try outbox.row("sub.a", a, "add", state: "done", outcome: "done", provider: "pm")
        try outbox.database.connection.execute(
            "UPDATE siwa.suppression_outbox SET created_at = now() - interval '3 days' WHERE sub = 'sub.b'")
        func added(after count: Int) throws -> [String] {
            try outbox.rows().dropFirst(count).map {
                $0.split(separator: " ").dropFirst().joined(separator: " ")
            }
        }
        // Since a day: a (c has a pending row, b's rows are older).
        var before = try outbox.rows().count
        let recent = try outbox.siwactlMail(["replay", "--provider", "sg", "--since", "1d"])
        #expect(recent.status == 0 && recent.standardOutput == "queued 1 row\n", "\(recent.standardError)")
        #expect(try added(after: before) == ["sub.a remove pending - 0"])
        try outbox.database.connection.execute(
            "UPDATE siwa.suppression_outbox SET state = 'done', outcome = 'done', finished_at = now() WHERE state = 'pending'"
        )
        // Every address, in the order of the rows repeated: b's add, c's add, a's latest remove.
        before = try outbox.rows().count
        let all = try outbox.siwactlMail(["replay", "--provider", "sg"])
        #expect(all.standardOutput == "queued 3 rows\n")
        #expect(
            try added(after: before) == [
                "sub.b add pending - 0", "sub.c add pending - 0", "sub.a remove pending - 0",
            ])
        #expect(try outbox.siwactlMail(["replay"]).status == 2)
        #expect(try outbox.siwactlMail(["replay", "--provider", "nope"]).status == 1)
        #expect(
            try SuppressionAdministration(outbox.database.connection).replay(provider: "pm") == 1)
    }
}
