/// The statements the Shared Signals push lanes run that are not a typed row's own (``ClaimedSET``), in
/// one place.
enum SignalQueries {
    /// Whether a due queue head nobody holds exists on an enabled push stream, yet the claim took none:
    /// its stream is at max_in_flight or another lane holds its row. The due index's probe, as in
    /// `siwa.claim_ssf_events`.
    static let saturated = """
        SELECT EXISTS (
            SELECT 1 FROM siwa.ssf_streams s
             WHERE s.status = 'enabled' AND s.delivery_method = 'urn:ietf:rfc:8935'
               AND (SELECT e.id FROM siwa.ssf_events e
                     WHERE (e.stream_id, e.id) BETWEEN (s.id, 0) AND (s.id, 9223372036854775807)
                       AND e.state = 'pending' AND e.next_attempt_at <= now()
                       AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= clock_timestamp())
                     ORDER BY e.stream_id, e.id LIMIT 1) IS NOT NULL)
        """

    /// Seconds until the next event of an enabled push stream is due (a retry, or a lease's end).
    static let nextDue = """
        SELECT extract(epoch FROM min(CASE WHEN e.lease_expires_at > clock_timestamp() THEN e.lease_expires_at
                                           ELSE e.next_attempt_at END) - clock_timestamp())::float8
          FROM siwa.ssf_events e JOIN siwa.ssf_streams s ON s.id = e.stream_id AND s.status = 'enabled'
               AND s.delivery_method = 'urn:ietf:rfc:8935'
         WHERE e.state = 'pending'
        """

    /// A batch's pushes (and releases) recorded; the ids whose lease was still the caller's.
    static let recordAttempts = """
        SELECT siwa.record_ssf_attempts($1, $2::bigint[], $3::text[], $4::integer[], $5::text[], $6::integer,
                                        $7::float8 * interval '1 second', $8::float8 * interval '1 second')
        """
}
