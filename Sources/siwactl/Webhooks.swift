import Foundation
import HTTPServer
import Postgres
import ServiceSupport
import WebhookAdministration
import Webhooks

/// `siwactl webhooks`: manage signed outbound webhook endpoints, replay deliveries, and listen locally.
enum WebhooksVerb {
    static let verb = Verb(
        name: "webhooks", abstract: "Manage signed webhook endpoints; replay deliveries; listen locally.",
        subverbs: [
            .parsing("add", addSpec) { parsed, _ in try add(parsed) },
            .parsing("list", listSpec) { parsed, _ in try list(parsed) },
            .parsing("disable", disableSpec) { parsed, _ in try setEnabled(parsed, false) },
            .parsing("enable", enableSpec) { parsed, _ in try setEnabled(parsed, true) },
            .parsing("rotate-secret", rotateSpec) { parsed, _ in try rotate(parsed) },
            .parsing("replay", replaySpec) { parsed, _ in try replay(parsed) },
            .parsing("listen", listenSpec) { parsed, _ in try listen(parsed) },
            // operations
            .parsing("retry", retrySpec) { parsed, _ in try retry(parsed) },
            .parsing("remove", removeSpec) { parsed, _ in try remove(parsed) },
            // The developer loop (WebhooksSend.swift).
            .parsing("send", sendSpec) { parsed, _ in try send(parsed) },
        ])

    static let types = WebhookChange.types

    /// The values of a repeatable `--secret` (a file may hold one per line), split on whitespace.
    static func secretValues(_ parsed: ParsedCommand) -> [String] {
        parsed.values("secret").flatMap { $0.split(whereSeparator: \.isWhitespace).map(String.init) }
    }

    /// The keys that sign a delivery `send` or the forwarder makes: `whsec_` (v1) or `whsk_` (v1a).
    static func signingKeys(_ parsed: ParsedCommand) throws -> [StandardWebhooks.SigningKey] {
        try secretValues(parsed).map { text in
            do { return try StandardWebhooks.SigningKey(text) } catch {
                throw UsageError("--secret: \(error)")
            }
        }
    }

    /// `--secret whsec_…`, also from `--secret-file FILE` ('-': stdin), `SIWA_WEBHOOK_SECRET` or
    /// `SIWA_WEBHOOK_SECRET_FILE`: a secret of the caller's choosing for `add` and `rotate-secret`.
    static func secretOption(_ help: String) -> CommandOption {
        CommandOption("secret", valueName: "whsec_…", help: help, environmentVariable: "SIWA_WEBHOOK_SECRET")
            .secret()
    }

    // MARK: add

    static let addSpec = CommandSpec(
        name: "siwactl webhooks add",
        abstract: """
            Add a webhook endpoint: https (or http to a loopback IP literal). Without a secret of your own
            (--secret-file FILE, '-' for stdin, or SIWA_WEBHOOK_SECRET) a whsec_ secret is generated and
            printed once. Prints the endpoint's id (and the generated secret). --scheme ed25519 signs v1a
            with a new whsk_ key kept in the database and prints only its whpk_ public key.
            """,
        options: [
            .databaseURL,
            CommandOption("url", valueName: "URL", help: "Where deliveries are POSTed.", isRequired: true),
            secretOption("The signing secret, whsec_ or an ed25519 whsk_ (default: a new one)."),
            CommandOption(
                "types", valueName: "TYPE,…",
                help: "Only these change types (default: all): \(types.joined(separator: ", "))."),
            CommandOption(
                "max-in-flight", valueName: "N", help: "Attempts to this endpoint at once, 1 to 64.",
                defaultValue: "4"),
            schemeOption("hmac (v1, default) or ed25519 (v1a)."),
        ])

    static func add(_ parsed: ParsedCommand) throws {
        let url = parsed.value("url") ?? ""
        if let problem = StandardWebhooks.endpointProblem(url) { throw UsageError("--url: \(problem)") }
        let secret = try signingKey(parsed, scheme: parsed.value("scheme"))
        let chosen = try parsedTypes(parsed)
        if let warning = WebhookChange.subscriptionWarning(chosen) {
            writeErrorLine("siwactl webhooks add", "warning: " + warning)
        }
        let maxInFlight: Int
        do { maxInFlight = try parsed.integer("max-in-flight", in: 1...64) ?? 4 } catch {
            throw UsageError(error.message)
        }
        let connection = try connect(parsed)
        defer { connection.close() }
        let id = try database("adding the endpoint") {
            try WebhookAdministration(connection).addEndpoint(
                url: url, secret: secret.text, types: chosen, maxInFlight: maxInFlight,
                publicKey: secret.publicKey?.text)
        }
        writeStandardOutput("endpoint \(id): \(url)\n")
        if let publicKey = secret.publicKey {
            // The private key stays in the database: the app needs only the public key (not a secret).
            writeStandardOutput("public key: \(publicKey.text)\n")
            writeErrorLine(
                "siwactl webhooks add",
                "signing v1a (ed25519): put the public key in your app's configuration")
        } else if parsed.value("secret") == nil {
            writeStandardOutput("secret: \(secret.text)\n")
            writeErrorLine(
                "siwactl webhooks add",
                "the secret is shown once: store it where your app verifies deliveries")
        }
    }

