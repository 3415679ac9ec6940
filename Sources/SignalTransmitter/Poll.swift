import Foundation
import HTTPServer
import Postgres
import ServiceSupport
import SharedSignals

extension SignalTransmitter {
    /// Poll delivery (RFC 8936) of one of the caller's poll streams, with `ssf.read`: `ack` and `setErrs`
    /// applied and up to `maxEvents` SETs leased in one transaction; without `returnImmediately` it waits
    /// (up to the long-poll limit, no transaction or connection held) until a SET is there.
    func poll(_ request: HTTPRequest, streamID uid: String) throws -> HTTPResponse {
        let caller: Caller
        switch try authenticate(request, scope: Scope.read) {
        case .success(let found): caller = found
        case .failure(let refusal): return refusal
        }
        guard let stream = try stream(uid, of: caller), stream.method == DeliveryMethod.poll else {
            return .streamNotFound
        }
        let object = request.body.isEmpty ? [:] : jsonBody(request)
        guard let object else {
            return .ssfError(status: 400, "invalid_request", "the body is a JSON object")
        }
        var maxEvents = 100
        if let given = object["maxEvents"] {
            guard let number = given as? Int, number >= 0 else {
                return .ssfError(status: 400, "invalid_request", "maxEvents is a non-negative integer")
            }
            maxEvents = min(number, 1000)
        }
        let returnImmediately = object["returnImmediately"] as? Bool ?? false
        var acks = (object["ack"] as? [Any] ?? []).compactMap { $0 as? String }
        guard acks.count <= 10_000 else { return .ssfError(status: 400, "invalid_request", "too many acks") }
        var errors = "{}"
        if let given = object["setErrs"] {
            guard let map = given as? [String: Any], map.count <= 10_000,
                let data = try? JSONSerialization.data(withJSONObject: map)
            else { return .ssfError(status: 400, "invalid_request", "setErrs is an object") }
            errors = String(decoding: data, as: UTF8.self)
        }
        let deadline = ContinuousClock.now + configuration.longPollLimit
        var events: [StoredEvent] = []
        while true {
            let generation = waker.generation
            events = try pool.withConnection { connection in
                try connection.transaction { connection in
                    try connection.query(
                        """
                        SELECT jti, issued_at, change_type, sub, old_sub, event_time, txn, detail::text
                          FROM siwa.poll_ssf_events($1, $2::text[], $3::jsonb, $4::integer,
                                                    $5::float8 * interval '1 second')
                        """,
                        [
                            .int(Int64(stream.id)), .array(acks.map { .text($0) }), .text(errors),
                            .int(Int64(maxEvents)), .double(configuration.pollLease.inSeconds),
                        ]
                    ).map { row throws(PostgresError) in
                        StoredEvent(
                            changeType: try row[2, as: String.self], subject: try row[3, as: String.self],
                            previousSubject: try row[4, as: String?.self],
                            eventTime: try row[5, as: Date.self],
                            notificationJTI: try row[6, as: String.self],
                            detail: StoredEvent.detail(fromJSON: try row[7, as: String?.self]),
                            jti: try row[0, as: String.self], issuedAt: try row[1, as: Date.self])
                    }
                }
            }
            acks = []
            errors = "{}"
            if !events.isEmpty || returnImmediately || maxEvents == 0 || waker.isStopped { break }
            guard waker.wait(after: generation, until: deadline) else { break }
        }
        var sets: [String: String] = [:]
        for event in events {
            sets[event.jti] = try event.sign(
                with: configuration.key, issuer: configuration.issuer, audience: stream.audience)
        }
        let more = try pool.withConnection { connection in
            try connection.value("SELECT siwa.ssf_poll_has_more($1)", [.int(Int64(stream.id))], as: Bool.self)
        }
        return .jsonObject(200, ["sets": sets, "moreAvailable": more] as [String: Any])
    }
}
