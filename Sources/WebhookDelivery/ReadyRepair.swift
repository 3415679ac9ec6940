import Postgres
import QueueConsumer

extension WebhookDispatcher {
    /// Lane 0's periodic task that repairs the `ready` hints the transitions could not keep (see
    /// `siwa.repair_webhook_ready`; every transition keeps them).
    var readyRepair: PeriodicTask<PostgresConnection> {
        PeriodicTask("ready repair", every: Self.repairInterval) { connection in
            ["ready_repaired": try connection.value(WebhookQueries.repairReady, as: Int.self)]
        }
    }
}