    static func parsedTypes(_ parsed: ParsedCommand) throws -> [String]? {
        guard let text = parsed.value("types") else { return nil }
        let chosen = text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter {
            !$0.isEmpty
        }
        guard !chosen.isEmpty, chosen.allSatisfy(types.contains) else {
            throw UsageError("--types: a comma-separated list of \(types.joined(separator: ", "))")
        }
        return chosen
    }

    // MARK: list

    static let listSpec = CommandSpec(
        name: "siwactl webhooks list",
        abstract: "List webhook endpoints with their delivery counts (never their secrets).",
        options: [.databaseURL], flags: [CommandFlag("json", help: "One JSON object per line.")])

    static func list(_ parsed: ParsedCommand) throws {
        let connection = try connect(parsed)
        defer { connection.close() }
        let endpoints = try database("listing endpoints") {
            try WebhookAdministration(connection).endpoints()
        }
        if parsed.flag("json") {
            for endpoint in endpoints {
                writeStandardOutput(
                    JSONText.line([
                        "id": endpoint.id, "url": endpoint.url, "types": endpoint.types,
                        "enabled": endpoint.enabled,
                        "max_in_flight": endpoint.maxInFlight, "live_secrets": endpoint.liveSecrets,
                        "pending": endpoint.pending, "dead": endpoint.dead,
                        "last_delivered_at": endpoint.lastDeliveredAt.map(formatShort) ?? "-",
                        "disabled_reason": endpoint.disabledReason ?? NSNull(),
                        "disabled_at": endpoint.disabledAt.map(formatShort) ?? "-",
                    ]))
            }
            return
        }
        let table = endpoints.map { endpoint in
            [
                String(endpoint.id), endpoint.url, endpoint.types, endpoint.enabled ? "yes" : "no",
                String(endpoint.maxInFlight), String(endpoint.liveSecrets), String(endpoint.pending),
                String(endpoint.dead), endpoint.lastDeliveredAt.map(formatShort) ?? "-",
                // auto-disable: why and when it was disabled
                endpoint.disabledReason.map { TerminalText.escaped($0) } ?? "-",
                endpoint.disabledAt.map(formatShort) ?? "-",
            ]
        }
        writeStandardOutput(
            renderTable(
                header: [
                    "ID", "URL", "TYPES", "ENABLED", "IN-FLIGHT", "SECRETS", "PENDING", "DEAD",
                    "LAST DELIVERED", "DISABLED WHY", "DISABLED AT",
                ],
                rows: table))
    }

    // MARK: disable / enable

    static let disableSpec = CommandSpec(
        name: "siwactl webhooks disable",
        abstract: "Disable an endpoint: new changes no longer fan out to it and its pending deliveries wait.",
        options: [.databaseURL, endpointOption])
    static let enableSpec = CommandSpec(
        name: "siwactl webhooks enable",
        abstract: "Enable an endpoint again: its pending deliveries resume (replay fills the gap).",
        options: [.databaseURL, endpointOption])
    static let endpointOption = CommandOption(
        "endpoint", valueName: "ID", help: "The endpoint's id (siwactl webhooks list).", isRequired: true)

    static func endpointID(_ parsed: ParsedCommand) throws -> Int {
        guard let text = parsed.value("endpoint"), let id = Int(text), id > 0 else {
            throw UsageError("--endpoint must be an endpoint id")
        }
        return id
    }

    static func setEnabled(_ parsed: ParsedCommand, _ enabled: Bool) throws {
        let id = try endpointID(parsed)
        let connection = try connect(parsed)
        defer { connection.close() }
        let found = try database("updating the endpoint") {
            try WebhookAdministration(connection).setEnabled(endpoint: Int64(id), enabled)
        }
        guard found else { throw ToolFailure("no endpoint \(id)") }
        writeStandardOutput("endpoint \(id) \(enabled ? "enabled" : "disabled")\n")
    }

