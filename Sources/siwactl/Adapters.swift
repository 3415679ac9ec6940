import AuthAdapterAdministration
import AuthAdapters
import AuthPlatforms
import Foundation
import Postgres
import ServiceSupport

/// `siwactl adapters`: the auth systems where siwa-worker applies Apple's events (docs/adapters.md).
/// The connection is always a file (its path stored as `file:PATH`): the URL is never on a command
/// line, in output or in an error.
enum AdaptersVerb {
    static let verb = Verb(
        name: "adapters",
        abstract:
            "Add, list, test, enable, disable, retry or remove the auth adapters (Supabase Auth, Better Auth, Auth.js, Django).",
        subverbs: [
            .parsing("add", addSpec) { parsed, _ in try add(parsed) },
            .parsing("list", listSpec) { parsed, _ in try list(parsed) },
            .parsing("remove", removeSpec) { parsed, _ in try remove(parsed) },
            .parsing("enable", enableSpec) { parsed, _ in try setEnabled(parsed, true) },
            .parsing("disable", disableSpec) { parsed, _ in try setEnabled(parsed, false) },
            .parsing("retry", retrySpec) { parsed, _ in try retry(parsed) },
            .parsing("test", testSpec) { parsed, _ in try test(parsed) },
        ])

    static let nameArgument = CommandPositional("NAME", help: "The adapter's name (a-z, 0-9, -; 1 to 40).")

    // MARK: add

    static let addSpec = CommandSpec(
        name: "siwactl adapters add",
        abstract: """
            Add an auth adapter NAME: siwa-worker --auth-adapters on applies every change from now on in that
            auth system — in its database, whose URL is read from --connection-file, or through a hosted
            platform's admin API, whose credentials (JSON) are read from it (absolute path, chmod 600; never
            stored). A policy the platform cannot express is refused, naming the option.
            """,
        options: [
            .databaseURL,
            CommandOption(
                "platform", valueName: "PLATFORM",
                help:
                    "supabase, better-auth, authjs, authjs-prisma, django-allauth, django-social-auth; hosted: firebase, auth0, clerk, keycloak.",
                isRequired: true),
            CommandOption(
                "provider", valueName: "NAME",
                help:
                    "The platform's name for Apple (default: apple; apple-id for django-social-auth, apple.com for firebase, oauth_apple for clerk)."
            ),
            CommandOption(
                "connection-file", valueName: "PATH",
                help:
                    "An owner-only file holding the auth database's URL, or the hosted platform's credentials (absolute path).",
                isRequired: true),
            CommandOption(
                "option", valueName: "KEY=VALUE",
                help: "A platform option, e.g. schema=auth_js or ban=true (Better Auth's admin plugin).",
                isRepeatable: true),
            CommandOption(
                "on-account-deleted", valueName: "unlink|delete|disable|sessions-only",
                help: "On account-delete.", defaultValue: "unlink"),
            CommandOption(
                "when-unlink-leaves-no-login", valueName: "disable|keep",
                help: "When unlink leaves the user no way to sign in (Auth.js: keep).", defaultValue: nil),
            CommandOption(
                "on-consent-revoked", valueName: "end-sessions|none", help: "On consent-revoked.",
                defaultValue: "end-sessions"),
            CommandOption(
                "on-forwarding-change", valueName: "ignore|record", help: "On email forwarding off/on.",
                defaultValue: "ignore"),
            CommandOption(
                "on-sub-transferred", valueName: "move|ignore", help: "On a team transfer.",
                defaultValue: "move"),
        ],
        flags: [CommandFlag("disabled", help: "Add it disabled (paused: its changes queue until enabled).")],
        positionals: [nameArgument])

    /// The flag each policy is set by, for the platform's and the database's refusals.
    static let policyFlags = [
        ("onAccountDeleted", "--on-account-deleted"), ("on_account_deleted", "--on-account-deleted"),
        ("whenUnlinkLeavesNoLogin", "--when-unlink-leaves-no-login"),
        ("when_unlink_leaves_no_login", "--when-unlink-leaves-no-login"),
        ("onConsentRevoked", "--on-consent-revoked"), ("on_consent_revoked", "--on-consent-revoked"),
        ("onForwardingChange", "--on-forwarding-change"), ("on_forwarding_change", "--on-forwarding-change"),
        ("onSubTransferred", "--on-sub-transferred"), ("on_sub_transferred", "--on-sub-transferred"),
    ]

