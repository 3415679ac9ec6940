public import AuthAdapters
public import AuthPlatforms
import HostedPlatforms
public import Foundation
public import Postgres
import ServiceSupport

/// The operator's calls on the auth adapters (`siwactl adapters`): every write a `siwa.*` function
/// (`siwa.add_auth_adapter`, `siwa.remove_auth_adapter`, `siwa.retry_auth_adapter_events`), every read
/// `siwa.auth_adapter_overview` or `siwa.auth_adapters` into a typed row, and ``test(_:sub:newSub:)``, a
/// dry run in the auth system's own database that changes nothing. The connection's file is read only
/// through `SecretFile` and its content is never returned, thrown or stored. Never prints or reads the
/// environment.
public struct AuthAdapterAdministration {
    /// The connection to siwa's database every call runs on (as `siwa_admin`).
    public let connection: PostgresConnection

    public init(_ connection: PostgresConnection) {
        self.connection = connection
    }

    /// The platforms `siwa.auth_adapters` accepts.
    public static let platforms = [
        "supabase", "better-auth", "authjs", "authjs-prisma", "django-allauth", "django-social-auth",
        "firebase",
        "auth0", "clerk", "keycloak",
    ]

    /// The platform's own name for Apple in its identity tables: `apple-id` for python-social-auth
    /// (django-social-auth), `apple.com` for Firebase's provider id, `apple` for the others.
    public static func defaultProvider(platform: String) -> String {
        switch platform {
        case "django-social-auth": "apple-id"
        case "firebase": "apple.com"
        default: "apple"
        }
    }

    /// What the caller gave that is refused before anything is written or read.
    public struct Refusal: Error, Sendable, Equatable, CustomStringConvertible {
        /// In words; names the option, never a file's content.
        public var description: String
        public init(_ description: String) { self.description = description }
    }

    /// The adapter's settings checked as the worker will use them: the platform known to this build
    /// (`AdapterSettings.makePlatform()`), the policy one the platform can express
    /// (`AuthPlatform.validate`), the connection a `file:` reference to an absolute path whose file is
    /// owner-only and not empty (`SecretFile.read`; its content is dropped at once).
    public static func validate(_ settings: AdapterSettings) throws(Refusal) {
        guard platforms.contains(settings.platform) else {
            throw Refusal(
                "unknown platform \(settings.platform): one of \(platforms.joined(separator: ", "))")
        }
        do {
            if settings.isHosted {
                // The credentials are read now: a field missing is refused before the row is written.
                let credentials = try connectionText(settings.connectionReference)
                try settings.makeHostedPlatform(credentials: credentials).validate(settings.policy)
            } else {
                try settings.makePlatform().validate(settings.policy)
                _ = try connectionText(settings.connectionReference)
            }
        } catch let error as Refusal {
            throw error
        } catch let error as AuthPlatformError {
            throw Refusal(error.description)
        } catch let error as HostedCallError {
            throw Refusal(error.description)
        } catch {
            throw Refusal("\(settings.platform): \(error)")
        }
    }

    /// The text of the connection file behind `reference` (`file:/absolute/path`), read through
    /// `SecretFile`: refused when the path is relative, the file missing or empty, or readable by group
    /// or others. The caller never shows it.
    static func connectionText(_ reference: String) throws(Refusal) -> String {
        do {
            return try AuthDatabase.url(reference)
        } catch {
            throw Refusal(error.message)
        }
    }

    /// Adds an adapter after ``validate(_:)`` (`siwa.add_auth_adapter`) and returns its id. The database
    /// refuses what it refuses with 22023 (a policy the platform cannot express, naming it) or 23505 (the
    /// name is taken): thrown as the `PostgresError`.
    @discardableResult
    public func add(name: String, settings: AdapterSettings, enabled: Bool = true) throws -> Int {
        try Self.validate(settings)
        let policy = settings.policy
        return try connection.value(
            "SELECT siwa.add_auth_adapter($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10, $11)",
            [
                .text(name), .text(settings.platform), .text(settings.provider),
                .text(settings.connectionReference), .text(settings.options),
                .text(policy.onConsentRevoked.rawValue), .text(policy.onAccountDeleted.rawValue),
                .text(policy.whenUnlinkLeavesNoLogin.rawValue), .text(policy.onForwardingChange.rawValue),
                .text(policy.onSubTransferred.rawValue), .bool(enabled),
            ], as: Int.self)
    }

    /// Removes an adapter and its outbox rows (`siwa.remove_auth_adapter`); false: no adapter of that name.
    public func remove(name: String) throws(PostgresError) -> Bool {
        try connection.value("SELECT siwa.remove_auth_adapter($1)", [.text(name)], as: Bool.self)
    }

