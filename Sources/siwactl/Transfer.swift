import AppleID
import AppleNotifications
import Foundation
import Postgres
import ServiceSupport

/// `siwactl transfer export` and `siwactl transfer import`: moving users when the app changes teams
/// (Apple's `/auth/usermigrationinfo`; docs/operations.md, "Moving users when the app changes teams").
enum TransferVerb {
    static let appleOptions: [CommandOption] = [
        .databaseURL,
        CommandOption(
            "apple-team-id", valueName: "ID", help: "This side's Apple team ID (client secrets' iss).",
            isRequired: true, environmentVariable: "SIWA_APPLE_TEAM_ID"),
        CommandOption(
            "apple-key-id", valueName: "ID", help: "This side's Sign in with Apple key ID (kid).",
            isRequired: true,
            environmentVariable: "SIWA_APPLE_KEY_ID"),
        CommandOption(
            "apple-key-file", valueName: "FILE", help: "This side's Sign in with Apple key (.p8).",
            isRequired: true, environmentVariable: "SIWA_APPLE_KEY_FILE"),
        CommandOption(
            "client-id", valueName: "C", help: "The transferred app's client ID (bundle ID or Services ID).",
            isRequired: true, environmentVariable: "SIWA_TRANSFER_CLIENT_ID"),
        CommandOption(
            "apple-url", valueName: "URL",
            help: "Apple's base URL (http only to loopback, for siwactl fake-apple).",
            environmentVariable: "SIWA_APPLE_URL", defaultValue: "https://appleid.apple.com"),
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
            are retried with backoff. With --output, writes the list for the new team ({sub, transfer_sub}
            per line). Runs as the schema's owner.
            """,
        options: appleOptions + [
            CommandOption(
                "target-team", valueName: "T", help: "The recipient's team ID.", isRequired: true,
                environmentVariable: "SIWA_TRANSFER_TARGET_TEAM"),
            CommandOption(
                "output", valueName: "FILE",
                help: "Write {sub, transfer_sub} per line for every user done (mode 600).",
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
            The new team's side of an app transfer: loads the old team's list (--input FILE from 'transfer
            export --output', or --from-target-team T: siwa.transfer_exports in this same database), asks
            Apple for each user's sub in this team, checks the answers (one new sub per old sub; the email of
            a non-private account), then rewrites every table holding a sub in batches
            (siwa.apply_sub_transfer), keeping each old sub in siwa.sub_aliases. Resumable. Runs as the
            schema's owner.
            """,
        options: appleOptions + [
            CommandOption(
                "input", valueName: "FILE", help: "The old team's list: {sub, transfer_sub} per line.",
                environmentVariable: "SIWA_TRANSFER_INPUT"),
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
        name: "transfer", abstract: "Move users to another team: transfer identifiers out, new subs in."
    ) { arguments, environment in
        switch arguments.first {
        case "export":
            switch parse(exportSpec, Array(arguments.dropFirst()), environment) {
            case .failure(let exit): return exit.status
            case .success(let parsed):
                return await runReportingFailure(exportSpec.name) {
                    try TransferExport(parsed, environment: environment).run()
                }
            }
        case "import":
            switch parse(importSpec, Array(arguments.dropFirst()), environment) {
            case .failure(let exit): return exit.status
            case .success(let parsed):
                return await runReportingFailure(importSpec.name) {
                    try TransferImport(parsed, environment: environment).run()
                }
            }
        case "--help", "-h", "help":
            writeStandardOutput(exportSpec.helpText() + "\n" + importSpec.helpText())
            return ExitStatus.success
        default:
            writeErrorLine("siwactl transfer", "expected 'export' or 'import' (see siwactl transfer --help)")
            return ExitStatus.usage
        }
    }
}

/// Apple's window: transfer identifiers are exchanged up to 60 days after the transfer.
enum TransferWindow {
    static let days = 60.0

    /// Days left in the window from `date` (negative once over), or nil without a date.
    static func daysLeft(transferDate: Date?, now: Date = Date()) -> Double? {
        transferDate.map { days - now.timeIntervalSince($0) / 86400 }
    }

