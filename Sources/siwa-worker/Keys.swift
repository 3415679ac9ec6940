import AppleID
import AppleNotifications
import Foundation
import Receiver
import ServiceSupport
import Worker

/// The worker verifies every stored token before applying it, with Apple's keys from the same options
/// (and the same fetch policy: `JWKSSource`, `KeyStore`) as the receiver, in a cache of its own.
let appleKeySetURL = JWKSSource.appleURL.absoluteString

let keyOptions: [CommandOption] = [
    CommandOption(
        "jwks-url", valueName: "URL",
        help: "Apple's key set (https; http only for loopback): every stored token is verified against it.",
        environmentVariable: "SIWA_JWKS_URL", defaultValue: appleKeySetURL),
    CommandOption(
        "jwks-cooldown", valueName: "SECONDS", help: "Least time between refetches caused by unknown kids.",
        environmentVariable: "SIWA_JWKS_COOLDOWN", defaultValue: "30"),
    CommandOption(
        "jwks-refresh", valueName: "SECONDS", help: "Periodic key-set refresh interval.",
        environmentVariable: "SIWA_JWKS_REFRESH", defaultValue: "3600"),
]

/// The worker's key cache and the verification that uses it.
func makeVerification(
    _ parsed: ParsedCommand, environment: [String: String], logger: Logger, metrics: MetricsRegistry
) throws -> (KeyStore, StoredTokenVerification) {
    guard let url = URL(string: parsed.value("jwks-url") ?? appleKeySetURL) else {
        throw ConfigurationError("--jwks-url is not a URL")
    }
    let source = try JWKSSource(url: url, environment: environment)
    if url.absoluteString != appleKeySetURL {
        logger.warning(
            "the key set is not Apple's: notifications signed by whoever holds its keys are applied; use this for tests and staging only, never in production",
            ["url": .string(source.description), "apple": .string(appleKeySetURL)])
    }
    let configuration = KeyStore.Configuration(
        refreshInterval: try parsed.seconds("jwks-refresh", positive: true) ?? .seconds(3600),
        cooldown: try parsed.seconds("jwks-cooldown", positive: true) ?? .seconds(30))
    let success = metrics.counter(
        "siwa_worker_jwks_fetches_total", help: "Fetches of Apple's key set by the worker, by outcome.",
        labels: [("outcome", "success")])
    let failure = metrics.counter(
        "siwa_worker_jwks_fetches_total", help: "Fetches of Apple's key set by the worker, by outcome.",
        labels: [("outcome", "failure")])
    let keys = KeyStore(configuration: configuration, source: { try source.fetch() }) { outcome in
        switch outcome {
        case .success(let count):
            success.increment()
            logger.debug("key set fetched", ["keys": .int(count)])
        case .failure(let reason, let held):
            failure.increment()
            logger.warning("key set fetch failed", ["reason": .string(reason), "held_keys": .int(held)])
        }
    }
    let verification = StoredTokenVerification(
        audiences: Set(AppleCredentialOptions.audiences(parsed)),
        heldKey: { keys.heldKey(id: $0) },
        fetchKey: { kid throws(NotificationError) in try keys.key(id: kid) })
    return (keys, verification)
}
