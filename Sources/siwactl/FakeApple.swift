import AppleNotifications
import Foundation
import HTTPClient
import HTTPServer
import ServiceSupport
import Synchronization

/// `siwactl fake-apple`: a local stand-in for Apple: the key endpoint serving a JWKS file, and, when
/// given a team, its key and client IDs, the token and revoke endpoints (see ``FakeAppleAuthority``).
enum FakeAppleVerb {
    static let spec = CommandSpec(
        name: "siwactl fake-apple",
        abstract: """
            A local Apple, on loopback only. Serves DIR/jwks.json (as written by 'siwactl keygen') at
            /auth/keys, re-reading it when it changes (to demonstrate key rotation). Given --team-id,
            --key-id, --team-key and --client-id it also answers /auth/token and /auth/revoke as Apple
            does, signing id_tokens with DIR/private-key.pem; after revoking a real token it POSTs a signed
            consent-revoked notification to --notify-url; /auth/usermigrationinfo answers both sides of
            an app transfer (--transfer-team adds the recipient team). 'siwactl fake-apple authorize' mints an
            authorization code for a test user, 'siwactl fake-apple fault' makes it fail on demand.
            Logs one line per request on stderr, prints the JWKS URL on stdout, and runs until SIGTERM or
            SIGINT.
            """,
        options: [
            CommandOption(
                "listen", valueName: "HOST:PORT",
                help: "Loopback address to listen on (port 0: any free port).", defaultValue: "127.0.0.1:8081"
            ),
            CommandOption(
                "keys", valueName: "DIR", help: "Directory holding jwks.json (and private-key.pem).",
                isRequired: true),
            CommandOption(
                "team-id", valueName: "T", help: "The team ID client secrets must carry as iss.",
                environmentVariable: "SIWA_APPLE_TEAM_ID"),
            CommandOption(
                "key-id", valueName: "K", help: "The key ID client secrets must carry as kid.",
                environmentVariable: "SIWA_APPLE_KEY_ID"),
            CommandOption(
                "team-key", valueName: "PEM",
                help: "The .p8's public half (openssl pkey -in AuthKey_K.p8 -pubout), or the .p8 itself.",
                environmentVariable: "SIWA_FAKE_APPLE_TEAM_KEY"),
            CommandOption(
                "client-id", valueName: "C", help: "A client ID Apple knows (bundle ID or Services ID).",
                isRepeatable: true, environmentVariable: "SIWA_AUDIENCES"),
            CommandOption(
                "notify-url", valueName: "URL",
                help: "Where to POST consent-revoked after a revocation (a receiver's notification URL).",
                environmentVariable: "SIWA_FAKE_APPLE_NOTIFY_URL"),
            CommandOption(
                "fail-with", valueName: "ERR",
                help:
                    "Answer every token/revoke call with this error (invalid_grant, invalid_client, …, or a status 429/5xx).",
                environmentVariable: "SIWA_FAKE_APPLE_FAIL_WITH"),
            CommandOption(
                "delay-ms", valueName: "MS", help: "Delay every token/revoke answer by MS milliseconds.",
                environmentVariable: "SIWA_FAKE_APPLE_DELAY_MS", defaultValue: "0"),
            CommandOption(
                "code-lifetime", valueName: "SECONDS", help: "How long authorization codes stay valid.",
                environmentVariable: "SIWA_FAKE_APPLE_CODE_LIFETIME", defaultValue: "300"),
            CommandOption(
                "transfer-team", valueName: "TEAM:KEYID:PEM",
                help:
                    "Another team whose client secrets are accepted (the recipient of an app transfer): its team ID, key ID and public key file.",
                isRepeatable: true, environmentVariable: "SIWA_FAKE_APPLE_TRANSFER_TEAMS"),
            CommandOption(
                "migration-users", valueName: "FILE",
                help:
                    "JSON lines {sub, email, is_private_email}: the users whose email /auth/usermigrationinfo returns to the recipient team.",
                environmentVariable: "SIWA_FAKE_APPLE_MIGRATION_USERS"),
        ])

    static let path = "/auth/keys"

