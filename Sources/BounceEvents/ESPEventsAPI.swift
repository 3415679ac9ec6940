public import Bounces
public import Foundation
public import HTTPClient
public import HTTPServer
public import Postgres
public import ServiceSupport

/// The ESP bounce listener's settings; a provider is served only when its authenticator is set.
public struct ESPEventsConfiguration: Sendable {
    /// The listener (its body bound included).
    public var http: HTTPServer.Configuration
    /// The database, as a login that is a member of `siwa_bounce` only.
    public var database: PostgresConfiguration
    public var mailgun: MailgunWebhook?
    public var sendgrid: SendGridWebhook?
    public var postmark: PostmarkWebhook?
    /// SES via SNS: the topics and the allowed certificate hosts.
    public var sns: SNSVerifier.Configuration?
    /// The outbound client that fetches SNS certificates and confirms subscriptions.
    public var outbound: OutboundHTTP.Client
    /// Database connections.
    public var poolSize: Int
    /// The oldest a SendGrid or SNS signature's timestamp may be (``ESPSignatureAge``); event ids are
    /// kept as long, so a duplicate is refused for its age or its id.
    public var maximumAge: TimeInterval = ESPSignatureAge.defaultMaximum

    public init(
        http: HTTPServer.Configuration, database: PostgresConfiguration,
        outbound: OutboundHTTP.Client = OutboundHTTP.Client(), poolSize: Int = 2
    ) {
        self.http = http
        self.database = database
        self.outbound = outbound
        self.poolSize = poolSize
    }

    /// The providers configured, in route order.
    public var providers: [ESPProvider] {
        ESPProvider.allCases.filter { provider in
            switch provider {
            case .mailgun: mailgun != nil
            case .sendgrid: sendgrid != nil
            case .postmark: postmark != nil
            case .ses: sns != nil
            }
        }
    }
}

/// The ESP bounce listener's series on `/metrics`.
public final class ESPEventsMetrics: Sendable {
    private let requests: [String: Counter]
    private let bounces: [String: Counter]
    private let ignored: [ESPProvider: Counter]
    private let replays: [String: Counter]

    /// Request results: accepted, unauthorized, malformed, unavailable.
    public static let results = ["accepted", "unauthorized", "malformed", "unavailable"]
    /// Why a replay was refused: stale (401, the signature's age) or duplicate (200, an event id seen).
    public static let replayReasons = ["stale", "duplicate"]

    public init(registry: MetricsRegistry) {
        var requests: [String: Counter] = [:]
        var bounces: [String: Counter] = [:]
        var ignored: [ESPProvider: Counter] = [:]
        var replays: [String: Counter] = [:]
        for provider in ESPProvider.allCases {
            for result in Self.results {
                requests["\(provider.rawValue)/\(result)"] = registry.counter(
                    "siwa_mailgate_esp_requests_total",
                    help: "ESP bounce-event requests by provider and result.",
                    labels: [("provider", provider.rawValue), ("result", result)])
            }
            for bounceClass in BounceClass.allCases {
                bounces["\(provider.rawValue)/\(bounceClass.rawValue)"] = registry.counter(
                    "siwa_mailgate_esp_bounces_total",
                    help: "Relay-address bounces recorded from ESP events, by provider and class.",
                    labels: [("provider", provider.rawValue), ("class", bounceClass.rawValue)])
            }
            ignored[provider] = registry.counter(
                "siwa_mailgate_esp_bounces_ignored_total",
                help: "ESP bounces for addresses that are not relay addresses (not recorded), by provider.",
                labels: [("provider", provider.rawValue)])
            for reason in Self.replayReasons {
                replays["\(provider.rawValue)/\(reason)"] = registry.counter(
                    "siwa_mailgate_esp_replays_total",
                    help:
                        "ESP requests refused for a stale signature, and events not recorded again for an id already seen, by provider.",
                    labels: [("provider", provider.rawValue), ("reason", reason)])
            }
        }
        self.replays = replays
        self.requests = requests
        self.bounces = bounces
        self.ignored = ignored
    }

    func request(_ provider: ESPProvider, _ result: String) {
        requests["\(provider.rawValue)/\(result)"]?.increment()
    }

    func recorded(_ provider: ESPProvider, _ bounceClass: BounceClass) {
        bounces["\(provider.rawValue)/\(bounceClass.rawValue)"]?.increment()
    }

    func ignored(_ provider: ESPProvider) { ignored[provider]?.increment() }

    func replay(_ provider: ESPProvider, _ reason: String, count: Int = 1) {
        guard count > 0 else { return }
        replays["\(provider.rawValue)/\(reason)"]?.increment(by: count)
    }
}

