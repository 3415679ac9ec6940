import Foundation
import HTTPClient
import HTTPServer
import Postgres
import ServiceSupport
import WebhookAdministration
import Webhooks

// MARK: - webhooks listen --forward-to (the developer loop, as `stripe listen --forward-to`)

/// `siwactl webhooks listen --forward-to URL`: the listener registers itself as a temporary endpoint
/// (a fresh secret of its own, `siwa.add_temporary_webhook_endpoint`), verifies each delivery the worker
/// sends it, and forwards it to the app with the same `webhook-id`, `webhook-timestamp` and body,
/// re-signed with the app's secret (given, or generated and printed: what `stripe listen` prints as
/// "your webhook signing secret"), so the app's secret does not change from one run to the next. The
/// worker is answered what the app answered (502 when the app cannot be reached): the app sees the
/// retries it would see in production. The endpoint is renewed every minute and removed on
/// SIGINT/SIGTERM; one left by a crash expires and is removed by the next listener.
extension WebhooksVerb {
    /// `--database-url`, required only with `--forward-to`.
    static let optionalDatabaseURL: CommandOption = {
        var option = CommandOption.databaseURL
        option.isRequired = false
        option.help += " With --forward-to: as a member of siwa_admin or the owner."
        return option
    }()

    /// How long a temporary endpoint lives without a renewal; renewed every ``renewalInterval``.
    static let temporaryLifetime: Double = 300
    static let renewalInterval: Duration = .seconds(60)

    static func forward(_ parsed: ParsedCommand) throws {
        let target = parsed.value("forward-to") ?? ""
        if let problem = StandardWebhooks.endpointProblem(target) {
            throw UsageError("--forward-to: \(problem)")
        }
        guard parsed.value("database-url") != nil else {
            throw UsageError("--forward-to needs --database-url (or SIWA_DATABASE_URL)")
        }
        let port: Int
        do { port = try parsed.integer("port", in: 0...65535) ?? 0 } catch { throw UsageError(error.message) }
        // The keys the forwarded deliveries are signed with: whsec_ (v1) or whsk_ (v1a), the app's own.
        var appSecrets = try signingKeys(parsed)
        let generated = appSecrets.isEmpty
        if generated { appSecrets = [.hmac(.generate())] }
        let chosen = try parsedTypes(parsed)
        if let warning = WebhookChange.subscriptionWarning(chosen) {
            writeErrorLine("siwactl webhooks listen", "warning: " + warning)
        }
        // The temporary endpoint's own secret: only the worker and this process ever know it.
        let ownSecret = StandardWebhooks.Secret.generate()
        let signals = TerminationSignals()
        let client = OutboundHTTP.Client(
            policy: OutboundHTTP.Policy(
                timeout: .seconds(9), maxResponseBodyBytes: 64 << 10, allowsPlainHTTPToLoopback: true,
                userAgent: "siwa-notifications-webhooks"),
            environment: ProcessInfo.processInfo.environment)
        let signing = appSecrets
        let addressFile = try listenAddressFile(parsed)
        let server = HTTPServer(
            configuration: HTTPServer.Configuration(
                host: "127.0.0.1", port: port, threadCount: 4, maxBodyBytes: 1 << 20)
        ) { request in
            relay(request, verifyingWith: ownSecret, to: target, signingWith: signing, client: client)
        }
        do { try server.start() } catch { throw ToolFailure("cannot listen on 127.0.0.1:\(port): \(error)") }
        defer { server.shutdown(gracePeriod: .seconds(2)) }
        let url = "http://\(server.address!)/"
        writeErrorLine("siwactl webhooks listen", "listening on \(url)")

        let connection = try connect(parsed)
        defer { connection.close() }
        let webhooks = WebhookAdministration(connection)
        let endpoint = try database("registering the temporary endpoint") {
            try webhooks.addTemporaryEndpoint(
                url: url, secret: ownSecret.text, types: chosen, lifetime: temporaryLifetime)
        }
        writeStandardOutput("endpoint \(endpoint) (temporary): \(url) → \(TerminalText.escaped(target))\n")
        for publicKey in appSecrets.compactMap(\.publicKey) {
            // Signing v1a: the app verifies with the public key (not a secret).
            writeStandardOutput("public key: \(publicKey.text)\n")
        }
        if generated {
            writeStandardOutput("secret: \(appSecrets[0].text)\n")
            writeErrorLine(
                "siwactl webhooks listen",
                "verify the forwarded deliveries with the secret above (give your own with --secret-file to keep it across runs)"
            )
        }
        writeErrorLine(
            "siwactl webhooks listen", "forwarding; SIGINT or SIGTERM removes endpoint \(endpoint)")
        try write(addressFile, server)  // once the endpoint is registered: deliveries can come
        defer { addressFile?.remove() }
        while !signals.wait(timeout: renewalInterval) {
            do {
                try webhooks.renewTemporaryEndpoint(Int64(endpoint), lifetime: temporaryLifetime)
            } catch {
                writeErrorLine("siwactl webhooks listen", "renewing endpoint \(endpoint) failed: \(error)")
            }
        }
        writeErrorLine("siwactl webhooks listen", "stopping: removing endpoint \(endpoint)")
        try database("removing the temporary endpoint") {
            try webhooks.removeTemporaryEndpoint(Int64(endpoint))
        }
    }

    /// Verifies one delivery with the temporary endpoint's secret, forwards it re-signed with the app's
    /// secrets (same id, timestamp and body), prints one escaped line, and answers the app's status.
    static func relay(
        _ request: HTTPRequest, verifyingWith ownSecret: StandardWebhooks.Secret, to target: String,
        signingWith secrets: [StandardWebhooks.SigningKey], client: OutboundHTTP.Client
    ) -> HTTPResponse {
        guard request.method == "POST" else { return .error(status: 405, "POST only") }
        let id = request.headers["webhook-id"] ?? ""
        let timestamp = request.headers["webhook-timestamp"] ?? ""
        do {
            try StandardWebhooks.verify(
                id: id, timestamp: timestamp, signature: request.headers["webhook-signature"],
                body: request.body,
                secrets: [ownSecret])
        } catch {
            let status = error.description == "no matching signature" ? 401 : 400
            writeErrorLine(
                "siwactl webhooks listen",
                "refused \(id.isEmpty ? "(no webhook-id)" : id) with \(status): \(error)")
            return .error(status: status, error.description)
        }
        let type =
            ((try? JSONSerialization.jsonObject(with: request.data)) as? [String: Any])?["type"] as? String
            ?? "?"
        // Verified: id and timestamp are ours (the timestamp whole seconds).
        let seconds = Int(timestamp) ?? 0
        let forwarded = OutboundHTTP.Request(
            method: "POST", url: target,
            headers: [
                .init("Content-Type", "application/json"), .init("webhook-id", id),
                .init("webhook-timestamp", timestamp),
                .init(
                    "webhook-signature",
                    StandardWebhooks.signatureHeader(
                        id: id, timestamp: seconds, body: request.body, keys: secrets)),
            ], body: request.body)
        let status: Int
        let verdict: String
        do {
            status = try client.perform(forwarded).status
            verdict = String(status)
        } catch {
            status = 502
            verdict = "failed (\(error.code): \(error.description))"
        }
        writeStandardOutput(TerminalText.escaped("\(id) \(type) → \(verdict)") + "\n")
        return HTTPResponse(status: (200...599).contains(status) ? status : 502)
    }
}
