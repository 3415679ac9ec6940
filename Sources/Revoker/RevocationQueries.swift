/// The statements the revoker and its periodic tasks run that are not a typed row's own
/// (``RevocationClaim``, ``RefreshCheckClaim``), in one place.
enum RevocationQueries {
    /// An attempt recorded: its state (revoked, partially_revoked, failed, retry, busy, lost).
    static let record = """
        SELECT siwa.record_revocation($1, $2, $3::bigint[], $4::bytea[], $5, $6, $7, $8::float8, $9::jsonb)
        """

    /// A request given back unrecorded (its lease released).
    static let release = "SELECT siwa.release_revocation($1, $2)"

    /// A refresh check's answer recorded (the consent-revoked's jti when Apple said invalid_grant).
    static let recordRefreshCheck = "SELECT siwa.record_refresh_check($1, $2, $3)"

    /// Sign-in codes older than $1 seconds forgotten; how many.
    static let pruneSignInCodes = "SELECT siwa.prune_sign_in_codes($1::float8 * interval '1 second')"
}
