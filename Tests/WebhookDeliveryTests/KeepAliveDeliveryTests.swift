import Foundation
import QueueConsumer
import ServiceSupport
import TestSupport
import Testing
import WebhookDelivery
import Webhooks

/// The lanes keep their connections to an endpoint between attempts, counted at a real keep-alive
/// server (``KeepAliveHTTPServer``), and cope with an endpoint that closes them.
@Suite("Webhook lanes keep their connections", .serialized)
struct KeepAliveDeliveryTests {
    static func dispatcher(_ database: WebhookDatabase, lanes: Int, metrics: MetricsRegistry) throws
        -> WebhookDispatcher
    {
        WebhookDispatcher(
            configuration: try WebhookDispatcher.Configuration(
                database: database.configuration, concurrency: lanes, timeout: .seconds(5),
                retryBaseDelay: .milliseconds(50), maxRetryDelay: .milliseconds(200),
                pollInterval: .milliseconds(100)),
            logger: quietLogger, metrics: metrics)
    }

    static func opened(_ metrics: MetricsRegistry) -> Int {
        metrics.counter("siwa_webhook_connections_opened_total", help: "").value
    }

    /// Every exchange's signature checks out with `secret`.
    static func verified(_ exchanges: [KeepAliveHTTPServer.Exchange], _ secret: StandardWebhooks.Secret)
        -> Bool
    {
        exchanges.allSatisfy { exchange in
            (try? StandardWebhooks.verify(
                id: exchange.header("webhook-id"), timestamp: exchange.header("webhook-timestamp"),
                signature: exchange.header("webhook-signature"), body: exchange.body, secrets: [secret]))
                != nil
        }
    }

    @Test("60 deliveries to one endpoint by 3 lanes open at most 3 connections, each signed")
    func atMostOneConnectionPerLane() throws {
        let database = try WebhookDatabase()
        let server = try KeepAliveHTTPServer { _ in (KeepAliveHTTPServer.answer(), .keepOpen) }
        let secret = StandardWebhooks.Secret.generate()
        try database.addEndpoint(url: server.url(), secret: secret, maxInFlight: 8)
        let ids = try database.insertChanges(subs: (0..<12).map { "sub-\($0)" }, count: 5)
        let metrics = MetricsRegistry()
        let running = RunningDispatcher(try Self.dispatcher(database, lanes: 3, metrics: metrics))
        defer { running.stop() }
        #expect(waitUntil(timeout: .seconds(60)) { (try? database.count("delivered")) == ids.count })
        #expect(server.exchanges.count == ids.count)
        #expect(server.connectionsAccepted <= 3, "\(server.connectionsAccepted) connections")
        #expect(Self.opened(metrics) == server.connectionsAccepted)
        #expect(Self.verified(server.exchanges, secret))
    }

    @Test("an endpoint that closes the connection after every answer still gets every delivery")
    func endpointClosingEachConnection() throws {
        let database = try WebhookDatabase()
        let server = try KeepAliveHTTPServer { exchange in
            (KeepAliveHTTPServer.answer(), exchange.connection % 2 == 0 ? .close : .halfClose)
        }
        let secret = StandardWebhooks.Secret.generate()
        try database.addEndpoint(url: server.url(), secret: secret, maxInFlight: 8)
        let ids = try database.insertChanges(subs: (0..<5).map { "sub-\($0)" }, count: 4)
        let metrics = MetricsRegistry()
        let running = RunningDispatcher(try Self.dispatcher(database, lanes: 2, metrics: metrics))
        defer { running.stop() }
        #expect(waitUntil(timeout: .seconds(60)) { (try? database.count("delivered")) == ids.count })
        #expect(try database.count("pending") == 0)
        // Every delivery on a connection of its own, none attempted twice.
        #expect(server.exchanges.count == ids.count)
        #expect(Set(server.exchanges.compactMap { $0.header("webhook-id") }).count == ids.count)
        #expect(server.exchanges.allSatisfy { $0.request == 0 })
        #expect(
            try database.value("SELECT count(*)::int FROM siwa.webhook_attempts WHERE outcome <> 'delivered'")
                as Int == 0)
        #expect(Self.verified(server.exchanges, secret))
    }
}