    static let verb = Verb(name: "fake-apple", abstract: "A local Apple: keys, token and revoke endpoints.") {
        arguments, environment in
        switch arguments.first {
        case "authorize":
            return await FakeAppleClientVerbs.authorize(Array(arguments.dropFirst()), environment)
        case "fault": return await FakeAppleClientVerbs.fault(Array(arguments.dropFirst()), environment)
        default: break
        }
        switch parse(spec, arguments, environment) {
        case .failure(let exit): return exit.status
        case .success(let parsed):
            guard let listen = ListenAddress(parsing: parsed.value("listen") ?? ""),
                OutboundHTTP.isLoopback(host: listen.host)
            else {
                writeErrorLine(
                    spec.name, "--listen must be HOST:PORT with a loopback host (127.0.0.1, [::1], localhost)"
                )
                return ExitStatus.usage
            }
            let fault: FakeAppleAuthority.FaultPlan?
            switch faultPlan(parsed) {
            case .success(let plan): fault = plan
            case .failure(let failure):
                writeErrorLine(spec.name, failure.description)
                return ExitStatus.usage
            }
            guard let codeLifetime = Double(parsed.value("code-lifetime") ?? ""), codeLifetime > 0,
                codeLifetime.isFinite
            else {
                writeErrorLine(spec.name, "--code-lifetime must be a positive number of seconds")
                return ExitStatus.usage
            }
            let tokenOptions = ["team-id", "key-id", "team-key", "client-id"]
            let given = tokenOptions.filter { !parsed.values($0).isEmpty }
            guard given.isEmpty || given.count == tokenOptions.count else {
                writeErrorLine(
                    spec.name,
                    "the token endpoints need all of --team-id, --key-id, --team-key and --client-id (missing: \(tokenOptions.filter { !given.contains($0) }.map { "--" + $0 }.joined(separator: ", ")))"
                )
                return ExitStatus.usage
            }
            if let url = parsed.value("notify-url"), !isAllowedURL(url) {
                writeErrorLine(spec.name, "--notify-url must be an https URL, or http to a loopback host")
                return ExitStatus.usage
            }
            return await runReportingFailure(spec.name) {
                try run(
                    parsed, listen: listen, fault: fault, codeLifetime: codeLifetime,
                    withTokens: !given.isEmpty)
            }
        }
    }

    /// The initial fault plan from --fail-with and --delay-ms (applies to every call).
    static func faultPlan(_ parsed: ParsedCommand) -> Result<FakeAppleAuthority.FaultPlan?, ToolFailure> {
        var plan = FakeAppleAuthority.FaultPlan()
        if let failWith = parsed.value("fail-with") {
            guard FakeAppleAuthority.FaultPlan.isValid(failWith: failWith) else {
                return .failure(
                    ToolFailure(
                        "--fail-with must be one of \(FakeAppleAuthority.FaultPlan.errorWords.sorted().joined(separator: ", ")), 429 or 500-599"
                    ))
            }
            plan.failWith = failWith
        }
        guard let delay = Int(parsed.value("delay-ms") ?? ""), (0...600_000).contains(delay) else {
            return .failure(ToolFailure("--delay-ms must be a whole number from 0 to 600000"))
        }
        plan.delay = .milliseconds(delay)
        return .success(plan.failWith != nil || delay > 0 ? plan : nil)
    }

    /// https anywhere, http to loopback only (as the services' outbound policy).
    static func isAllowedURL(_ text: String) -> Bool {
        guard let url = URL(string: text), let scheme = url.scheme?.lowercased(), let host = url.host else {
            return false
        }
        return scheme == "https" || (scheme == "http" && OutboundHTTP.isLoopback(host: host))
    }

