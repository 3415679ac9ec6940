import AppleNotifications
import Foundation
import HTTPServer
import Postgres
import ServiceSupport

/// The receiver's HTTP routes: Apple's notification endpoint, health, readiness and metrics.
///
/// Answers: 200 only after the row is committed (or for a `jti` already stored); 400 malformed;
/// 401 verification failed; 503 with `Retry-After` when it cannot decide or store now. Bodies are small
/// JSON objects that never echo the token.
public final class NotificationEndpoint: Sendable {
    /// The path Apple posts to.
    public static let notificationPath = "/apple/notifications"

    private let verifier: NotificationVerifier
    private let keys: KeyStore
    private let store: NotificationStore
    private let logger: Logger
    private let metrics: ReceiverMetrics
    private let retryAfterSeconds: Int

    public init(
        verifier: NotificationVerifier, keys: KeyStore, store: NotificationStore, logger: Logger,
        metrics: ReceiverMetrics, retryAfterSeconds: Int = 5
    ) {
        self.verifier = verifier
        self.keys = keys
        self.store = store
        self.logger = logger
        self.metrics = metrics
        self.retryAfterSeconds = retryAfterSeconds
    }

    /// Routes one request.
    public func handle(_ request: HTTPRequest) -> HTTPResponse {
        switch request.path {
        case Self.notificationPath:
            guard request.method == "POST" else {
                return Self.json(405, #"{"error":"method not allowed"}"#, headers: [("Allow", "POST")])
            }
            return receive(request)
        case "/healthz":
            return Self.json(200, #"{"status":"ok"}"#)
        case "/readyz":
            let keysLoaded = keys.hasKeys
            let databaseReachable = store.isReachable()
            let body = #"{"keys_loaded":\#(keysLoaded),"database_reachable":\#(databaseReachable)}"#
            return Self.json(keysLoaded && databaseReachable ? 200 : 503, body)
        case "/metrics":
            return HTTPResponse(
                status: 200, headers: ["Content-Type": "text/plain; version=0.0.4; charset=utf-8"],
                body: Array(metrics.registry.render().utf8))
        default:
            return Self.json(404, #"{"error":"not found"}"#)
        }
    }

    private func receive(_ request: HTTPRequest) -> HTTPResponse {
        let started = ContinuousClock.now
        metrics.inFlight.increment()
        defer { metrics.inFlight.decrement() }

        var fields: [String: Logger.Value] = [
            "request_id": .string(request.id),
            "queued_ms": .double((Self.seconds(since: request.receivedAt) * 1e6).rounded() / 1e3),
        ]
        let response: HTTPResponse
        let outcome: DeliveryOutcome
        do throws(NotificationError) {
            let token = try NotificationRequestBody.payload(from: request.body)
            let jws = try CompactJWS(token)
            let notification = try verifier.verify(jws, now: Date()) { kid throws(NotificationError) in
                try keys.key(id: kid)
            }
            fields["jti"] = .string(notification.jti)
            fields["event_type"] = .string(notification.eventType.rawValue)
            let storeStarted = ContinuousClock.now
            do {
                // The commit timeout counts from the request's arrival, so time spent waiting for a
                // handler thread is part of it and the client's whole wait stays bounded.
                let stored = try store.store(
                    notification, rawToken: token,
                    deadline: request.receivedAt + store.configuration.commitTimeout)
                metrics.storageSeconds.observe(Self.seconds(since: storeStarted))
                outcome = stored == .accepted ? .accepted : .duplicate
                response = Self.json(200, #"{"status":"\#(stored.rawValue)"}"#)
            } catch {
                metrics.storageSeconds.observe(Self.seconds(since: storeStarted))
                outcome = .unavailable
                fields["reason"] = "storage_unavailable"
                fields["error"] = .string(String(describing: error))
                response = unavailable("storage_unavailable")
            }
        } catch {
            fields["reason"] = .string(error.code.rawValue)
            switch error.kind {
            case .malformed:
                outcome = .malformed
                response = Self.json(400, #"{"error":"malformed","reason":"\#(error.code.rawValue)"}"#)
            case .keyNotAvailable:
                outcome = .unavailable
                response = unavailable("keys_unavailable")
            default:
                outcome = .unauthorized
                metrics.verificationFailure(error.code.rawValue).increment()
                response = Self.json(
                    401, #"{"error":"verification failed","reason":"\#(error.code.rawValue)"}"#)
            }
        }
        metrics.delivery(outcome).increment()
        fields["status"] = .int(response.status)
        fields["outcome"] = .string(outcome.rawValue)
        fields["latency_ms"] = .double((Self.seconds(since: started) * 1e6).rounded() / 1e3)
        logger.log(response.status >= 500 ? .warning : .info, "notification", fields)
        return response
    }

    private func unavailable(_ reason: String) -> HTTPResponse {
        Self.json(
            503, #"{"error":"unavailable","reason":"\#(reason)"}"#,
            headers: [("Retry-After", String(retryAfterSeconds))])
    }

    private static func json(_ status: Int, _ body: String, headers: [(String, String)] = []) -> HTTPResponse
    {
        HTTPResponse(
            status: status, headers: HTTPHeaders([("Content-Type", "application/json")] + headers),
            body: Array(body.utf8))
    }

    private static func seconds(since start: ContinuousClock.Instant) -> Double {
        (ContinuousClock.now - start).inSeconds
    }
}

/// How one delivery to the notification endpoint ended (the `outcome` label and log field).
public enum DeliveryOutcome: String, Sendable, CaseIterable {
    /// Stored (200).
    case accepted
    /// Already stored (200).
    case duplicate
    /// Not a notification body (400).
    case malformed
    /// Forged, foreign, expired or otherwise refused (401).
    case unauthorized
    /// Could not decide or store now (503).
    case unavailable
}

/// The receiver's metrics, registered once.
public final class ReceiverMetrics: Sendable {
    /// The registry rendered at `/metrics`.
    public let registry: MetricsRegistry
    /// Requests to the notification endpoint being handled now.
    public let inFlight: Gauge
    /// Time from queuing a notification to its commit, as the request sees it.
    public let storageSeconds: Histogram
    /// Rows per group-commit transaction.
    public let batchSize: Histogram
    /// Time to execute one group-commit transaction.
    public let batchSeconds: Histogram
    let jwksSuccess: Counter
    let jwksFailure: Counter
    private let deliveries: [DeliveryOutcome: Counter]

    public init(registry: MetricsRegistry = MetricsRegistry()) {
        self.registry = registry
        inFlight = registry.gauge("siwa_requests_in_flight", help: "Notification requests being handled.")
        storageSeconds = registry.histogram(
            "siwa_storage_duration_seconds", help: "Time to commit one notification to PostgreSQL.")
        batchSize = registry.histogram(
            "siwa_commit_batch_size", help: "Notifications per group-commit transaction.",
            buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
        batchSeconds = registry.histogram(
            "siwa_commit_batch_duration_seconds", help: "Time to execute one group-commit transaction.")
        jwksSuccess = registry.counter(
            "siwa_jwks_fetches_total", help: "Fetches of Apple's key set, by result.",
            labels: [("result", "success")])
        jwksFailure = registry.counter(
            "siwa_jwks_fetches_total", help: "Fetches of Apple's key set, by result.",
            labels: [("result", "failure")])
        var deliveries: [DeliveryOutcome: Counter] = [:]
        for outcome in DeliveryOutcome.allCases {
            deliveries[outcome] = registry.counter(
                "siwa_deliveries_total", help: "Notification deliveries by outcome.",
                labels: [("outcome", outcome.rawValue)])
        }
        self.deliveries = deliveries
    }

    /// Deliveries by outcome (created once, so counting takes no lock).
    public func delivery(_ outcome: DeliveryOutcome) -> Counter { deliveries[outcome]! }

    /// Verification failures by reason (the error code).
    public func verificationFailure(_ reason: String) -> Counter {
        registry.counter(
            "siwa_verification_failures_total", help: "Notifications refused (401) by reason.",
            labels: [("reason", reason)])
    }

    /// Records one committed batch.
    public func recordBatch(size: Int, duration: Duration) {
        batchSize.observe(Double(size))
        batchSeconds.observe(duration.inSeconds)
    }

    /// Counts one key-set fetch.
    public func record(_ outcome: KeyStore.FetchOutcome) {
        switch outcome {
        case .success: jwksSuccess.increment()
        case .failure: jwksFailure.increment()
        }
    }
}
