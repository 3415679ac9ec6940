import Foundation
import Postgres
import ServiceSupport
import TestSupport
import Testing
import Worker

/// How the tests count subtransaction XIDs: a row written inside a subtransaction carries that
/// subtransaction's XID as its xmin, and a rolled-back one's rows vanish with it. So the distinct xmins of
/// rows written in one transaction, one per subtransaction, are the XIDs of its committed
/// subtransactions: exactly what PostgreSQL keeps in the transaction's cache of 64
/// (PGPROC_MAX_CACHED_SUBXIDS) until it ends, and what overflows it.
/// PostgreSQL's cache of subtransaction XIDs per transaction.
private let cachedSubtransactions = 64

@Suite("Batches stay within PostgreSQL's 64 cached subtransactions per transaction")
struct SubtransactionTests {
    @Test("with its default batch size the worker's transactions never hold more than 64 subtransaction XIDs")
    func workerBatchesStayInTheCache() throws {
        let db = try TestDatabase()
        // The hook runs inside each notification's subtransaction: its row's xmin is that subtransaction's
        // XID, and `top` the batch transaction's.
        try db.connection.simpleQuery(
            """
            CREATE TABLE public.hook_rows (top xid8 NOT NULL);
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text)
            RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
            BEGIN
                INSERT INTO public.hook_rows (top) VALUES (pg_catalog.pg_current_xact_id());
            END $$;
            """)
        try db.connection.storeAsReceiver(
            (1...200).map { SeededNotification(jti: "sx-\($0)", sub: "sx-user-\($0)") })
        let worker = Worker(
            configuration: try Worker.Configuration(
                database: db.configuration, verification: .tests, concurrency: 1),
            logger: quietLogger)
        #expect(worker.configuration.batchSize == Worker.Configuration.defaultBatchSize)
        #expect(try worker.drainOnce().applied == 200)
        let most = try db.value(
            """
            SELECT max(c)::integer FROM (SELECT count(DISTINCT xmin::text) AS c FROM public.hook_rows
                                          GROUP BY top) AS batches
            """, as: Int.self)
        #expect(most <= cachedSubtransactions)
        // The set-based pass applies a whole batch in one subtransaction (siwa.apply_claimed_batch).
        #expect(most == 1)
    }

    @Test(
        "a batch that falls back to one subtransaction per notification stays within 64 subtransaction XIDs")
    func fallbackBatchesStayInTheCache() throws {
        let db = try TestDatabase()
        // One event per batch raises in the hook, so every batch's set-based pass fails and is rolled back
        // (giving its XID back), and the batch is processed one subtransaction per notification.
        try db.connection.simpleQuery(
            """
            CREATE TABLE public.hook_rows (top xid8 NOT NULL);
            CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                     email text, jti text) RETURNS void
            LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
            BEGIN
                IF jti LIKE 'sx-bad-%' THEN RAISE EXCEPTION 'refusing'; END IF;
                INSERT INTO public.hook_rows (top) VALUES (pg_catalog.pg_current_xact_id());
            END $$;
            """)
        try db.connection.storeAsReceiver(
            (1...192).map {
                SeededNotification(jti: ($0 % 64 == 1 ? "sx-bad-" : "sx-") + "\($0)", sub: "sx-user-\($0)")
            })
        let worker = Worker(
            configuration: try Worker.Configuration(
                database: db.configuration, verification: .tests, concurrency: 1, maxAttempts: 1),
            logger: quietLogger)
        #expect(try worker.drainOnce().applied == 189)
        let most = try db.value(
            """
            SELECT max(c)::integer FROM (SELECT count(DISTINCT xmin::text) AS c FROM public.hook_rows
                                          GROUP BY top) AS batches
            """, as: Int.self)
        #expect(most <= cachedSubtransactions)
        #expect(most == Worker.Configuration.maxBatchSize - 1)
    }

    @Test("siwa.process_due_notifications claims at most 64, whatever it is asked for")
    func processingFunctionCaps() throws {
        let db = try TestDatabase()
        try db.connection.storeAsReceiver(
            (1...100).map { SeededNotification(jti: "cap-\($0)", sub: "cap-user-\($0)") })
        let (handled, subtransactions) = try db.connection.transaction { connection in
            let handled = try connection.query(
                "SELECT outcome FROM siwa.process_due_notifications(1000, 5, interval '1 second')"
            ).count
            // The batch was applied and marked in one subtransaction: the set-based pass's.
            let subtransactions = try connection.query(
                """
                SELECT count(DISTINCT xmin::text)::integer FROM siwa.notification_log
                 WHERE state = 'applied' AND xmin::text::bigint <> (pg_current_xact_id()::text::bigint % 4294967296)
                """)[0][0, as: Int.self]
            return (handled, subtransactions)
        }
        #expect(handled == cachedSubtransactions)
        #expect(subtransactions == 1)
        #expect(
            try db.value("SELECT count(*)::integer FROM siwa.notifications WHERE state = 'pending'") == 36)
    }

    @Test("siwa.erase_due_personal_data erases at most 64 accounts per call, whatever it is asked for")
    func erasureCaps() throws {
        let db = try TestDatabase()
        try db.connection.simpleQuery(
            """
            UPDATE siwa.settings SET erase_personal_data_after = interval '1 hour';
            INSERT INTO siwa.accounts (sub, email, deleted_at)
            SELECT 'gone-' || g, 'gone' || g || '@privaterelay.appleid.com', now() - interval '1 day'
              FROM generate_series(1, 100) AS g;
            """)
        let (erased, subtransactions) = try db.connection.transaction { connection in
            let erased = try connection.query("SELECT siwa.erase_due_personal_data(1000)")[0][0, as: Int.self]
            // Each account was erased inside its own subtransaction.
            let subtransactions = try connection.query(
                """
                SELECT count(DISTINCT xmin::text)::integer FROM siwa.accounts
                 WHERE personal_data_erased_at IS NOT NULL
                   AND xmin::text::bigint <> (pg_current_xact_id()::text::bigint % 4294967296)
                """)[0][0, as: Int.self]
            return (erased, subtransactions)
        }
        #expect(erased == cachedSubtransactions)
        #expect(subtransactions == cachedSubtransactions)
        // The worker's maintenance pass erases the rest in further transactions.
        let worker = try db.worker(concurrency: 1)
        _ = try worker.drainOnce()
        #expect(
            try db.value(
                "SELECT count(*)::integer FROM siwa.accounts WHERE personal_data_erased_at IS NULL") == 0)
    }

    @Test("a batch size above 64 is refused")
    func largerBatchRefused() throws {
        let database = try PostgresConfiguration("host=/nonexistent dbname=x")
        #expect(throws: ConfigurationError.self) {
            _ = try Worker.Configuration(
                database: database, verification: .tests, batchSize: Worker.Configuration.maxBatchSize + 1)
        }
    }
}
