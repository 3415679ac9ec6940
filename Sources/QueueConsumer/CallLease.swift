/// How long a consumer that calls out (an ``Outbox``, the refresh check) leases the rows
/// it claimed: the one rule for every lease (schema/54-leases.sql; docs/operations.md § 12).
///
/// A lease covers one call: its deadline plus ``margin``. The claim commits before the call and the
/// record starts after it, so a consumer killed mid-call is taken over within seconds of its deadline,
/// and a live one never has its lease taken while its call can still answer.
public enum CallLease {
    /// What a lease adds to its call's deadline: the claim's commit before the call, the record's start
    /// after it.
    public static let margin: Duration = .seconds(5)

    /// How long after its claim a consumer may still start a call of a batch it claimed at once.
    public static let batchWindow: Duration = .seconds(2)

    /// The lease for a call with this deadline.
    public static func covering(_ deadline: Duration) -> Duration { deadline + margin }

    /// The lease for each row of a batch whose calls have this deadline, each started within
    /// ``batchWindow`` of the claim.
    public static func covering(batchOf deadline: Duration) -> Duration { deadline + batchWindow + margin }

    /// Makes the calls of a batch claimed at `claimed` one after another, in order, until one fails,
    /// ``batchWindow`` has passed or `isStopping` says so; returns the results and the rows left unsent
    /// (for the caller to release).
    public static func callInTurn<Row, Result>(
        _ rows: [Row], claimed: ContinuousClock.Instant, isStopping: () -> Bool, call: (Row) -> Result,
        failed: (Result) -> Bool
    ) -> (results: [Result], unsent: [Row]) {
        var results: [Result] = []
        for (index, row) in rows.enumerated() {
            if isStopping() || results.contains(where: failed)
                || (!results.isEmpty && claimed.duration(to: .now) > batchWindow)
            {
                return (results, Array(rows[index...]))
            }
            results.append(call(row))
        }
        return (results, [])
    }
}
