import Foundation
import Postgres
import ServiceSupport

/// `siwactl events`: the newest rows of `siwa.event_history`, filtered.
enum EventsVerb {
    static let spec = CommandSpec(
        name: "siwactl events",
        abstract: """
            List notifications from siwa.event_history, newest first: an aligned table, or with --json
            one JSON object per line.
            """,
        options: [
            .databaseURL,
            CommandOption("sub", valueName: "SUB", help: "Only this user."),
            CommandOption("type", valueName: "TYPE", help: "Only this event type (e.g. consent-revoked)."),
            CommandOption(
                "state", valueName: "STATE", help: "Only this state: pending, applied, skipped or dead."),
            CommandOption(
                "since", valueName: "TIME",
                help:
                    "Only received since TIME: ISO 8601 (2026-01-31T12:00:00Z) or an age (90s, 15m, 2h, 3d, 1w)."
            ),
            CommandOption("limit", valueName: "N", help: "At most N rows.", defaultValue: "50"),
        ],
        flags: [CommandFlag("json", help: "One JSON object per line instead of a table.")])

    static let verb = Verb(name: "events", abstract: "List stored notifications (newest first).") {
        arguments, environment in
        switch parse(spec, arguments, environment) {
        case .failure(let exit): return exit.status
        case .success(let parsed):
            let filter: Filter
            do {
                filter = try Filter(parsed)
            } catch {
                writeErrorLine(spec.name, "\(error)")
                return ExitStatus.usage
            }
            return await runReportingFailure(spec.name) { try run(parsed, filter) }
        }
    }

    static let states: Set<String> = ["pending", "applied", "skipped", "dead"]

    /// The validated filters.
    struct Filter {
        var sub: String?
        var type: String?
        var state: String?
        var since: Date?
        var limit: Int

        init(_ parsed: ParsedCommand) throws {
            sub = parsed.value("sub")
            // Apple's spelling of the deletion event is stored under its canonical name.
            type = parsed.value("type").map { $0 == "account-deleted" ? "account-delete" : $0 }
            state = parsed.value("state")
            if let state, !EventsVerb.states.contains(state) {
                throw ToolFailure("--state must be pending, applied, skipped or dead")
            }
            if let text = parsed.value("since") {
                guard let date = parseSince(text) else {
                    throw ToolFailure("--since must be ISO 8601 or an age such as 2h or 3d")
                }
                since = date
            }
            guard let limit = Int(parsed.value("limit") ?? ""), (1...100_000).contains(limit) else {
                throw ToolFailure("--limit must be a whole number from 1 to 100000")
            }
            self.limit = limit
        }
    }

    static let query = """
        SELECT id, received_at, event_type, state, attempts, sub, jti, audience, email, is_private_email,
               event_time, applied_at, next_attempt_at, last_error
          FROM siwa.event_history
         WHERE ($1::text IS NULL OR sub = $1::text)
           AND ($2::text IS NULL OR event_type = $2::text)
           AND ($3::text IS NULL OR state = $3::text)
           AND ($4::timestamptz IS NULL OR received_at >= $4::timestamptz)
         ORDER BY id DESC
         LIMIT $5
        """

    static func run(_ parsed: ParsedCommand, _ filter: Filter) throws {
        let connection = try connect(parsed)
        defer { connection.close() }
        let rows = try database("reading siwa.event_history") {
            try connection.query(
                query,
                [
                    filter.sub.map(PostgresData.text), filter.type.map(PostgresData.text),
                    filter.state.map(PostgresData.text), filter.since.map(PostgresData.date),
                    .int(Int64(filter.limit)),
                ])
        }
        let events = try database("decoding siwa.event_history") { try rows.map(Event.init) }
        if parsed.flag("json") {
            writeStandardOutput(events.map { JSONText.line($0.json) }.joined())
        } else if events.isEmpty {
            writeStandardOutput("no events\n")
        } else {
            let header = ["RECEIVED", "TYPE", "STATE", "ATTEMPTS", "SUB", "JTI", "LAST ERROR"]
            writeStandardOutput(renderTable(header: header, rows: events.map(\.cells)))
        }
    }

    /// One row of the history.
    struct Event {
        var id: Int64
        var receivedAt: Date
        var type: String
        var state: String
        var attempts: Int
        var sub: String
        var jti: String
        var audience: String
        var email: String?
        var isPrivateEmail: Bool?
        var eventTime: Date
        var appliedAt: Date?
        /// Only a pending notification has one (schema version 3).
        var nextAttemptAt: Date?
        var lastError: String?

        init(_ row: PostgresRow) throws(PostgresError) {
            id = try row["id"]
            receivedAt = try row["received_at"]
            type = try row["event_type"]
            state = try row["state"]
            attempts = try row["attempts"]
            sub = try row["sub"]
            jti = try row["jti"]
            audience = try row["audience"]
            email = try row["email"]
            isPrivateEmail = try row["is_private_email"]
            eventTime = try row["event_time"]
            appliedAt = try row["applied_at"]
            nextAttemptAt = try row["next_attempt_at"]
            lastError = try row["last_error"]
        }

        var cells: [String] {
            var error = (lastError ?? "").replacingOccurrences(of: "\n", with: " ")
            if error.count > 60 { error = String(error.prefix(59)) + "…" }
            return [formatShort(receivedAt), type, state, String(attempts), sub, jti, error]
        }

        var json: [String: Any] {
            [
                "id": id, "received_at": VerifyVerb.formatISO8601(receivedAt), "event_type": type,
                "state": state, "attempts": attempts, "sub": sub, "jti": jti, "audience": audience,
                "email": email ?? NSNull(), "is_private_email": isPrivateEmail ?? NSNull(),
                "event_time": VerifyVerb.formatISO8601(eventTime),
                "applied_at": appliedAt.map(VerifyVerb.formatISO8601) ?? NSNull(),
                "next_attempt_at": nextAttemptAt.map(VerifyVerb.formatISO8601) ?? NSNull(),
                "last_error": lastError ?? NSNull(),
            ]
        }
    }
}
