import Foundation
import Postgres
import ServiceSupport
import SiwaSchema

/// `siwactl doctor --database-url`: what only the database can tell. Reads
/// `siwa.service_heartbeats` (every receiver and worker refreshes its row every 15 s and deletes it when
/// it stops cleanly), `siwa.health_gauges` (when a notification was last stored and applied: what is
/// known when no process is alive) and `siwa.client_ids_in_use`; as the schema's owner or a member of
/// `siwa_admin`. Rows are not trusted: a heartbeat dated in the future or at infinity (which a database
/// without version 5's constraints may hold) is reported and left out, never counted as alive.
extension Doctor {
    /// One running process as its heartbeat (a row of `siwa.service_heartbeats`) says.
    struct Heartbeat: PostgresRowDecodable {
        static let statement = """
            SELECT kind, host, pid, array_to_json(audiences)::text AS audiences,
                   CASE WHEN isfinite(last_seen) THEN extract(epoch FROM now() - last_seen)::float8 END AS age,
                   version, to_jsonb(h) ->> 'product_version' AS product_version,
                   to_jsonb(h) ->> 'build_commit' AS build_commit
              FROM siwa.service_heartbeats h ORDER BY kind, host, pid
            """
        static let columns: PostgresColumns = """
            kind text, host text, pid integer, audiences text, age double precision, version text, \
            product_version text, build_commit text
            """
        var kind: String
        var host: String
        var pid: Int
        var audiences: [String]
        /// Seconds since it was last seen; −∞ for a heartbeat dated at infinity (never counted as alive).
        var age: Double
        /// `version` as recorded (`schema N`), the product version and the commit (nil for a process
        /// built before schema version 5).
        var schema: String
        var productVersion: String?
        var commit: String?
        var name: String { "\(host) pid \(pid)" }
        /// What it runs, e.g. `5.0.0 (commit 0123456789ab, schema 5)`.
        var running: String {
            guard let productVersion else { return "built before 5.0.0 (\(schema))" }
            return "\(productVersion) (commit \(commit ?? "unknown"), \(schema))"
        }

        init(row: PostgresRow) throws(PostgresError) {
            kind = try row[0, as: String.self]
            host = try row[1, as: String.self]
            pid = try row[2, as: Int.self]
            let json = try row[3, as: String.self]
            audiences = (try? JSONSerialization.jsonObject(with: Data(json.utf8))) as? [String] ?? []
            age = try row[4, as: Double?.self] ?? -.infinity
            schema = try row[5, as: String.self]
            productVersion = try row[6, as: String?.self]
            commit = try row[7, as: String?.self]
        }
    }

    /// How far back notifications' audiences count as in use.
    static let audienceWindowDays = 30

    /// How far in the future a heartbeat may be dated (the database's clock moving back) and still count.
    static let heartbeatSkew: Double = 60

    /// When the database last stored and applied a notification, in seconds ago (nil: none, or unknown).
    struct Activity: PostgresRowDecodable {
        static let statement = """
            SELECT CASE WHEN isfinite(last_received_at) THEN extract(epoch FROM now() - last_received_at)::float8 END
                     AS stored_ago,
                   CASE WHEN isfinite(last_applied_at) THEN extract(epoch FROM now() - last_applied_at)::float8 END
                     AS applied_ago
              FROM siwa.health_gauges()
            """
        static let columns: PostgresColumns = "stored_ago double precision, applied_ago double precision"
        var lastStored: Double?
        var lastApplied: Double?

        init(lastStored: Double? = nil, lastApplied: Double? = nil) {
            self.lastStored = lastStored
            self.lastApplied = lastApplied
        }

        init(row: PostgresRow) throws(PostgresError) {
            lastStored = try row[0, as: Double?.self]
            lastApplied = try row[1, as: Double?.self]
        }
    }

    /// Where each client ID was seen in use (`siwa.client_ids_in_use`) over the last `$1` days.
    struct ClientIDUse: PostgresRowDecodable {
        static let statement =
            "SELECT source, client_id FROM siwa.client_ids_in_use(now() - make_interval(days => $1::integer))"
        static let columns: PostgresColumns = "source text, client_id text"
        var source: String
        var clientID: String

        init(row: PostgresRow) throws(PostgresError) {
            source = try row[0, as: String.self]
            clientID = try row[1, as: String.self]
        }
    }