    static func parse(_ text: String?) throws -> Date? {
        guard let text else { return nil }
        if let date = VerifyVerb.parseISO8601(text) { return date }
        let dateOnly = ISO8601DateFormatter()
        dateOnly.formatOptions = [.withFullDate]
        guard let date = dateOnly.date(from: text) else {
            throw ToolFailure("--transfer-date must be an ISO 8601 date or date-time")
        }
        return date
    }

    /// "57 days 3h left of Apple's 60-day window (ends 2027-01-30 10:00:00Z)".
    static func describe(transferDate: Date, now: Date = Date()) -> String {
        let end = transferDate.addingTimeInterval(days * 86400)
        let left = end.timeIntervalSince(now)
        return left > 0
            ? "\(formatAge(left)) left of Apple's 60-day window (ends \(formatShort(end)))"
            : "Apple's 60-day window ended \(formatAge(-left)) ago (\(formatShort(end)))"
    }
}

/// The settings both directions share, validated.
struct TransferSettings {
    var client: AppleIDClient
    var rate: Double
    var concurrency: Int
    var maxAttempts: Int
    var retryBaseDelay: Double
    var transferDate: Date?
    var stopAfter: Int?
    var progressInterval: Double
    var dryRun: Bool
    var retryFailed: Bool

    init(_ parsed: ParsedCommand, environment: [String: String]) throws {
        func number(_ name: String, _ range: ClosedRange<Double>) throws -> Double {
            guard let value = Double(parsed.value(name) ?? ""), value.isFinite, range.contains(value) else {
                throw ToolFailure(
                    "--\(name) must be a number from \(String(format: "%g", range.lowerBound)) to \(String(format: "%g", range.upperBound))"
                )
            }
            return value
        }
        rate = try number("rate", 0.01...10_000)
        concurrency = Int(try number("concurrency", 1...64))
        maxAttempts = Int(try number("max-attempts", 1...100))
        retryBaseDelay = try number("retry-base-delay", 0...600)
        progressInterval = try number("progress-interval", 0.1...3600)
        if parsed.value("stop-after") != nil { stopAfter = Int(try number("stop-after", 0...1e9)) }
        transferDate = try TransferWindow.parse(parsed.value("transfer-date"))
        dryRun = parsed.flag("dry-run")
        retryFailed = parsed.flag("retry-failed")
        do {
            let clients = try ConfiguredClients(
                keyFile: parsed.value("apple-key-file")!, teamID: parsed.value("apple-team-id")!,
                keyID: parsed.value("apple-key-id")!, clientIDs: [parsed.value("client-id")!],
                baseURL: parsed.value("apple-url"), environment: environment)
            client = clients.clients[parsed.value("client-id")!]!
        } catch {
            throw ToolFailure("\(error.message)")
        }
        if let transferDate, let left = TransferWindow.daysLeft(transferDate: transferDate), left <= 0 {
            throw ToolFailure(
                "\(TransferWindow.describe(transferDate: transferDate)): Apple no longer exchanges transfer identifiers (see TN3159 for what is left)"
            )
        }
    }

    func printWindow(_ name: String) {
        guard let transferDate else { return }
        writeErrorLine(name, TransferWindow.describe(transferDate: transferDate))
        if let left = TransferWindow.daysLeft(transferDate: transferDate), left < 7 {
            writeErrorLine(name, "warning: fewer than 7 days left: run it now, and again for what failed")
        }
    }
}

/// One call's outcome for one user.
enum TransferOutcome: Sendable {
    /// Apple answered: the transfer identifier (export) or the new user (import).
    case done(String, AppleIDClient.MigratedUser?)
    /// Apple refused for good (4xx): its error word and status.
    case refused(String, Int?)
    /// Still failing after this run's attempts (transient): the last error.
    case transient(String, Int?)
}

/// Calls Apple for many users: a shared access token (renewed on expiry or invalid_grant), a rate limit,
/// a bounded number of threads, retries with jittered backoff, results flushed to the database in
/// batches, progress lines with an estimate.
final class TransferRunner: @unchecked Sendable {
    private let settings: TransferSettings
    private let name: String
    private let lock = NSLock()
    private var token: AppleIDClient.MigrationToken?
    private var tokenAt = Date.distantPast
    private var nextSlot = Date()
    private var calls = 0
    private var stopped = false
    private var fatal: ToolFailure?

    init(settings: TransferSettings, name: String) {
        self.settings = settings
        self.name = name
    }

