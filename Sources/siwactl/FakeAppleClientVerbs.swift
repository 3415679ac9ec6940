import Foundation
import HTTPClient
import ServiceSupport

/// `siwactl fake-apple authorize` and `siwactl fake-apple fault`: talk to a running fake-apple.
enum FakeAppleClientVerbs {
    static let urlOption = CommandOption(
        "url", valueName: "URL", help: "The running fake-apple (loopback), e.g. http://127.0.0.1:8081.",
        environmentVariable: "SIWA_FAKE_APPLE_URL", defaultValue: "http://127.0.0.1:8081")

    static let authorizeSpec = CommandSpec(
        name: "siwactl fake-apple authorize",
        abstract: """
            Sign a test user in: ask a running fake-apple for a fresh authorization code (single-use, valid
            --code-lifetime seconds) and the id_token the app would receive. Prints one JSON line
            {"code": …, "id_token": …}. --nonce is put in the id_token as given: pass what your app sends
            to Apple (the SHA-256 hex of its raw nonce).
            """,
        options: [
            urlOption,
            CommandOption("sub", valueName: "SUB", help: "The user identifier.", isRequired: true),
            CommandOption("email", valueName: "E", help: "The user's email (a relay address is private)."),
            CommandOption("nonce", valueName: "N", help: "The nonce claim (the hash the app sent)."),
            CommandOption("client-id", valueName: "C", help: "The client ID (default: fake-apple's first)."),
            CommandOption(
                "real-user-status", valueName: "0|1|2", help: "0 unsupported, 1 unknown, 2 likely real.",
                defaultValue: "2"),
            CommandOption(
                "redirect-uri", valueName: "URI", help: "Required again when the code is exchanged."),
        ])

    static let faultSpec = CommandSpec(
        name: "siwactl fake-apple fault",
        abstract: """
            Make a running fake-apple fail on demand: the next --times calls (default: all) to --endpoint
            wait --delay-ms, then answer --fail-with instead of the real answer, or are carried out and
            answered --answer-delay-ms late. None of the three clears the faults.
            """,
        options: [
            urlOption,
            CommandOption(
                "fail-with", valueName: "ERR",
                help:
                    "invalid_grant, invalid_client, invalid_request, unsupported_grant_type, unauthorized_client, invalid_scope, 429 or 500-599."
            ),
            CommandOption("delay-ms", valueName: "MS", help: "Delay each answer by MS milliseconds."),
            CommandOption(
                "answer-delay-ms", valueName: "MS",
                help: "Carry each call out, then hold its answer MS milliseconds (not with --fail-with)."),
            CommandOption("times", valueName: "N", help: "Only the next N calls."),
            CommandOption(
                "endpoint", valueName: "token|revoke|both|migration",
                help: "Which endpoint fails (both: token and revoke; migration: /auth/usermigrationinfo).",
                defaultValue: "both"),
            CommandOption(
                "subjects", valueName: "FILE",
                help: "Only migration calls about these subs or transfer_subs (one a line)."),
            CommandOption("every", valueName: "N", help: "Only every N-th call to the endpoint."),
        ],
        flags: [CommandFlag("add", help: "Add this fault to those in force instead of replacing them.")])

    static func authorize(_ arguments: [String], _ environment: [String: String]) async -> Int32 {
        switch parse(authorizeSpec, arguments, environment) {
        case .failure(let exit): return exit.status
        case .success(let parsed):
            guard let status = Int(parsed.value("real-user-status") ?? ""), (0...2).contains(status) else {
                writeErrorLine(authorizeSpec.name, "--real-user-status must be 0, 1 or 2")
                return ExitStatus.usage
            }
            var body: [String: Any] = ["sub": parsed.value("sub")!, "real_user_status": status]
            for (option, key) in [
                ("email", "email"), ("nonce", "nonce"), ("client-id", "client_id"),
                ("redirect-uri", "redirect_uri"),
            ] {
                if let value = parsed.value(option) { body[key] = value }
            }
            return await runReportingFailure(authorizeSpec.name) {
                let answer = try post(parsed, "/fake/authorize", body)
                guard answer.status == 200 else {
                    throw ToolFailure(
                        "fake-apple answered \(answer.status): \(String(decoding: answer.body.prefix(200), as: UTF8.self))"
                    )
                }
                writeStandardOutput(String(decoding: answer.body, as: UTF8.self) + "\n")
            }
        }
    }

    static func fault(_ arguments: [String], _ environment: [String: String]) async -> Int32 {
        switch parse(faultSpec, arguments, environment) {
        case .failure(let exit): return exit.status
        case .success(let parsed):
            var body: [String: Any] = ["endpoint": parsed.value("endpoint")!]
            if let failWith = parsed.value("fail-with") { body["fail_with"] = failWith }
            if parsed.flag("add") { body["add"] = true }
            if let path = parsed.value("subjects") {
                do {
                    body["subjects"] = try readText(path: path).split(separator: "\n").map(String.init).filter
                    {
                        !$0.isEmpty
                    }
                } catch {
                    writeErrorLine(faultSpec.name, "\(error)")
                    return ExitStatus.usage
                }
            }
            for (option, key) in [
                ("delay-ms", "delay_ms"), ("answer-delay-ms", "answer_delay_ms"), ("times", "times"),
                ("every", "every"),
            ] {
                guard let text = parsed.value(option) else { continue }
                guard let number = Int(text), number >= 0 else {
                    writeErrorLine(faultSpec.name, "--\(option) must be a whole number")
                    return ExitStatus.usage
                }
                body[key] = number
            }
            return await runReportingFailure(faultSpec.name) {
                let answer = try post(parsed, "/fake/faults", body)
                guard answer.status == 204 else {
                    throw ToolFailure(
                        "fake-apple answered \(answer.status): \(String(decoding: answer.body.prefix(200), as: UTF8.self))"
                    )
                }
            }
        }
    }

    /// POSTs JSON to the fake at --url (a loopback host only: it is a test double).
    private static func post(_ parsed: ParsedCommand, _ path: String, _ body: [String: Any]) throws
        -> OutboundHTTP.Response
    {
        var base = parsed.value("url")!
        if base.hasSuffix(FakeAppleVerb.path) { base.removeLast(FakeAppleVerb.path.count) }
        while base.hasSuffix("/") { base.removeLast() }
        guard let url = URL(string: base), url.scheme?.lowercased() == "http", let host = url.host,
            OutboundHTTP.isLoopback(host: host)
        else { throw ToolFailure("--url must be http://LOOPBACK:PORT (fake-apple listens on loopback only)") }
        let data = try JSONSerialization.data(withJSONObject: body)
        do {
            return try OutboundHTTP.Client().perform(
                OutboundHTTP.Request(
                    method: "POST", url: base + path, headers: [.init("Content-Type", "application/json")],
                    body: Array(data)))
        } catch {
            throw ToolFailure("cannot reach fake-apple at \(base): \(error)")
        }
    }
}