    /// Resumes (`true`) or pauses an adapter (`siwa.set_auth_adapter_enabled`): a paused adapter's changes
    /// queue unclaimed. False: no adapter of that name.
    public func setEnabled(name: String, _ enabled: Bool) throws(PostgresError) -> Bool {
        try connection.value(
            "SELECT siwa.set_auth_adapter_enabled($1, $2)", [.text(name), .bool(enabled)], as: Bool.self)
    }

    /// Makes the adapter's dead rows (or its one row `id`) pending and due now
    /// (`siwa.retry_auth_adapter_events`); nil: no adapter of that name.
    public func retry(name: String, id: Int? = nil) throws(PostgresError) -> Int? {
        guard
            let adapter = try connection.firstValue(
                "SELECT id FROM siwa.auth_adapter_overview WHERE name = $1", [.text(name)], as: Int.self)
        else { return nil }
        return try connection.value(
            "SELECT siwa.retry_auth_adapter_events($1, $2)",
            [.int(Int64(adapter)), id.map { .int(Int64($0)) }], as: Int.self)
    }

    /// Every adapter with its settings and outbox counts, by name (never the connection file's content).
    public func adapters() throws(PostgresError) -> [AdapterOverview] {
        try connection.rows(AdapterOverview.self)
    }

    /// The adapter `name`'s settings, or nil.
    public func settings(name: String) throws(PostgresError) -> AdapterSettings? {
        try adapters().first { $0.name == name }?.settings
    }

    /// One adapter: `siwa.auth_adapter_overview` joined with its settings in `siwa.auth_adapters`.
    public struct AdapterOverview: PostgresRowDecodable, Sendable {
        public static let statement = """
            SELECT o.id, o.name, o.platform, o.provider, a.connection_ref, a.options::text, o.on_consent_revoked,
                   o.on_account_deleted, o.when_unlink_leaves_no_login, o.on_forwarding_change,
                   o.on_sub_transferred, o.enabled, o.pending, o.dead, o.no_user,
                   extract(epoch FROM now() - o.oldest_due_at)::float8 AS oldest_due_ago, o.oldest_due_at,
                   o.last_error, o.last_error_at
              FROM siwa.auth_adapter_overview o JOIN siwa.auth_adapters a ON a.id = o.id
             ORDER BY o.name
            """
        public static let columns: PostgresColumns = """
            id bigint, name text, platform text, provider text, connection_ref text, options text, \
            on_consent_revoked text, on_account_deleted text, when_unlink_leaves_no_login text, \
            on_forwarding_change text, on_sub_transferred text, enabled boolean, pending bigint, dead bigint, \
            no_user bigint, oldest_due_ago double precision, oldest_due_at timestamp with time zone, \
            last_error text, last_error_at timestamp with time zone
            """
        /// Its id.
        public var id: Int
        /// Its name (`siwactl adapters remove NAME`).
        public var name: String
        /// Platform, provider, the `file:` reference, options and policy.
        public var settings: AdapterSettings
        /// Whether new changes fan out to it.
        public var enabled: Bool
        /// Rows waiting, in flight or waiting for a retry.
        public var pending: Int
        /// Rows given up (`siwactl adapters retry NAME`).
        public var dead: Int
        /// Rows whose sub linked no user there.
        public var noUser: Int
        /// Seconds since the earliest pending row was due (negative: due later); nil: none pending.
        public var oldestDueAgo: Double?
        /// When the earliest pending row is (was) due.
        public var oldestDueAt: Date?
        /// The latest error recorded (our own words) and when.
        public var lastError: String?
        public var lastErrorAt: Date?

        public init(row: PostgresRow) throws(PostgresError) {
            id = try row["id"]
            name = try row["name"]
            settings = AdapterSettings(
                platform: try row["platform"], provider: try row["provider"],
                connectionReference: try row["connection_ref"], options: try row["options"],
                policy: AuthPolicy(
                    onConsentRevoked: .init(rawValue: try row["on_consent_revoked"]) ?? .endSessions,
                    onAccountDeleted: .init(rawValue: try row["on_account_deleted"]) ?? .unlink,
                    whenUnlinkLeavesNoLogin: .init(rawValue: try row["when_unlink_leaves_no_login"])
                        ?? .disable,
                    onForwardingChange: .init(rawValue: try row["on_forwarding_change"]) ?? .ignore,
                    onSubTransferred: .init(rawValue: try row["on_sub_transferred"]) ?? .move))
            enabled = try row["enabled"]
            pending = try row["pending"]
            dead = try row["dead"]
            noUser = try row["no_user"]
            oldestDueAgo = try row["oldest_due_ago"]
            oldestDueAt = try row["oldest_due_at"]
            lastError = try row["last_error"]
            lastErrorAt = try row["last_error_at"]
        }
    }