    /// A token, fetched when there is none, it is 50 minutes old, or `renew` (after invalid_grant).
    func accessToken(renew: AppleIDClient.MigrationToken? = nil) throws(AppleIDError)
        -> AppleIDClient.MigrationToken
    {
        lock.lock()
        defer { lock.unlock() }
        if let token, Date().timeIntervalSince(tokenAt) < 3000,
            renew == nil || renew!.accessToken != token.accessToken
        {
            return token
        }
        let fresh = try settings.client.migrationToken()
        token = fresh
        tokenAt = Date()
        return fresh
    }

    /// Waits for the next slot under the rate limit; false when the run is stopping.
    private func takeSlot() -> Bool {
        lock.lock()
        if stopped || fatal != nil {
            lock.unlock()
            return false
        }
        if let stopAfter = settings.stopAfter, calls >= stopAfter {
            stopped = true
            lock.unlock()
            return false
        }
        calls += 1
        let now = Date()
        let slot = max(nextSlot, now)
        nextSlot = slot.addingTimeInterval(1 / settings.rate)
        lock.unlock()
        let wait = slot.timeIntervalSince(now)
        if wait > 0 { Thread.sleep(forTimeInterval: wait) }
        return true
    }

    /// Whether --stop-after ended the run.
    var stoppedEarly: Bool { lock.withLock { stopped } }

    private func fail(_ failure: ToolFailure) { lock.withLock { if fatal == nil { fatal = failure } } }

    /// One user: calls `call` with retries; nil when the run stopped before an answer.
    private func attempt(
        _ call: (AppleIDClient.MigrationToken) throws(AppleIDError) -> TransferOutcome
    ) -> (TransferOutcome, Int)? {
        var attempts = 0
        var renewed = false
        var delay = settings.retryBaseDelay
        var last: AppleIDError?
        while attempts < settings.maxAttempts {
            guard takeSlot() else { return attempts == 0 ? nil : last.map { (Self.transient($0), attempts) } }
            attempts += 1
            do {
                let token = try accessToken()
                do {
                    return (try call(token), attempts)
                } catch  where error.code == .invalidGrant && !renewed {
                    // The access token expired (one hour) or was refused: a new one, once per user.
                    renewed = true
                    attempts -= 1
                    _ = try accessToken(renew: token)
                    continue
                }
            } catch {
                if error.code == .invalidClient || error.code == .configuration
                    || error.code == .unauthorizedClient
                    || error.code == .invalidScope
                {
                    // The credentials are wrong: every user would fail the same way.
                    fail(
                        ToolFailure(
                            "Apple refused our credentials: \(error.appleError ?? error.code.rawValue)"))
                    return nil
                }
                guard error.isRetryable else {
                    return (.refused(error.appleError ?? error.code.rawValue, error.status), attempts)
                }
                last = error
                if attempts < settings.maxAttempts {
                    Thread.sleep(forTimeInterval: delay * Double.random(in: 0.5...1.5))
                    delay = min(delay * 2, 60)
                }
            }
        }
        return last.map { (Self.transient($0), attempts) }
    }

    private static func transient(_ error: AppleIDError) -> TransferOutcome {
        .transient(error.appleError ?? error.code.rawValue, error.status)
    }

