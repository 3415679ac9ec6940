public import AppleKeys
public import AppleNotifications
import Foundation
public import HTTPServer
import Postgres
public import ServiceSupport
import Synchronization

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

    /// Routes one request and waits for its answer (for callers without a connection to suspend, such
    /// as in-process tests). The server uses ``handle(_:responder:)``.
    public func handle(_ request: HTTPRequest) -> HTTPResponse {
        guard request.path == Self.notificationPath, request.method == "POST" else { return route(request) }
        let done = DispatchSemaphore(value: 0)
        let answer = Mutex<HTTPResponse?>(nil)
        receive(request, mayBlock: true, offload: { $0() }) { response in
            answer.withLock { $0 = response }
            done.signal()
        }
        done.wait()  // bounded by the commit timeout
        return answer.withLock { $0! }
    }

    /// Routes one request on the HTTP server's I/O thread without blocking it. A notification is
    /// verified right here and handed to the group commit; its connection stays suspended, holding no
    /// thread, until the commit's completion answers it. A notification signed with a key not held yet
    /// (the key set must be fetched) and every other route, which may block (readiness pings the
    /// database), go to the server's handler threads.
    public func handle(_ request: HTTPRequest, responder: HTTPResponder) {
        guard request.path == Self.notificationPath, request.method == "POST" else {
            return responder.respondBlocking { self.route(request) }
        }
        receive(
            request, mayBlock: false,
            offload: { work in responder.offload(work) },
            answer: { responder.respond($0) })
    }

    /// Every route but a notification's POST (which takes ``receive(_:mayBlock:offload:answer:)``).
    private func route(_ request: HTTPRequest) -> HTTPResponse {
        switch request.path {
        case Self.notificationPath:
            return Self.json(405, #"{"error":"method not allowed"}"#, headers: [("Allow", "POST")])
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

    private static let acceptedResponse = json(200, #"{"status":"accepted"}"#)
    private static let duplicateResponse = json(200, #"{"status":"duplicate"}"#)

    /// Verifies a notification and hands it to the group commit; `answer` is called exactly once, after
    /// the commit for a 200. Unless `mayBlock`, nothing here blocks: a key that must be fetched first
    /// sends the whole delivery to `offload` (a thread that may block), which runs it again with
    /// `mayBlock`.
    private func receive(
        _ request: HTTPRequest, mayBlock: Bool, offload: (@escaping @Sendable () -> Void) -> Void,
        answer: @escaping @Sendable (HTTPResponse) -> Void
    ) {
        let started = ContinuousClock.now
        // The log line's fields are gathered only when a line may be written (an info line for every
        // delivery, a warning for some): at `--log-level error` a delivery builds none.
        let describes = logger.isEnabled(.warning)
        var fields: [String: Logger.Value] = [:]
        if describes {
            fields["request_id"] = .string(request.id)
            fields["queued_ms"] = .double((Self.seconds(since: request.receivedAt) * 1e6).rounded() / 1e3)
        }
        let response: HTTPResponse
        let outcome: DeliveryOutcome
        do throws(NotificationError) {
            let token = try NotificationRequestBody.payload(from: request.body)
            let jws = try CompactJWS(token)
            guard let notification = try verify(jws, mayBlock: mayBlock) else {
                // The key set must be fetched: not on this thread.
                return offload { self.receive(request, mayBlock: true, offload: { $0() }, answer: answer) }
            }
            if describes {
                fields["jti"] = .string(notification.jti)
                fields["event_type"] = .string(notification.eventType.rawValue)
            }
            if describes, let claimed = notification.claimedEventTime {
                // Dated after Apple signed it: stored with iat + leeway as its event_time (see the verifier).
                fields["claimed_event_time"] = .string(ISO8601DateFormatter().string(from: claimed))
            }
            metrics.inFlight.increment()
            let storeStarted = ContinuousClock.now
            let logged = fields
            // The commit timeout counts from the request's arrival, so time spent waiting before this
            // point is part of it and the client's whole wait stays bounded.
            store.store(
                notification, rawToken: token,
                deadline: request.receivedAt + store.configuration.commitTimeout
            ) { [self] result in
                metrics.inFlight.decrement()
                metrics.storageSeconds.observe(Self.seconds(since: storeStarted))
                var fields = logged
                let response: HTTPResponse
                let outcome: DeliveryOutcome
                switch result {
                case .success(let stored):
                    outcome = stored == .accepted ? .accepted : .duplicate
                    response = stored == .accepted ? Self.acceptedResponse : Self.duplicateResponse
                    if stored == .accepted, notification.claimedEventTime != nil {
                        metrics.futureEventTimes.increment()
                    }
                case .failure(let error):
                    outcome = .unavailable
                    fields["reason"] = "storage_unavailable"
                    fields["error"] = .string(String(describing: error))
                    response = unavailable("storage_unavailable")
                }
                // Logged and counted before the answer, so both are there once the client has it.
                finish(outcome, response, started: started, fields: &fields)
                answer(response)
            }
            return
        } catch {
            fields["reason"] = .string(error.code.rawValue)
            switch error.kind {
            case .malformed:
                outcome = .malformed
                response = Self.json(400, #"{"error":"malformed","reason":"\#(error.code.rawValue)"}"#)
            case .keyNotAvailable:
                outcome = .unavailable
                // The reason logged is the one answered; the key store's own reason beside it.
                fields["reason"] = "keys_unavailable"
                fields["detail"] = .string(error.code.rawValue)
                response = unavailable("keys_unavailable")
            default:
                if let audience = error.refusedAudience { fields["aud"] = .string(audience) }
                outcome = .unauthorized
                metrics.verificationFailure(error.code.rawValue).increment()
                response = Self.json(
                    401, #"{"error":"verification failed","reason":"\#(error.code.rawValue)"}"#)
            }
        }
        finish(outcome, response, started: started, fields: &fields)
        answer(response)
    }

    /// Verifies `jws`; unless `mayBlock`, only with keys held now, returning `nil` when its key is not
    /// held (finding it may need a fetch).
    private func verify(_ jws: CompactJWS, mayBlock: Bool) throws(NotificationError) -> ServerNotification? {
        if mayBlock {
            return try verifier.verify(jws, now: Date()) { kid throws(NotificationError) in
                try keys.key(id: kid)
            }
        }
        var notHeld = false
        do {
            return try verifier.verify(jws, now: Date()) { kid throws(NotificationError) in
                if let key = keys.heldKey(id: kid) { return key }
                notHeld = true
                throw NotificationError(.keyNotAvailable, .unknownKeyID, "kid not held")
            }
        } catch {
            if notHeld { return nil }
            throw error
        }
    }

    /// Counts and logs one answered delivery.
    private func finish(
        _ outcome: DeliveryOutcome, _ response: HTTPResponse, started: ContinuousClock.Instant,
        fields: inout [String: Logger.Value]
    ) {
        metrics.record(outcome)
        guard logger.isEnabled(.warning) else { return }
        fields["status"] = .int(response.status)
        fields["outcome"] = .string(outcome.rawValue)
        fields["latency_ms"] = .double((Self.seconds(since: started) * 1e6).rounded() / 1e3)
        // A refused audience is a configuration gap (an app whose notifications are lost), not noise;
        // an event dated after its token was signed is an anomaly to look into.
        let warn = response.status >= 500 || fields["aud"] != nil || fields["claimed_event_time"] != nil
        logger.log(warn ? .warning : .info, "notification", fields)
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
    /// Notifications stored whose signed `event_time` was later than `iat` + leeway (stored with
    /// `iat` + leeway as their event time, the signed value in `claimed_event_time`).
    public let futureEventTimes: Counter
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
        futureEventTimes = registry.counter(
            "siwa_future_event_times_total",
            help:
                "Notifications stored whose signed event_time was later than iat + leeway: not believed, stored with event_time = iat + leeway (siwa.event_history.claimed_event_time holds the signed value)."
        )
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
        // Every refusal reason exported at 0 from the start: a series born at 1 on the first refusal
        // has no earlier sample, so increase() (and an alert such as SiwaWrongAudience) misses it.
        for reason in Self.refusalReasons { _ = verificationFailure(reason.rawValue) }
        registry.computedGauge(
            "siwa_receiver_last_verified_notification_timestamp_seconds",
            help:
                "Unix time this receiver process last answered 200 to a verified notification; 0 since its start."
        ) { [self] in Double(lastVerifiedMilliseconds.load(ordering: .relaxed)) / 1000 }
    }

    /// The reasons a verified-shape token is refused with 401, each a series of
    /// `siwa_verification_failures_total` from the start.
    public static let refusalReasons: [NotificationError.Code] = [
        .unknownKeyID, .missingKeyID, .badSignature, .algorithmNotAllowed, .criticalHeader, .wrongIssuer,
        .wrongAudience, .expired, .tooOld, .issuedInFuture,
    ]

    /// Deliveries by outcome (created once, so counting takes no lock).
    public func delivery(_ outcome: DeliveryOutcome) -> Counter { deliveries[outcome]! }

    /// Counts one answered delivery; a verified one (accepted or duplicate) also moves
    /// `siwa_receiver_last_verified_notification_timestamp_seconds`.
    public func record(_ outcome: DeliveryOutcome) {
        delivery(outcome).increment()
        if outcome == .accepted || outcome == .duplicate {
            lastVerifiedMilliseconds.store(Int(Date().timeIntervalSince1970 * 1000), ordering: .relaxed)
        }
    }

    /// When this process last answered 200 to a verified notification (Unix milliseconds; 0: never).
    private let lastVerifiedMilliseconds = Atomic<Int>(0)

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
