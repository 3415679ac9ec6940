import AppleNotifications
import Foundation
import ServiceSupport

/// `siwactl sign`: a notification body exactly as Apple would POST it.
enum SignVerb {
    static let spec = CommandSpec(
        name: "siwactl sign",
        abstract: """
            Sign a notification with a private key and print the body Apple would POST: {"payload":"<JWS>"}.
            """,
        options: [
            CommandOption("key", valueName: "PEM", help: "Private key file (PEM).", isRequired: true)
        ] + notificationOptions + [
            CommandOption(
                "private-email", valueName: "BOOL",
                help: "is_private_email (default: whether E is a private relay address).")
        ])

    /// What a signed notification says (sign and simulate): its header's kid, aud, event type, sub, email.
    static let notificationOptions = [
        CommandOption(
            "kid", valueName: "KID", help: "Key ID for the header (default: hash of the public key)."),
        CommandOption("audience", valueName: "AUD", help: "Client ID for the aud claim.", isRequired: true),
        CommandOption(
            "type", valueName: "TYPE",
            help: "email-disabled, email-enabled, consent-revoked or account-delete.", isRequired: true),
        CommandOption("sub", valueName: "SUB", help: "The user identifier.", isRequired: true),
        CommandOption("email", valueName: "E", help: "Email address (email events)."),
    ]

    static let verb = Verb(name: "sign", abstract: "Sign a notification as Apple would send it.") {
        arguments, environment in
        switch parse(spec, arguments, environment) {
        case .failure(let exit): return exit.status
        case .success(let parsed): return await runReportingFailure(spec.name) { try run(parsed) }
        }
    }

    static func run(_ parsed: ParsedCommand) throws {
        let pem = try readText(path: parsed.value("key")!)
        let signer: NotificationSigner
        if let kid = parsed.value("kid") {
            signer = try NotificationSigner(privateKeyPEM: pem, keyID: kid)
        } else {
            signer = try NotificationSigner(privateKeyPEM: pem)
        }
        var isPrivate: Bool?
        switch parsed.value("private-email") {
        case nil: isPrivate = nil
        case "true"?: isPrivate = true
        case "false"?: isPrivate = false
        default: throw ToolFailure("--private-email must be true or false")
        }
        let token = try signer.sign(
            type: parsed.value("type")!, subject: parsed.value("sub")!, audience: parsed.value("audience")!,
            email: parsed.value("email"), isPrivateEmail: isPrivate)
        let body = try JSONSerialization.data(
            withJSONObject: ["payload": token], options: [.withoutEscapingSlashes])
        writeStandardOutput(String(decoding: body, as: UTF8.self) + "\n")
    }
}