/// The routes `POST /v1/esp/{mailgun,sendgrid,postmark,ses}`: authenticate as the provider documents,
/// record each relay-address bounce through `siwa.record_relay_bounce` once per event id
/// (`siwa.record_esp_event`), answer 200 (every ESP retries a non-2xx; a duplicate too), 401 for a failed
/// check or a stale signature, 400 for a body not the provider's, 503 when the database is down.
public struct ESPEventsAPI: Sendable {
    private let configuration: ESPEventsConfiguration
    private let sns: SNSVerifier?
    private let pool: PostgresPool
    private let metrics: ESPEventsMetrics
    private let logger: Logger

    public init(
        configuration: ESPEventsConfiguration, pool: PostgresPool, metrics: ESPEventsMetrics, logger: Logger
    ) {
        self.configuration = configuration
        self.pool = pool
        self.metrics = metrics
        self.logger = logger
        let outbound = configuration.outbound
        sns = configuration.sns.map { sns in
            SNSVerifier(configuration: sns) { url in
                let response = try outbound.perform(.init(url: url))
                guard response.status == 200 else {
                    throw ESPEventError(.unauthenticated, "certificate fetch")
                }
                return response.body
            }
        }
    }

    /// Answers one request.
    public func handle(_ request: HTTPRequest) -> HTTPResponse {
        let prefix = "/v1/esp/"
        guard request.path.hasPrefix(prefix),
            let provider = ESPProvider(rawValue: String(request.path.dropFirst(prefix.count))),
            configuration.providers.contains(provider)
        else { return .error(status: 404, "not_found") }
        guard request.method == "POST" else {
            var response = HTTPResponse.error(status: 405, "method_not_allowed")
            response.headers.replaceOrAdd(name: "Allow", value: "POST")
            return response
        }
        let response = answer(provider, request)
        logger.info("esp event", request.callLogFields(endpoint: request.path, response: response))
        return response
    }

    private func answer(_ provider: ESPProvider, _ request: HTTPRequest) -> HTTPResponse {
        let batch: ESPEventBatch
        do {
            batch = try events(provider, request)
        } catch {
            switch error.kind {
            case .unauthenticated, .stale:
                metrics.request(provider, "unauthorized")
                if error.kind == .stale { metrics.replay(provider, "stale") }
                logger.warning(
                    "esp event refused",
                    ["provider": .string(provider.rawValue), "reason": .string(error.reason)])
                return .error(status: 401, "unauthorized")
            case .malformed:
                metrics.request(provider, "malformed")
                return .json(status: 400, ["error": "malformed", "reason": error.reason])
            }
        }
        var recorded = 0
        var ignored = 0
        var duplicates = 0
        do {
            // The ids are kept until no signature carrying them can be accepted; Postmark signs nothing.
            let keepUntil = (batch.signedAt ?? Date()).addingTimeInterval(configuration.maximumAge)
            let outcomes = try record(provider, batch.bounces, keepUntil: keepUntil)
            for (bounce, outcome) in zip(batch.bounces, outcomes) {
                switch outcome {
                case .recorded:
                    recorded += 1
                    metrics.recorded(provider, bounce.bounceClass)
                case .ignored:
                    ignored += 1
                    metrics.ignored(provider)
                case .duplicate: duplicates += 1
                }
            }
            let duplicateEvents = Set(
                zip(batch.bounces, outcomes).compactMap { $1 == .duplicate ? $0.eventID : nil })
            metrics.replay(provider, "duplicate", count: duplicateEvents.count)
            if !duplicateEvents.isEmpty {
                logger.info(
                    "esp events already recorded",
                    ["provider": .string(provider.rawValue), "events": .int(duplicateEvents.count)])
            }
        } catch {
            configuration.mailgun?.forget(batch.replayToken)
            metrics.request(provider, "unavailable")
            // PostgresError's description never carries the server's text (nor so an address).
            logger.error(
                "recording esp bounces failed",
                ["provider": .string(provider.rawValue), "error": .string("\(error)")])
            var response = HTTPResponse.error(status: 503, "unavailable")
            response.headers.replaceOrAdd(name: "Retry-After", value: "30")
            return response
        }
        metrics.request(provider, "accepted")
        return .json([
            "recorded": recorded, "ignored": ignored, "duplicates": duplicates,
            "other_events": batch.otherEvents,
        ])
    }

