import Dispatch
import Foundation
import Postgres
import Synchronization
import TestSupport
import Testing

/// The changefeed: one siwa.changes row per applied effect, read by apps through
/// siwa.changefeed with a position cursor that never misses a change, NOTIFY siwa_changes, retention.
@Suite("The changefeed: every applied effect once, in a cursor no reader can miss")
struct ChangefeedTests {
    /// Stores a notification as siwa-receiver does, as the owner; `eventTime` is SQL.
    static func insert(
        _ owner: PostgresConnection, jti: String, type: String, sub: String, eventTime: String = "now()",
        email: String? = nil, isPrivateEmail: Bool? = nil, audience: String = "com.example.app"
    ) throws {
        try owner.storeAsReceiver(
            SeededNotification(
                jti: jti, type: type, sub: sub, audience: audience, email: email,
                isPrivateEmail: isPrivateEmail,
                eventTime: owner.instant(eventTime)))
    }

    /// Everything siwa_app reads from the changefeed, in position order, as one line per change.
    static func feed(_ app: PostgresConnection) throws -> [String] {
        try app.query(
            """
            SELECT concat_ws(' ', type, sub, jti, audience, sessions_revoked, refresh_tokens_revoked,
                             coalesce(email, '-'), coalesce(is_private_email::text, '-'))
              FROM siwa.changefeed ORDER BY position
            """
        ).map { try $0[0, as: String.self] }
    }

    static let drain =
        "SELECT count(*)::integer FROM siwa.process_due_notifications(64, 5, interval '1 second')"

