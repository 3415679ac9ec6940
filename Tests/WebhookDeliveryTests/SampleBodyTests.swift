import Foundation
import Postgres
import QueueConsumer
import TestSupport
import Testing
import WebhookDelivery
import Webhooks

// MARK: - The developer loop: samples are what the worker sends

@Suite("Sample deliveries (siwactl webhooks send) are what the worker sends", .serialized)
struct SampleBodyTests {
    @Test(
        "for every type, the worker's body of a change holding a sample's fields is the sample's body, byte for byte"
    )
    func sampleIsTheWorkersBody() throws {
        let database = try WebhookDatabase()
        let receiver = try WebhookReceiver()
        try database.addEndpoint(url: receiver.url, secret: .generate())
        var samples: [Int: WebhookChange] = [:]
        for type in WebhookChange.types {
            let sample = WebhookChange.sample(type: type, changeID: 0)
            // The change row as the worker writes it, with the sample's values.
            let id = try database.connection.query(
                """
                INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti, audience, sessions_revoked,
                                          refresh_tokens_revoked, email, is_private_email, old_sub)
                VALUES ($1, $2, $3, $4, $5, $6, $7::integer, $8::integer, $9, $10::boolean, $11)
                RETURNING id
                """,
                [
                    .text(sample.type), .text(sample.sub), .date(sample.eventTime), .date(sample.appliedAt),
                    .text(sample.jti), sample.audience.map { .text($0) }, .int(Int64(sample.sessionsRevoked)),
                    .int(Int64(sample.refreshTokensRevoked)), sample.email.map { .text($0) },
                    sample.isPrivateEmail.map { .bool($0) }, sample.oldSub.map { .text($0) },
                ])[0][0, as: Int.self]
            var numbered = sample
            numbered.changeID = id
            samples[id] = numbered
        }
        let outcomes = try database.dispatcher().drainOnce()
        #expect(
            outcomes.count == WebhookChange.types.count && outcomes.allSatisfy { $0.state == .delivered })
        #expect(receiver.accepted.count == WebhookChange.types.count)
        for delivery in receiver.accepted {
            let sample = try #require(samples[delivery.changeID])
            #expect(delivery.id == sample.webhookID(endpoint: 1))
            #expect(
                String(decoding: delivery.body, as: UTF8.self)
                    == String(decoding: sample.body, as: UTF8.self),
                "\(sample.type)")
        }
        #expect(Set(receiver.accepted.compactMap { $0.json["type"] as? String }) == Set(WebhookChange.types))
    }
}
