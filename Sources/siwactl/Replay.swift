import Foundation
import Postgres
import ServiceSupport

/// `siwactl replay`: puts finished notifications back in the worker's queue.
enum ReplayVerb {
    static let spec = CommandSpec(
        name: "siwactl replay",
        abstract: """
            Requeue notifications for another round of attempts (siwa.requeue): one by --jti, or every
            notification in --state dead (or skipped), optionally only those received --since a time.
            Prints how many were requeued; with --jti, exit status 1 when none was.
            """,
        options: [
            .databaseURL,
            CommandOption("jti", valueName: "JTI", help: "The notification to requeue."),
            CommandOption(
                "state", valueName: "STATE",
                help: "Requeue every notification in this state: dead or skipped."),
            CommandOption(
                "since", valueName: "TIME",
                help: "With --state: only those received since TIME (ISO 8601, or an age such as 2h, 3d)."),
        ])

    static let verb = Verb(name: "replay", abstract: "Requeue a notification, or all dead ones.") {
        arguments, environment in
        switch parse(spec, arguments, environment) {
        case .failure(let exit): return exit.status
        case .success(let parsed):
            let jti = parsed.value("jti")
            let state = parsed.value("state")
            var since: Date?
            guard (jti == nil) != (state == nil) else {
                writeErrorLine(spec.name, "give exactly one of --jti or --state (see --help)")
                return ExitStatus.usage
            }
            if let state, state != "dead" && state != "skipped" {
                writeErrorLine(spec.name, "--state must be dead or skipped")
                return ExitStatus.usage
            }
            if let text = parsed.value("since") {
                guard state != nil, let date = parseSince(text) else {
                    writeErrorLine(spec.name, "--since needs --state and ISO 8601 or an age such as 2h or 3d")
                    return ExitStatus.usage
                }
                since = date
            }
            return await runReportingFailure(spec.name) {
                try run(parsed, jti: jti, state: state, since: since)
            }
        }
    }

    static func run(_ parsed: ParsedCommand, jti: String?, state: String?, since: Date?) throws {
        let connection = try connect(parsed)
        defer { connection.close() }
        let count = try database("requeueing") {
            try connection.value(
                "SELECT siwa.requeue($1::text, $2::text, $3::timestamptz)",
                [jti.map(PostgresData.text), state.map(PostgresData.text), since.map(PostgresData.date)],
                as: Int.self
            )
        }
        writeStandardOutput("requeued \(count) notification\(count == 1 ? "" : "s")\n")
        if jti != nil && count == 0 {
            throw ToolFailure("no finished notification with that jti (unknown, or already pending)")
        }
    }
}