    @Test(
        "each applied effect is one change with its counts and email; superseded and unknown events write none"
    )
    func effectsAndSupersededEvents() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.simpleQuery(
            """
            INSERT INTO siwa.sessions (sub, created_at) VALUES
                ('u', now() - interval '3 days'), ('u', now() - interval '2 days'), ('u', now());
            INSERT INTO siwa.refresh_tokens (sub, created_at, token_ciphertext) VALUES
                ('u', now() - interval '3 days', '\\x01');
            INSERT INTO siwa.sessions (sub, created_at) VALUES ('v', now() - interval '1 day');
            """)
        try Self.insert(
            owner, jti: "e-new", type: "email-enabled", sub: "u", eventTime: "now() - interval '1 hour'",
            email: "u@privaterelay.appleid.com", isPrivateEmail: true)
        // Older than the status the previous one set: superseded.
        try Self.insert(
            owner, jti: "e-old", type: "email-disabled", sub: "u", eventTime: "now() - interval '2 hours'",
            email: "old@privaterelay.appleid.com", isPrivateEmail: true)
        try Self.insert(
            owner, jti: "c-new", type: "consent-revoked", sub: "u", eventTime: "now() - interval '1 day'")
        // Older than the consent already revoked, and nothing left to revoke: superseded.
        try Self.insert(
            owner, jti: "c-old", type: "consent-revoked", sub: "u", eventTime: "now() - interval '30 hours'")
        try Self.insert(owner, jti: "x", type: "brand-new-type", sub: "u")
        try Self.insert(owner, jti: "d", type: "account-delete", sub: "v", audience: "com.example.web")
        // A second deletion of a deleted account: superseded.
        try Self.insert(owner, jti: "d-again", type: "account-delete", sub: "v")
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        #expect(try worker.query(Self.drain)[0][0, as: Int.self] == 7)
        let app = try database.connect(as: .app)
        defer { app.close() }
        #expect(
            try Self.feed(app) == [
                "siwa.email_enabled u e-new com.example.app 0 0 u@privaterelay.appleid.com true",
                "siwa.consent_revoked u c-new com.example.app 2 1 - -",
                "siwa.account_deleted v d com.example.web 1 0 - -",
                "siwa.personal_data_erased v d com.example.web 0 0 - -",
            ])
        // Positions 1…4 in the order of ids: nothing is left unnumbered.
        #expect(
            try owner.query("SELECT array_agg(position ORDER BY id)::text FROM siwa.changes")[0][
                0, as: String.self] == "{1,2,3,4}")
    }

    @Test(
        "erasure leaves no email in the user's changes; a delayed erasure is a change of its own, once")
    func erasure() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.execute("UPDATE siwa.settings SET erase_personal_data_after = interval '1 hour'")
        try Self.insert(
            owner, jti: "mail", type: "email-enabled", sub: "u", eventTime: "now() - interval '3 hours'",
            email: "u@privaterelay.appleid.com", isPrivateEmail: true)
        try Self.insert(
            owner, jti: "other", type: "email-enabled", sub: "o", email: "o@privaterelay.appleid.com",
            isPrivateEmail: true)
        try Self.insert(
            owner, jti: "delete", type: "account-delete", sub: "u", eventTime: "now() - interval '2 hours'")
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        _ = try worker.query(Self.drain)
        let app = try database.connect(as: .app)
        defer { app.close() }
        // Deleted, not erased yet: the email stays until the erasure is due.
        #expect(
            try Self.feed(app) == [
                "siwa.email_enabled u mail com.example.app 0 0 u@privaterelay.appleid.com true",
                "siwa.email_enabled o other com.example.app 0 0 o@privaterelay.appleid.com true",
                "siwa.account_deleted u delete com.example.app 0 0 - -",
            ])
        #expect(try worker.query("SELECT siwa.erase_due_personal_data(64)")[0][0, as: Int.self] == 1)
        #expect(try worker.query("SELECT siwa.erase_due_personal_data(64)")[0][0, as: Int.self] == 0)
        #expect(
            try Self.feed(app) == [
                "siwa.email_enabled u mail com.example.app 0 0 - -",
                "siwa.email_enabled o other com.example.app 0 0 o@privaterelay.appleid.com true",
                "siwa.account_deleted u delete com.example.app 0 0 - -",
                "siwa.personal_data_erased u delete com.example.app 0 0 - -",
            ])
        // Its event_time is the deletion's; nothing of the user's email is left in any change.
        #expect(
            try owner.query(
                """
                SELECT c.event_time = a.deleted_at FROM siwa.changes c JOIN siwa.accounts a USING (sub)
                 WHERE c.type = 'siwa.personal_data_erased'
                """)[0][0, as: Bool.self])
        #expect(
            try owner.query(
                "SELECT count(*)::integer FROM siwa.changes WHERE sub = 'u' AND (email IS NOT NULL OR is_private_email IS NOT NULL)"
            )[0][0, as: Int.self] == 0)
        // A late account-delete of the erased account erases nothing again: no second erasure change.
        try owner.execute("UPDATE siwa.settings SET erase_personal_data_after = interval '0'")
        try Self.insert(owner, jti: "delete-again", type: "account-delete", sub: "u")
        _ = try worker.query(Self.drain)
        #expect(try Self.feed(app).count == 4)
    }

    @Test(
        "siwa_app and siwa_admin read siwa.changefeed, but not the table behind it, nor number or write changes"
    )
    func appReadsOnlyTheView() throws {
        let database = try AdminDatabase.make()
        for role in [AdminRole.app, .admin] {
            let connection = try database.connect(as: role)
            defer { connection.close() }
            #expect(throws: Never.self) {
                try connection.query(
                    "SELECT * FROM siwa.changefeed WHERE position > 0 ORDER BY position LIMIT 10")
            }
            for statement in [
                "SELECT * FROM siwa.changes", "SELECT * FROM siwa.changes_counter",
                "SELECT siwa.number_changes()",
                "INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti) VALUES ('siwa.email_enabled', 's', now(), now(), 'j')",
                "UPDATE siwa.changefeed SET email = NULL", "DELETE FROM siwa.changefeed",
            ] {
                #expect(
                    sqlState { try connection.query(statement) } == permissionDenied, "\(role) \(statement)")
            }
        }
        let nobody = try database.connect(as: .nobody)
        defer { nobody.close() }
        #expect(sqlState { try nobody.query("SELECT * FROM siwa.changefeed") } == permissionDenied)
    }

    @Test(
        "a change not numbered yet is invisible to readers, and numbered by the next transaction that numbers"
    )
    func unnumberedChanges() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        // Written without the worker's entry points (which number last): committed without a position.
        try owner.execute(
            """
            INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti, audience)
            VALUES ('siwa.consent_revoked', 'h', now(), now(), 'by-hand', 'com.example.app')
            """)
        let app = try database.connect(as: .app)
        defer { app.close() }
        #expect(try Self.feed(app).isEmpty)
        try Self.insert(owner, jti: "next", type: "consent-revoked", sub: "n")
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        _ = try worker.query(Self.drain)
        // The batch numbers its own changes as it inserts them; the left-over one comes right after.
        #expect(
            try Self.feed(app) == [
                "siwa.consent_revoked n next com.example.app 0 0 - -",
                "siwa.consent_revoked h by-hand com.example.app 0 0 - -",
            ])
    }

    @Test("NOTIFY siwa_changes tells listeners the last readable position once the changes commit")
    func notifiesListeners() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        let app = try database.connect(as: .app)
        defer { app.close() }
        try app.listen("siwa_changes")
        // A batch with nothing to report notifies nobody.
        try Self.insert(owner, jti: "unknown", type: "brand-new-type", sub: "u")
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        _ = try worker.query(Self.drain)
        #expect(try app.waitForNotifications(timeout: .milliseconds(200)).isEmpty)
        for index in 0..<3 {
            try Self.insert(
                owner, jti: "e\(index)", type: "email-enabled", sub: "u\(index)",
                email: "u\(index)@privaterelay.appleid.com")
        }
        try worker.simpleQuery("BEGIN")
        _ = try worker.query(Self.drain)
        #expect(try app.waitForNotifications(timeout: .milliseconds(200)).isEmpty)
        try worker.simpleQuery("COMMIT")
        let notifications = try app.waitForNotifications(timeout: .seconds(10))
        #expect(notifications.map(\.channel) == ["siwa_changes"])
        #expect(notifications.map(\.payload) == ["3"])
    }

    @Test("siwa.prune deletes changes older than siwa.settings.changes_retention, never one not numbered yet")
    func retention() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        for index in 0..<4 {
            try Self.insert(owner, jti: "c\(index)", type: "consent-revoked", sub: "u\(index)")
        }
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        _ = try worker.query(Self.drain)
        try owner.simpleQuery(
            """
            UPDATE siwa.settings SET changes_retention = interval '1 day';
            UPDATE siwa.changes SET applied_at = now() - interval '2 days' WHERE jti IN ('c0', 'c1');
            INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti)
            VALUES ('siwa.consent_revoked', 'unnumbered', now(), now() - interval '2 days', 'late');
            """)
        _ = try worker.query("SELECT * FROM siwa.prune(NULL, NULL)")
        #expect(
            try owner.query("SELECT string_agg(jti, ' ' ORDER BY id) FROM siwa.changes")[0][
                0, as: String.self]
                == "c2 c3 late")
    }

    @Test("siwa.prune keeps a change while a webhook delivery of it is pending, then deletes both")
    func retentionWaitsForWebhookDeliveries() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        try owner.simpleQuery(
            """
            SELECT siwa.add_webhook_endpoint('http://127.0.0.1:9/hooks',
                                             'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw');
            """)
        for index in 0..<2 {
            try Self.insert(owner, jti: "w\(index)", type: "consent-revoked", sub: "v\(index)")
        }
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        _ = try worker.query(Self.drain)
        // Both changes are past the retention; w0's delivery is done, w1's is still pending.
        try owner.simpleQuery(
            """
            UPDATE siwa.settings SET changes_retention = interval '1 day';
            UPDATE siwa.changes SET applied_at = now() - interval '2 days';
            UPDATE siwa.webhook_deliveries d SET state = 'delivered', delivered_at = now()
              FROM siwa.changes c WHERE c.id = d.change_id AND c.jti = 'w0';
            """)
        let changes = "SELECT coalesce(string_agg(jti, ' ' ORDER BY id), '') FROM siwa.changes"
        let deliveries = "SELECT count(*)::integer FROM siwa.webhook_deliveries"
        #expect(try owner.query(deliveries)[0][0, as: Int.self] == 2)
        _ = try worker.query("SELECT * FROM siwa.prune(NULL, NULL)")
        #expect(try owner.query(changes)[0][0, as: String.self] == "w1")
        #expect(try owner.query(deliveries)[0][0, as: Int.self] == 1)
        try owner.simpleQuery("UPDATE siwa.webhook_deliveries SET state = 'dead', last_error = 'gave up'")
        _ = try worker.query("SELECT * FROM siwa.prune(NULL, NULL)")
        #expect(try owner.query(changes)[0][0, as: String.self] == "")
        #expect(try owner.query(deliveries)[0][0, as: Int.self] == 0)
    }

    /// The cursor test's state shared with its threads: what the reader read, in order, and failures.
    final class Shared: Sendable {
        struct Read: Sendable {
            var positions: [Int64] = []
            var ids: [Int64] = []
        }
        let read = Mutex(Read())
        let stop = Atomic<Bool>(false)
        let failures = Mutex<[String]>([])
    }

    @Test(
        "a reader polling with the cursor sees every change exactly once while workers commit out of order")
    func cursorUnderConcurrentWorkers() throws {
        let database = try AdminDatabase.make()
        let owner = try database.connectAsOwner()
        defer { owner.close() }
        // Held back: written first (the lowest ids), numbered and committed last, as a transaction that
        // writes changes and numbers them at its end does (siwa.erase_due_personal_data).
        let total = 400
        try owner.storeAsReceiver(
            (1...total).map { g in
                SeededNotification(
                    jti: "n-\(g)", type: g % 2 == 0 ? "email-enabled" : "consent-revoked", sub: "user-\(g)",
                    email: g % 2 == 0 ? "u\(g)@privaterelay.appleid.com" : nil)
            })
        let held = try database.connect(as: .worker)
        defer { held.close() }
        try held.simpleQuery(
            """
            BEGIN;
            INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti, audience)
            SELECT 'siwa.consent_revoked', 'held-' || g, now(), now(), 'held-' || g, 'com.example.app'
              FROM generate_series(0, 2) AS g ORDER BY g;
            """)
        #expect(
            try held.query("SELECT array_agg(id ORDER BY id)::text FROM siwa.changes")[0][0, as: String.self]
                == "{1,2,3}")

        let shared = Shared()
        let reader = try database.connect(as: .app)
        defer { reader.close() }
        let group = DispatchGroup()
        DispatchQueue.global().async(group: group) {
            var last: Int64 = 0
            do {
                while !shared.stop.load(ordering: .acquiring) {
                    let rows = try reader.query(
                        "SELECT position, id FROM siwa.changefeed WHERE position > $1 ORDER BY position LIMIT 7",
                        [.int(last)])
                    for row in rows {
                        let position = try row[0, as: Int64.self]
                        let id = try row[1, as: Int64.self]
                        shared.read.withLock {
                            $0.positions.append(position)
                            $0.ids.append(id)
                        }
                        last = position
                    }
                }
            } catch {
                shared.failures.withLock { $0.append("reader: \(error)") }
            }
        }
        // A lane holds its batch's transaction open after numbering it: the others' numbering waits for
        // it. Three more lanes drain the rest in small batches meanwhile.
        let holder = try database.connect(as: .worker)
        defer { holder.close() }
        try holder.simpleQuery("BEGIN")
        #expect(
            try holder.query(
                "SELECT count(*)::integer FROM siwa.process_due_notifications(5, 5, interval '1 second')"
            )[0][0, as: Int.self] == 5)
        let lanes = try (0..<3).map { _ in try database.connect(as: .worker) }
        defer { lanes.forEach { $0.close() } }
        for lane in lanes {
            DispatchQueue.global().async(group: group) {
                do {
                    while try lane.query(
                        "SELECT count(*)::integer FROM siwa.process_due_notifications(5, 5, interval '1 second')"
                    )[0][0, as: Int.self] > 0 {}
                } catch {
                    shared.failures.withLock { $0.append("lane: \(error)") }
                }
            }
        }
        // All three lanes wait for the holder's lock on the counter; the reader has seen nothing yet.
        #expect(
            try waitUntil(timeout: .seconds(30)) {
                try owner.query(
                    """
                    SELECT count(*)::integer FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                     WHERE NOT l.granted AND a.datname = current_database()
                    """
                )[0][0, as: Int.self] == 3
            })
        #expect(shared.read.withLock { $0.ids.isEmpty })
        try holder.simpleQuery("COMMIT")

        // Every notification is applied and readable...
        #expect(try waitUntil(timeout: .seconds(60)) { shared.read.withLock { $0.ids.count } == total })
        // ...changes with higher ids than the held ones, which are not readable yet: a reader that kept
        // the last id as its cursor would skip the held ones for good.
        #expect(shared.read.withLock { $0.ids }.allSatisfy { $0 > 3 })
        _ = try held.query("SELECT siwa.number_changes()")
        try held.simpleQuery("COMMIT")
        #expect(
            try waitUntil(timeout: .seconds(30)) { shared.read.withLock { $0.ids.count } >= total + 3 })
        shared.stop.store(true, ordering: .releasing)
        group.wait()
        #expect(shared.failures.withLock { $0 }.isEmpty)
        let result = shared.read.withLock { $0 }
        let allIDs = try owner.query("SELECT id FROM siwa.changes ORDER BY id").map {
            try $0[0, as: Int64.self]
        }
        #expect(allIDs.count == total + 3)
        #expect(result.ids.sorted() == allIDs)  // each exactly once
        #expect(result.positions == Array(1...Int64(total + 3)))  // in order, none skipped
        #expect(Array(result.ids.suffix(3)) == [1, 2, 3])  // the held ones, read last
    }
}
