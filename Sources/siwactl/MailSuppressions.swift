import Foundation
import Postgres
import ServiceSupport
import Suppressions

/// `siwactl mail suppressions`: the ESP suppression outbox (siwa.suppression_outbox) listed, retried,
/// replayed, through `SuppressionAdministration`. Never prints an address: the user's sub stands for it.
enum MailSuppressionsVerb {
    static let providerOption = CommandOption(
        "provider", valueName: "NAME", help: "A provider (siwa.suppression_providers.name).")

    static let listSpec = CommandSpec(
        name: "siwactl mail suppressions list",
        abstract: """
            Lists the newest suppression outbox rows: provider, the user's sub (never the address), event,
            action, state and outcome, attempts, the last status and error, when a pending row is due.
            Connect as the owner.
            """,
        options: [
            .databaseURL, providerOption,
            CommandOption(
                "state", valueName: "STATE", help: "Only rows in this state: pending, done or dead."),
            CommandOption("limit", valueName: "N", help: "At most this many rows (default 50)."),
        ],
        flags: [CommandFlag("json", help: "One JSON object per line.")])

    static let retrySpec = CommandSpec(
        name: "siwactl mail suppressions retry",
        abstract: """
            Attempts rows now: one ID (pending: due now; dead: pending again with its attempts reset), or
            with --dead every dead row (of one --provider), except those a later finished row of their
            address supersedes and those erased with their account. Prints how many are due now.
            """,
        options: [.databaseURL, providerOption],
        flags: [CommandFlag("dead", help: "Every dead row (of --provider) instead of one ID.")],
        positionals: [CommandPositional("ID", help: "A row (siwa.suppression_outbox.id).", isOptional: true)])

    static let replaySpec = CommandSpec(
        name: "siwactl mail suppressions replay",
        abstract: """
            Sends a provider its desired states again (after its list was reset, or restored from a backup):
            for every address of --provider with a row since --since (all without), its latest state as a
            new pending row, in order. Addresses with a pending row already are skipped. Prints how many
            rows were queued.
            """,
        options: [
            .databaseURL, providerOption,
            CommandOption(
                "since", valueName: "TIME", help: "Addresses with a row since (ISO 8601, or an age: 2h)."),
        ])

    static let realAddressesSpec = CommandSpec(
        name: "siwactl mail suppressions real-addresses",
        abstract: """
            Lists what an earlier version added to a suppression list for an address that is not a relay
            address (a user who shared a real address): provider, the user's sub, when. With --remove, queues
            the removal of each (siwa-worker --suppressions sends it) and prints how many.
            """,
        options: [.databaseURL, providerOption],
        flags: [CommandFlag("remove", help: "Queue their removal from the providers' lists.")])

    static let verb = Verb(
        name: "suppressions",
        abstract:
            "The ESP suppression outbox: list, retry and replay its rows; find and remove real addresses.",
        subverbs: [
            .parsing("list", listSpec) { parsed, _ in try list(parsed) },
            .parsing("retry", retrySpec) { parsed, _ in try retry(parsed) },
            .parsing("replay", replaySpec) { parsed, _ in try replay(parsed) },
            .parsing("real-addresses", realAddressesSpec) { parsed, _ in try realAddresses(parsed) },
        ])

    static func realAddresses(_ parsed: ParsedCommand) throws {
        let provider = parsed.value("provider")
        let connection = try connect(parsed)
        defer { connection.close() }
        let administration = SuppressionAdministration(connection)
        if let provider,
            try !database("reading the provider", { try administration.providerExists(provider) })
        {
            throw ToolFailure("no provider \(provider)")
        }
        if parsed.flag("remove") {
            let count = try database("queueing removals") {
                try administration.removeRealAddressSuppressions(provider: provider)
            }
            writeStandardOutput("queued \(count) removal\(count == 1 ? "" : "s")\n")
            return
        }
        let rows = try database("listing") { try administration.realAddressSuppressions(provider: provider) }
        writeStandardOutput(
            renderTable(
                header: ["PROVIDER", "SUB", "ADDED"],
                rows: rows.map { [$0.provider, $0.sub, formatShort($0.addedAt)] }))
    }

