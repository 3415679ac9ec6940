import AppleNotifications
import Foundation
import HTTPClient
public import ServiceSupport

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The checks of `siwactl doctor`: a deployed notification endpoint checked the way Apple reaches it
/// (``checkEndpoint()``), and what only the database can tell (``checkDatabase(url:heartbeatMaxAge:)``).
/// Run in order; a check that makes the next ones meaningless stops them. Each finding goes to the
/// `report` callback at once (so a slow check shows what came before it) and into ``findings``.
///
/// Nothing read from the network or the database is trusted as text: ``Finding/text`` escapes every
/// message (``TerminalText``), so a host name or an error message cannot forge a line of the report.
public struct Doctor {
    /// A check's verdict.
    public enum Verdict: String, Sendable {
        case ok = "ok"
        case warn = "warn"
        case fail = "FAIL"
    }

    /// One check's verdict, what was found, and the fix.
    public struct Finding: Sendable, Equatable {
        /// ok, warn or FAIL.
        public var verdict: Verdict
        /// The check's short name (`dns`, `tls`, `workers` …).
        public var check: String
        /// What was found (may quote values from outside; ``text`` escapes them).
        public var message: String
        /// What to do about it.
        public var fix: String?

        /// The finding as printed: `verdict check message`, then an indented `fix:` line; every message
        /// escaped, so the text is exactly these one or two lines.
        public var text: String {
            var line =
                verdict.rawValue.padding(toLength: 5, withPad: " ", startingAt: 0) + " "
                + check.padding(toLength: 11, withPad: " ", startingAt: 0) + " "
                + TerminalText.escaped(message)
                + "\n"
            if let fix {
                line += String(repeating: " ", count: 18) + "fix: " + TerminalText.escaped(fix) + "\n"
            }
            return line
        }
    }

    /// What to check and how.
    public struct Configuration: Sendable {
        /// The endpoint registered with Apple.
        public var url: String
        /// `https` or `http`.
        public let scheme: String
        /// The URL's host.
        public let host: String
        /// Whether a plain http URL on a loopback host is checked (tests), still as a warning.
        public var allowHTTPLoopback: Bool
        /// The aud claim of the forged notification.
        public var audience: String
        /// Deadline for each request.
        public var timeout: Duration
        /// A warning when an answer takes longer.
        public var slowAfter: Duration
        /// The proxy (`https_proxy` …) and CA file (`SSL_CERT_FILE`) settings of the requests: the
        /// executable's environment, handed in.
        public var environment: [String: String]

        /// - Throws: ``ConfigurationError`` unless `url` is an absolute http(s) URL with a host.
        public init(
            url: String, allowHTTPLoopback: Bool = false, audience: String = "siwactl.doctor",
            timeout: Duration = .seconds(10), slowAfter: Duration = .seconds(2),
            environment: [String: String] = [:]
        ) throws(ConfigurationError) {
            guard let components = URLComponents(string: url), let scheme = components.scheme?.lowercased(),
                scheme == "https" || scheme == "http", let host = components.host, !host.isEmpty
            else {
                throw ConfigurationError(
                    "URL must be an absolute https URL, e.g. https://host/apple/notifications")
            }
            self.url = url
            self.scheme = scheme
            self.host = host
            self.allowHTTPLoopback = allowHTTPLoopback
            self.audience = audience
            self.timeout = timeout
            self.slowAfter = slowAfter
            self.environment = environment
        }
    }

    /// The settings.
    public let configuration: Configuration
    var url: String { configuration.url }
    var scheme: String { configuration.scheme }
    var host: String { configuration.host }
    private let emit: (Finding) -> Void
    /// Every finding so far, in order.
    public private(set) var findings: [Finding] = []
    private var slowest: Duration = .zero

    /// A doctor for `configuration`; each finding is handed to `report` as soon as it is made.
    public init(configuration: Configuration, report: @escaping (Finding) -> Void = { _ in }) {
        self.configuration = configuration
        self.emit = report
    }

    /// Whether no check failed (warnings allowed).
    public var isHealthy: Bool { !findings.contains { $0.verdict == .fail } }

    /// The last line: `healthy: 0 failed, 1 warning(s)` or `NOT HEALTHY: …`.
    public var summary: String {
        let failed = findings.filter { $0.verdict == .fail }.count
        let warned = findings.filter { $0.verdict == .warn }.count
        return "\(failed == 0 ? "healthy" : "NOT HEALTHY"): \(failed) failed, \(warned) warning(s)\n"
    }

    /// Records a finding and hands it to the callback.
    mutating func report(_ verdict: Verdict, _ check: String, _ message: String, fix: String? = nil) {
        let finding = Finding(verdict: verdict, check: check, message: message, fix: fix)
        findings.append(finding)
        emit(finding)
    }

    /// The endpoint's checks: https, DNS, POST {} answered 400, a forged notification answered 401, and
    /// the answer time.
    public mutating func checkEndpoint() {
        guard checkScheme(), checkDNS() else { return }
        let client = OutboundHTTP.Client(
            policy: OutboundHTTP.Policy(
                timeout: configuration.timeout, maxResponseBodyBytes: 64 << 10,
                allowsPlainHTTPToLoopback: configuration.allowHTTPLoopback && scheme == "http",
                userAgent: "siwactl-doctor"),
            environment: configuration.environment)
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
                type: "consent-revoked", subject: "000000.siwactl-doctor.0000",
                audience: configuration.audience,
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
        if slowest > configuration.slowAfter {
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
        if !configuration.allowHTTPLoopback {
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
