/// The statements the auth adapter lanes run that are not a typed row's own (``ClaimedAdapterEvent``), in
/// one place.
enum AuthAdapterQueries {
    /// The enabled adapters: name, id, platform.
    static let enabledAdapters =
        "SELECT name, id, platform FROM siwa.auth_adapters WHERE enabled ORDER BY name"

    /// Seconds until the adapter's ($1) next pending row is due (a retry's time, or a lease's end).
    static let nextDue = """
        SELECT extract(epoch FROM min(CASE WHEN e.lease_expires_at > clock_timestamp() THEN e.lease_expires_at
                                           ELSE e.next_attempt_at END) - clock_timestamp())::float8
          FROM siwa.auth_adapter_events e
         WHERE (e.adapter_id, e.id) BETWEEN ($1::bigint, 0) AND ($1::bigint, 9223372036854775807)
           AND e.state = 'pending'
        """

    /// A batch's outcomes (and releases) recorded; the ids whose lease was still the caller's.
    static let record = """
        SELECT siwa.record_auth_adapter_events($1, $2::bigint[], $3::text[], $4::text[], $5::jsonb[], $6::integer,
                                               $7::float8 * interval '1 second', $8::float8 * interval '1 second')
        """

}
