import AppleID
import Foundation
import Postgres
import ServiceSupport
import TeamTransfer

/// `siwactl transfer export` and `siwactl transfer import`: moving users when the app changes teams
/// (Apple's `/auth/usermigrationinfo`; docs/operations.md, "Moving users when the app changes teams").
enum TransferVerb {
    static let appleOptions: [CommandOption] =
        [.databaseURL] + AppleCredentialOptions.credentials(required: true) + [
            CommandOption(
                "client-id", valueName: "C",
                help: "The transferred app's client ID (bundle ID or Services ID).",
                isRequired: true, environmentVariable: "SIWA_TRANSFER_CLIENT_ID"),
            CommandOption(
                "rate", valueName: "N", help: "At most N calls to Apple per second.",
                environmentVariable: "SIWA_TRANSFER_RATE", defaultValue: "20"),
            CommandOption(
                "concurrency", valueName: "N", help: "At most N calls to Apple at once (1 to 64).",
                environmentVariable: "SIWA_TRANSFER_CONCURRENCY", defaultValue: "4"),
            CommandOption(
                "max-attempts", valueName: "N",
                help:
                    "Calls per user per run on transient failures (429, 5xx, timeouts) before leaving it for the next run.",
                environmentVariable: "SIWA_TRANSFER_MAX_ATTEMPTS", defaultValue: "5"),
            CommandOption(
                "retry-base-delay", valueName: "SECONDS",
                help: "First backoff after a transient failure (doubles, jittered).",
                environmentVariable: "SIWA_TRANSFER_RETRY_BASE_DELAY", defaultValue: "1"),
            CommandOption(
                "transfer-date", valueName: "DATE",
                help:
                    "When the app transfer completed (ISO 8601): Apple answers for 60 days after it; shows the countdown.",
                environmentVariable: "SIWA_TRANSFER_DATE"),
            CommandOption(
                "stop-after", valueName: "N", help: "Stop after N calls to Apple (resume by running again).",
                environmentVariable: "SIWA_TRANSFER_STOP_AFTER"),
            CommandOption(
                "progress-interval", valueName: "SECONDS", help: "Seconds between progress lines on stderr.",
                environmentVariable: "SIWA_TRANSFER_PROGRESS_INTERVAL", defaultValue: "5"),
        ]

    static let dryRunFlag = CommandFlag(
        "dry-run", help: "Check the settings and the credentials, print what would be done; change nothing.",
        environmentVariable: "SIWA_TRANSFER_DRY_RUN")

    static let exportSpec = CommandSpec(
        name: "siwactl transfer export",
        abstract: """
            The old team's side of an app transfer: for every known sub (siwa.accounts, deleted ones
            excepted) asks Apple for its transfer identifier to --target-team and records it, or Apple's
            exact error, in siwa.transfer_exports. Resumable (run it again: what is done is not asked again;
            a refusal is asked again only with --retry-failed), rate-limited, concurrent; transient failures
            are retried with backoff. Prints the digest of the list of users done, which the new team's
            import requires: send it by another channel than the list. With --output, writes the list for
            the new team (account references and transfer identifiers: no sub, no email). Runs as the
            schema's owner.
            """,
        options: appleOptions + [
            CommandOption(
                "target-team", valueName: "T", help: "The recipient's team ID.", isRequired: true,
                environmentVariable: "SIWA_TRANSFER_TARGET_TEAM"),
            CommandOption(
                "output", valueName: "FILE",
                help:
                    "Write the list for the new team, every user done (mode 600): a header, then {account, transfer_sub} per line.",
                environmentVariable: "SIWA_TRANSFER_OUTPUT"),
        ],
        flags: [
            dryRunFlag,
            CommandFlag(
                "retry-failed", help: "Ask again for users Apple refused in an earlier run.",
                environmentVariable: "SIWA_TRANSFER_RETRY_FAILED"),
        ])

