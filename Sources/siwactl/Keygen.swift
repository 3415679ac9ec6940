import AppleNotifications
import Foundation
import ServiceSupport

/// `siwactl keygen`: a fresh RSA-2048 key pair for signing test notifications.
enum KeygenVerb {
    static let spec = CommandSpec(
        name: "siwactl keygen",
        abstract: """
            Generate an RSA-2048 key pair: DIR/private-key.pem (PKCS#8, mode 0600) and DIR/jwks.json.
            Prints the key ID. Refuses to overwrite an existing private key.
            """,
        options: [
            CommandOption(
                "out", valueName: "DIR", help: "Directory to write into (created if absent).",
                isRequired: true),
            CommandOption("kid", valueName: "KID", help: "Key ID (default: a short hash of the public key)."),
        ])

    static let verb = Verb(name: "keygen", abstract: "Generate a signing key pair and its JWKS.") {
        arguments, environment in
        switch parse(spec, arguments, environment) {
        case .failure(let exit): return exit.status
        case .success(let parsed): return await runReportingFailure(spec.name) { try run(parsed) }
        }
    }

    static func run(_ parsed: ParsedCommand) throws {
        let directory = URL(fileURLWithPath: parsed.value("out")!)
        do {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        } catch {
            throw ToolFailure("cannot create directory \(directory.path)")
        }
        let signer = try NotificationSigner.generate(keyID: parsed.value("kid"))
        let keyPath = directory.appendingPathComponent("private-key.pem").path
        try writeSecret(signer.privateKeyPEM, to: keyPath)
        let jwksPath = directory.appendingPathComponent("jwks.json")
        do {
            try signer.jwksJSON().write(to: jwksPath, options: .atomic)
        } catch {
            throw ToolFailure("cannot write \(jwksPath.path)")
        }
        writeStandardOutput(signer.keyID + "\n")
    }

    /// Creates the file exclusively with mode 0600 so the key is never readable by others.
    static func writeSecret(_ text: String, to path: String) throws {
        let descriptor = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            throw ToolFailure(
                errno == EEXIST ? "\(path) already exists; not overwriting a key" : "cannot create \(path)")
        }
        let handle = FileHandle(fileDescriptor: descriptor, closeOnDealloc: true)
        do {
            try handle.write(contentsOf: Data(text.utf8))
            try handle.synchronize()
        } catch {
            throw ToolFailure("cannot write \(path)")
        }
    }
}
