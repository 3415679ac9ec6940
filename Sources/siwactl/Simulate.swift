import AppleNotifications
import Foundation
import HTTPClient
import ServiceSupport

/// `siwactl simulate`: plays Apple, POSTing signed notifications to a receiver.
enum SimulateVerb {
    static let spec = CommandSpec(
        name: "siwactl simulate",
        abstract: """
            Sign --count notifications as Apple would (a distinct jti each) and POST them one after another
            to a receiver's notification URL, printing one line per answer and a summary. Exit status 1
            when any answer is not 200. https is verified against the system's CA bundle, or --cacert
            (else SSL_CERT_FILE) instead, so it can test through a TLS proxy with a private CA;
            https_proxy is honoured; plain http only to a loopback address.
            """,
        options: [
            CommandOption(
                "to", valueName: "URL",
                help: "The receiver's URL, e.g. http://127.0.0.1:8080/apple/notifications.",
                isRequired: true),
            CommandOption(
                "key", valueName: "PEM", help: "Private key file (from siwactl keygen).", isRequired: true),
        ] + SignVerb.notificationOptions + [
            CommandOption(
                "count", valueName: "N", help: "How many notifications, 1 to 100000.", defaultValue: "1"),
            CommandOption(
                "cacert", valueName: "PEM",
                help: "CA certificates to trust instead of the system's (default: SSL_CERT_FILE if set)."),
        ])

    static let verb = Verb(name: "simulate", abstract: "POST signed notifications to a receiver.") {
        arguments, environment in
        switch parse(spec, arguments, environment) {
        case .failure(let exit): return exit.status
        case .success(let parsed):
            guard let count = Int(parsed.value("count") ?? ""), (1...100_000).contains(count) else {
                writeErrorLine(spec.name, "--count must be a whole number from 1 to 100000")
                return ExitStatus.usage
            }
            guard let url = URL(string: parsed.value("to")!), let scheme = url.scheme?.lowercased(),
                scheme == "http" || scheme == "https", url.host != nil
            else {
                writeErrorLine(spec.name, "--to must be an http(s) URL")
                return ExitStatus.usage
            }
            return await runReportingFailure(spec.name) {
                try run(parsed, url: url, count: count, environment: environment)
            }
        }
    }

    static func run(_ parsed: ParsedCommand, url: URL, count: Int, environment: [String: String]) throws {
        let pem = try readText(path: parsed.value("key")!)
        let signer =
            try parsed.value("kid").map { try NotificationSigner(privateKeyPEM: pem, keyID: $0) }
            ?? NotificationSigner(privateKeyPEM: pem)
        if let cacert = parsed.value("cacert"), !FileManager.default.isReadableFile(atPath: cacert) {
            throw ToolFailure("cannot read --cacert \(cacert)")
        }
        // The services' outbound HTTP (libcurl): SSL_CERT_FILE and https_proxy from the environment.
        let client = OutboundHTTP.Client(
            policy: OutboundHTTP.Policy(
                timeout: .seconds(15), maxResponseBodyBytes: 64 << 10, caFile: parsed.value("cacert"),
                userAgent: "siwactl-simulate"),
            environment: environment)
        var accepted = 0
        for index in 1...count {
            let jti = UUID().uuidString.lowercased()
            let token = try signer.sign(
                type: parsed.value("type")!, subject: parsed.value("sub")!,
                audience: parsed.value("audience")!,
                email: parsed.value("email"), jti: jti)
            let body = try JSONSerialization.data(
                withJSONObject: ["payload": token], options: [.withoutEscapingSlashes])
            let answer: String
            do {
                let response = try client.perform(
                    OutboundHTTP.Request(
                        method: "POST", url: url,
                        headers: [OutboundHTTP.Header("Content-Type", "application/json")], body: Array(body))
                )
                if response.status == 200 { accepted += 1 }
                var text = String(decoding: response.body.prefix(300), as: UTF8.self)
                text = text.replacingOccurrences(of: "\n", with: " ").trimmingCharacters(in: .whitespaces)
                answer = "\(response.status) \(text)"
            } catch {
                answer = "no answer: \(error)"
            }
            writeStandardOutput("\(index)/\(count) jti=\(jti) \(answer)\n")
        }
        writeStandardOutput("sent \(count): \(accepted) answered 200, \(count - accepted) did not\n")
        if accepted != count { throw ToolFailure("\(count - accepted) of \(count) not accepted") }
    }
}
