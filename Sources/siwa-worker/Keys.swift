import AppleID
import AppleKeys
import AppleNotifications
import Foundation
import ServiceSupport
import Worker

/// The worker verifies every stored token before applying it, with Apple's keys from the same options
/// (``KeySetOptions``) and the same fetch policy (`JWKSSource`, `KeyStore`) as the receiver, in a cache
/// of its own: the worker's key cache and the verification that uses it.
func makeVerification(
    _ parsed: ParsedCommand, environment: [String: String], logger: Logger, metrics: MetricsRegistry
) throws -> (KeyStore, StoredTokenVerification) {
    let source = try KeySetOptions.source(parsed, environment: environment)
    if !KeySetOptions.isApple(source) {
        logger.warning(
            "the key set is not Apple's: notifications signed by whoever holds its keys are applied; use this for tests and staging only, never in production",
            ["url": .string(source.description), "apple": .string(JWKSSource.appleURL.absoluteString)])
    }
    let configuration = try KeySetOptions.storeConfiguration(parsed)
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
