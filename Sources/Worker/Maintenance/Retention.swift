import Postgres
import QueueConsumer
import ServiceSupport

extension Maintenance {
    /// Prunes what the retention settings let go (`siwa.prune`), 1000 rows a call.
    var retention: PeriodicTask<PostgresConnection> {
        PeriodicTask("retention", every: configuration.maintenanceInterval) {
            [worker, configuration] connection in
            var tokens = 0
            var rows = 0
            // Always: besides the raw tokens and months of history the flags ask for (NULL: kept), it
            // deletes dedupe keys past their window and changes past siwa.settings.changes_retention.
            for _ in 0..<100 where !worker.isStopping {
                guard
                    let row = try connection.query(
                        """
                        SELECT tokens_pruned, rows_pruned FROM siwa.prune(
                            $1::float8 * interval '1 second', $2::float8 * interval '1 second', 1000)
                        """,
                        [
                            configuration.retainTokens.map { .double($0.inSeconds) },
                            configuration.retainEvents.map { .double($0.inSeconds) },
                        ]
                    ).first
                else { break }
                let (t, r) = (try row[0, as: Int.self], try row[1, as: Int.self])
                tokens += t
                rows += r
                if t == 0 && r == 0 { break }
            }
            return ["tokens_pruned": tokens, "rows_pruned": rows]
        }
    }
}