    /// The database's checks: workers alive, versions, receivers alive and their audiences against the
    /// client IDs in use, the revoker's client IDs. Connects to `url` (a URL or conninfo string).
    public mutating func checkDatabase(url: String, heartbeatMaxAge: Duration) {
        let connection: PostgresConnection
        do {
            connection = try PostgresConnection(
                configuration: try PostgresConfiguration(url, applicationName: "siwactl-doctor"))
        } catch {
            report(
                .fail, "database", "cannot connect: \(error.message)",
                fix: "check --database-url (SIWA_DATABASE_URL): host, database, role and password")
            return
        }
        defer { connection.close() }
        let heartbeats: [Heartbeat]
        var implausible: [String] = []
        var inUse: [String: [String]] = [:]  // client ID → where it is used
        do {
            heartbeats = try connection.rows(Heartbeat.self).compactMap { heartbeat in
                guard heartbeat.age >= -Self.heartbeatSkew else {
                    implausible.append("\(heartbeat.kind) \(heartbeat.name)")
                    return nil
                }
                var seen = heartbeat
                seen.age = max(heartbeat.age, 0)
                return seen
            }
            for use in try connection.rows(ClientIDUse.self, [.int(Int64(Self.audienceWindowDays))]) {
                inUse[use.clientID, default: []].append(use.source)
            }
        } catch {
            let denied = (error as? PostgresError)?.sqlState == "42501"
            let missing =
                (error as? PostgresError)?.sqlState.map { ["42P01", "42883", "3F000"].contains($0) } == true
            report(
                .fail, "database",
                "cannot read the heartbeats: \((error as? PostgresError)?.message ?? "\(error)")",
                fix: denied
                    ? "connect as the schema's owner or a member of siwa_admin (GRANT siwa_admin TO you)"
                    : missing
                        ? "migrate the database (siwactl migrate) to a schema with siwa.service_heartbeats"
                        : "check the database and the role")
            return
        }
        if !implausible.isEmpty {
            report(
                .warn, "heartbeats",
                "ignored \(implausible.count) heartbeat row(s) dated in the future or at infinity, which no receiver or worker writes: \(implausible.joined(separator: ", "))",
                fix: """
                    migrate the database (siwactl migrate: schema version 5 refuses such rows and deletes them), \
                    and find who writes heartbeats with the receiver's or worker's credential
                    """)
        }
        let activity = Self.activity(connection)
        let maxAge = heartbeatMaxAge.inSeconds
        let fresh = heartbeats.filter { $0.age <= maxAge }
        let workers = fresh.filter { $0.kind == "worker" }
        let receivers = fresh.filter { $0.kind == "receiver" }
        checkWorkers(
            workers, all: heartbeats.filter { $0.kind == "worker" }, maxAge: maxAge, activity: activity)
        checkVersions(fresh)
        checkSenderUnauthorized(connection)
        checkAuthAdapters(connection)
        guard
            checkReceivers(
                receivers, all: heartbeats.filter { $0.kind == "receiver" }, maxAge: maxAge,
                activity: activity)
        else {
            return
        }
        checkAudiences(receivers, inUse: inUse)
        checkRevoker(workers, inUse: inUse)
    }

    /// How long a pending auth adapter row may stay overdue before it makes a warning (a lane applies a
    /// due row within seconds; longer means no worker runs the adapters, or the auth database is down).
    public static let adapterOverdueWarning: Double = 600

    /// One line per auth adapter (`siwa.auth_adapter_overview`): dead rows (warning, with the retry), the
    /// oldest due row's age (warning when overdue), the last error. Nothing when none is configured.
    /// Whether a worker runs with `--auth-adapters on` is not in the heartbeats: an overdue row is what
    /// tells.
    private mutating func checkAuthAdapters(_ connection: PostgresConnection) {
        let rows:
            [(
                name: String, platform: String, enabled: Bool, pending: Int, dead: Int, overdue: Double?,
                error: String?
            )]
        do {
            rows = try connection.query(
                """
                SELECT name, platform, enabled, pending::bigint, dead::bigint,
                       extract(epoch FROM now() - oldest_due_at)::float8, last_error
                  FROM siwa.auth_adapter_overview ORDER BY name
                """
            ).map {
                (
                    try $0[0, as: String.self], try $0[1, as: String.self], try $0[2, as: Bool.self],
                    try $0[3, as: Int.self], try $0[4, as: Int.self], try $0[5, as: Double?.self],
                    try $0[6, as: String?.self]
                )
            }
        } catch {
            report(
                .warn, "adapters",
                "cannot read siwa.auth_adapter_overview: \((error as? PostgresError)?.message ?? "\(error)")",
                fix:
                    "migrate the database (siwactl migrate), and connect as the owner or a member of siwa_admin"
            )
            return
        }
        for row in rows {
            var parts = ["\(row.name) (\(row.platform))\(row.enabled ? "" : ", disabled")"]
            parts.append("\(row.pending) pending")
            if let overdue = row.overdue, overdue > 0 {
                parts.append("the oldest due \(formatAge(overdue)) ago")
            }
            if row.dead > 0 { parts.append("\(row.dead) dead") }
            if let error = row.error { parts.append("last error: \(TerminalText.escaped(error))") }
            let message = parts.joined(separator: ", ")
            if row.dead > 0 {
                report(
                    .warn, "adapters", message,
                    fix:
                        "fix the cause (the last error; siwactl adapters test \(row.name) --sub SUB), then siwactl adapters retry \(row.name)"
                )
            } else if row.enabled, let overdue = row.overdue, overdue > Self.adapterOverdueWarning {
                report(
                    .warn, "adapters", message,
                    fix:
                        "run siwa-worker with --auth-adapters on against this database, and check the adapter's auth database (siwactl adapters test \(row.name) --sub SUB)"
                )
            } else {
                report(.ok, "adapters", message)
            }
        }
    }

