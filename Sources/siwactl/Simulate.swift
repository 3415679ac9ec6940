import AppleNotifications
import Foundation
import ServiceSupport

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// `siwactl simulate`: plays Apple, POSTing signed notifications to a receiver.
enum SimulateVerb {
    static let spec = CommandSpec(
        name: "siwactl simulate",
        abstract: """
            Sign --count notifications as Apple would (a distinct jti each) and POST them one after another
            to a receiver's notification URL, printing one line per answer and a summary. Exit status 1
            when any answer is not 200.
            """,
        options: [
            CommandOption(
                "to", valueName: "URL",
                help: "The receiver's URL, e.g. http://127.0.0.1:8080/apple/notifications.",
                isRequired: true),
            CommandOption(
                "key", valueName: "PEM", help: "Private key file (from siwactl keygen).", isRequired: true),
            CommandOption(
                "kid", valueName: "KID", help: "Key ID for the header (default: hash of the public key)."),
            CommandOption(
                "audience", valueName: "AUD", help: "Client ID for the aud claim.", isRequired: true),
            CommandOption(
                "type", valueName: "TYPE",
                help: "email-disabled, email-enabled, consent-revoked or account-delete.",
                isRequired: true),
            CommandOption("sub", valueName: "SUB", help: "The user identifier.", isRequired: true),
            CommandOption("email", valueName: "E", help: "Email address (email events)."),
            CommandOption(
                "count", valueName: "N", help: "How many notifications, 1 to 100000.", defaultValue: "1"),
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
            return await runReportingFailure(spec.name) { try await run(parsed, url: url, count: count) }
        }
    }

    static func run(_ parsed: ParsedCommand, url: URL, count: Int) async throws {
        let pem = try readText(path: parsed.value("key")!)
        let signer =
            try parsed.value("kid").map { try NotificationSigner(privateKeyPEM: pem, keyID: $0) }
            ?? NotificationSigner(privateKeyPEM: pem)
        let session = URLSession(configuration: .ephemeral)
        var accepted = 0
        for index in 1...count {
            let jti = UUID().uuidString.lowercased()
            let token = try signer.sign(
                type: parsed.value("type")!, subject: parsed.value("sub")!,
                audience: parsed.value("audience")!,
                email: parsed.value("email"), jti: jti)
            var request = URLRequest(
                url: url, cachePolicy: .reloadIgnoringLocalCacheData, timeoutInterval: 15)
            request.httpMethod = "POST"
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
            request.httpBody = try JSONSerialization.data(
                withJSONObject: ["payload": token], options: [.withoutEscapingSlashes])
            let answer: String
            do {
                let (data, response) = try await session.data(for: request)
                let status = (response as? HTTPURLResponse)?.statusCode ?? 0
                if status == 200 { accepted += 1 }
                var body = String(decoding: data.prefix(300), as: UTF8.self)
                body = body.replacingOccurrences(of: "\n", with: " ").trimmingCharacters(in: .whitespaces)
                answer = "\(status) \(body)"
            } catch {
                answer = "no answer: \(error.localizedDescription)"
            }
            writeStandardOutput("\(index)/\(count) jti=\(jti) \(answer)\n")
        }
        session.finishTasksAndInvalidate()
        writeStandardOutput("sent \(count): \(accepted) answered 200, \(count - accepted) did not\n")
        if accepted != count { throw ToolFailure("\(count - accepted) of \(count) not accepted") }
    }
}