    // MARK: rotate-secret

    static let rotateSpec = CommandSpec(
        name: "siwactl webhooks rotate-secret",
        abstract: """
            Add a new signing secret (generated and printed once unless given: --secret-file FILE, '-' for
            stdin, or SIWA_WEBHOOK_SECRET); the current one keeps signing alongside it for --overlap (e.g.
            24h, 90m, 0), then stops.
            """,
        options: [
            .databaseURL, endpointOption,
            secretOption("The new secret, whsec_ or an ed25519 whsk_ (default: a new one)."),
            CommandOption(
                "overlap", valueName: "DURATION", help: "How long the old secret still signs (s, m, h, d).",
                defaultValue: "24h"),
            schemeOption("hmac (v1) or ed25519 (v1a) for the new key (default: the current key's)."),
        ])

    static func rotate(_ parsed: ParsedCommand) throws {
        let id = try endpointID(parsed)
        guard let overlap = parseDuration(parsed.value("overlap") ?? "24h") else {
            throw UsageError("--overlap must be a duration such as 24h, 90m, 3600s or 0")
        }
        let connection = try connect(parsed)
        defer { connection.close() }
        // Without --scheme (or a key of the caller's) the new key has the scheme of the current one.
        let webhooks = WebhookAdministration(connection)
        var scheme = parsed.value("scheme")
        if scheme == nil, parsed.value("secret") == nil {
            let current = try database("reading the endpoint's scheme") {
                try webhooks.currentScheme(endpoint: Int64(id))
            }
            if current == .v1a { scheme = "ed25519" }
        }
        let secret = try signingKey(parsed, scheme: scheme)
        let found = try database("rotating the secret") {
            try webhooks.rotateSecret(
                endpoint: Int64(id), secret: secret.text, overlap: overlap, publicKey: secret.publicKey?.text)
        }
        guard found else { throw ToolFailure("no endpoint \(id)") }
        writeStandardOutput(
            "endpoint \(id): new secret signs now; the previous one signs for \(formatAge(overlap)) more\n")
        if let publicKey = secret.publicKey {
            writeStandardOutput("public key: \(publicKey.text)\n")
        } else if parsed.value("secret") == nil {
            writeStandardOutput("secret: \(secret.text)\n")
        }
    }

    // MARK: signing schemes (ed25519, v1a)

    /// `--scheme hmac|ed25519`.
    static func schemeOption(_ help: String) -> CommandOption {
        CommandOption("scheme", valueName: "hmac|ed25519", help: help)
    }

    /// The signing key for `add` and `rotate-secret`: the caller's (`--secret`, whsec_ or whsk_), else a
    /// new one of `scheme` (hmac when nil).
    static func signingKey(_ parsed: ParsedCommand, scheme: String?) throws -> StandardWebhooks.SigningKey {
        guard scheme == nil || scheme == "hmac" || scheme == "ed25519" else {
            throw UsageError("--scheme is hmac or ed25519")
        }
        guard let text = parsed.value("secret") else {
            return scheme == "ed25519" ? .ed25519(.generate()) : .hmac(.generate())
        }
        let key: StandardWebhooks.SigningKey
        do { key = try StandardWebhooks.SigningKey(text) } catch { throw UsageError("--secret: \(error)") }
        if let scheme, (scheme == "ed25519") != (key.scheme == "v1a") {
            throw UsageError(
                "--secret: a \(scheme == "ed25519" ? "whsk_" : "whsec_") key for --scheme \(scheme)")
        }
        return key
    }

    /// `90`, `90s`, `15m`, `24h`, `2d`: seconds.
    static func parseDuration(_ text: String) -> Double? {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        let units: [Character: Double] = ["s": 1, "m": 60, "h": 3600, "d": 86400]
        if let last = trimmed.last, let unit = units[last], let value = Double(trimmed.dropLast()),
            value.isFinite,
            value >= 0
        {
            return value * unit
        }
        if let value = Double(trimmed), value.isFinite, value >= 0 { return value }
        return nil
    }

    // MARK: replay