    /// Runs `call` for every key, `settings.concurrency` at a time, handing results to `record` in
    /// batches (under one lock: `record` may use one database connection). Prints progress.
    func run(
        keys: [String], total: Int, alreadyDone: Int,
        call:
            @escaping @Sendable (String, AppleIDClient.MigrationToken) throws(AppleIDError) -> TransferOutcome,
        record: @escaping @Sendable ([(key: String, outcome: TransferOutcome, attempts: Int)]) throws -> Void
    ) throws -> (done: Int, refused: Int, transient: Int) {
        let state = RunState(keys: keys)
        let started = Date()
        let recordLock = NSLock()
        let threads = (0..<min(settings.concurrency, max(keys.count, 1))).map { _ in
            JoinableThread(name: "siwa-transfer") { [self] in
                var pending: [(key: String, outcome: TransferOutcome, attempts: Int)] = []
                func flush() {
                    guard !pending.isEmpty else { return }
                    let batch = pending
                    pending = []
                    recordLock.lock()
                    defer { recordLock.unlock() }
                    do {
                        try record(batch)
                        state.count(batch.map(\.outcome))
                    } catch {
                        fail(error as? ToolFailure ?? ToolFailure("recording progress failed: \(error)"))
                    }
                }
                while let key = state.next() {
                    guard
                        let (outcome, attempts) = attempt({ (token) throws(AppleIDError) in
                            try call(key, token)
                        })
                    else { break }
                    pending.append((key, outcome, attempts))
                    if pending.count >= 100 { flush() }
                }
                flush()
                state.finishThread()
            }
        }
        var lastProgress = Date()
        while state.finishedThreads < threads.count {
            Thread.sleep(forTimeInterval: 0.05)
            if Date().timeIntervalSince(lastProgress) >= settings.progressInterval {
                lastProgress = Date()
                progress(state: state, total: total, alreadyDone: alreadyDone, started: started)
            }
        }
        for thread in threads { thread.join() }
        progress(state: state, total: total, alreadyDone: alreadyDone, started: started)
        if let fatal = lock.withLock({ fatal }) { throw fatal }
        return state.totals
    }

    private func progress(state: RunState, total: Int, alreadyDone: Int, started: Date) {
        let (done, refused, transient) = state.totals
        let handled = done + refused + transient
        let elapsed = Date().timeIntervalSince(started)
        let perSecond = elapsed > 0 ? Double(handled) / elapsed : 0
        let left = state.keyCount - handled
        var line =
            "\(alreadyDone + done) of \(total) done, \(refused) refused by Apple, \(transient) to retry, \(left) left in this run"
        line += String(format: "; %.0f/s", perSecond)
        if left > 0, perSecond > 0 { line += ", about \(formatAge(Double(left) / perSecond)) to go" }
        if let date = settings.transferDate { line += "; " + TransferWindow.describe(transferDate: date) }
        writeErrorLine(name, line)
    }

    /// The keys still to hand out and the counts so far.
    private final class RunState: @unchecked Sendable {
        private let lock = NSLock()
        private let keys: [String]
        private var position = 0
        private var done = 0
        private var refused = 0
        private var transient = 0
        private var finished = 0

        init(keys: [String]) { self.keys = keys }

        func finishThread() { lock.withLock { finished += 1 } }

        var finishedThreads: Int { lock.withLock { finished } }

        var keyCount: Int { keys.count }

        func next() -> String? {
            lock.withLock {
                guard position < keys.count else { return nil }
                defer { position += 1 }
                return keys[position]
            }
        }

        func count(_ outcomes: [TransferOutcome]) {
            lock.withLock {
                for outcome in outcomes {
                    switch outcome {
                    case .done: done += 1
                    case .refused: refused += 1
                    case .transient: transient += 1
                    }
                }
            }
        }

        var totals: (Int, Int, Int) { lock.withLock { (done, refused, transient) } }
    }
}

/// The outcomes of a batch as JSON for `jsonb_to_recordset` (one statement per batch).
func outcomesJSON(_ batch: [(key: String, outcome: TransferOutcome, attempts: Int)]) -> String {
    let rows: [[String: Any]] = batch.map { entry in
        var row: [String: Any] = ["k": entry.key, "a": entry.attempts]
        switch entry.outcome {
        case .done(let value, let user):
            row["s"] = "done"
            row["v"] = value
            if let user {
                row["v"] = user.sub
                if let email = user.email { row["e"] = email }
                if let flag = user.isPrivateEmail { row["p"] = flag }
            }
        case .refused(let error, let status):
            row["s"] = "failed"
            row["err"] = error
            if let status { row["st"] = status }
        case .transient(let error, let status):
            row["s"] = "pending"
            row["err"] = error
            if let status { row["st"] = status }
        }
        return row
    }
    let data = (try? JSONSerialization.data(withJSONObject: rows)) ?? Data("[]".utf8)
    return String(decoding: data, as: UTF8.self)
}

/// Checks that the transfer tables exist (schema.sql applied, version with the transfer section).
func requireTransferSchema(_ connection: PostgresConnection) throws {
    guard try relationExists("siwa.transfer_exports", on: connection),
        try relationExists("siwa.sub_aliases", on: connection)
    else {
        throw ToolFailure("the database has no siwa.transfer_exports: run 'siwactl migrate' first")
    }
}

/// The old team's run.
struct TransferExport {
    let parsed: ParsedCommand
    let settings: TransferSettings
    let target: String
    static let name = "siwactl transfer export"