    // MARK: test

    /// What ``test(_:sub:newSub:)`` found: the login's problems, and what each event would change.
    public struct TestReport: Sendable {
        /// `AuthPlatform.check`'s findings (empty: the login is ready).
        public var problems: [AuthPlatformProblem]
        /// One dry run per event, in order.
        public var dryRuns: [DryRun]
    }

    /// One event's dry run.
    public struct DryRun: Sendable {
        /// `consent revoked`, `account deleted`, `forwarding off`, `sub transferred`.
        public var event: String
        /// The policy's choice for it.
        public var policy: String
        /// What it would change, or why it failed (`AuthPlatformError`, `HostedCallError`: our words,
        /// never data).
        public var outcome: Result<AuthChange, any Error>
    }

    /// Why the auth database could not be reached: our own words, never the URL.
    public struct ConnectionFailure: Error, Sendable, CustomStringConvertible {
        public var description: String
    }

    /// `siwactl adapters test`: reads the connection file (``validate(_:)``'s rules), connects to the auth
    /// database, runs `check` and a dry run (`AuthPlatform.dryRun`, rolled back) of consent revoked,
    /// account deleted and forwarding off for `sub`, and of a transfer from `sub` to `newSub` when given.
    /// Changes nothing there.
    public static func test(_ settings: AdapterSettings, sub: String, newSub: String?) throws -> TestReport {
        try validate(settings)
        if settings.isHosted { return try testHosted(settings, sub: sub, newSub: newSub) }
        let platform = try settings.makePlatform()
        let url = try connectionText(settings.connectionReference)
        let auth: PostgresConnection
        do {
            auth = try AuthDatabase.connect(
                url, applicationName: "siwactl-adapters-test", timeout: .seconds(10))
        } catch  where error.code == .invalidConfiguration {
            throw ConnectionFailure(
                description: "the connection file does not hold a PostgreSQL URL or conninfo string")
        } catch {
            throw ConnectionFailure(
                description:
                    "cannot connect to the auth database: \(error.sqlState ?? error.code.description)"
                    + (error.connectionFailureReason.map { " (\($0))" } ?? ""))
        }
        defer { auth.close() }
        let problems = try platform.check(on: auth, policy: settings.policy)
        let dryRuns = events(settings.policy, sub: sub, newSub: newSub).map { name, choice, event, target in
            DryRun(
                event: name, policy: choice,
                outcome: Result { try platform.dryRun(event, sub: target, policy: settings.policy, on: auth) })
        }
        return TestReport(problems: problems, dryRuns: dryRuns)
    }

    /// ``test(_:sub:newSub:)`` for a hosted platform: a token from the credentials, then each event with
    /// its changes unsent (`HostedAPI.dryRun`: only the lookups reach the platform).
    static func testHosted(_ settings: AdapterSettings, sub: String, newSub: String?) throws -> TestReport {
        let platform = try settings.makeHostedPlatform(
            credentials: try connectionText(settings.connectionReference))
        let api = HostedAPI(platform: platform, timeout: .seconds(10), dryRun: true)
        do {
            _ = try platform.obtainToken(api.http)
        } catch {
            throw ConnectionFailure(description: "cannot get a token: \(error)")
        }
        let dryRuns = events(settings.policy, sub: sub, newSub: newSub).map { name, choice, event, target in
            DryRun(
                event: name, policy: choice,
                outcome: Result { try platform.apply(event, sub: target, policy: settings.policy, api: api) })
        }
        return TestReport(problems: [], dryRuns: dryRuns)
    }

    /// The events a test runs for `sub`: name, the policy's choice, the event, the sub it is applied to.
    static func events(_ policy: AuthPolicy, sub: String, newSub: String?) -> [(String, String, AuthEvent, String)] {
        var events: [(String, String, AuthEvent, String)] = [
            ("consent revoked", policy.onConsentRevoked.rawValue, .consentRevoked, sub),
            (
                "account deleted",
                policy.onAccountDeleted == .unlink
                    ? "unlink, when it leaves no login: \(policy.whenUnlinkLeavesNoLogin.rawValue)"
                    : policy.onAccountDeleted.rawValue,
                .accountDeleted, sub
            ),
            ("forwarding off", policy.onForwardingChange.rawValue, .forwardingChanged(on: false), sub),
        ]
        if let newSub {
            events.append(
                ("sub transferred", policy.onSubTransferred.rawValue, .subTransferred(from: sub), newSub))
        }
        return events
    }
}
