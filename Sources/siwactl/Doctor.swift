import AppleNotifications
import Foundation
import HTTPClient
import ServiceSupport

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// `siwactl doctor URL`: checks a deployed notification endpoint the way Apple will reach it, one
/// verdict per check with its fix. Exit 0 when nothing failed (warnings allowed), 1 on any failure.
enum DoctorVerb {
    static let spec = CommandSpec(
        name: "siwactl doctor",
        abstract: """
            Check a deployed notification endpoint as Apple will reach it: DNS, https with TLS 1.2+ and a
            trusted certificate for the host, POST {} answered 400, a notification signed by a key Apple
            never had answered 401, answer time; with --database-url, that workers are alive and that the
            receivers accept every client ID in use. One line per check (ok, warn, FAIL) with the fix; exit
            status 1 when any check failed.
            """,
        options: [
            CommandOption(
                "audience", valueName: "AUD",
                help: "Client ID for the aud claim of the forged notification (default: siwactl.doctor).",
                environmentVariable: "SIWA_DOCTOR_AUDIENCE"),
            CommandOption(
                "timeout", valueName: "SECONDS", help: "Deadline for each request.",
                environmentVariable: "SIWA_DOCTOR_TIMEOUT", defaultValue: "10"),
            CommandOption(
                "slow-after", valueName: "SECONDS", help: "Warn when an answer takes longer than this.",
                environmentVariable: "SIWA_DOCTOR_SLOW_AFTER", defaultValue: "2"),
            CommandOption(
                "database-url", valueName: "URL",
                help: """
                    Also check the database (as its owner or a siwa_admin member): workers alive, and the \
                    receivers' audiences against the client IDs in use.
                    """,
                environmentVariable: "SIWA_DATABASE_URL"),
            CommandOption(
                "heartbeat-max-age", valueName: "SECONDS",
                help: "A receiver or worker whose last heartbeat is older than this is not alive.",
                environmentVariable: "SIWA_DOCTOR_HEARTBEAT_MAX_AGE", defaultValue: "60"),
        ],
        flags: [
            CommandFlag(
                "allow-http-loopback",
                help: "Check a plain http URL on a loopback host (tests); still reported as a warning.",
                environmentVariable: "SIWA_DOCTOR_ALLOW_HTTP_LOOPBACK")
        ],
        positionals: [
            CommandPositional(
                "URL", help: "The endpoint registered with Apple, e.g. https://host/apple/notifications.")
        ])

    static let verb = Verb(name: "doctor", abstract: "Check a deployed endpoint as Apple will reach it.") {
        arguments, environment in
        switch parse(spec, arguments, environment) {
        case .failure(let exit): return exit.status
        case .success(let parsed):
            let timeout: Duration
            let slowAfter: Duration
            let heartbeatMaxAge: Duration
            do {
                timeout = try parsed.seconds("timeout", positive: true) ?? .seconds(10)
                slowAfter = try parsed.seconds("slow-after", positive: true) ?? .seconds(2)
                heartbeatMaxAge = try parsed.seconds("heartbeat-max-age", positive: true) ?? .seconds(60)
            } catch let error as CommandLineError {
                writeErrorLine(spec.name, error.message)
                return ExitStatus.usage
            } catch {
                writeErrorLine(spec.name, "\(error)")
                return ExitStatus.usage
            }
            let text = parsed.positionals[0]
            guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased(),
                scheme == "https" || scheme == "http", let host = components.host, !host.isEmpty
            else {
                writeErrorLine(
                    spec.name, "URL must be an absolute https URL, e.g. https://host/apple/notifications")
                return ExitStatus.usage
            }
            var doctor = Doctor(
                url: text, scheme: scheme, host: host,
                allowHTTPLoopback: parsed.flag("allow-http-loopback"),
                audience: parsed.value("audience") ?? "siwactl.doctor", timeout: timeout,
                slowAfter: slowAfter,
                environment: environment)
            doctor.run()
            if let databaseURL = parsed.value("database-url"), !databaseURL.isEmpty {
                doctor.checkDatabase(url: databaseURL, heartbeatMaxAge: heartbeatMaxAge)
            }
            let failed = doctor.findings.filter { $0.verdict == .fail }.count
            let warned = doctor.findings.filter { $0.verdict == .warn }.count
            writeStandardOutput(
                "\(failed == 0 ? "healthy" : "NOT HEALTHY"): \(failed) failed, \(warned) warning(s)\n")
            return failed == 0 ? ExitStatus.success : ExitStatus.failure
        }
    }
}

/// The checks of `siwactl doctor`, run in order; a check that makes the next ones meaningless stops them.
struct Doctor {
    enum Verdict: String {
        case ok = "ok"
        case warn = "warn"
        case fail = "FAIL"
    }

    struct Finding {
        var verdict: Verdict
        var check: String
        var message: String
        var fix: String?
    }