    init(_ parsed: ParsedCommand, environment: [String: String]) throws {
        self.parsed = parsed
        target = parsed.value("target-team")!
        guard FakeAppleAuthority.isTeamID(target) else {
            throw ToolFailure("--target-team must be a ten-character team ID (upper-case letters and digits)")
        }
        guard target != parsed.value("apple-team-id") else {
            throw ToolFailure("--target-team is this team: the recipient is the other team")
        }
        settings = try TransferSettings(parsed, environment: environment)
    }

    func run() throws {
        let connection = try connect(parsed)
        defer { connection.close() }
        try requireTransferSchema(connection)
        settings.printWindow(Self.name)
        let counts = try database("counting users") {
            try connection.query(
                """
                SELECT (SELECT count(*) FROM siwa.accounts a WHERE a.deleted_at IS NULL)::bigint,
                       (SELECT count(*) FROM siwa.accounts a WHERE a.deleted_at IS NULL
                           AND NOT EXISTS (SELECT 1 FROM siwa.transfer_exports e
                                            WHERE e.target_team = $1 AND e.sub = a.sub))::bigint,
                       (SELECT count(*) FROM siwa.transfer_exports e WHERE e.target_team = $1 AND e.state = 'done')::bigint,
                       (SELECT count(*) FROM siwa.transfer_exports e WHERE e.target_team = $1 AND e.state = 'failed')::bigint,
                       (SELECT count(*) FROM siwa.transfer_exports e WHERE e.target_team = $1 AND e.state = 'pending')::bigint
                """, [.text(target)])[0]
        }
        let (users, new, done, failed, pending): (Int, Int, Int, Int, Int) = (
            try counts[0], try counts[1], try counts[2], try counts[3], try counts[4]
        )
        let todo = new + pending + (settings.retryFailed ? failed : 0)
        if settings.dryRun {
            let runner = TransferRunner(settings: settings, name: Self.name)
            do {
                _ = try runner.accessToken()
            } catch {
                throw ToolFailure(
                    "dry run: Apple refused the client credentials: \(error.appleError ?? error.code.rawValue)"
                )
            }
            writeStandardOutput(
                """
                dry run: nothing changed.
                users (not deleted): \(users); transfer identifiers for \(target): \(done) done, \(failed) refused, \(pending) pending, \(new) not asked yet
                would ask Apple for \(todo) (at most \(String(format: "%g", settings.rate))/s: at least \(formatAge(Double(todo) / settings.rate)))
                credentials: Apple issued a migration access token

                """)
            return
        }
        try database("recording the users to export") {
            _ = try connection.execute(
                """
                INSERT INTO siwa.transfer_exports (target_team, sub)
                SELECT $1, a.sub FROM siwa.accounts a WHERE a.deleted_at IS NULL
                ON CONFLICT (target_team, sub) DO NOTHING
                """, [.text(target)])
        }
        let keys = try database("reading the users to export") {
            try connection.query(
                """
                SELECT e.sub FROM siwa.transfer_exports e
                 WHERE e.target_team = $1 AND (e.state = 'pending' OR ($2 AND e.state = 'failed'))
                 ORDER BY e.sub
                """, [.text(target), .bool(settings.retryFailed)]
            ).map { row throws -> String in try row[0] }
        }
        let client = settings.client
        let team = target
        let alreadyDone = done
        let runner = TransferRunner(settings: settings, name: Self.name)
        let (ok, refused, transient) = try runner.run(
            keys: keys, total: users, alreadyDone: alreadyDone,
            call: { (sub, token) throws(AppleIDError) in
                .done(try client.transferIdentifier(sub: sub, targetTeam: team, token: token), nil)
            },
            record: { batch in
                try database("recording progress") {
                    _ = try connection.execute(
                        """
                        UPDATE siwa.transfer_exports e
                           SET state = r.s, transfer_sub = r.v,
                               attempts = e.attempts + r.a, apple_error = r.err, apple_status = r.st,
                               last_attempt_at = clock_timestamp(),
                               done_at = CASE WHEN r.s = 'done' THEN clock_timestamp() END
                          FROM jsonb_to_recordset($2::jsonb) AS r(k text, s text, v text, a integer, err text, st integer)
                         WHERE e.target_team = $1 AND e.sub = r.k
                        """, [.text(team), .text(outcomesJSON(batch))])
                }
            })
        let stopped = runner.stoppedEarly
        writeStandardOutput(
            "export to \(target): \(alreadyDone + ok) of \(users) done; this run: \(ok) done, \(refused) refused by Apple (see siwa.transfer_exports.apple_error), \(transient) still failing\(stopped ? "; stopped by --stop-after: run again to resume" : "")\n"
        )
        if let output = parsed.value("output") { try writeList(connection, to: output) }
    }