    /// The provider's check and parse of one request.
    private func events(_ provider: ESPProvider, _ request: HTTPRequest) throws(ESPEventError)
        -> ESPEventBatch
    {
        switch provider {
        case .mailgun:
            return try configuration.mailgun!.events(body: request.body)
        case .sendgrid:
            return try configuration.sendgrid!.events(
                body: request.body, signature: request.headers[SendGridWebhook.signatureHeader],
                timestamp: request.headers[SendGridWebhook.timestampHeader],
                maximumAge: configuration.maximumAge)
        case .postmark:
            return try configuration.postmark!.events(
                body: request.body, authorization: request.headers["Authorization"])
        case .ses:
            let message = try SNSMessage(parsing: request.body)
            try sns!.verify(message, maximumAge: configuration.maximumAge)
            switch message.type {
            case "Notification":
                var batch = try SESNotification.events(message: message.message)
                batch.signedAt = message.signedAt
                for index in batch.bounces.indices { batch.bounces[index].eventID = message.messageID }
                return batch
            case "SubscriptionConfirmation":
                confirm(message)
                return ESPEventBatch(otherEvents: 1)
            default: return ESPEventBatch(otherEvents: 1)
            }
        }
    }

    /// Confirms an SNS subscription by GET of its SubscribeURL on a thread of its own, when the URL's host
    /// is one the certificate check allows; the URL (it holds the token) is never logged.
    private func confirm(_ message: SNSMessage) {
        let fields: [String: Logger.Value] = ["topic_arn": .string(message.topicARN)]
        guard let url = message.subscribeURL, sns?.isAllowedURL(url) == true else {
            logger.warning("sns subscription not confirmed: SubscribeURL not on an allowed host", fields)
            return
        }
        let outbound = configuration.outbound
        let logger = logger
        let thread = Thread {
            do {
                let response = try outbound.perform(.init(url: url))
                if response.status == 200 {
                    logger.info("sns subscription confirmed", fields)
                } else {
                    logger.warning(
                        "sns subscription confirmation refused",
                        fields.merging(["status": .int(response.status)]) { $1 })
                }
            } catch {
                logger.warning(
                    "sns subscription confirmation failed",
                    fields.merging([
                        "error": .string((error as? OutboundHTTP.Error)?.code.rawValue ?? "unknown")
                    ]) { $1 })
            }
        }
        thread.start()
    }

    private enum Outcome { case recorded, ignored, duplicate }

    /// Records the bounces in one transaction with their event ids (the ids and bounces commit or roll
    /// back together, so a retry after a 503 is recorded); each bounce's outcome.
    private func record(_ provider: ESPProvider, _ bounces: [ESPBounce], keepUntil: Date) throws -> [Outcome]
    {
        guard !bounces.isEmpty else { return [] }
        return try pool.withConnection { connection in
            try connection.transaction { connection in
                var fresh: [String: Bool] = [:]
                return try bounces.map { bounce in
                    if let id = bounce.eventID {
                        if fresh[id] == nil {
                            let rows = try connection.query(
                                "SELECT siwa.record_esp_event($1, $2, $3)",
                                [.text(provider.rawValue), .text(id), .date(keepUntil)])
                            fresh[id] = try rows[0][0, as: Bool.self]
                        }
                        if fresh[id] == false { return .duplicate }
                    }
                    let rows = try connection.query(
                        "SELECT recorded FROM siwa.record_relay_bounce($1, $2, $3, $4, $5, $6, $7)",
                        [
                            .text(bounce.bounceClass.rawValue), .text(bounce.recipient),
                            bounce.sendingDomain.map { .text($0) }, .text(bounce.status),
                            .text(bounce.action),
                            bounce.remoteMTA.map { .text($0) }, .text(bounce.provider.rawValue),
                        ])
                    return try rows[0][0, as: Bool.self] ? .recorded : .ignored
                }
            }
        }
    }
}

/// The listener and its pool, as one service of siwa-mailgate's group.
public final class ESPEventsService: Sendable {
    private let server: HTTPServer
    private let pool: PostgresPool

    public init(configuration: ESPEventsConfiguration, metrics: ESPEventsMetrics, logger: Logger) {
        let pool = PostgresPool(
            configuration: configuration.database, maxConnections: max(1, configuration.poolSize),
            acquireTimeout: .seconds(2))
        self.pool = pool
        let api = ESPEventsAPI(configuration: configuration, pool: pool, metrics: metrics, logger: logger)
        server = HTTPServer(configuration: configuration.http) { api.handle($0) }
    }

    /// The bound address, once started.
    public var address: String? { server.address }

    public func start() throws { try server.start() }

    /// Answers the requests in flight, then closes the pool.
    public func shutdown() {
        _ = server.shutdown(gracePeriod: .seconds(5))
        pool.close()
    }
}
