import Foundation
import ServiceSupport
import SharedSignals

/// `siwactl ssf`: the Shared Signals transmitter's signing key (and, in SharedSignalsStreams.swift, streams).
enum SharedSignalsVerb {
    static let verb = Verb(
        name: "ssf", abstract: "Shared Signals: the SET signing key, the streams and the API's receivers.",
        subverbs: [
            .parsing("keygen", keygenSpec) { parsed, _ in try keygen(parsed) },
            .parsing("jwks", jwksSpec) { parsed, _ in try jwks(parsed) },
            streamsVerb,
            receiversVerb,
        ])

    static let keygenSpec = CommandSpec(
        name: "siwactl ssf keygen",
        abstract: """
            Generate the dedicated RSA-2048 key that signs Security Event Tokens: FILE (PKCS#8 PEM, mode
            0600, never overwritten). Prints its key ID; 'siwactl ssf jwks' prints the key set to publish.
            """,
        options: [
            CommandOption("out", valueName: "FILE", help: "The private key file to create.", isRequired: true)
        ])

    static let jwksSpec = CommandSpec(
        name: "siwactl ssf jwks",
        abstract: "Print the JWKS (public key only) of the SET signing key in FILE.",
        options: [
            CommandOption("key-file", valueName: "FILE", help: "The private key file.", isRequired: true)
        ])

    static func keygen(_ parsed: ParsedCommand) throws {
        let key = try SETSigningKey.generate()
        try KeygenVerb.writeSecret(key.privateKeyPEM, to: parsed.value("out")!)
        writeStandardOutput(key.keyID + "\n")
    }

    static func jwks(_ parsed: ParsedCommand) throws {
        let key = try loadKey(parsed.value("key-file")!)
        writeStandardOutput(String(decoding: key.jwksJSON(), as: UTF8.self) + "\n")
    }

    /// The signing key from its secret file; the error names the file, never its content.
    static func loadKey(_ path: String) throws -> SETSigningKey {
        guard let pem = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw ToolFailure("cannot read \(path)")
        }
        do { return try SETSigningKey(privateKeyPEM: pem) } catch {
            throw ToolFailure("\(path) holds no usable RSA private key (at least 2048 bits)")
        }
    }
}
