import Foundation
import HTTPClient
import Postgres
import TestSupport

/// siwactl's helpers on TestSupport's `TestDatabase`.
extension TestDatabase {
    /// Inserts one notification as the receiver and worker would have left it.
    /// - Parameters:
    ///   - receivedAgo: seconds before now that it was received.
    ///   - appliedAfter: seconds after receipt that it was applied (nil: 0 for an applied or skipped
    ///     one, which always has an applied_at; not applied otherwise).
    ///   - dueIn: seconds from now until its next attempt.
    ///   - lastError: the stored error (nil: a made-up one for a dead notification, which always has one).
    func insert(
        jti: String, type: String = "consent-revoked", sub: String = "001.sub", state: String = "pending",
        attempts: Int = 0, receivedAgo: Double = 0, appliedAfter: Double? = nil, dueIn: Double = 0,
        lastError: String? = nil
    ) throws {
        let appliedAfter = appliedAfter ?? (state == "applied" || state == "skipped" ? 0 : nil)
        let lastError = lastError ?? (state == "dead" ? "P0001: gave up" : nil)
        try query(
            """
            INSERT INTO siwa.notifications (jti, event_type, sub, audience, event_time, issued_at, received_at,
                                            state, attempts, next_attempt_at, applied_at, last_error)
            VALUES ($1, $2, $3, 'com.example.app', now(), now(), now() - make_interval(secs => $4), $5, $6,
                    now() + make_interval(secs => $7),
                    now() - make_interval(secs => $4) + make_interval(secs => $8::float8), $9)
            """,
            [
                .text(jti), .text(type), .text(sub), .double(receivedAgo), .text(state),
                .int(Int64(attempts)),
                .double(dueIn), appliedAfter.map(PostgresData.double), lastError.map(PostgresData.text),
            ])
    }

    func state(of jti: String) throws -> String? {
        try query("SELECT state FROM siwa.notifications WHERE jti = $1", [.text(jti)]).first?[
            0, as: String.self]
    }
}

/// POSTs `body` to `url` as a webhook delivery with these headers, from a client of the test's own;
/// returns the status answered (for forged, stale and hand-signed deliveries).
func postDelivery(to url: String, id: String, timestamp: Int, body: [UInt8], signature: String) throws -> Int
{
    try OutboundHTTP.Client().perform(
        OutboundHTTP.Request(
            method: "POST", url: url,
            headers: [
                .init("webhook-id", id), .init("webhook-timestamp", String(timestamp)),
                .init("webhook-signature", signature),
            ], body: body)
    ).status
}