    static let importSpec = CommandSpec(
        name: "siwactl transfer import",
        abstract: """
            The new team's side of an app transfer: verifies the old team's list (--input FILE from 'transfer
            export --output', or --from-target-team T: siwa.transfer_exports in this same database) against
            --list-digest, the digest the old team's export printed, and refuses it, loading nothing, when
            its pairs differ; loads it, asks
            Apple for each user's sub in this team, checks the answers (one new sub per old sub; the email of
            a non-private account), then rewrites every table holding a sub in batches
            (siwa.apply_sub_transfer), keeping each old sub in siwa.sub_aliases. Resumable. Runs as the
            schema's owner.
            """,
        options: appleOptions + [
            CommandOption(
                "input", valueName: "FILE",
                help: "The old team's list, as its 'transfer export --output' wrote it.",
                environmentVariable: "SIWA_TRANSFER_INPUT"),
            CommandOption(
                "list-digest", valueName: "HEX",
                help:
                    "The list's digest as the old team's export printed it, received by another channel than the list.",
                isRequired: true, environmentVariable: "SIWA_TRANSFER_LIST_DIGEST"),
            CommandOption(
                "from-target-team", valueName: "T",
                help: "Read the list from siwa.transfer_exports (target team T) of this database instead.",
                environmentVariable: "SIWA_TRANSFER_FROM_TARGET_TEAM"),
            CommandOption(
                "transfer-id", valueName: "ID",
                help: "Names this transfer in the audit trail (default: the team ID).",
                environmentVariable: "SIWA_TRANSFER_ID"),
            CommandOption(
                "batch-size", valueName: "N",
                help: "Users rewritten per transaction (each meets every table once).",
                environmentVariable: "SIWA_TRANSFER_BATCH_SIZE", defaultValue: "2000"),
        ],
        flags: [
            dryRunFlag,
            CommandFlag(
                "retry-failed", help: "Ask again for transfer identifiers Apple refused in an earlier run.",
                environmentVariable: "SIWA_TRANSFER_RETRY_FAILED"),
        ])

    static let verb = Verb(
        name: "transfer", abstract: "Move users to another team: transfer identifiers out, new subs in.",
        subverbs: [
            .parsing("export", exportSpec) { parsed, environment in
                try TransferExportCommand.run(parsed, environment: environment)
            },
            .parsing("import", importSpec) { parsed, environment in
                try TransferImportCommand.run(parsed, environment: environment)
            },
        ],
        help: { exportSpec.helpText() + "\n" + importSpec.helpText() })
}

/// Parses --transfer-date: an ISO 8601 date-time or date.
func parseTransferDate(_ text: String?) throws -> Date? {
    guard let text else { return nil }
    if let date = VerifyVerb.parseISO8601(text) { return date }
    let dateOnly = ISO8601DateFormatter()
    dateOnly.formatOptions = [.withFullDate]
    guard let date = dateOnly.date(from: text) else {
        throw ToolFailure("--transfer-date must be an ISO 8601 date or date-time")
    }
    return date
}

/// The settings both directions share, validated: the client for the transferred app and the pacing.
struct TransferSettings {
    var client: AppleIDClient
    var pacing: TransferPacing
    var dryRun: Bool

    init(_ parsed: ParsedCommand, environment: [String: String]) throws {
        func number(_ name: String, _ range: ClosedRange<Double>) throws -> Double {
            guard let value = Double(parsed.value(name) ?? ""), value.isFinite, range.contains(value) else {
                throw ToolFailure(
                    "--\(name) must be a number from \(String(format: "%g", range.lowerBound)) to \(String(format: "%g", range.upperBound))"
                )
            }
            return value
        }
        pacing = TransferPacing(
            rate: try number("rate", 0.01...10_000), concurrency: Int(try number("concurrency", 1...64)),
            maxAttempts: Int(try number("max-attempts", 1...100)),
            retryBaseDelay: try number("retry-base-delay", 0...600),
            progressInterval: try number("progress-interval", 0.1...3600),
            retryFailed: parsed.flag("retry-failed"))
        if parsed.value("stop-after") != nil { pacing.stopAfter = Int(try number("stop-after", 0...1e9)) }
        pacing.transferDate = try parseTransferDate(parsed.value("transfer-date"))
        dryRun = parsed.flag("dry-run")
        do {
            client = try AppleCredentials(parsed).client(
                for: parsed.value("client-id")!, environment: environment)
        } catch {
            throw ToolFailure("\(error.message)")
        }
    }

    /// The window's countdown, and a warning in its last week.
    func printWindow(_ name: String) {
        guard let transferDate = pacing.transferDate else { return }
        writeErrorLine(name, TransferWindow.describe(transferDate: transferDate))
        if let left = TransferWindow.daysLeft(transferDate: transferDate), left < 7 {
            writeErrorLine(name, "warning: fewer than 7 days left: run it now, and again for what failed")
        }
    }
}

/// `siwactl transfer export`: parses, runs ``TeamTransfer/TransferExport``, prints.
enum TransferExportCommand {
    static let name = "siwactl transfer export"

