/// The statements the suppression lanes run that are not a typed row's own (``ClaimedSuppression``), in
/// one place.
enum SuppressionQueries {
    /// Seconds until the provider's ($1) next queue head is due: a retry's time, a lease's end, an erased
    /// account's erase_by (queue heads only: a row behind another of its address waits for it).
    static let nextDue = """
        SELECT extract(epoch FROM min(least(CASE WHEN r.lease_expires_at > clock_timestamp()
                                                 THEN r.lease_expires_at ELSE r.next_attempt_at END,
                                            r.erase_by)) - clock_timestamp())::float8
          FROM siwa.suppression_outbox r
          JOIN siwa.suppression_providers p ON p.name = r.provider AND p.enabled
         WHERE r.state = 'pending' AND r.provider = $1
           AND NOT EXISTS (SELECT 1 FROM siwa.suppression_outbox q
                            WHERE q.provider = r.provider AND q.address_key = r.address_key
                              AND q.state = 'pending' AND q.id < r.id)
        """

    /// Whether an earlier attempt of the leased add ($1, owner $2) sent it, when the address is listed
    /// ($3); else marks it sent by this attempt, before the call.
    static let addSent = "SELECT siwa.suppression_add_sent($1, $2, $3)"

    /// When we recorded adding the address ($2) to the provider's ($1) list (null: we hold no record).
    static let addedAt = "SELECT siwa.suppression_added_at($1, $2)"

    /// A batch's attempts (and releases) recorded; the ids whose lease was still the caller's.
    static let recordAttempts = """
        SELECT siwa.record_suppression_attempts($1, $2::bigint[], $3::text[], $4::integer[], $5::text[],
                                                $6::float8[], $7::integer, $8::float8 * interval '1 second',
                                                $9::float8 * interval '1 second')
        """

    /// Finished rows older than $1 seconds pruned, 10,000 at most; how many.
    static let prune = "SELECT siwa.prune_suppressions($1::float8 * interval '1 second', 10000)"
}
