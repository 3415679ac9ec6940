import Foundation
import Postgres
import ServiceSupport
import SharedSignals
import SignalDelivery

/// The Shared Signals push lanes' settings: off unless --ssf-key-file is given (docs/shared-signals.md).
let sharedSignalsOptions: [CommandOption] = [
    CommandOption(
        "ssf-key-file", valueName: "FILE",
        help:
            "The SET signing key (siwactl ssf keygen); turns the Shared Signals push lanes on (default: off).",
        environmentVariable: "SIWA_SSF_KEY_FILE"),
    CommandOption(
        "ssf-issuer", valueName: "URL", help: "The SETs' iss (required with --ssf-key-file).",
        environmentVariable: "SIWA_SSF_ISSUER"),
    CommandOption(
        "ssf-concurrency", valueName: "N", help: "Shared Signals pushes in flight at once from this process.",
        environmentVariable: "SIWA_SSF_CONCURRENCY", defaultValue: "2"),
    CommandOption(
        "ssf-timeout", valueName: "SECONDS", help: "Deadline of one push (connect to last byte).",
        environmentVariable: "SIWA_SSF_TIMEOUT", defaultValue: "10"),
    CommandOption(
        "ssf-max-attempts", valueName: "N",
        help: "Attempts before a SET is dead (retries back off up to 1 h).",
        environmentVariable: "SIWA_SSF_MAX_ATTEMPTS", defaultValue: "30"),
]

/// The dispatcher from the command line, or nil without --ssf-key-file.
func makeSignalDispatcher(
    _ parsed: ParsedCommand, database: PostgresConfiguration, environment: [String: String], logger: Logger
) throws -> SignalDispatcher? {
    guard let keyFile = parsed.value("ssf-key-file") else {
        logger.info("shared signals off: no --ssf-key-file")
        return nil
    }
    guard let issuer = parsed.value("ssf-issuer"), !issuer.isEmpty else {
        throw ConfigurationError("--ssf-key-file needs --ssf-issuer")
    }
    guard let pem = try? String(contentsOfFile: keyFile, encoding: .utf8),
        let key = try? SETSigningKey(privateKeyPEM: pem)
    else { throw ConfigurationError("--ssf-key-file: \(keyFile) holds no usable RSA private key") }
    var signalDatabase = database
    signalDatabase.applicationName = "siwa-worker-ssf"
    return SignalDispatcher(
        configuration: try SignalDispatcher.Configuration(
            database: signalDatabase, issuer: issuer, key: key,
            concurrency: try parsed.integer("ssf-concurrency", in: 1...256) ?? 2,
            timeout: try parsed.seconds("ssf-timeout", positive: true) ?? .seconds(10),
            maxAttempts: try parsed.integer("ssf-max-attempts", in: 1...1000) ?? 30, environment: environment),
        logger: logger)
}
