import Foundation
import HTTPClient
import ServiceSupport
import Webhooks

// MARK: - webhooks send (the developer loop: a signed sample delivery, no database)

/// `siwactl webhooks send`: what `stripe trigger` is to Stripe. One sample delivery of a type (or of each
/// type), built by the worker's own body builder (``WebhookChange``) and signed by its signer, POSTed to
/// the app with no database, receiver or worker running.
extension WebhooksVerb {
    static let sendSpec = CommandSpec(
        name: "siwactl webhooks send",
        abstract: """
            Send a signed sample delivery to your app, with no database: the body and headers a real delivery
            of --type has (all: one of each type), signed with your endpoint's secret (v1) or whsk_ key (v1a)
            (--secret-file FILE, '-' for stdin, or SIWA_WEBHOOK_SECRET). Prints the app's status per delivery; exits 1 if any was not
            2xx.
            """,
        options: [
            CommandOption("url", valueName: "URL", help: "Your app's endpoint.", isRequired: true),
            CommandOption(
                "type", valueName: "TYPE",
                help: "The change type, or all: \(WebhookChange.types.joined(separator: ", ")).",
                isRequired: true),
            CommandOption(
                "secret", valueName: "whsec_…|whsk_…",
                help:
                    "The secret your app verifies with (v1), or the whsk_ private key whose whpk_ public key it verifies with (v1a); repeat for several (as during a rotation).",
                isRepeatable: true, isRequired: true, environmentVariable: "SIWA_WEBHOOK_SECRET"
            ).secret(),
            CommandOption(
                "change-id", valueName: "N",
                help: "The sample's change id (webhook-id msg_N_0); default: new each run, from the clock."),
            CommandOption(
                "timeout", valueName: "SECONDS", help: "Deadline of one POST.", defaultValue: "10"),
        ])

    static func send(_ parsed: ParsedCommand) throws {
        let url = parsed.value("url") ?? ""
        if let problem = StandardWebhooks.endpointProblem(url) { throw UsageError("--url: \(problem)") }
        let type = parsed.value("type") ?? ""
        let chosen = type == "all" ? WebhookChange.types : [type]
        guard chosen.allSatisfy(WebhookChange.types.contains) else {
            throw UsageError("--type: all or one of \(WebhookChange.types.joined(separator: ", "))")
        }
        let secrets = try signingKeys(parsed)
        guard !secrets.isEmpty else { throw UsageError("--secret: no secret given") }
        let firstChange: Int
        let timeout: Int
        do {
            // Milliseconds since 1970: a fresh webhook-id each run, so an app that dedupes acts on it.
            firstChange =
                try parsed.integer("change-id", in: 1...Int(Int64.max / 2))
                ?? Int(Date().timeIntervalSince1970 * 1000)
            timeout = try parsed.integer("timeout", in: 1...300) ?? 10
        } catch { throw UsageError(error.message) }
        let client = OutboundHTTP.Client(
            policy: OutboundHTTP.Policy(
                timeout: .seconds(timeout), maxResponseBodyBytes: 64 << 10, allowsPlainHTTPToLoopback: true,
                userAgent: "siwa-notifications-webhooks"),
            environment: ProcessInfo.processInfo.environment)
        var refused = 0
        for (index, type) in chosen.enumerated() {
            let change = WebhookChange.sample(type: type, changeID: firstChange + index)
            let body = change.body
            // Endpoint 0: no endpoint has it, so a sample's webhook-id never collides with a real one.
            let id = change.webhookID(endpoint: 0)
            let timestamp = Int(Date().timeIntervalSince1970)
            let request = OutboundHTTP.Request(
                method: "POST", url: url,
                headers: [
                    .init("Content-Type", "application/json"), .init("webhook-id", id),
                    .init("webhook-timestamp", String(timestamp)),
                    .init(
                        "webhook-signature",
                        StandardWebhooks.signatureHeader(
                            id: id, timestamp: timestamp, body: body, keys: secrets)),
                ], body: body)
            let verdict: String
            do {
                let status = try client.perform(request).status
                if !(200...299).contains(status) { refused += 1 }
                verdict = String(status)
            } catch {
                refused += 1
                verdict = "failed (\(error.code): \(error.description))"
            }
            writeStandardOutput(TerminalText.escaped("\(id) \(type) \(verdict)") + "\n")
        }
        if refused > 0 {
            throw ToolFailure(
                "\(refused) of \(chosen.count) deliver\(chosen.count == 1 ? "y was" : "ies were") not accepted (2xx)"
            )
        }
    }
}