    static func run(
        _ parsed: ParsedCommand, listen: ListenAddress, fault: FakeAppleAuthority.FaultPlan?,
        codeLifetime: TimeInterval, withTokens: Bool
    ) throws {
        // Installed before serving, so a signal arriving early is not lost.
        let signals = TerminationSignals()
        let directory = URL(fileURLWithPath: parsed.value("keys")!)
        let file = KeySetFile(path: directory.appendingPathComponent("jwks.json").path)
        if case .failure(let failure) = file.current() { throw failure }
        var settings: FakeAppleAuthority.Settings?
        var signer: NotificationSigner?
        if withTokens {
            let keyPath = directory.appendingPathComponent("private-key.pem").path
            let pem = try readText(path: keyPath)
            let unnamed = try NotificationSigner(privateKeyPEM: pem)
            // Sign with the kid that jwks.json publishes for this key, so verifiers find it.
            let published =
                (try? JSONWebKeySet(
                    jsonData: (try? Data(contentsOf: URL(fileURLWithPath: file.path))) ?? Data()))
            let kid = published?.keyIDs.first {
                published?.key(id: $0)?.modulus == unnamed.publicKey().modulus
            }
            guard let kid else { throw ToolFailure("\(keyPath) is not the key published in \(file.path)") }
            signer = try NotificationSigner(privateKeyPEM: pem, keyID: kid)
            let teamKey: ClientSecretVerifier
            do {
                teamKey = try ClientSecretVerifier(pem: try readText(path: parsed.value("team-key")!))
            } catch let error as ClientSecretError {
                throw ToolFailure("--team-key: \(error)")
            }
            settings = FakeAppleAuthority.Settings(
                teamID: parsed.value("team-id")!, keyID: parsed.value("key-id")!,
                clientIDs: parsed.values("client-id").flatMap { $0.split(separator: ",").map(String.init) },
                teamKey: teamKey, notifyURL: parsed.value("notify-url"), codeLifetime: codeLifetime)
            for entry in parsed.values("transfer-team").flatMap({ $0.split(separator: ",").map(String.init) })
            {
                let parts = entry.split(separator: ":", maxSplits: 2).map(String.init)
                guard parts.count == 3, FakeAppleAuthority.isTeamID(parts[0]) else {
                    throw ToolFailure("--transfer-team must be TEAMID:KEYID:PEM (a ten-character team ID)")
                }
                do {
                    settings?.otherTeams[parts[0]] = (
                        parts[1], try ClientSecretVerifier(pem: try readText(path: parts[2]))
                    )
                } catch let error as ClientSecretError {
                    throw ToolFailure("--transfer-team \(parts[0]): \(error)")
                }
            }
            if let path = parsed.value("migration-users") {
                for line in try readText(path: path).split(separator: "\n") where !line.isEmpty {
                    guard
                        let object = try? JSONSerialization.jsonObject(with: Data(line.utf8))
                            as? [String: Any],
                        let sub = object["sub"] as? String
                    else { throw ToolFailure("--migration-users: each line must be a JSON object with sub") }
                    settings?.migrationUsers[sub] = (
                        object["email"] as? String, (object["is_private_email"] as? Bool) ?? false
                    )
                }
            }
        }
        let authority =
            try signer.map {
                FakeAppleAuthority(settings: settings, signer: $0, fault: fault) {
                    writeErrorLine("fake-apple", $0)
                }
            }
            ?? FakeAppleAuthority(
                settings: nil, signer: try NotificationSigner.generate(), fault: nil
            ) { writeErrorLine("fake-apple", $0) }
        var configuration = HTTPServer.Configuration()
        configuration.host = listen.host
        configuration.port = listen.port
        configuration.threadCount = 4
        let server = HTTPServer(
            configuration: configuration,
            onResponse: { request, response, _ in
                writeErrorLine(
                    "fake-apple",
                    "\(request.remoteAddress) \(request.method) \(request.path) \(response.status)"
                )
            },
            handler: { request in
                if let answer = authority.handle(request) { return answer }
                guard request.path == path else { return .error(status: 404, "not found") }
                guard request.method == "GET" || request.method == "HEAD" else {
                    return .error(status: 405, "method not allowed")
                }
                switch file.current() {
                case .success(let body):
                    return HTTPResponse(
                        status: 200,
                        headers: ["Content-Type": "application/json", "Cache-Control": "no-store"],
                        body: [UInt8](body))
                case .failure:
                    return .error(status: 503, "no valid key set")
                }
            })
        do {
            try server.start()
        } catch {
            throw ToolFailure("cannot listen on \(listen): \(error)")
        }
        let host = listen.host.contains(":") ? "[\(listen.host)]" : listen.host
        writeStandardOutput("http://\(host):\(server.port ?? listen.port)\(path)\n")
        let name = signals.wait()
        writeErrorLine("fake-apple", "\(name), stopping")
        server.shutdown(gracePeriod: .seconds(2))
    }
}

/// The JWKS file, re-read whenever its identity, size or modification time changes. A file that is
/// not a valid key set is reported once and the last good one is kept.
final class KeySetFile: Sendable {
    private struct Stamp: Equatable {
        var inode: UInt64
        var size: Int64
        var modified: timespec

        static func == (lhs: Stamp, rhs: Stamp) -> Bool {
            lhs.inode == rhs.inode && lhs.size == rhs.size && lhs.modified.tv_sec == rhs.modified.tv_sec
                && lhs.modified.tv_nsec == rhs.modified.tv_nsec
        }
    }

    private struct State {
        var stamp: Stamp?
        var body: Data?
    }

    let path: String
    private let state = Mutex(State())

    init(path: String) { self.path = path }

    /// The key set to serve, or why there is none.
    func current() -> Result<Data, ToolFailure> {
        var info = stat()
        guard stat(path, &info) == 0 else {
            return state.withLock {
                $0.body.map { .success($0) } ?? .failure(ToolFailure("cannot read \(path)"))
            }
        }
        let stamp = Stamp(inode: UInt64(info.st_ino), size: Int64(info.st_size), modified: info.st_mtim)
        return state.withLock { state -> Result<Data, ToolFailure> in
            if state.stamp != stamp {
                state.stamp = stamp
                if let data = FileManager.default.contents(atPath: path),
                    let keys = try? JSONWebKeySet(jsonData: data), !keys.keyIDs.isEmpty
                {
                    state.body = data
                    writeErrorLine(
                        "fake-apple", "loaded \(path): kids \(keys.keyIDs.joined(separator: ", "))")
                } else {
                    writeErrorLine("fake-apple", "\(path) is not a usable key set; keeping the previous one")
                }
            }
            return state.body.map { .success($0) } ?? .failure(ToolFailure("\(path) is not a usable key set"))
        }
    }
}
