import Foundation
import Postgres
import TestSupport
import Testing
import Webhooks

/// `siwa.claim_webhook_deliveries` and `siwa.record_webhook_attempts` (and their one-delivery forms) as
/// siwa_worker: each endpoint's caps, batches, its backoff as a whole, and the rotation between endpoints.
@Suite("Webhook claims in SQL: caps, backoff, rotation")
struct WebhookClaimSQLTests {
    /// One claim: `claimed` with its delivery and endpoint, `saturated`, or nil (nothing claimable).
    private static func claim(_ worker: PostgresConnection, owner: String, lanes: Int) throws
        -> (outcome: String, delivery: Int?, endpoint: Int?)?
    {
        guard
            let row = try worker.query(
                """
                SELECT outcome, delivery_id, endpoint_id
                  FROM siwa.claim_webhook_delivery($1, interval '1 minute', '{}', NULL, $2::integer)
                """, [.text(owner), .int(Int64(lanes))]
            ).first
        else { return nil }
        return (try row[0, as: String.self], try row[1, as: Int?.self], try row[2, as: Int?.self])
    }

    private static func record(
        _ worker: PostgresConnection, _ delivery: Int?, owner: String, outcome: String, status: Int
    ) throws {
        #expect(
            try worker.query(
                """
                SELECT siwa.record_webhook_attempt($1, $2, now(), 5, $3::integer, $4, 600, 'HTTP', 600, 3600)
                """, [.int(Int64(delivery ?? -1)), .text(owner), .int(Int64(status)), .text(outcome)])[0][
                    0, as: Bool.self])
    }

    @Test(
        "a batch: a lane leases up to its limit of heads, one per user, each for the lease, and counts as one in flight; its part of a short queue; one while failing; released ones are uncounted; a lost lease is left out"
    )
    func batches() throws {
        let database = try AdminDatabase.make()
        let endpoint = try database.addEndpoint(url: "https://first.example.com/hooks", secret: .generate())
        _ = try database.connection.query(
            "UPDATE siwa.webhook_endpoints SET max_in_flight = 1 WHERE id = $1", [.int(Int64(endpoint))])
        // 6 users with 2 changes each: 6 queue heads.
        _ = try database.insertChanges(subs: (1...6).map { "001.u\($0)" }, count: 2)
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        func claim(_ owner: String, limit: Int) throws -> [(id: Int, sub: String, lease: Double)] {
            let claimed = try worker.query(
                "SELECT delivery_id, sub FROM siwa.claim_webhook_deliveries($1, interval '1 minute', $2::integer, NULL, 4) WHERE outcome = 'claimed'",
                [.text(owner), .int(Int64(limit))]
            ).map { (try $0[0, as: Int.self], try $0[1, as: String.self]) }
            return try claimed.map { id, sub in
                let lease = try worker.value(
                    "SELECT extract(epoch FROM lease_expires_at - clock_timestamp())::float8 FROM siwa.webhook_deliveries WHERE id = $1",
                    [.int(Int64(id))], as: Double.self)
                return (id, sub, lease)
            }
        }
        func record(_ owner: String, _ ids: [Int], _ outcomes: [String]) throws -> [Int] {
            try worker.query(
                """
                SELECT unnest(siwa.record_webhook_attempts($1, $2::bigint[],
                    array_fill(now(), ARRAY[cardinality($2::bigint[])]), array_fill(5, ARRAY[cardinality($2::bigint[])]),
                    array_fill(NULL::integer, ARRAY[cardinality($2::bigint[])]), $3::text[],
                    array_fill(600::float8, ARRAY[cardinality($2::bigint[])]),
                    array_fill('HTTP'::text, ARRAY[cardinality($2::bigint[])]), 600, 3600))
                """, [.text(owner), .array(ids.map { .int(Int64($0)) }), .array(outcomes.map { .text($0) })]
            ).map { try $0[0, as: Int.self] }
        }

        let batch = try claim("host:1:aa:0", limit: 4)
        #expect(batch.count == 4 && Set(batch.map(\.sub)).count == 4, "\(batch)")
        #expect(batch.allSatisfy { abs($0.lease - 60) < 5 }, "\(batch.map(\.lease))")
        // max_in_flight 1: the lane holding 4 leases is the one attempt in flight.
        #expect(try claim("host:1:aa:1", limit: 4).isEmpty)
        #expect(
            try worker.query(
                "SELECT outcome FROM siwa.claim_webhook_deliveries('host:1:aa:1', interval '1 minute', 4, NULL, 4)"
            ).map { try $0[0, as: String.self] } == ["saturated"])

        // Delivered, failed, then two released unattempted; another lane holds the last one's lease now.
        _ = try database.connection.query(
            "UPDATE siwa.webhook_deliveries SET lease_owner = 'host:2:bb:0' WHERE id = $1",
            [.int(Int64(batch[3].id))])
        let recorded = try record(
            "host:1:aa:0", batch.map(\.id), ["delivered", "retry", "released", "released"])
        #expect(recorded == batch.prefix(3).map(\.id))
        let rows = try database.connection.query(
            """
            SELECT state, attempts, first_attempt_at IS NULL, lease_owner,
                   (SELECT count(*)::int FROM siwa.webhook_attempts a WHERE a.delivery_id = d.id)
              FROM siwa.webhook_deliveries d WHERE id = ANY ($1::bigint[]) ORDER BY array_position($1::bigint[], id)
            """, [.array(batch.map { .int(Int64($0.id)) })]
        ).map {
            "\(try $0[0, as: String.self]) \(try $0[1, as: Int.self]) \(try $0[2, as: Bool.self]) "
                + "\(try $0[3, as: String?.self] ?? "-") \(try $0[4, as: Int.self])"
        }
        #expect(
            rows == [
                "delivered 1 false - 1", "pending 1 false - 1", "pending 0 true - 0",
                "pending 1 false host:2:bb:0 0",
            ], "\(rows)")
        // The delivered user's next change heads its queue; the endpoint is failing now: one at a time.
        #expect(
            try database.value(
                "SELECT ready FROM siwa.webhook_deliveries WHERE sub = $1 AND state = 'pending'",
                [.text(batch[0].sub)]) as Bool)
        _ = try database.connection.query(
            "UPDATE siwa.webhook_deliveries SET lease_owner = NULL, lease_expires_at = NULL")
        #expect(try claim("host:1:aa:0", limit: 4).count == 1)

        // A short queue spreads over the lanes: a second endpoint (never claimed: first in the rotation)
        // with 6 heads and this process's share of its 4 lanes, 2 with two endpoints due, gets 3 a claim.
        let second = try database.addEndpoint(url: "https://second.example.com/hooks", secret: .generate())
        _ = try database.connection.query(
            "UPDATE siwa.webhook_endpoints SET max_in_flight = 8 WHERE id = $1", [.int(Int64(second))])
        _ = try database.insertChanges(subs: (1...6).map { "001.v\($0)" }, count: 1)
        let part = try claim("host:1:aa:2", limit: 4)
        #expect(part.count == 3 && part.allSatisfy { $0.sub.hasPrefix("001.v") }, "\(part)")

        // Bad input changes nothing: arrays of different lengths, an unknown outcome, a repeated delivery.
        for (ids, outcomes) in [
            ([batch[2].id], ["delivered", "dead"]), ([batch[2].id], ["lost"]),
            ([batch[2].id, batch[2].id], ["dead", "dead"]),
        ] {
            #expect(throws: PostgresError.self) { _ = try record("host:1:aa:0", ids, outcomes) }
        }
    }

    @Test(
        "a process's lanes: at most lanes − 1 to one endpoint, its share with two due; max_in_flight across processes; one while failing; backed off at the 3rd failure; a 2xx ends it"
    )
    func capsAndBackoff() throws {
        let database = try AdminDatabase.make()
        let first = try database.addEndpoint(url: "https://first.example.com/hooks", secret: .generate())
        let second = try database.addEndpoint(url: "https://second.example.com/hooks", secret: .generate())
        _ = try database.insertChanges(subs: (1...8).map { "001.u\($0)" }, count: 1)
        // The second endpoint's deliveries wait while it is disabled.
        _ = try database.connection.query(
            "SELECT siwa.set_webhook_endpoint_enabled($1, false)", [.int(Int64(second))])
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        func leases(_ endpoint: Int) throws -> Int {
            try database.value(
                "SELECT count(*)::int FROM siwa.webhook_deliveries WHERE endpoint_id = $1 AND lease_owner IS NOT NULL",
                [.int(Int64(endpoint))])
        }

        // One endpoint due: a process of 3 lanes gives it 2, never the third.
        let a0 = try #require(try Self.claim(worker, owner: "host:1:aa:0", lanes: 3))
        let a1 = try #require(try Self.claim(worker, owner: "host:1:aa:1", lanes: 3))
        #expect([a0.outcome, a1.outcome] == ["claimed", "claimed"] && a0.endpoint == first)
        #expect(try Self.claim(worker, owner: "host:1:aa:2", lanes: 3)?.outcome == "saturated")
        // Another process gets the rest of max_in_flight (4), across processes; 'saturated' writes nothing.
        let b0 = try #require(try Self.claim(worker, owner: "host:2:bb:0", lanes: 3))
        let b1 = try #require(try Self.claim(worker, owner: "host:2:bb:1", lanes: 3))
        #expect([b0.outcome, b1.outcome] == ["claimed", "claimed"])
        #expect(try Self.claim(worker, owner: "other:9", lanes: 8)?.outcome == "saturated")
        #expect(try leases(first) == 4)

        // Two endpoints due: each gets its share of a process's lanes (4 lanes: 2 each).
        _ = try database.connection.query(
            "SELECT siwa.set_webhook_endpoint_enabled($1, true)", [.int(Int64(second))])
        let c0 = try #require(try Self.claim(worker, owner: "host:3:cc:0", lanes: 4))
        let c1 = try #require(try Self.claim(worker, owner: "host:3:cc:1", lanes: 4))
        #expect([c0.endpoint, c1.endpoint] == [second, second])
        #expect(try Self.claim(worker, owner: "host:3:cc:2", lanes: 4)?.outcome == "saturated")
        #expect(try leases(second) == 2)

        // A failure: the first endpoint is failing, so nothing more of it until its attempts in flight end.
        try Self.record(worker, a0.delivery, owner: "host:1:aa:0", outcome: "retry", status: 503)
        #expect(try Self.claim(worker, owner: "host:4:dd:0", lanes: 8)?.endpoint == second)
        try Self.record(worker, a1.delivery, owner: "host:1:aa:1", outcome: "retry", status: 503)
        try Self.record(worker, b0.delivery, owner: "host:2:bb:0", outcome: "retry", status: 503)
        // The 3rd failure in a row backs it off as a whole (600 s × 2^0 × jitter ≥ 300 s).
        let backedOff = try database.connection.query(
            """
            SELECT consecutive_failures, backoff_until > now() + interval '290 seconds', last_failure_at IS NOT NULL
              FROM siwa.webhook_endpoints WHERE id = $1
            """, [.int(Int64(first))])[0]
        #expect(try backedOff[0, as: Int.self] == 3)
        #expect(try backedOff[1, as: Bool.self])
        #expect(try backedOff[2, as: Bool.self])
        // Its deliveries are due (retry in 0 s) but not claimed: only the second endpoint's are.
        try database.connection.execute("UPDATE siwa.webhook_deliveries SET next_attempt_at = now()")
        for lane in 0..<4 {
            if let next = try Self.claim(worker, owner: "host:5:ee:\(lane)", lanes: 8) {
                #expect(next.outcome == "saturated" || next.endpoint == second)
            }
        }
        #expect(try leases(first) == 1)  // b1's, still in flight
        // Its attempt in flight answers 2xx: the run and the backoff end; it is claimed again.
        try Self.record(worker, b1.delivery, owner: "host:2:bb:1", outcome: "delivered", status: 204)
        #expect(
            try database.value(
                "SELECT consecutive_failures = 0 AND failing_since IS NULL AND backoff_until IS NULL FROM siwa.webhook_endpoints WHERE id = $1",
                [.int(Int64(first))]) as Bool)
        #expect(try Self.claim(worker, owner: "host:6:ff:0", lanes: 8)?.endpoint == first)

        #expect(
            sqlState {
                _ = try worker.query(
                    "SELECT * FROM siwa.claim_webhook_delivery('x:0', interval '1 minute', '{}', NULL, 0)")
            }
                == "22023")
        // The claim locks the endpoint's row: a role that merely connects may not.
        let nobody = try database.connect(as: .nobody)
        defer { nobody.close() }
        #expect(
            sqlState {
                _ = try nobody.query("SELECT * FROM siwa.claim_webhook_delivery('x:0', interval '1 minute')")
            }
                == permissionDenied)
    }

    @Test(
        "rotation: of two endpoints with backlogs the least recently claimed goes first, though the other's is older"
    )
    func rotation() throws {
        let database = try AdminDatabase.make()
        let older = try database.addEndpoint(
            url: "https://older.example.com/hooks", secret: .generate(), types: ["siwa.consent_revoked"])
        let newer = try database.addEndpoint(
            url: "https://newer.example.com/hooks", secret: .generate(), types: ["siwa.account_deleted"])
        for index in 0..<4 { try database.insertChange(type: "siwa.consent_revoked", sub: "001.o\(index)") }
        for index in 0..<4 { try database.insertChange(type: "siwa.account_deleted", sub: "001.n\(index)") }
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        var order: [Int] = []
        while let next = try Self.claim(worker, owner: "host:7:rr:0", lanes: 2), next.outcome == "claimed" {
            order.append(try #require(next.endpoint))
            try Self.record(worker, next.delivery, owner: "host:7:rr:0", outcome: "delivered", status: 204)
        }
        #expect(order == [older, newer, older, newer, older, newer, older, newer])
    }

    @Test(
        "a claim finds the due head through the due index: it reads no delivery row sequentially, however many delivered ones lie before the pending ones"
    )
    func claimReadsNoDeliverySequentially() throws {
        let database = try AdminDatabase.make()
        let endpoint = try database.addEndpoint(url: "https://first.example.com/hooks", secret: .generate())
        _ = try database.insertChanges(subs: (1...100).map { "001.u\($0)" }, count: 20)
        // A backlog half delivered, the delivered rows first in the table (where a drain leaves them): the
        // first 1,000 changes delivered, the next ones queue heads, the table rewritten in id order.
        for sql in [
            "UPDATE siwa.webhook_deliveries SET state = 'delivered', delivered_at = now() WHERE id IN (SELECT id FROM siwa.webhook_deliveries ORDER BY change_id LIMIT 1000)",
            "SELECT siwa.repair_webhook_ready()",
            "CLUSTER siwa.webhook_deliveries USING webhook_deliveries_pkey",
            "ANALYZE siwa.webhook_deliveries",
        ] {
            _ = try database.connection.query(sql)
        }
        // A fresh session, so that its statistics of this transaction are the claim's alone.
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        _ = try worker.query("BEGIN")
        let claimed = try #require(try Self.claim(worker, owner: "host:1:aa:0", lanes: 2))
        #expect(claimed.outcome == "claimed" && claimed.endpoint == endpoint)
        let row = try worker.query(
            """
            SELECT seq_scan::int, seq_tup_read::int FROM pg_stat_xact_user_tables
             WHERE schemaname = 'siwa' AND relname = 'webhook_deliveries'
            """)[0]
        #expect(try row[0, as: Int.self] == 0 && row[1, as: Int.self] == 0)
        _ = try worker.query("ROLLBACK")
    }

    /// What one statement of `worker` read of `siwa.webhook_deliveries` in its own transaction: rows
    /// read sequentially and rows fetched through an index.
    private static func deliveryRowsRead(_ worker: PostgresConnection, _ body: () throws -> Void) throws
        -> (sequential: Int, indexed: Int)
    {
        _ = try worker.query("BEGIN")
        defer { _ = try? worker.query("ROLLBACK") }
        try body()
        let row = try worker.query(
            """
            SELECT seq_tup_read::int, coalesce(idx_tup_fetch, 0)::int FROM pg_stat_xact_user_tables
             WHERE schemaname = 'siwa' AND relname = 'webhook_deliveries'
            """)[0]
        return (try row[0, as: Int.self], try row[1, as: Int.self])
    }

    @Test(
        "the claim's and the record's plans are made once per session (generic) and stay index probes: made on a table without statistics, they read a few rows of a grown one, where the order check's anti join read every pending delivery"
    )
    func plansMadeOnAnEmptyTableStayIndexProbes() throws {
        let database = try AdminDatabase.make()
        _ = try database.addEndpoint(url: "https://first.example.com/hooks", secret: .generate())
        // No ANALYZE between the session's first claim and the last one (it would make the plans anew).
        try database.connection.execute(
            "ALTER TABLE siwa.webhook_deliveries SET (autovacuum_enabled = false)")
        #expect(
            try database.value(
                "SELECT reltuples <= 0 FROM pg_class WHERE oid = 'siwa.webhook_deliveries'::regclass") as Bool
        )
        let worker = try database.connect(as: .worker)
        defer { worker.close() }
        let owner = "host:1:aa:0"
        // The session's plans are made here, on a table of one delivery and no statistics: every
        // statement of the claim and the record runs once.
        #expect(try Self.claim(worker, owner: owner, lanes: 2) == nil)
        try database.insertChange(sub: "001.first")
        let first = try #require(try Self.claim(worker, owner: owner, lanes: 2))
        try Self.record(worker, first.delivery, owner: owner, outcome: "delivered", status: 204)
        #expect(
            try database.value(
                "SELECT reltuples <= 0 FROM pg_class WHERE oid = 'siwa.webhook_deliveries'::regclass") as Bool
        )

        // The table grows: 2,000 deliveries of 100 users, the first 1,000 delivered.
        _ = try database.insertChanges(subs: (1...100).map { "001.u\($0)" }, count: 20)
        _ = try database.connection.query(
            """
            UPDATE siwa.webhook_deliveries SET state = 'delivered', delivered_at = now()
             WHERE id IN (SELECT id FROM siwa.webhook_deliveries WHERE state = 'pending' ORDER BY change_id LIMIT 1000)
            """)
        _ = try database.connection.query("SELECT siwa.repair_webhook_ready()")
        var claimed: (outcome: String, delivery: Int?, endpoint: Int?)?
        let claimRead = try Self.deliveryRowsRead(worker) {
            claimed = try Self.claim(worker, owner: owner, lanes: 2)
        }
        #expect(claimed?.outcome == "claimed")
        #expect(claimRead.sequential == 0 && claimRead.indexed < 50, "\(claimRead)")
        // The same claim committed, then its record (delivered: the next head of its user made ready).
        let next = try #require(try Self.claim(worker, owner: owner, lanes: 2))
        let recordRead = try Self.deliveryRowsRead(worker) {
            try Self.record(worker, next.delivery, owner: owner, outcome: "delivered", status: 204)
        }
        // The record reads the delivery by key twice (its lock, its update), its foreign key and the next head.
        #expect(recordRead.sequential == 0 && recordRead.indexed < 30, "\(recordRead)")
        #expect(
            try database.value(
                "SELECT reltuples <= 0 FROM pg_class WHERE oid = 'siwa.webhook_deliveries'::regclass") as Bool
        )
    }
}
