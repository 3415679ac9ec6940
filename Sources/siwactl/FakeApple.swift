import AppleID
import FakeApple
import Foundation
import HTTPClient
import ServiceSupport

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
            .listenAddressFile(environmentVariable: "SIWA_FAKE_APPLE_LISTEN_ADDRESS_FILE", names: "apple"),
        ])

    static let path = FakeAppleServer.keysPath

    static let verb = Verb(
        name: "fake-apple", abstract: "A local Apple: keys, token and revoke endpoints.",
        subverbs: [
            Verb(
                name: "authorize", abstract: Verb.firstSentence(FakeAppleClientVerbs.authorizeSpec.abstract),
                run: FakeAppleClientVerbs.authorize),
            Verb(
                name: "fault", abstract: Verb.firstSentence(FakeAppleClientVerbs.faultSpec.abstract),
                run: FakeAppleClientVerbs.fault),
        ]
    ) { arguments, environment in
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
        var settings: FakeAppleAuthority.Settings?
        if withTokens {
            let teamKey: ClientSecretVerifier
            do {
                teamKey = try ClientSecretVerifier(pem: try readText(path: parsed.value("team-key")!))
            } catch let error as ClientSecretError {
                throw ToolFailure("--team-key: \(error)")
            }
            settings = FakeAppleAuthority.Settings(
                teamID: parsed.value("team-id")!, keyID: parsed.value("key-id")!,
                clientIDs: parsed.values("client-id").flatMap { $0.split(separator: ",").map(String.init) },
                teamKey: teamKey,
                notifyURL: parsed.value("notify-url"), codeLifetime: codeLifetime)
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
        let addressFile = parsed.value("listen-address-file").map(ListenAddressFile.init(path:))
        do { try addressFile?.removeStale() } catch { throw ToolFailure(error.message) }
        let server = try FakeAppleServer(
            configuration: FakeAppleServer.Configuration(
                host: listen.host, port: listen.port, keysDirectory: parsed.value("keys")!,
                settings: settings,
                fault: fault)
        ) { writeErrorLine("fake-apple", $0) }
        do {
            try server.start()
        } catch {
            throw ToolFailure("cannot listen on \(listen): \(error)")
        }
        writeErrorLine("fake-apple", "listening on \(server.address!)")
        if let addressFile {
            do { try addressFile.write([("apple", server.address!)]) } catch {
                server.shutdown(gracePeriod: .zero)
                throw ToolFailure(error.message)
            }
        }
        writeStandardOutput(server.baseURL! + FakeAppleServer.keysPath + "\n")
        let name = signals.wait()
        writeErrorLine("fake-apple", "\(name), stopping")
        server.shutdown(gracePeriod: .seconds(2))
        addressFile?.remove()
    }
}