    /// Writes every done user as {sub, transfer_sub} per line, replacing the file at once (mode 600).
    func writeList(_ connection: PostgresConnection, to path: String) throws {
        let rows = try database("reading the transfer identifiers") {
            try connection.query(
                """
                SELECT e.sub, e.transfer_sub FROM siwa.transfer_exports e
                 WHERE e.target_team = $1 AND e.state = 'done' ORDER BY e.sub
                """, [.text(target)])
        }
        var text = ""
        for row in rows {
            let sub: String = try row[0]
            let transferSub: String = try row[1]
            text += jsonLine(["sub": sub, "transfer_sub": transferSub, "target_team": target])
        }
        let temporary = path + ".tmp-\(getpid())"
        guard
            FileManager.default.createFile(
                atPath: temporary, contents: Data(text.utf8), attributes: [.posixPermissions: 0o600])
        else { throw ToolFailure("cannot write \(temporary)") }
        guard rename(temporary, path) == 0 else {
            unlink(temporary)
            throw ToolFailure("cannot replace \(path)")
        }
        writeStandardOutput("wrote \(rows.count) users to \(path)\n")
    }
}

/// The new team's run.
struct TransferImport {
    let parsed: ParsedCommand
    let settings: TransferSettings
    let transferID: String
    let batchSize: Int
    static let name = "siwactl transfer import"

    init(_ parsed: ParsedCommand, environment: [String: String]) throws {
        self.parsed = parsed
        guard (parsed.value("input") == nil) != (parsed.value("from-target-team") == nil) else {
            throw ToolFailure("give exactly one of --input FILE and --from-target-team T")
        }
        transferID = parsed.value("transfer-id") ?? parsed.value("apple-team-id")!
        guard !transferID.isEmpty, transferID.count <= 200 else {
            throw ToolFailure("--transfer-id must be 1 to 200 characters")
        }
        guard let size = Int(parsed.value("batch-size") ?? ""), (1...10_000).contains(size) else {
            throw ToolFailure("--batch-size must be a whole number from 1 to 10000")
        }
        batchSize = size
        settings = try TransferSettings(parsed, environment: environment)
    }

    /// The old team's list from --input: (sub, transfer_sub) pairs.
    func readList(_ path: String) throws -> [(sub: String, transferSub: String)] {
        var pairs: [(String, String)] = []
        for (number, line) in try readText(path: path).split(separator: "\n").enumerated() where !line.isEmpty
        {
            guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                let sub = object["sub"] as? String, let transferSub = object["transfer_sub"] as? String,
                !sub.isEmpty, !transferSub.isEmpty
            else {
                throw ToolFailure("\(path) line \(number + 1): expected {\"sub\": …, \"transfer_sub\": …}")
            }
            pairs.append((sub, transferSub))
        }
        return pairs
    }