    static func list(_ parsed: ParsedCommand) throws {
        let state = parsed.value("state")
        if let state, !["pending", "done", "dead"].contains(state) {
            throw UsageError("--state must be pending, done or dead")
        }
        var limit = 50
        if let text = parsed.value("limit") {
            guard let value = Int(text), (1...100_000).contains(value) else {
                throw UsageError("--limit must be a number from 1 to 100000")
            }
            limit = value
        }
        let connection = try connect(parsed)
        defer { connection.close() }
        let rows = try database("listing suppressions") {
            try SuppressionAdministration(connection).rows(
                provider: parsed.value("provider"), state: state, limit: limit)
        }
        func due(_ row: SuppressionAdministration.Row) -> String {
            guard let due = row.due else { return "-" }
            if row.leased { return "in flight" }
            return due <= Date() ? "now" : formatShort(due)
        }
        if parsed.flag("json") {
            for row in rows {
                writeStandardOutput(
                    JSONText.line([
                        "id": row.id, "provider": row.provider, "sub": row.sub, "event": row.event,
                        "action": row.action, "state": row.state, "outcome": row.outcome ?? NSNull(),
                        "attempts": row.attempts, "last_status": row.lastStatus ?? NSNull(),
                        "last_error": row.lastError ?? NSNull(), "due": row.due.map(formatShort) ?? NSNull(),
                        "leased": row.leased, "created_at": formatShort(row.createdAt),
                    ]))
            }
            return
        }
        writeStandardOutput(
            renderTable(
                header: [
                    "ID", "PROVIDER", "SUB", "EVENT", "ACTION", "STATE", "OUTCOME", "ATTEMPTS", "STATUS",
                    "LAST ERROR", "DUE",
                ],
                rows: rows.map { row in
                    [
                        String(row.id), row.provider, row.sub, row.event, row.action, row.state,
                        row.outcome ?? "-", String(row.attempts), row.lastStatus.map(String.init) ?? "-",
                        row.lastError ?? "-", due(row),
                    ]
                }))
    }

    static func retry(_ parsed: ParsedCommand) throws {
        let dead = parsed.flag("dead")
        let id = try parsed.positionals.first.map { text -> Int in
            guard let value = Int(text), value > 0 else { throw UsageError("ID must be a row id") }
            return value
        }
        guard (id == nil) == dead else { throw UsageError("give exactly one of ID or --dead") }
        if id != nil, parsed.value("provider") != nil { throw UsageError("--provider goes with --dead") }
        let connection = try connect(parsed)
        defer { connection.close() }
        let administration = SuppressionAdministration(connection)
        if let id {
            switch try database("retrying") { try administration.retry(id) } {
            case .dueNow: writeStandardOutput("row \(id): due now\n")
            case .revived: writeStandardOutput("row \(id): pending again, due now\n")
            case .unchanged(let why): throw ToolFailure(why)
            }
            return
        }
        let provider = parsed.value("provider")
        if let provider,
            try !database("reading the provider", { try administration.providerExists(provider) })
        {
            throw ToolFailure("no provider \(provider)")
        }
        let count = try database("reviving") { try administration.revive(.dead(provider: provider)) }
        writeStandardOutput("pending again, due now: \(count) row\(count == 1 ? "" : "s")\n")
    }

    static func replay(_ parsed: ParsedCommand) throws {
        guard let provider = parsed.value("provider") else { throw UsageError("--provider is required") }
        var since: Date?
        if let text = parsed.value("since") {
            guard let date = parseSince(text) else {
                throw UsageError("--since: ISO 8601 or an age such as 2h")
            }
            since = date
        }
        let connection = try connect(parsed)
        defer { connection.close() }
        let administration = SuppressionAdministration(connection)
        guard try database("reading the provider", { try administration.providerExists(provider) }) else {
            throw ToolFailure("no provider \(provider)")
        }
        let count = try database("replaying") { try administration.replay(provider: provider, since: since) }
        writeStandardOutput("queued \(count) row\(count == 1 ? "" : "s")\n")
    }
}
