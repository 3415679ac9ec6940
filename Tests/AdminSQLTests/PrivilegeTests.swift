import Foundation
import Postgres
import Receiver
import TestSupport
import Testing

@Suite("Roles: each may do what its job needs and nothing else")
struct PrivilegeTests {
    // MARK: siwa_admin

    @Test(
        "siwa_admin cannot read the tables",
        arguments: [
            "siwa.notifications", "siwa.notification_log", "siwa.notification_log_default",
            "siwa.notification_queue", "siwa.retention_state", "siwa.accounts", "siwa.sessions",
            "siwa.refresh_tokens", "siwa.settings", "siwa.schema_version",
        ])
    func adminCannotReadTables(table: String) throws {
        let database = try AdminDatabase.make()
        let admin = try database.connect(as: .admin)
        defer { admin.close() }
        #expect(sqlState { try admin.query("SELECT * FROM \(table)") } == permissionDenied)
    }

    @Test(
        "siwa_admin cannot write anything",
        arguments: [
            "INSERT INTO siwa.accounts (sub) VALUES ('x')",
            "UPDATE siwa.event_history SET state = 'dead'",
            "DELETE FROM siwa.event_history",
            "INSERT INTO siwa.notifications (jti, event_type, sub, audience, event_time, issued_at) "
                + "VALUES ('j', 't', 's', 'a', now(), now())",
            "INSERT INTO siwa.notification_log (jti, event_type, sub, audience, event_time, issued_at) "
                + "VALUES ('j', 't', 's', 'a', now(), now())",
            "UPDATE siwa.settings SET erase_personal_data_after = interval '1 day'",
        ])
    func adminCannotWrite(statement: String) throws {
        let database = try AdminDatabase.make()
        let admin = try database.connect(as: .admin)
        defer { admin.close() }
        // event_history joins log and queue: no view of a join is writable (55000) for anyone.
        #expect([permissionDenied, "55000"].contains(sqlState { try admin.query(statement) }))
    }

    @Test(
        "siwa_admin cannot run the worker's or the owner's functions",
        arguments: [
            "SELECT * FROM siwa.process_due_notifications(10, 5, interval '1 second')",
            "SELECT siwa.requeue(NULL, 'dead')",
            "SELECT siwa.erase_personal_data('x')",
            "SELECT * FROM siwa.prune(interval '1 day', NULL)",
            "SELECT siwa.create_log_partitions(3)",
            "SELECT siwa.drop_log_partitions(interval '1 day')",
        ])
    func adminCannotRunFunctions(statement: String) throws {
        let database = try AdminDatabase.make()
        let admin = try database.connect(as: .admin)
        defer { admin.close() }
        #expect(sqlState { try admin.query(statement) } == permissionDenied)
    }

    @Test("siwa_admin reads the three views")
    func adminReadsViews() throws {
        let database = try AdminDatabase.make()
        let admin = try database.connect(as: .admin)
        defer { admin.close() }
        for view in ["siwa.event_history", "siwa.account_overview", "siwa.queue_health"] {
            #expect(throws: Never.self) { try admin.query("SELECT * FROM \(view)") }
        }
    }

    // MARK: siwa_receiver

    @Test("siwa_receiver stores a notification once, and the workers are woken only for the new row")
    func receiverInserts() throws {
        let database = try AdminDatabase.make()
        let listener = try database.connectAsOwner()
        defer { listener.close() }
        try listener.listen("siwa_notifications")
        let receiver = try database.connect(as: .receiver)
        defer { receiver.close() }
        #expect(try receiver.query("SELECT 1").first?[0, as: Int.self] == 1)

        #expect(try storeAsReceiver(database, jti: "jti-receiver-1", sub: "001000.rita") == .accepted)
        let woken = try listener.waitForNotifications(timeout: .seconds(10))
        #expect(woken.map(\.channel) == ["siwa_notifications"])

        // A redelivery writes nothing and wakes nobody: the next notification is our marker.
        #expect(try storeAsReceiver(database, jti: "jti-receiver-1", sub: "001000.rita") == .duplicate)
        try receiver.notify("siwa_notifications", payload: "marker")
        let next = try listener.waitForNotifications(timeout: .seconds(10))
        #expect(next.map(\.payload) == ["marker"])

        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let stored = try owner.query("SELECT id, state FROM siwa.notifications WHERE jti = 'jti-receiver-1'")
        #expect(stored.count == 1)
        #expect(try stored.first?["state", as: String.self] == "pending")
        #expect(try stored.first?["id", as: Int.self] ?? 0 > 0)
    }

