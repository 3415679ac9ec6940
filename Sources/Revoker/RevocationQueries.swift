/// The statements the revoker runs that are not a typed row's own (``RevocationClaim``), in one place.
enum RevocationQueries {
    /// An attempt recorded: its state (revoked, partially_revoked, failed, retry, busy, lost).
    static let record = """
        SELECT siwa.record_revocation($1, $2, $3::bigint[], $4::bytea[], $5, $6, $7, $8::float8, $9::jsonb)
        """

    /// A request given back unrecorded (its lease released).
    static let release = "SELECT siwa.release_revocation($1, $2)"
}