    func run() throws {
        let connection = try connect(parsed)
        defer { connection.close() }
        try requireTransferSchema(connection)
        settings.printWindow(Self.name)
        let list = try parsed.value("input").map(readList)
        if settings.dryRun {
            try dryRun(connection, list: list)
            return
        }
        // 1. The list.
        try database("loading the list") {
            var skipped = 0
            defer {
                if skipped > 0 {
                    writeErrorLine(
                        Self.name,
                        "\(skipped) lines of the list were not loaded: their sub or transfer_sub is already listed for this transfer (see siwa.transfer_imports)"
                    )
                }
            }
            if let list {
                for start in stride(from: 0, to: list.count, by: 5000) {
                    let slice = list[start..<min(start + 5000, list.count)]
                    let json = slice.map { ["sub": $0.sub, "transfer_sub": $0.transferSub] }
                    let data = try JSONSerialization.data(withJSONObject: Array(json))
                    // A line whose pair is already loaded (a second run) is not a conflict; another
                    // pairing of a sub or transfer_sub already listed is reported.
                    let loaded = try connection.query(
                        """
                        WITH r AS (SELECT r.sub, r.transfer_sub FROM jsonb_to_recordset($2::jsonb) AS r(sub text, transfer_sub text)),
                             ins AS (INSERT INTO siwa.transfer_imports (transfer_id, transfer_sub, old_sub)
                                     SELECT $1, r.transfer_sub, r.sub FROM r
                                     ON CONFLICT DO NOTHING RETURNING 1)
                        SELECT (SELECT count(*) FROM ins)::bigint,
                               (SELECT count(*) FROM r WHERE EXISTS (
                                    SELECT 1 FROM siwa.transfer_imports i
                                     WHERE i.transfer_id = $1 AND i.transfer_sub = r.transfer_sub AND i.old_sub = r.sub))::bigint
                        """, [.text(transferID), .text(String(decoding: data, as: UTF8.self))])[0]
                    let inserted: Int = try loaded[0]
                    let already: Int = try loaded[1]
                    skipped += slice.count - inserted - already
                }
            } else {
                _ = try connection.execute(
                    """
                    INSERT INTO siwa.transfer_imports (transfer_id, transfer_sub, old_sub)
                    SELECT $1, e.transfer_sub, e.sub FROM siwa.transfer_exports e
                     WHERE e.target_team = $2 AND e.state = 'done'
                    ON CONFLICT DO NOTHING
                    """, [.text(transferID), .text(parsed.value("from-target-team")!)])
            }
        }
        // 2. The exchange.
        let keys = try database("reading the identifiers to exchange") {
            try connection.query(
                """
                SELECT i.transfer_sub FROM siwa.transfer_imports i
                 WHERE i.transfer_id = $1 AND (i.state = 'pending' OR ($2 AND i.state = 'failed'))
                 ORDER BY i.transfer_sub
                """, [.text(transferID), .bool(settings.retryFailed)]
            ).map { row throws -> String in try row[0] }
        }
        let total: Int = try database("counting") {
            try connection.query(
                "SELECT count(*)::bigint FROM siwa.transfer_imports WHERE transfer_id = $1",
                [.text(transferID)])[0][0]
        }
        let client = settings.client
        let transfer = transferID
        let runner = TransferRunner(settings: settings, name: Self.name)
        let (ok, refused, transient) = try runner.run(
            keys: keys, total: total, alreadyDone: total - keys.count,
            call: { (transferSub, token) throws(AppleIDError) in
                let user = try client.exchange(transferSub: transferSub, token: token)
                return .done(user.sub, user)
            },
            record: { batch in
                try database("recording progress") {
                    _ = try connection.execute(
                        """
                        UPDATE siwa.transfer_imports i
                           SET state = CASE r.s WHEN 'done' THEN 'exchanged' ELSE r.s END, new_sub = r.v,
                               email = CASE WHEN r.s = 'done' THEN r.e END, is_private_email = r.p,
                               attempts = i.attempts + r.a, apple_error = r.err, apple_status = r.st,
                               last_attempt_at = clock_timestamp()
                          FROM jsonb_to_recordset($2::jsonb)
                               AS r(k text, s text, v text, e text, p boolean, a integer, err text, st integer)
                         WHERE i.transfer_id = $1 AND i.transfer_sub = r.k
                        """, [.text(transfer), .text(outcomesJSON(batch))])
                }
            })
        writeStandardOutput(
            "exchange for \(transferID): this run \(ok) exchanged, \(refused) refused by Apple (see siwa.transfer_imports.apple_error), \(transient) still failing\(runner.stoppedEarly ? "; stopped by --stop-after: run again to resume" : "")\n"
        )
        // 3. The wrong-identifier guard: a new sub Apple gave for two old subs is applied to neither.
        let duplicates = try database("checking for duplicate new subs") {
            _ = try connection.execute("ANALYZE siwa.transfer_imports")
            return try connection.execute(
                """
                WITH duplicate AS (
                    SELECT d.new_sub FROM siwa.transfer_imports d
                     WHERE d.transfer_id = $1 AND d.state IN ('exchanged', 'applied', 'duplicate')
                     GROUP BY d.new_sub HAVING count(*) > 1
                    UNION
                    SELECT i.new_sub FROM siwa.transfer_imports i
                      JOIN siwa.sub_aliases a ON a.new_sub = i.new_sub AND a.old_sub <> i.old_sub
                     WHERE i.transfer_id = $1 AND i.state = 'exchanged')
                UPDATE siwa.transfer_imports i
                   SET state = 'duplicate', email = NULL,
                       detail = 'Apple gave this new sub for more than one old sub (or it is already another old sub''s alias)'
                  FROM duplicate
                 WHERE i.transfer_id = $1 AND i.state = 'exchanged' AND i.new_sub = duplicate.new_sub
                """, [.text(transferID)])
        }
        if duplicates > 0 {
            writeErrorLine(
                Self.name,
                "\(duplicates) users got a new sub that Apple also gave another user: not applied (state duplicate); ask Apple"
            )
        }
        // 4. The rewrite, batch by batch, each in one transaction.
        var outcomes: [String: Int] = [:]
        while true {
            let rows = try database("rewriting a batch") {
                try connection.query(
                    """
                    WITH b AS MATERIALIZED (
                        SELECT i.old_sub, i.new_sub, i.email, i.is_private_email FROM siwa.transfer_imports i
                         WHERE i.transfer_id = $1 AND i.state = 'exchanged' ORDER BY i.old_sub LIMIT $2)
                    SELECT r.outcome, count(*)::bigint
                      FROM siwa.apply_sub_transfer($1,
                               ARRAY(SELECT b.old_sub FROM b ORDER BY b.old_sub),
                               ARRAY(SELECT b.new_sub FROM b ORDER BY b.old_sub),
                               ARRAY(SELECT b.email FROM b ORDER BY b.old_sub),
                               ARRAY(SELECT b.is_private_email FROM b ORDER BY b.old_sub)) AS r
                     GROUP BY r.outcome
                    """, [.text(transferID), .int(Int64(batchSize))])
            }
            if rows.isEmpty { break }
            for row in rows {
                let outcome: String = try row[0]
                let count: Int = try row[1]
                outcomes[outcome, default: 0] += count
            }
        }
        let summary = try database("summarising") {
            try connection.query(
                "SELECT state, count(*)::bigint FROM siwa.transfer_imports WHERE transfer_id = $1 GROUP BY state ORDER BY state",
                [.text(transferID)]
            ).map { row throws -> String in "\(try row[0] as String) \(try row[1] as Int)" }
        }
        writeStandardOutput(
            "rewrite for \(transferID): this run \(outcomes.isEmpty ? "nothing" : outcomes.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", ")); all: \(summary.joined(separator: ", "))\n"
        )
    }