    static func run(_ parsed: ParsedCommand, environment: [String: String]) throws {
        let settings = try TransferSettings(parsed, environment: environment)
        let target = parsed.value("target-team")!
        let export = try TransferExport(
            client: settings.client, ownTeam: parsed.value("apple-team-id")!, targetTeam: target,
            pacing: settings.pacing)
        let connection = try connect(parsed)
        defer { connection.close() }
        try export.requireSchema(on: connection)
        settings.printWindow(name)
        if settings.dryRun {
            let status = try export.status(on: connection)
            try export.checkCredentials()
            writeStandardOutput(
                """
                dry run: nothing changed.
                users (not deleted): \(status.users); transfer identifiers for \(target): \(status.done) done, \(status.failed) refused, \(status.pending) pending, \(status.notAsked) not asked yet
                would ask Apple for \(status.toDo) (at most \(String(format: "%g", settings.pacing.rate))/s: at least \(formatAge(Double(status.toDo) / settings.pacing.rate)))
                credentials: Apple issued a migration access token

                """)
            return
        }
        let result = try export.run(on: connection) { writeErrorLine(name, $0) }
        let totals = result.totals
        writeStandardOutput(
            "export to \(target): \(result.alreadyDone + totals.done) of \(result.users) done; this run: \(totals.done) done, \(totals.refused) refused by Apple (see siwa.transfer_exports.apple_error), \(totals.transient) still failing\(totals.stoppedEarly ? "; stopped by --stop-after: run again to resume" : "")\n"
        )
        let list: TransferExport.ListDigest
        if let output = parsed.value("output") {
            list = try export.writeList(from: connection, to: output)
            writeStandardOutput(
                "wrote \(list.users) users to \(output) (account references and transfer identifiers: no sub, no email)\n"
            )
        } else {
            list = try export.digest(on: connection)
        }
        writeStandardOutput(
            """
            list digest for \(target) (\(list.users) users): \(list.digest)
            give it to the new team by another channel than the list: their import (--list-digest) refuses a list whose pairs differ

            """)
    }
}

/// `siwactl transfer import`: parses, runs ``TeamTransfer/TransferImport`` step by step, prints.
enum TransferImportCommand {
    static let name = "siwactl transfer import"

    static func run(_ parsed: ParsedCommand, environment: [String: String]) throws {
        guard (parsed.value("input") == nil) != (parsed.value("from-target-team") == nil) else {
            throw ToolFailure("give exactly one of --input FILE and --from-target-team T")
        }
        let transferID = parsed.value("transfer-id") ?? parsed.value("apple-team-id")!
        guard !transferID.isEmpty, transferID.count <= 200 else {
            throw ToolFailure("--transfer-id must be 1 to 200 characters")
        }
        guard let batchSize = Int(parsed.value("batch-size") ?? ""), (1...10_000).contains(batchSize) else {
            throw ToolFailure("--batch-size must be a whole number from 1 to 10000")
        }
        let settings = try TransferSettings(parsed, environment: environment)
        let connection = try connect(parsed)
        defer { connection.close() }
        let source: TransferImport.Source =
            try parsed.value("input").map { .list(try TransferImport.readList(path: $0)) }
            ?? .exports(targetTeam: parsed.value("from-target-team")!)
        let transfer = try TransferImport(
            client: settings.client, transferID: transferID, batchSize: batchSize, source: source,
            listDigest: parsed.value("list-digest")!, pacing: settings.pacing)
        try transfer.requireSchema(on: connection)
        settings.printWindow(name)
        if settings.dryRun {
            try transfer.checkCredentials()
            let verified = try transfer.verifiedEntries(on: connection).count
            let listed = try transfer.sourceCount(on: connection)
            let states = try transfer.states(on: connection).map { "\($0.state) \($0.count)" }
            writeStandardOutput(
                """
                dry run: nothing changed.
                the list holds \(listed) users; its \(verified) pairs match --list-digest; this transfer (\(transferID)) so far: \(states.isEmpty ? "nothing" : states.joined(separator: ", "))
                would exchange what is pending at Apple (at most \(String(format: "%g", settings.pacing.rate))/s), then rewrite in batches of \(batchSize)
                credentials: Apple issued a migration access token

                """)
            return
        }
        let skipped = try transfer.load(on: connection)
        if skipped > 0 {
            writeErrorLine(
                name,
                "\(skipped) lines of the list were not loaded: their sub or transfer_sub is already listed for this transfer (see siwa.transfer_imports)"
            )
        }
        let exchange = try transfer.exchange(on: connection) { writeErrorLine(name, $0) }
        writeStandardOutput(
            "exchange for \(transferID): this run \(exchange.done) exchanged, \(exchange.refused) refused by Apple (see siwa.transfer_imports.apple_error), \(exchange.transient) still failing\(exchange.stoppedEarly ? "; stopped by --stop-after: run again to resume" : "")\n"
        )
        let duplicates = try transfer.refuseDuplicates(on: connection)
        if duplicates > 0 {
            writeErrorLine(
                name,
                "\(duplicates) users got a new sub that Apple also gave another user: not applied (state duplicate); ask Apple"
            )
        }
        let outcomes = try transfer.rewrite(on: connection)
        let summary = try transfer.states(on: connection).map { "\($0.state) \($0.count)" }
        writeStandardOutput(
            "rewrite for \(transferID): this run \(outcomes.isEmpty ? "nothing" : outcomes.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", ")); all: \(summary.joined(separator: ", "))\n"
        )
    }
}
