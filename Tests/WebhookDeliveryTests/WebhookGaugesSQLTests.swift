import Foundation
import Postgres
import TestSupport
import Testing
import Webhooks

/// `siwa.webhook_endpoint_gauges()` and the run of failures siwa.record_webhook_attempt keeps on the
/// endpoint's row, as the roles in question.
@Suite("Webhook endpoint gauges in SQL")
struct WebhookGaugesSQLTests {
    @Test(
        "the worker's recorded attempts count a run of failures that a delivery ends; siwa_worker and siwa_admin read the gauges, no other role"
    )
    func gaugesAndGrants() throws {
        let database = try AdminDatabase.make()
        let endpoint = try database.addEndpoint(
            url: "https://user.example.com:8443/hooks/secret-path?token=abc", secret: .generate())
        try database.insertChange(sub: "001.gauge")
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        let admin = try database.connect(as: .admin)
        defer { admin.close() }
        let gauges = """
            SELECT endpoint_id, host, enabled, pending, dead, consecutive_failures, failing_since IS NOT NULL
              FROM siwa.webhook_endpoint_gauges()
            """
        func attempt(_ outcome: String, status: Int) throws {
            let claimed = try worker.query(
                "SELECT delivery_id FROM siwa.claim_webhook_delivery('gauge-test', interval '1 minute', '{}', now() + interval '1 day')"
            )[0]
            #expect(
                try worker.query(
                    "SELECT siwa.record_webhook_attempt($1, 'gauge-test', now(), 5, $2::integer, $3, 0, 'HTTP')",
                    [.int(Int64(try claimed[0, as: Int.self])), .int(Int64(status)), .text(outcome)])[0][
                        0, as: Bool.self])
        }
        try attempt("retry", status: 503)
        try attempt("retry", status: 500)
        for connection in [worker, admin] {
            let row = try connection.query(gauges)[0]
            #expect(try row[0, as: Int.self] == endpoint)
            #expect(try row[1, as: String.self] == "user.example.com:8443")  // never the path or query
            #expect(try row[2, as: Bool.self])
            #expect(try row[3, as: Int.self] == 1)
            #expect(try row[4, as: Int.self] == 0)
            #expect(try row[5, as: Int.self] == 2)
            #expect(try row[6, as: Bool.self])
        }
        try attempt("delivered", status: 204)
        let row = try admin.query(gauges)[0]
        #expect(try row[3, as: Int.self] == 0)
        #expect(try row[5, as: Int.self] == 0)
        #expect(try !row[6, as: Bool.self])
        #expect(
            try database.value(
                "SELECT last_failure_at IS NOT NULL FROM siwa.webhook_endpoints WHERE id = $1",
                [.int(Int64(endpoint))]) as Bool)

        for role in [AdminRole.receiver, .app, .signin, .nobody] {
            let connection = try database.connect(as: role)
            defer { connection.close() }
            #expect(sqlState { try connection.query(gauges) } == permissionDenied, "\(role)")
        }
        #expect(
            sqlState { try admin.query("SELECT * FROM siwa.webhook_endpoints") } == permissionDenied)
    }
}
