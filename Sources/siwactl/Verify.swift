import AppleID
import AppleKeys
import AppleNotifications
import Foundation
import ServiceSupport

/// `siwactl verify`: verify one notification token and print what it says.
enum VerifyVerb {
    static let spec = CommandSpec(
        name: "siwactl verify",
        abstract: """
            Verify one token (a bare JWS or a {"payload":...} body; '-' reads stdin) against a JWKS file
            or URL and print the notification as JSON. On failure: one line on stderr, exit status 1.
            """,
        options: [
            CommandOption(
                "jwks", valueName: "FILE_OR_URL",
                help:
                    "Key set: a file, or an https URL (http only for loopback), fetched as the receiver does.",
                isRequired: true,
                environmentVariable: "SIWA_JWKS_URL"),
            AppleCredentialOptions.audiences(required: true),
            CommandOption("at", valueName: "ISO8601", help: "Verify as of this instant instead of now."),
            CommandOption(
                "max-token-age", valueName: "SECONDS",
                help: "Oldest accepted token without exp, from its iat (plus 60 s), as of --at.",
                environmentVariable: "SIWA_MAX_TOKEN_AGE", defaultValue: "86400"),
        ],
        positionals: [CommandPositional("TOKEN", help: "The token or body, or '-' for stdin.")])

    static let verb = Verb(name: "verify", abstract: "Verify a notification token and print it.") {
        arguments, environment in
        switch parse(spec, arguments, environment) {
        case .failure(let exit): return exit.status
        case .success(let parsed):
            var now = Date()
            if let at = parsed.value("at") {
                guard let date = parseISO8601(at) else {
                    writeErrorLine(spec.name, "--at must be an ISO 8601 date-time, e.g. 2026-01-31T12:00:00Z")
                    return ExitStatus.usage
                }
                now = date
            }
            return await runReportingFailure(spec.name) {
                try await run(parsed, now: now, environment: environment)
            }
        }
    }

    static func run(_ parsed: ParsedCommand, now: Date, environment: [String: String]) async throws {
        let maxTokenAge = try parsed.seconds("max-token-age", positive: true) ?? .seconds(86400)
        let verifier = try NotificationVerifier(
            audiences: Set(AppleCredentialOptions.audiences(parsed)), maxTokenAge: maxTokenAge.inSeconds)
        let input = parsed.positionals[0]
        let raw: String
        if input == "-" {
            let data = FileHandle.standardInput.readDataToEndOfFile()
            raw = String(decoding: data, as: UTF8.self)
        } else {
            raw = input
        }
        let token = try extractToken(raw.trimmingCharacters(in: .whitespacesAndNewlines))
        let keys = try JSONWebKeySet(
            jsonData: try await loadKeySet(parsed.value("jwks")!, environment: environment))
        let notification = try verifier.verify(token: token, keys: keys, now: now)
        writeStandardOutput(render(notification) + "\n")
    }

    /// Accepts a bare JWS or Apple's body `{"payload":"<JWS>"}`, read as the receiver reads it
    /// (``NotificationRequestBody``: strict JSON, a `payload` named twice is refused).
    static func extractToken(_ text: String) throws -> String {
        guard text.hasPrefix("{") else { return text }
        guard text.utf8.count <= 64 * 1024 else { throw ToolFailure("body is larger than 64 KiB") }
        return try NotificationRequestBody.payload(from: Array(text.utf8))
    }

    /// A file's bytes, or the key set fetched from an http(s) URL by ``JWKSSource`` (the receiver's
    /// policy: https or loopback http, no redirects, no compression, at most 1 MiB, 15 s; proxy and CA
    /// file from `environment`, as in the receiver).
    static func loadKeySet(_ location: String, environment: [String: String]) async throws -> Data {
        if location.hasPrefix("https://") || location.hasPrefix("http://") {
            guard let url = URL(string: location) else { throw ToolFailure("invalid JWKS URL") }
            let source = try JWKSSource(url: url, timeout: 15, environment: environment)
            do {
                return try source.fetch()
            } catch {
                throw ToolFailure("cannot fetch JWKS from \(url.host ?? "URL"): \(error)")
            }
        }
        guard let data = FileManager.default.contents(atPath: location) else {
            throw ToolFailure("cannot read \(location)")
        }
        return data
    }

    static func render(_ notification: ServerNotification) -> String {
        var object: [String: Any] = [
            "type": notification.eventType.rawValue,
            "known_type": notification.eventType.isKnown,
            "sub": notification.subject,
            "email": notification.email ?? NSNull(),
            "is_private_email": notification.isPrivateEmail ?? NSNull(),
            "event_time": formatISO8601(notification.eventTime),
            "jti": notification.jti,
            "aud": notification.audience,
            "iat": formatISO8601(notification.issuedAt),
            "exp": notification.expiresAt.map(formatISO8601) ?? NSNull(),
        ]
        // Only for an event dated after its token was signed: event_time above is then iat + leeway.
        if let claimed = notification.claimedEventTime {
            object["claimed_event_time"] = formatISO8601(claimed)
        }
        let data =
            (try? JSONSerialization.data(
                withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes]))
            ?? Data()
        return String(decoding: data, as: UTF8.self)
    }

    static func parseISO8601(_ text: String) -> Date? {
        let formatter = ISO8601DateFormatter()
        if let date = formatter.date(from: text) { return date }
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.date(from: text)
    }

    static func formatISO8601(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.string(from: date)
    }
}