    /// How far back a `sender_unauthorized` bounce makes a finding.
    public static let senderUnauthorizedWindowDays = 7

    /// Relay bounces of class `sender_unauthorized` recently (`siwa.relay_bounce_history`): the sending
    /// domains Apple's relay refused, each a configuration error. Said and skipped when the view is
    /// missing or not readable.
    private mutating func checkSenderUnauthorized(_ connection: PostgresConnection) {
        let rows: [(domain: String, count: Int, last: Double)]
        do {
            rows = try connection.query(
                """
                SELECT coalesce(sending_domain, '(unknown)'), count(*)::bigint,
                       extract(epoch FROM now() - max(received_at))::float8
                  FROM siwa.relay_bounce_history
                 WHERE class = 'sender_unauthorized' AND received_at > now() - $1::integer * interval '1 day'
                 GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 20
                """, [.int(Int64(Self.senderUnauthorizedWindowDays))]
            ).map { (try $0[0, as: String.self], try $0[1, as: Int.self], try $0[2, as: Double.self]) }
        } catch {
            report(
                .warn, "bounces",
                "cannot read siwa.relay_bounce_history: \((error as? PostgresError)?.message ?? "\(error)")",
                fix:
                    "migrate the database (siwactl migrate), and connect as the owner or a member of siwa_admin"
            )
            return
        }
        guard !rows.isEmpty else {
            report(
                .ok, "bounces",
                "no sender_unauthorized bounce in the last \(Self.senderUnauthorizedWindowDays) days")
            return
        }
        let domains = rows.map { "\($0.domain) (\($0.count), last \(formatAge($0.last)) ago)" }
        report(
            .fail, "bounces",
            "Apple's relay refused mail as sender_unauthorized from \(rows.count) sending domain(s) in the last \(Self.senderUnauthorizedWindowDays) days: \(domains.joined(separator: ", "))",
            fix: """
                register each domain (and the envelope sender's SPF) with Apple: developer.apple.com → \
                Certificates, Identifiers & Profiles → Services → Sign in with Apple for Email \
                Communication; never suppress the recipients, every relay user bounces until then \
                (docs/operations.md, "Bounces")
                """)
    }

    /// When the database last stored and applied a notification (`siwa.health_gauges`); nothing when it
    /// cannot say.
    static func activity(_ connection: PostgresConnection) -> Activity {
        (try? connection.rows(Activity.self).first) ?? Activity()
    }

    private mutating func checkWorkers(
        _ workers: [Heartbeat], all: [Heartbeat], maxAge: Double, activity: Activity
    ) {
        if !workers.isEmpty {
            report(
                .ok, "workers",
                "\(workers.count) worker(s) alive: \(workers.map(\.name).joined(separator: ", "))")
            return
        }
        let last = all.min { $0.age < $1.age }
        // No row at all: none ran, or every one stopped cleanly (a stopping worker deletes its row).
        let applied =
            activity.lastApplied.map { "the last notification was applied \(formatAge(max($0, 0))) ago" }
            ?? "none has ever applied a notification in this database"
        report(
            .fail, "workers",
            last.map {
                "no worker is alive: the last heartbeat (\($0.name)) is \(formatAge($0.age)) old; \(applied)"
            }
                ?? "no worker is alive: no heartbeat (a worker deletes its own when it stops cleanly); \(applied)",
            fix: """
                start siwa-worker against this database (systemctl start siwa-worker; kubectl scale \
                deployment/siwa-worker --replicas=1) and read its log; until then notifications are stored \
                but not applied (no heartbeat within \(Int(maxAge)) s)
                """)
    }