    func dryRun(_ connection: PostgresConnection, list: [(sub: String, transferSub: String)]?) throws {
        let runner = TransferRunner(settings: settings, name: Self.name)
        do {
            _ = try runner.accessToken()
        } catch {
            throw ToolFailure(
                "dry run: Apple refused the client credentials: \(error.appleError ?? error.code.rawValue)")
        }
        let source: Int =
            try list?.count
            ?? database("counting the list") {
                try connection.query(
                    "SELECT count(*)::bigint FROM siwa.transfer_exports WHERE target_team = $1 AND state = 'done'",
                    [.text(parsed.value("from-target-team")!)])[0][0]
            }
        let states = try database("counting") {
            try connection.query(
                "SELECT state, count(*)::bigint FROM siwa.transfer_imports WHERE transfer_id = $1 GROUP BY state ORDER BY state",
                [.text(transferID)]
            ).map { row throws -> String in "\(try row[0] as String) \(try row[1] as Int)" }
        }
        writeStandardOutput(
            """
            dry run: nothing changed.
            the list holds \(source) users; this transfer (\(transferID)) so far: \(states.isEmpty ? "nothing" : states.joined(separator: ", "))
            would exchange what is pending at Apple (at most \(String(format: "%g", settings.rate))/s), then rewrite in batches of \(batchSize)
            credentials: Apple issued a migration access token

            """)
    }
}
