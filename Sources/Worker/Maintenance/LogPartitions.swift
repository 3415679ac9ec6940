import Postgres
import QueueConsumer

extension Maintenance {
    /// Creates the history's month partitions, this month and the next (a no-op while they exist; rows
    /// of a month without one wait in the DEFAULT partition and move when it is created).
    var logPartitions: PeriodicTask<PostgresConnection> {
        PeriodicTask("log partitions", every: configuration.maintenanceInterval) { connection in
            try connection.query("SELECT siwa.create_log_partitions(1)")
            return [:]
        }
    }
}