    static func namingFlags(_ text: String) -> String {
        policyFlags.reduce(text) { $0.replacingOccurrences(of: $1.0, with: $1.1) }
    }

    static func choice<T: RawRepresentable & CaseIterable>(_ parsed: ParsedCommand, _ name: String, _: T.Type)
        throws -> T? where T.RawValue == String
    {
        guard let text = parsed.value(name) else { return nil }
        guard let value = T(rawValue: text) else {
            throw UsageError("--\(name) is \(T.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        return value
    }

    /// `--option key=value`…, as a JSON object: `true`/`false` are booleans, anything else a string.
    static func options(_ parsed: ParsedCommand) throws -> String {
        var object: [String: Any] = [:]
        for pair in parsed.values("option") {
            guard let equals = pair.firstIndex(of: "="), equals != pair.startIndex else {
                throw UsageError("--option is KEY=VALUE (e.g. schema=auth_js, ban=true)")
            }
            let key = String(pair[..<equals])
            let value = String(pair[pair.index(after: equals)...])
            object[key] = value == "true" ? true as Any : value == "false" ? false as Any : value as Any
        }
        let data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
        return String(decoding: data, as: UTF8.self)
    }

    static func name(_ parsed: ParsedCommand) throws -> String {
        guard let name = parsed.positionals.first,
            name.range(of: "^[a-z0-9-]{1,40}$", options: .regularExpression) != nil
        else { throw UsageError("NAME: 1 to 40 of a-z, 0-9 and -") }
        return name
    }

    static func add(_ parsed: ParsedCommand) throws {
        let name = try name(parsed)
        let platform = parsed.value("platform") ?? ""
        guard AuthAdapterAdministration.platforms.contains(platform) else {
            throw UsageError(
                "--platform: unknown platform \(platform): one of "
                    + AuthAdapterAdministration.platforms.joined(separator: ", "))
        }
        let path = parsed.value("connection-file") ?? ""
        guard path.hasPrefix("/") else {
            throw UsageError(
                "--connection-file \(path) is not an absolute path (the worker reads it from anywhere)")
        }
        let onAccountDeleted =
            try choice(parsed, "on-account-deleted", AuthPolicy.AccountDeleted.self) ?? .unlink
        // Auth.js has no disable flag: its default fallback is keep.
        let noLoginDefault: AuthPolicy.UnlinkLeavesNoLogin =
            ["authjs", "authjs-prisma"].contains(platform) ? .keep : .disable
        let policy = AuthPolicy(
            onConsentRevoked: try choice(parsed, "on-consent-revoked", AuthPolicy.ConsentRevoked.self)
                ?? .endSessions,
            onAccountDeleted: onAccountDeleted,
            whenUnlinkLeavesNoLogin: try choice(
                parsed, "when-unlink-leaves-no-login", AuthPolicy.UnlinkLeavesNoLogin.self) ?? noLoginDefault,
            onForwardingChange: try choice(parsed, "on-forwarding-change", AuthPolicy.ForwardingChange.self)
                ?? .ignore,
            onSubTransferred: try choice(parsed, "on-sub-transferred", AuthPolicy.SubTransferred.self)
                ?? .move)
        let settings = AdapterSettings(
            platform: platform,
            provider: parsed.value("provider")
                ?? AuthAdapterAdministration.defaultProvider(platform: platform),
            connectionReference: "file:" + path, options: try options(parsed), policy: policy)
        do {
            try AuthAdapterAdministration.validate(settings)
        } catch {
            throw UsageError(namingFlags(error.description))
        }
        let connection = try connect(parsed)
        defer { connection.close() }
        let id: Int
        do {
            id = try AuthAdapterAdministration(connection).add(
                name: name, settings: settings, enabled: !parsed.flag("disabled"))
        } catch let error as PostgresError where error.sqlState == "22023" {
            throw UsageError("refused: " + namingFlags(error.message))
        } catch let error as PostgresError where error.sqlState == "23505" {
            throw ToolFailure("an adapter named \(name) exists (siwactl adapters list)")
        } catch let error as PostgresError {
            throw ToolFailure("adding the adapter failed: \(error.message)")
        }
        writeStandardOutput(
            "adapter \(name) (id \(id)): \(platform), provider \(settings.provider), connection file:\(path)\n"
        )
        writeStandardOutput("policy: \(describe(policy))\n")
        writeErrorLine(
            "siwactl adapters add",
            "check it with 'siwactl adapters test \(name) --sub SUB'; it applies once siwa-worker runs with --auth-adapters on"
        )
    }

    static func describe(_ policy: AuthPolicy) -> String {
        "on-consent-revoked=\(policy.onConsentRevoked.rawValue) on-account-deleted=\(policy.onAccountDeleted.rawValue) "
            + "when-unlink-leaves-no-login=\(policy.whenUnlinkLeavesNoLogin.rawValue) "
            + "on-forwarding-change=\(policy.onForwardingChange.rawValue) "
            + "on-sub-transferred=\(policy.onSubTransferred.rawValue)"
    }

    // MARK: list

    static let listSpec = CommandSpec(
        name: "siwactl adapters list",
        abstract:
            "List the auth adapters: settings, policies and outbox counts (never the connection's URL).",
        options: [.databaseURL], flags: [CommandFlag("json", help: "One JSON object per line.")])

    static func list(_ parsed: ParsedCommand) throws {
        let connection = try connect(parsed)
        defer { connection.close() }
        let adapters = try database("listing the adapters") {
            try AuthAdapterAdministration(connection).adapters()
        }
        if parsed.flag("json") {
            for adapter in adapters {
                let policy = adapter.settings.policy
                let options =
                    (try? JSONSerialization.jsonObject(with: Data(adapter.settings.options.utf8))) ?? [:]
                writeStandardOutput(
                    JSONText.line([
                        "id": adapter.id, "name": adapter.name, "platform": adapter.settings.platform,
                        "provider": adapter.settings.provider,
                        "connection": adapter.settings.connectionReference,
                        "options": options, "enabled": adapter.enabled,
                        "on_consent_revoked": policy.onConsentRevoked.rawValue,
                        "on_account_deleted": policy.onAccountDeleted.rawValue,
                        "when_unlink_leaves_no_login": policy.whenUnlinkLeavesNoLogin.rawValue,
                        "on_forwarding_change": policy.onForwardingChange.rawValue,
                        "on_sub_transferred": policy.onSubTransferred.rawValue,
                        "pending": adapter.pending, "dead": adapter.dead, "no_user": adapter.noUser,
                        "oldest_due_at": adapter.oldestDueAt.map(formatShort) ?? NSNull(),
                        "last_error": adapter.lastError ?? NSNull(),
                        "last_error_at": adapter.lastErrorAt.map(formatShort) ?? NSNull(),
                    ]))
            }
            return
        }
        let rows = adapters.map { adapter in
            let policy = adapter.settings.policy
            return [
                adapter.name, adapter.settings.platform, adapter.settings.provider,
                adapter.settings.connectionReference,
                [
                    policy.onConsentRevoked.rawValue, policy.onAccountDeleted.rawValue,
                    policy.whenUnlinkLeavesNoLogin.rawValue, policy.onForwardingChange.rawValue,
                    policy.onSubTransferred.rawValue,
                ].joined(separator: "/"),
                adapter.enabled ? "yes" : "no", String(adapter.pending), String(adapter.dead),
                String(adapter.noUser), adapter.oldestDueAt.map(formatShort) ?? "-", adapter.lastError ?? "-",
            ]
        }
        writeStandardOutput(
            renderTable(
                header: [
                    "NAME", "PLATFORM", "PROVIDER", "CONNECTION", "POLICIES", "ENABLED", "PENDING", "DEAD",
                    "NO USER", "OLDEST DUE", "LAST ERROR",
                ], rows: rows))
    }

    // MARK: remove

    static let removeSpec = CommandSpec(
        name: "siwactl adapters remove",
        abstract:
            "Remove an auth adapter and its outbox rows, pending ones included (the auth system is not touched).",
        options: [.databaseURL], positionals: [nameArgument])

    static func remove(_ parsed: ParsedCommand) throws {
        let name = try name(parsed)
        let connection = try connect(parsed)
        defer { connection.close() }
        let removed = try database("removing the adapter") {
            try AuthAdapterAdministration(connection).remove(name: name)
        }
        guard removed else { throw ToolFailure("no adapter \(name) (siwactl adapters list)") }
        writeStandardOutput("adapter \(name): removed\n")
    }

    // MARK: enable, disable

    static let enableSpec = CommandSpec(
        name: "siwactl adapters enable",
        abstract: "Resume an auth adapter: the worker's lanes claim its queued changes again within seconds.",
        options: [.databaseURL], positionals: [nameArgument])

    static let disableSpec = CommandSpec(
        name: "siwactl adapters disable",
        abstract:
            "Pause an auth adapter: its changes queue, unapplied, until 'siwactl adapters enable' (nothing is lost).",
        options: [.databaseURL], positionals: [nameArgument])

    static func setEnabled(_ parsed: ParsedCommand, _ enabled: Bool) throws {
        let name = try name(parsed)
        let connection = try connect(parsed)
        defer { connection.close() }
        let found = try database(enabled ? "enabling the adapter" : "disabling the adapter") {
            try AuthAdapterAdministration(connection).setEnabled(name: name, enabled)
        }
        guard found else { throw ToolFailure("no adapter \(name) (siwactl adapters list)") }
        writeStandardOutput("adapter \(name): \(enabled ? "enabled" : "disabled (its changes queue)")\n")
    }

    // MARK: retry

    static let retrySpec = CommandSpec(
        name: "siwactl adapters retry",
        abstract: "Make an adapter's dead rows (or its one row --id N) pending and due now, attempts reset.",
        options: [.databaseURL, CommandOption("id", valueName: "N", help: "Only this row.")],
        positionals: [nameArgument])

    static func retry(_ parsed: ParsedCommand) throws {
        let name = try name(parsed)
        var id: Int?
        if let text = parsed.value("id") {
            guard let value = Int(text), value > 0 else { throw UsageError("--id must be a row id") }
            id = value
        }
        let connection = try connect(parsed)
        defer { connection.close() }
        let count = try database("retrying") {
            try AuthAdapterAdministration(connection).retry(name: name, id: id)
        }
        guard let count else { throw ToolFailure("no adapter \(name) (siwactl adapters list)") }
        if count == 0, let id { throw ToolFailure("row \(id) is not a dead row of adapter \(name)") }
        writeStandardOutput("due now: \(count) row\(count == 1 ? "" : "s")\n")
    }

    // MARK: test

    static let testSpec = CommandSpec(
        name: "siwactl adapters test",
        abstract: """
            Check an adapter against its auth database (tables, columns, grants, row-level security) and dry-run
            each event for --sub (and a transfer to --new-sub): prints what each would change, changing
            nothing. Exit 1 when a problem was found.
            """,
        options: [
            .databaseURL,
            CommandOption(
                "sub", valueName: "SUB", help: "The Apple sub of a user linked there.", isRequired: true),
            CommandOption("new-sub", valueName: "SUB", help: "Also dry-run a team transfer to this sub."),
        ], positionals: [nameArgument])

    static func test(_ parsed: ParsedCommand) throws {
        let name = try name(parsed)
        let sub = parsed.value("sub") ?? ""
        guard !sub.isEmpty else { throw UsageError("--sub: the Apple sub to dry-run") }
        let connection = try connect(parsed)
        defer { connection.close() }
        let settings = try database("reading the adapter") {
            try AuthAdapterAdministration(connection).settings(name: name)
        }
        guard let settings else { throw ToolFailure("no adapter \(name) (siwactl adapters list)") }
        let report: AuthAdapterAdministration.TestReport
        do {
            report = try AuthAdapterAdministration.test(settings, sub: sub, newSub: parsed.value("new-sub"))
        } catch let error as AuthPlatformError {
            throw ToolFailure("\(name): \(error.description)")
        } catch {
            throw ToolFailure("\(name): \(error)")
        }
        var output = "adapter \(name): \(settings.platform), provider \(settings.provider)\n"
        if report.problems.isEmpty {
            output +=
                settings.isHosted
                ? "check: ok (a token from the credentials)\n"
                : "check: ok (tables, columns, grants, row-level security)\n"
        } else {
            output += "check: \(report.problems.count) problem(s)\n"
            for problem in report.problems {
                output += "  problem: \(TerminalText.escaped(problem.description))\n"
            }
        }
        output +=
            settings.isHosted
            ? "dry run (lookups only, no change sent):\n" : "dry run (rolled back, nothing changed):\n"
        var failed = !report.problems.isEmpty
        for run in report.dryRuns {
            let what: String
            switch run.outcome {
            case .success(.noUser): what = "no user linked to this sub"
            case .success(.applied(let counts)): what = counts.description
            case .failure(let error):
                failed = true
                what = "FAILED: \(error)"
            }
            output += "  \(run.event) (\(run.policy)): \(TerminalText.escaped(what))\n"
        }
        writeStandardOutput(output)
        if failed { throw ToolFailure("\(name): the adapter is not ready (see above)") }
    }
}
