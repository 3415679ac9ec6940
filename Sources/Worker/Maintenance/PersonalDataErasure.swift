import Postgres
import QueueConsumer

extension Maintenance {
    /// Erases the personal data that has become due, at most 100 calls of 64 accounts a pass.
    var personalDataErasure: PeriodicTask<PostgresConnection> {
        PeriodicTask("personal data erasure", every: configuration.maintenanceInterval) {
            [worker] connection in
            // Each call is its own transaction of at most 64 accounts, one subtransaction each (the
            // subtransaction cache's size, see Worker.Configuration.maxBatchSize).
            var erased = 0
            for _ in 0..<100 where !worker.isStopping {
                let count = try connection.value("SELECT siwa.erase_due_personal_data(64)", as: Int.self)
                erased += count
                if count < 64 { break }
            }
            return ["personal_data_erased": erased]
        }
    }
}