    /// What version runs where: one line per live process, a warning when they differ from each other
    /// or from this siwactl.
    private mutating func checkVersions(_ processes: [Heartbeat]) {
        guard !processes.isEmpty else { return }
        let listing = processes.map { "\($0.kind) \($0.name): \($0.running)" }.joined(separator: "; ")
        let kinds = Set(processes.map(\.running))
        let mine = "\(SiwaBuild.version) (commit \(SiwaBuild.commit), schema \(SiwaBuild.schemaVersion))"
        if kinds.count > 1 {
            report(
                .warn, "versions", "processes run different versions: \(listing)",
                fix:
                    "finish the upgrade: restart every receiver and worker with the same release (docs/versioning.md)"
            )
        } else if kinds.first != mine {
            report(
                .warn, "versions",
                "every process runs \(kinds.first ?? ""), this siwactl is \(mine): \(listing)",
                fix:
                    "use the siwactl of the release the services run, or finish the upgrade (docs/versioning.md)"
            )
        } else {
            report(.ok, "versions", listing)
        }
    }

    /// False when there is no live receiver to compare.
    private mutating func checkReceivers(
        _ receivers: [Heartbeat], all: [Heartbeat], maxAge: Double, activity: Activity
    ) -> Bool {
        guard !receivers.isEmpty else {
            let stored =
                activity.lastStored.map { "the latest notification was stored \(formatAge(max($0, 0))) ago" }
                ?? "no notification was stored here within 400 days"
            report(
                .fail, "receivers",
                all.isEmpty
                    ? "no receiver is alive: no heartbeat (a receiver deletes its own when it stops cleanly); \(stored)"
                    : "no receiver is alive: the last heartbeat is \(formatAge(all.map(\.age).min() ?? 0)) old; \(stored)",
                fix: """
                    the receiver answering at \(url) stores into another database, or is not running: point its \
                    SIWA_DATABASE_URL here (no heartbeat within \(Int(maxAge)) s)
                    """)
            return false
        }
        let lists = Set(receivers.map { $0.audiences.sorted() })
        if lists.count > 1 {
            report(
                .warn, "receivers",
                "the \(receivers.count) receivers accept different audiences: "
                    + receivers.map { "\($0.name): \($0.audiences.sorted().joined(separator: ","))" }
                    .joined(separator: "; "),
                fix: "give every receiver the same SIWA_AUDIENCES and restart them")
        } else {
            report(
                .ok, "receivers",
                "\(receivers.count) receiver(s) alive, accepting \(lists.first?.joined(separator: ", ") ?? "")"
            )
        }
        return true
    }

    private mutating func checkAudiences(_ receivers: [Heartbeat], inUse: [String: [String]]) {
        guard !inUse.isEmpty else {
            report(
                .ok, "audiences",
                "no client ID in use yet (no notification in \(Self.audienceWindowDays) days, no sign-in): nothing to compare"
            )
            return
        }
        var refused = false
        for (clientID, sources) in inUse.sorted(by: { $0.key < $1.key }) {
            let missing = receivers.filter { !$0.audiences.contains(clientID) }
            guard !missing.isEmpty else { continue }
            refused = true
            let who =
                missing.count == receivers.count
                ? "no receiver accepts it"
                : "\(missing.map(\.name).joined(separator: ", ")) do(es) not accept it"
            report(
                .fail, "audiences",
                "\(clientID) is in use (\(Self.describe(sources))) but \(who): Apple's notifications for it are refused (401 wrong_audience) and lost",
                fix: "add \(clientID) to SIWA_AUDIENCES (--audience) of every receiver and restart them")
        }
        if !refused {
            let unused = Set(receivers.flatMap(\.audiences)).subtracting(inUse.keys).sorted()
            report(
                .ok, "audiences",
                "every client ID in use (\(inUse.keys.sorted().joined(separator: ", "))) is accepted by every receiver"
                    + (unused.isEmpty ? "" : "; not seen in use yet: \(unused.joined(separator: ", "))"))
        }
    }

    /// A worker whose revoker is on (it records its client IDs) must know every client ID of a stored
    /// refresh token, or it cannot revoke those tokens.
    private mutating func checkRevoker(_ workers: [Heartbeat], inUse: [String: [String]]) {
        let revokers = workers.filter { !$0.audiences.isEmpty }
        guard !revokers.isEmpty else { return }
        let tokenClients = inUse.filter { $0.value.contains("refresh tokens") }.keys.sorted()
        for clientID in tokenClients {
            let missing = revokers.filter { !$0.audiences.contains(clientID) }
            guard !missing.isEmpty else { continue }
            report(
                .warn, "revoker",
                "refresh tokens issued to \(clientID) are stored, but the revoker of \(missing.map(\.name).joined(separator: ", ")) has no client secret for it",
                fix: "add \(clientID) to the worker's SIWA_AUDIENCES (--audience) and restart it")
        }
    }

    private static func describe(_ sources: [String]) -> String {
        sources.map { $0 == "notifications" ? "notifications of the last \(audienceWindowDays) days" : $0 }
            .joined(separator: ", ")
    }
}