    let url: String
    let scheme: String
    let host: String
    let allowHTTPLoopback: Bool
    let audience: String
    let timeout: Duration
    let slowAfter: Duration
    let environment: [String: String]
    private(set) var findings: [Finding] = []
    private var slowest: Duration = .zero

    init(
        url: String, scheme: String, host: String, allowHTTPLoopback: Bool, audience: String,
        timeout: Duration, slowAfter: Duration, environment: [String: String]
    ) {
        self.url = url
        self.scheme = scheme
        self.host = host
        self.allowHTTPLoopback = allowHTTPLoopback
        self.audience = audience
        self.timeout = timeout
        self.slowAfter = slowAfter
        self.environment = environment
    }

    /// Prints a finding at once, so a slow check shows what came before it.
    mutating func report(_ verdict: Verdict, _ check: String, _ message: String, fix: String? = nil) {
        let finding = Finding(verdict: verdict, check: check, message: message, fix: fix)
        findings.append(finding)
        var line =
            verdict.rawValue.padding(toLength: 5, withPad: " ", startingAt: 0) + " "
            + check.padding(toLength: 11, withPad: " ", startingAt: 0) + " " + message + "\n"
        if let fix { line += String(repeating: " ", count: 18) + "fix: " + fix + "\n" }
        writeStandardOutput(line)
    }