    static let replaySpec = CommandSpec(
        name: "siwactl webhooks replay",
        abstract: """
            Queue deliveries again, with the same webhook-id and a fresh retry schedule: one --delivery, every
            delivery of one --change (whatever their state), or a window: the changes applied --since/--until,
            to one --endpoint or to all, choosing --state dead (the default), failed (dead, and pending ones
            in backoff: due now) or all (delivered too; with --endpoint, creating the deliveries it never
            had). Prints how many were queued.
            """,
        options: [
            .databaseURL,
            CommandOption("delivery", valueName: "ID", help: "A delivery (siwa.webhook_delivery_status.id)."),
            CommandOption("change", valueName: "ID", help: "A change (siwa.changes.id): all its deliveries."),
            CommandOption("endpoint", valueName: "ID", help: "An endpoint: every change in the time range."),
            CommandOption(
                "since", valueName: "TIME", help: "Applied since (ISO 8601, or an age: 2h)."),
            CommandOption(
                "until", valueName: "TIME", help: "Applied before (ISO 8601, or an age)."),
            // replay with a state selector
            CommandOption(
                "state", valueName: "STATE",
                help: "For a window: dead, failed or all (default dead); a delivery or change: all."),
        ])

    static func replay(_ parsed: ParsedCommand) throws {
        func id(_ name: String) throws -> Int64? {
            guard let text = parsed.value(name) else { return nil }
            guard let value = Int64(text), value > 0 else { throw UsageError("--\(name) must be an id") }
            return value
        }
        let delivery = try id("delivery")
        let change = try id("change")
        let endpoint = try id("endpoint")
        func time(_ name: String) throws -> Date? {
            guard let text = parsed.value(name) else { return nil }
            guard delivery == nil, change == nil else {
                throw UsageError("--\(name) is a window: not with --delivery or --change")
            }
            guard let date = parseSince(text) else {
                throw UsageError("--\(name): ISO 8601 or an age such as 2h")
            }
            return date
        }
        let since = try time("since")
        let until = try time("until")
        let window = endpoint != nil || since != nil || until != nil
        guard [delivery, change].compactMap({ $0 }).count + (window ? 1 : 0) == 1 else {
            throw UsageError(
                "give exactly one of --delivery, --change, or a window (--endpoint and/or --since)")
        }
        guard
            let state = WebhookAdministration.ReplayChoice(
                rawValue: parsed.value("state") ?? (window ? "dead" : "all"))
        else {
            throw UsageError("--state must be dead, failed or all")
        }
        let connection = try connect(parsed)
        defer { connection.close() }
        let webhooks = WebhookAdministration(connection)
        let count = try database("replaying") {
            try webhooks.replay(
                delivery: delivery, change: change, endpoint: endpoint, since: since, until: until,
                choosing: state)
        }
        if let delivery, count == 0 { try explainNotReplayed(delivery, state: state, on: webhooks) }
        writeStandardOutput("queued \(count) deliver\(count == 1 ? "y" : "ies")\n")
    }

    // MARK: listen

    static let listenSpec = CommandSpec(
        name: "siwactl webhooks listen",
        abstract: """
            A local webhook endpoint for developers: listens on 127.0.0.1, verifies each delivery's signature
            (v1 with a whsec_ secret, v1a with a whpk_ public key) and timestamp (±5 min), prints it as one JSON line, and answers 204 (or --status); 401 for a bad
            signature, 400 for a missing header or a stale timestamp. Until SIGINT/SIGTERM.
            """,
        options: [
            CommandOption("port", valueName: "N", help: "The port (0, the default: any free one, printed)."),
            CommandOption(
                "secret", valueName: "whsec_…|whpk_…",
                help:
                    "The endpoint's secret (v1), or its whpk_ public key (v1a); repeat for several (rotation; in a file, one per line). With --forward-to: the whsec_ secret or whsk_ key the forwarded deliveries are signed with (default: a new whsec_, printed).",
                isRepeatable: true, environmentVariable: "SIWA_WEBHOOK_SECRET"
            ).secret(),
            // The developer loop (WebhooksForward.swift).
            CommandOption(
                "forward-to", valueName: "URL",
                help:
                    "Register a temporary endpoint for this listener (needs --database-url; removed on exit) and forward each verified delivery to your app at URL, re-signed."
            ),
            optionalDatabaseURL,
            CommandOption("types", valueName: "TYPE,…", help: "With --forward-to: only these change types."),
            CommandOption(
                "status", valueName: "CODE",
                help: "The status answered to a verified delivery (e.g. 500 to test retries).",
                defaultValue: "204"),
            .listenAddressFile(environmentVariable: nil, names: "webhooks"),
        ])