    @Test(
        "siwa_receiver cannot read, change or delete stored notifications",
        arguments: [
            "SELECT raw_token FROM siwa.notifications",
            "SELECT * FROM siwa.notifications",
            "UPDATE siwa.notifications SET state = 'dead'",
            "DELETE FROM siwa.notifications",
            "SELECT raw_token FROM siwa.notification_log",
            "SELECT sub FROM siwa.notification_log",
            "UPDATE siwa.notification_log SET state = 'dead'",
            "DELETE FROM siwa.notification_log",
            "SELECT * FROM siwa.notification_queue",
            "INSERT INTO siwa.notification_queue (id, jti, issued_at, attempts) VALUES (1, 'j', now(), 5)",
            "INSERT INTO siwa.notification_queue (id, jti, issued_at, next_attempt_at) "
                + "VALUES (1, 'j', now(), now() + interval '1 day')",
            "UPDATE siwa.notification_queue SET attempts = 0",
            "DELETE FROM siwa.notification_queue",
            "SELECT siwa.create_log_partitions(3)",
            "SELECT siwa.drop_log_partitions(interval '1 day')",
            "SELECT * FROM siwa.event_history",
            "SELECT * FROM siwa.refresh_tokens",
            "INSERT INTO siwa.accounts (sub) VALUES ('x')",
            "SELECT * FROM siwa.process_due_notifications(10, 5, interval '1 second')",
        ])
    func receiverCannot(statement: String) throws {
        let database = try AdminDatabase.make()
        let receiver = try database.connect(as: .receiver)
        defer { receiver.close() }
        #expect(sqlState { try receiver.query(statement) } == permissionDenied)
    }

    static let receiverMayNotWrite = ["state", "attempts", "applied_at", "last_error", "received_at"]