    mutating func run() {
        guard checkScheme(), checkDNS() else { return }
        let client = OutboundHTTP.Client(
            policy: OutboundHTTP.Policy(
                timeout: timeout, maxResponseBodyBytes: 64 << 10,
                allowsPlainHTTPToLoopback: allowHTTPLoopback && scheme == "http",
                userAgent: "siwactl-doctor"),
            environment: environment)
        let json = [OutboundHTTP.Header("Content-Type", "application/json")]

        // 1. POST {}: reaching the endpoint at all (connection, TLS), then the route.
        guard
            let empty = send(
                client, OutboundHTTP.Request(method: "POST", url: url, headers: json, body: Array("{}".utf8)))
        else { return }
        if scheme == "https" {
            report(
                .ok, "tls", "TLS 1.2 or newer; the certificate is valid for \(host) and trusted")
        }
        checkEmptyPost(empty.status)

        // 2. A well-formed notification signed by a key Apple never had.
        let body: [UInt8]
        do {
            let signer = try NotificationSigner.generate(keyID: "siwactl-doctor-not-an-apple-key")
            let token = try signer.sign(
                type: "consent-revoked", subject: "000000.siwactl-doctor.0000", audience: audience,
                email: nil,
                isPrivateEmail: nil)
            body = Array(#"{"payload":"\#(token)"}"#.utf8)
        } catch {
            report(.fail, "forged", "could not sign a test notification: \(error)")
            return
        }
        guard
            let forged = send(
                client, OutboundHTTP.Request(method: "POST", url: url, headers: json, body: body))
        else { return }
        checkForged(forged.status)

        // 3. Answer time (Apple retries after a timeout; its deadline is not published).
        let seconds = String(
            format: "%.2f", Double(slowest.components.seconds) + Double(slowest.components.attoseconds) / 1e18
        )
        if slowest > slowAfter {
            report(
                .warn, "time", "the slowest answer took \(seconds) s",
                fix:
                    "answer within a second or two: Apple may time out and retry; check the database and proxy"
            )
        } else {
            report(.ok, "time", "the slowest answer took \(seconds) s")
        }
    }

    private mutating func checkScheme() -> Bool {
        guard scheme == "http" else { return true }
        let fix =
            "serve the endpoint over https (TLS 1.2 or newer, a certificate from a public CA); Apple calls https URLs only"
        if !allowHTTPLoopback {
            report(.fail, "https", "plain http: Apple will not deliver to it", fix: fix)
            return false
        }
        if !OutboundHTTP.isLoopback(host: host) {
            report(
                .fail, "https",
                "plain http to \(host), which is not loopback (--allow-http-loopback is for tests)", fix: fix)
            return false
        }
        report(
            .warn, "https", "plain http to loopback (--allow-http-loopback): Apple would not deliver to it",
            fix: fix)
        return true
    }

    private mutating func checkDNS() -> Bool {
        var literal = host
        if literal.hasPrefix("["), literal.hasSuffix("]") { literal = String(literal.dropFirst().dropLast()) }
        var v4 = in_addr()
        var v6 = in6_addr()
        if inet_pton(AF_INET, literal, &v4) == 1 || inet_pton(AF_INET6, literal, &v6) == 1 {
            report(.ok, "dns", "\(host) is an IP address literal")
            return true
        }
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var result: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(literal, nil, &hints, &result)
        if let result { freeaddrinfo(result) }
        guard status == 0 else {
            let reason = String(cString: gai_strerror(status))
            report(
                .fail, "dns", "\(host) does not resolve (\(reason))",
                fix:
                    "publish an A/AAAA record for \(host) in public DNS (Apple resolves it from the internet)"
            )
            return false
        }
        report(.ok, "dns", "\(host) resolves")
        return true
    }

    /// Sends one request, timing it; a transport failure is reported (and `nil` returned).
    private mutating func send(_ client: OutboundHTTP.Client, _ request: OutboundHTTP.Request)
        -> OutboundHTTP.Response?
    {
        let clock = ContinuousClock()
        let started = clock.now
        do {
            let response = try client.perform(request)
            slowest = max(slowest, clock.now - started)
            return response
        } catch {
            switch error.code {
            case .tls:
                report(
                    .fail, "tls",
                    "TLS failed: \(Self.certificateProblem(error.certificateVerifyResult)) (\(error.description))",
                    fix: """
                        serve a certificate chain from a public CA (self-signed and private-CA certificates are \
                        refused by Apple) that names \(host), not expired, intermediates included, with TLS 1.2 or \
                        newer enabled
                        """)
            case .connect:
                report(
                    .fail, "connection", "cannot connect to \(host): \(error.description)",
                    fix:
                        "check that the server (or its TLS proxy) listens on that port and that no firewall drops Apple's traffic"
                )
            case .resolve:
                report(
                    .fail, "dns", "\(host) does not resolve: \(error.description)",
                    fix: "publish a DNS record for \(host)")
            case .timeout:
                report(
                    .fail, "connection", "no answer within the deadline: \(error.description)",
                    fix: "answer within a second or two; check the server, its proxy and the database")
            default:
                report(
                    .fail, "connection", "the request failed: \(error.description)",
                    fix: "check the server and its proxy logs")
            }
            return nil
        }
    }

    /// What OpenSSL's verification result means, in words (the common ones).
    static func certificateProblem(_ result: Int?) -> String {
        switch result {
        case 18?, 19?: return "the certificate is self-signed"
        case 20?, 2?:
            return "the certificate's issuer is not a trusted CA (private CA, or intermediates missing)"
        case 21?: return "the certificate chain is incomplete (intermediates missing)"
        case 10?: return "the certificate has expired"
        case 9?: return "the certificate is not valid yet"
        case 62?: return "the certificate is not issued for this host name"
        case let result?: return "the certificate did not verify (OpenSSL error \(result))"
        case nil: return "the handshake failed (TLS older than 1.2, or no shared cipher)"
        }
    }

    private mutating func checkEmptyPost(_ status: Int) {
        let check = "route"
        switch status {
        case 400:
            report(
                .ok, check, "POST {} answered 400: the endpoint is there and refuses a body without a payload"
            )
        case 404, 405:
            report(
                .fail, check, "POST {} answered \(status): wrong path",
                fix:
                    "register the URL of the receiver's route (siwa-receiver serves /apple/notifications) or fix the proxy's location"
            )
        case 200..<300:
            report(
                .fail, check, "POST {} answered \(status): it accepts anything",
                fix: "the URL reaches something that is not a verifying receiver; point it at siwa-receiver")
        case 300..<400:
            report(
                .fail, check, "POST {} answered \(status): a redirect",
                fix:
                    "register the final URL (a redirect is not a delivery); e.g. not http→https or a trailing slash"
            )
        case 500...:
            report(
                .fail, check, "POST {} answered \(status): server error",
                fix: "check the receiver's and proxy's logs (database reachable? keys loaded? /readyz)")
        default:
            report(
                .warn, check, "POST {} answered \(status), not 400",
                fix: "expected 400 for a body without a payload; check what answers at this URL")
        }
    }

    private mutating func checkForged(_ status: Int) {
        let check = "signature"
        switch status {
        case 401:
            report(
                .ok, check,
                "a notification signed by a key Apple never had answered 401: forgeries are refused")
        case 200..<300:
            report(
                .fail, check,
                "a notification signed by a key Apple never had answered \(status): verification is off; anyone can forge notifications (the worst finding)",
                fix:
                    "put siwa-receiver (which verifies every token against Apple's keys) behind this URL; never answer 200 before verifying"
            )
        case 400:
            report(
                .warn, check, "a well-formed notification answered 400, not 401",
                fix:
                    "check --audience and the receiver's SIWA_AUDIENCES; a real notification may be refused too"
            )
        case 404, 405:
            report(.fail, check, "a notification answered \(status): wrong path", fix: "see the route check")
        case 500...:
            report(
                .fail, check, "a notification answered \(status): server error",
                fix: "check the receiver's logs (can it fetch Apple's keys? is the database reachable?)")
        default:
            report(
                .fail, check, "a notification signed by a key Apple never had answered \(status), not 401",
                fix: "check what answers at this URL")
        }
    }
}