    static func listen(_ parsed: ParsedCommand) throws {
        if parsed.value("forward-to") != nil { return try forward(parsed) }
        guard !parsed.values("secret").isEmpty else {
            throw UsageError(
                "--secret (or --secret-file, SIWA_WEBHOOK_SECRET) is required without --forward-to")
        }
        let port: Int
        let answer: Int
        do {
            port = try parsed.integer("port", in: 0...65535) ?? 0
            answer = try parsed.integer("status", in: 200...599) ?? 204
        } catch { throw UsageError(error.message) }
        // whsec_ secrets check v1 signatures, whpk_ public keys v1a: either kind, several of each.
        let keys = try secretValues(parsed).map { text in
            do { return try StandardWebhooks.VerificationKey(text) } catch {
                throw UsageError("--secret: \(error)")
            }
        }
        let addressFile = try listenAddressFile(parsed)
        let signals = TerminationSignals()
        let server = HTTPServer(
            configuration: HTTPServer.Configuration(
                host: "127.0.0.1", port: port, threadCount: 2, maxBodyBytes: 1 << 20)
        ) { request in
            handle(request, keys: keys, answer: answer)
        }
        do { try server.start() } catch { throw ToolFailure("cannot listen on 127.0.0.1:\(port): \(error)") }
        defer { server.shutdown(gracePeriod: .seconds(2)) }
        let schemes = Set(keys.map(\.scheme)).sorted().joined(separator: ", ")
        writeErrorLine(
            "siwactl webhooks listen",
            "listening on http://\(server.address!)/ (\(keys.count) key\(keys.count == 1 ? "" : "s"): \(schemes))"
        )
        try write(addressFile, server)
        defer { addressFile?.remove() }
        let name = signals.wait()
        writeErrorLine("siwactl webhooks listen", "\(name), stopping")
    }

    /// `--listen-address-file`, with a file left by an earlier run removed.
    static func listenAddressFile(_ parsed: ParsedCommand) throws -> ListenAddressFile? {
        let file = parsed.value("listen-address-file").map(ListenAddressFile.init(path:))
        do { try file?.removeStale() } catch { throw ToolFailure(error.message) }
        return file
    }

    /// Writes the listener's address (as `webhooks`) to `file`, when given.
    static func write(_ file: ListenAddressFile?, _ server: HTTPServer) throws {
        do { try file?.write([("webhooks", server.address ?? "")]) } catch {
            throw ToolFailure(error.message)
        }
    }

    /// Verifies one request and prints it (stdout, one JSON line) or why it was refused (stderr).
    static func handle(_ request: HTTPRequest, keys: [StandardWebhooks.VerificationKey], answer: Int)
        -> HTTPResponse
    {
        guard request.method == "POST" else { return .error(status: 405, "POST only") }
        let id = request.headers["webhook-id"]
        do {
            try StandardWebhooks.verify(
                id: id, timestamp: request.headers["webhook-timestamp"],
                signature: request.headers["webhook-signature"], body: request.body, keys: keys)
        } catch {
            let status = error.description == "no matching signature" ? 401 : 400
            writeErrorLine(
                "siwactl webhooks listen", "refused \(id ?? "(no webhook-id)") with \(status): \(error)")
            return .error(status: status, error.description)
        }
        writeStandardOutput(printedLine(id: id ?? "", body: request.body, answer: answer))
        return HTTPResponse(status: answer)
    }

    /// The line printed for a verified delivery: `{"answered":…,"body":…,"type":…,"verified":true,
    /// "webhook_id":…}`, the body as JSON when it is JSON (else as a string). A JSON object on one line
    /// (every body the worker sends) is printed as it came, its controls escaped (``JSONText``), without
    /// being serialised again; any other body is re-serialised by ``JSONText/line(_:)``.
    static func printedLine(id: String, body: [UInt8], answer: Int) -> String {
        let parsed = try? JSONSerialization.jsonObject(with: Data(body))
        let type = (parsed as? [String: Any])?["type"]
        // One line of UTF-8 (UTF-16 or 32 would hold NULs; a byte order mark would not start with `{`).
        if parsed != nil, body.first == UInt8(ascii: "{"),
            !body.contains(where: { $0 == 10 || $0 == 13 || $0 == 0 }), type == nil || type is String
        {
            var line = #"{"answered":\#(answer),"body":"#
            line += JSONText.escapingControls(String(decoding: body, as: UTF8.self))
            if let type = type as? String { line += #","type":"# + JSONText.quoted(type) }
            return line + #","verified":true,"webhook_id":"# + JSONText.quoted(id) + "}\n"
        }
        var line: [String: Any] = [
            "webhook_id": id, "verified": true, "answered": answer,
            "body": parsed ?? String(decoding: body, as: UTF8.self),
        ]
        if let type { line["type"] = type }
        return JSONText.line(line)
    }
}