    @Test("siwa_receiver may not set the columns the worker and erasure own", arguments: receiverMayNotWrite)
    func receiverCannotWriteColumn(column: String) throws {
        let database = try AdminDatabase.make()
        let receiver = try database.connect(as: .receiver)
        defer { receiver.close() }
        let value =
            switch column {
            case "state": "'applied'"
            case "attempts": "0"
            case "last_error": "'x'"
            default: "now()"
            }
        #expect(
            sqlState {
                try receiver.query(
                    """
                    INSERT INTO siwa.notification_log (jti, event_type, sub, audience, event_time, issued_at, \(column))
                    VALUES ('j-\(column)', 'account-delete', '001000.zed', 'com.example.app', now(), now(), \(value))
                    ON CONFLICT (jti, issued_at) DO NOTHING
                    """)
            } == permissionDenied)
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        #expect(try owner.query("SELECT count(*) FROM siwa.notifications")[0][0, as: Int.self] == 0)
    }

    @Test(
        "applied again over a table-wide INSERT grant on the log (as version 1 had), schema.sql takes it back"
    )
    func reapplyRevokesTableWideInsert() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.simpleQuery("GRANT INSERT ON siwa.notification_log TO siwa_receiver")  // as version 1 did
        try TestSchema.apply(on: owner)
        let receiver = try database.connect(as: .receiver)
        defer { receiver.close() }
        #expect(
            sqlState {
                try receiver.query(
                    """
                    INSERT INTO siwa.notification_log (jti, event_type, sub, audience, event_time, issued_at, state)
                    VALUES ('j', 'account-delete', '001000.zed', 'com.example.app', now(), now(), 'applied')
                    """)
            } == permissionDenied)
        #expect(
            try storeAsReceiver(
                database, jti: "jti-after-upgrade", sub: "001000.zed", eventType: "email-enabled",
                email: "zed@privaterelay.appleid.com") == .accepted)
        let stored = try owner.query(
            "SELECT state, email, attempts FROM siwa.notifications WHERE jti = 'jti-after-upgrade'")[0]
        #expect(try stored[0, as: String.self] == "pending")
        #expect(try stored[1, as: String?.self] == "zed@privaterelay.appleid.com")
        #expect(try stored[2, as: Int.self] == 0)
    }

    // MARK: siwa_worker

    @Test("siwa_worker applies a consent revocation end to end: the session is revoked")
    func workerEndToEnd() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.simpleQuery(
            """
            INSERT INTO siwa.sessions (sub, created_at) VALUES ('001000.walt', now() - interval '1 day');
            INSERT INTO siwa.refresh_tokens (sub, token_sha256, token_ciphertext, created_at)
                VALUES ('001000.walt', '\\x0a', '\\x0b', now() - interval '1 day');
            """)
        try storeAsReceiver(database, jti: "jti-walt", sub: "001000.walt")

        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        try worker.listen("siwa_notifications")
        let outcomes = try worker.transaction { connection in
            try connection.query(
                "SELECT outcome FROM siwa.process_due_notifications(10, 5, interval '1 second')"
            )
            .map { try $0[0, as: String.self] }
        }
        #expect(outcomes == ["applied"])
        #expect(try worker.query("SELECT siwa.erase_due_personal_data(100)").first?[0, as: Int.self] == 0)
        #expect(throws: Never.self) { try worker.query("SELECT * FROM siwa.prune(interval '30 days', NULL)") }
        #expect(
            try worker.query("SELECT siwa.record_failure(-1, 'x', 5, interval '1 second')").first?[
                0, as: String.self] == "gone")

        let session = try #require(
            try owner.query("SELECT revoked_at, revoke_reason FROM siwa.sessions WHERE sub = '001000.walt'")
                .first)
        #expect(try session["revoked_at", as: Date?.self] != nil)
        #expect(try session["revoke_reason", as: String?.self] == "consent-revoked")
        let token = try #require(
            try owner.query("SELECT revoke_reason FROM siwa.refresh_tokens WHERE sub = '001000.walt'").first)
        #expect(try token["revoke_reason", as: String?.self] == "consent-revoked")
        let account = try owner.query(
            "SELECT consent_revoked_at FROM siwa.accounts WHERE sub = '001000.walt'")
        #expect(try account.first?["consent_revoked_at", as: Date?.self] != nil)
    }

    @Test(
        "siwa_worker cannot insert notifications, requeue or change settings",
        arguments: [
            "INSERT INTO siwa.notifications (jti, event_type, sub, audience, event_time, issued_at) "
                + "VALUES ('j', 't', 's', 'a', now(), now())",
            "INSERT INTO siwa.notification_log (jti, event_type, sub, audience, event_time, issued_at) "
                + "VALUES ('j', 't', 's', 'a', now(), now())",
            "INSERT INTO siwa.notification_queue (id, jti, issued_at) VALUES (1, 'j', now())",
            "SELECT siwa.create_log_partition(current_date + 400)",
            "DROP TABLE siwa.notification_log_default",
            "SELECT siwa.requeue(NULL, 'dead')",
            "UPDATE siwa.settings SET erase_personal_data_after = interval '1 day'",
            "DELETE FROM siwa.accounts",
        ])
    func workerCannot(statement: String) throws {
        let database = try AdminDatabase.make()
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        #expect(sqlState { try worker.query(statement) } == permissionDenied)
    }

    // MARK: PUBLIC

    @Test("a login role without a siwa role can use nothing in schema siwa")
    func publicGetsNothing() throws {
        let database = try AdminDatabase.make()
        let nobody = try database.connect(as: .nobody)
        defer { nobody.close() }
        #expect(sqlState { try nobody.query("SELECT * FROM siwa.queue_health") } == permissionDenied)
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let executable = try owner.query(
            """
            SELECT count(*) FROM pg_proc p
             WHERE p.pronamespace = 'siwa'::regnamespace
               AND has_function_privilege($1, p.oid, 'EXECUTE')
            """, [.text(AdminRole.nobody.loginName)])
        #expect(try executable.first?[0, as: Int.self] == 0)
        let readable = try owner.query(
            """
            SELECT count(*) FROM pg_class c
             WHERE c.relnamespace = 'siwa'::regnamespace AND c.relkind IN ('r', 'v', 'p', 'm')
               AND has_table_privilege($1, c.oid, 'SELECT, INSERT, UPDATE, DELETE')
            """, [.text(AdminRole.nobody.loginName)])
        #expect(try readable.first?[0, as: Int.self] == 0)
    }
}
