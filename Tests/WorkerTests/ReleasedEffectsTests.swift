import AppleNotifications
import Foundation
import Postgres
import Receiver
import TestSupport
import Testing

/// The guard of "each effect once": the worker's effects have one implementation (the set-based pass,
/// run on a batch of one by its fallback), and they must be exactly those of the released schema
/// version 4, which had two (the pass, and one notification at a time). The same seeded random
/// notifications, signed as Apple signs them and stored by each version's receiver, are applied by
/// version 4 (Tests/Fixtures/released-schemas/schema-v4.sql) in one database and by schema.sql in
/// another, through the functions the worker calls, and everything they leave is compared.
@Suite("The worker's effects are those of the released schema version 4")
struct ReleasedEffectsTests {
    /// Hooks that record every call, and raise for the users in `public.poison` (so batches fall back).
    static let hooks = """
        CREATE TABLE public.hook_calls (n serial, event_type text, sub text, email text, jti text, change text);
        CREATE TABLE public.poison (sub text PRIMARY KEY);
        CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz,
                                                 email text, jti text) RETURNS void
        LANGUAGE plpgsql AS $$
        BEGIN
            IF EXISTS (SELECT 1 FROM public.poison p WHERE p.sub = on_event.sub) THEN
                RAISE EXCEPTION 'the hook refuses % for %', jti, email;
            END IF;
            INSERT INTO public.hook_calls (event_type, sub, email, jti) VALUES (event_type, sub, email, jti);
        END $$;
        CREATE FUNCTION siwa.on_change(c siwa.changes, superseded boolean) RETURNS void
        LANGUAGE sql AS $$
            INSERT INTO public.hook_calls (event_type, sub, email, jti, change)
            VALUES (c.type, c.sub, c.email, c.jti,
                    concat_ws(' ', c.id IS NULL, superseded, c.position IS NULL, c.event_time, c.audience,
                              c.sessions_revoked, c.refresh_tokens_revoked, c.is_private_email))
        $$;
        """

    /// Everything the worker's functions write, without ids of changes, times and random delays.
    static let snapshot = """
        SELECT concat_ws(E'\\n',
            (SELECT string_agg(a::text, E'\\n' ORDER BY a.sub) FROM (
                SELECT sub, email, is_private_email, email_status, email_status_at, consent_revoked_at,
                       deleted_at, personal_data_erased_at IS NOT NULL FROM siwa.accounts) AS a),
            (SELECT string_agg(s::text, E'\\n' ORDER BY s.id) FROM (
                SELECT id, sub, revoked_at IS NOT NULL, revoke_reason FROM siwa.sessions) AS s),
            (SELECT string_agg(t::text, E'\\n' ORDER BY t.id) FROM (
                SELECT id, sub, revoked_at IS NOT NULL, revoke_reason, token_ciphertext IS NULL
                  FROM siwa.refresh_tokens) AS t),
            (SELECT string_agg(n::text, E'\\n' ORDER BY n.id) FROM (
                SELECT id, jti, event_type, sub, state, attempts, last_error, email, raw_token,
                       personal_data_erased_at IS NOT NULL, applied_at IS NOT NULL, busy_since IS NOT NULL,
                       next_attempt_at IS NOT NULL
                  FROM siwa.notifications) AS n),
            (SELECT string_agg(ROW(c.type, c.sub, c.event_time, c.jti, c.audience, c.sessions_revoked,
                                   c.refresh_tokens_revoked, c.email, c.is_private_email,
                                   c.position IS NOT NULL)::text, E'\\n' ORDER BY c.position, c.id)
               FROM siwa.changes AS c),
            (SELECT string_agg(ROW(h.event_type, h.sub, h.email, h.jti, h.change)::text, E'\\n' ORDER BY h.n)
               FROM public.hook_calls AS h))
        """

    /// One database: a connection, and the receiver's store writing into it (this version's
    /// NotificationStore, or for version 4 the statement its receiver used).
    struct Side {
        let connection: PostgresConnection
        let pool: PostgresPool
        let store: NotificationStore
        let isVersion4: Bool

        init(schema: String, isVersion4: Bool) throws {
            let configuration = try PostgresCluster.shared.createDatabase(applying: schema)
            connection = try PostgresConnection(configuration: configuration)
            pool = PostgresPool(configuration: configuration, maxConnections: 1)
            store = NotificationStore(pool: pool, configuration: .init(committers: 1))
            self.isVersion4 = isVersion4
        }

        /// Stores `n` as that version's receiver does.
        func store(_ n: ServerNotification, rawToken: String) throws -> NotificationStore.Outcome {
            guard isVersion4 else { return try store.store(n, rawToken: rawToken) }
            let columns: [PostgresData?] = [
                .text(n.jti), .text(n.eventType.rawValue), .text(n.subject), .text(n.audience),
                n.email.map { .text($0) }, n.isPrivateEmail.map { .bool($0) }, .date(n.eventTime),
                .date(n.issuedAt), n.expiresAt.map { .date($0) }, .text(rawToken),
            ]
            let stored = try connection.query(
                ReleasedReceiver.version4Store, columns.map { .array([$0]) })
            return stored.isEmpty ? .duplicate : .accepted
        }

        func close() {
            store.close()
            pool.close()
            connection.close()
        }

        /// One row per handled notification: what the worker's entry points report (not the timings).
        func results(_ sql: String, _ parameters: [PostgresData?] = []) throws -> [String] {
            try connection.query(
                "SELECT concat_ws(' ', id, jti, event_type, outcome, error, attempt) FROM (\(sql)) AS r",
                parameters
            ).map { try $0[0, as: String.self] }
        }
    }

    @Test(
        "seeded random notifications leave what version 4 leaves: accounts, sessions, tokens, log and queue, changes, hook calls",
        arguments: 1...16)
    func sameAsVersion4(seed: UInt64) throws {
        let released = try String(
            contentsOf: RepositoryRoot.url.appendingPathComponent(
                "Tests/Fixtures/released-schemas/schema-v4.sql"),
            encoding: .utf8)
        let version4 = try Side(schema: released, isVersion4: true)
        let current = try Side(schema: TestSchema.sql, isVersion4: false)
        defer {
            version4.close()
            current.close()
        }
        var scenario = Scenario(seed: seed)
        for side in [version4, current] {
            try side.connection.simpleQuery(Self.hooks + scenario.setup)
        }
        // Stored the way siwa-receiver stores: verified, then its own statement (a redelivered jti is a
        // duplicate; a jti whose dedupe key is gone, past the window, is stored again).
        for delivery in scenario.deliveries {
            let notification = try TestSigning.verifier.verify(
                token: delivery.token, keys: TestSigning.appleKeySet)
            var outcomes: [NotificationStore.Outcome] = []
            for side in [version4, current] {
                if delivery.pastTheWindow {
                    try side.connection.execute(
                        "DELETE FROM siwa.notification_jtis WHERE jti = $1", [.text(notification.jti)])
                }
                outcomes.append(try side.store(notification, rawToken: delivery.token))
            }
            #expect(outcomes[0] == outcomes[1], "seed \(seed): stored \(outcomes)")
        }

        // The worker's calls, the same in both: batches of random sizes until nothing is due, in rounds
        // that make every retry due again; one round as the lane's own fallback does it (one
        // notification per transaction, and a failure no subtransaction caught recorded apart).
        var handled: [[String]] = [[], []]
        for round in 0..<4 {
            for side in [version4, current] {
                try side.connection.execute(
                    "UPDATE siwa.notification_queue SET next_attempt_at = now() - interval '1 hour'")
            }
            if round == 2 {
                let due = try current.connection.query(
                    "SELECT q.id, l.sub FROM siwa.notification_queue q JOIN siwa.notification_log l USING (id) ORDER BY q.id"
                ).map { (try $0[0, as: Int64.self], try $0[1, as: String.self]) }
                for (id, sub) in due {
                    for (index, side) in [version4, current].enumerated() {
                        if scenario.poison.contains(sub) {
                            handled[index] += try side.results(
                                """
                                SELECT $1::bigint AS id, '' AS jti, '' AS event_type,
                                       siwa.record_failure($1, '57014: canceling statement due to statement timeout',
                                                           3, interval '1 hour') AS outcome,
                                       NULL AS error, 0 AS attempt
                                """, [.int(id)])
                        } else {
                            handled[index] += try side.results(
                                "SELECT * FROM siwa.process_notification($1, 3, interval '1 hour')",
                                [.int(id)])
                        }
                    }
                }
                continue
            }
            while true {
                let limit = scenario.batchSize()
                var counts: [Int] = []
                for (index, side) in [version4, current].enumerated() {
                    let rows = try side.results(
                        "SELECT * FROM siwa.process_due_notifications($1::integer, 3, interval '1 hour')",
                        [.int(Int64(limit))])
                    handled[index] += rows
                    counts.append(rows.count)
                }
                if counts == [0, 0] || counts[0] != counts[1] { break }
            }
        }
        #expect(handled[1] == handled[0], "seed \(seed): the worker's results")
        let expected = try version4.connection.query(Self.snapshot)[0][0, as: String.self]
        let actual = try current.connection.query(Self.snapshot)[0][0, as: String.self]
        #expect(actual == expected, "seed \(seed)")
        // The scenario did what it is for: the fallback ran, and every notification is done.
        if scenario.fallsBack {
            #expect(handled[1].contains { $0.contains(" retry ") || $0.contains(" dead ") }, "seed \(seed)")
        }
        #expect(
            try current.connection.query("SELECT count(*)::integer FROM siwa.notification_queue")[0][
                0, as: Int.self] == 0, "seed \(seed)")
    }

    @Test("across the seeds, the scenarios cover what the guard is for")
    func scenariosCoverTheCases() {
        var types = Set<String>()
        var forms = Set<Bool>()
        var pastTheWindow = 0
        var redelivered = 0
        var aliased = 0
        var poisoned = 0
        for seed in UInt64(1)...16 {
            let scenario = Scenario(seed: seed)
            types.formUnion(scenario.deliveries.map(\.type))
            forms.formUnion(scenario.deliveries.map(\.eventsAsObject))
            pastTheWindow += scenario.deliveries.filter(\.pastTheWindow).count
            redelivered += scenario.deliveries.filter(\.redelivery).count
            aliased += scenario.deliveries.filter { $0.subject.hasPrefix("old-") }.count
            poisoned += scenario.fallsBack ? 1 : 0
        }
        #expect(
            types == [
                "email-enabled", "email-disabled", "consent-revoked", "account-delete", "account-deleted",
                "brand-new-type",
            ])
        #expect(forms == [true, false])
        #expect(pastTheWindow > 0 && redelivered > 0 && aliased > 0 && poisoned > 0)
    }
}

/// A random but reproducible scenario: a few users with accounts (some deleted, some erased), sessions
/// and refresh tokens created at random times, users whose sub a team transfer replaced (their
/// notifications still name the old sub), users whose hook raises, and up to 64 notifications of every
/// event type (Apple's documentation spelling of account-delete and an unknown type included), with
/// event times that often tie, the `events` claim as a JSON string (real traffic) or an object (Apple's
/// page), redeliveries of a token, and a jti Apple signs again after its dedupe key was pruned.
struct Scenario {
    struct Delivery {
        var token: String
        var type: String
        var subject: String
        var eventsAsObject: Bool
        var redelivery = false
        var pastTheWindow = false
    }

    var random: SplitMix64
    let setup: String
    let deliveries: [Delivery]
    let poison: Set<String>

    init(seed: UInt64) {
        var random = SplitMix64(seed: seed)
        var deliveries: [Delivery] = []
        var poison: Set<String> = []
        let now = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down))
        let base = now.addingTimeInterval(-600)
        func time() -> Date { base.addingTimeInterval(Double(Int.random(in: 0...6, using: &random) * 60)) }
        func sql(_ date: Date) -> String { "to_timestamp(\(Int64(date.timeIntervalSince1970)))" }
        var statements: [String] = []
        if Bool.random(using: &random) {
            statements.append("UPDATE siwa.settings SET erase_personal_data_after = interval '1 day';")
        }
        let subs = (0..<Int.random(in: 1...10, using: &random)).map { "s\($0)" }
        for sub in subs {
            if Double.random(in: 0..<1, using: &random) < 0.6 {
                let deleted = Double.random(in: 0..<1, using: &random) < 0.25
                let erased = deleted && Bool.random(using: &random)
                let status = ["NULL", "'enabled'", "'disabled'"].randomElement(using: &random)!
                let email = erased || status == "NULL" ? "NULL" : "'\(sub)-pre@privaterelay.appleid.com'"
                statements.append(
                    """
                    INSERT INTO siwa.accounts (sub, email, is_private_email, email_status, email_status_at,
                                               consent_revoked_at, deleted_at, personal_data_erased_at)
                    VALUES ('\(sub)', \(email), \(email == "NULL" ? "NULL" : "false"), \(status),
                            \(status == "NULL" ? "NULL" : sql(time())),
                            \(Bool.random(using: &random) ? "NULL" : sql(time())),
                            \(deleted ? sql(time()) : "NULL"), \(erased ? sql(time()) : "NULL"));
                    """)
            }
            for _ in 0..<Int.random(in: 0...3, using: &random) {
                statements.append(
                    "INSERT INTO siwa.sessions (sub, created_at) VALUES ('\(sub)', \(sql(time())));")
                statements.append(
                    "INSERT INTO siwa.refresh_tokens (sub, created_at, token_ciphertext) VALUES ('\(sub)', \(sql(time())), '\\x01');"
                )
            }
        }
        // A team transfer replaced some subs: Apple may still send an event with the old one.
        var senders = subs
        var replaced: Set<String> = []
        for sub in subs where Double.random(in: 0..<1, using: &random) < 0.3 {
            replaced.insert(sub)
            statements.append(
                "INSERT INTO siwa.sub_aliases (old_sub, new_sub, transfer_id) VALUES ('old-\(sub)', '\(sub)', 't1');"
            )
            senders.append("old-\(sub)")
        }
        // Version 5 erases what the failure of a replaced sub's notification keeps once the account is
        // erased (AliasTests); version 4 kept its token and error text. So the users whose hook raises
        // are chosen among those no transfer replaced.
        let candidates = subs.filter { !replaced.contains($0) }
        if seed % 4 != 0, let first = candidates.randomElement(using: &random) {
            poison = [first]
            if candidates.count > 3 && Bool.random(using: &random) {
                poison.insert(candidates.randomElement(using: &random)!)
            }
            statements += poison.sorted().map { "INSERT INTO public.poison VALUES ('\($0)');" }
        }

        let types = [
            "email-enabled", "email-disabled", "email-enabled", "email-disabled", "consent-revoked",
            "account-delete", "account-deleted", "brand-new-type",
        ]
        let count = Int.random(in: 1...64, using: &random)
        for index in 0..<count {
            let earlier = deliveries.filter { !$0.redelivery && !$0.pastTheWindow }
            let roll = Double.random(in: 0..<1, using: &random)
            if !earlier.isEmpty && roll < 0.08 {
                // A redelivery: the same signed token again.
                var again = earlier.randomElement(using: &random)!
                again.redelivery = true
                deliveries.append(again)
                continue
            }
            let sub = senders.randomElement(using: &random)!
            let type = types.randomElement(using: &random)!
            let isEmail = type.hasPrefix("email-")
            // Two effects changed on purpose in version 5 (AliasTests): an email event of a replaced sub
            // applies its status but not its address (version 4 applied the old team's address), and
            // an account-delete earlier than the recorded deletion is a change (version 4 marked it
            // superseded). So old subs send email events without an address here, and every deletion
            // is dated at the latest time, never earlier than one recorded.
            let replaced = sub.hasPrefix("old-")
            var email =
                isEmail && Double.random(in: 0..<1, using: &random) < 0.85
                ? "\(sub)-\(index)@privaterelay.appleid.com" : nil
            var isPrivate = isEmail ? [true, false, nil].randomElement(using: &random)! : nil
            if replaced {
                email = nil
                isPrivate = nil
            }
            // Signed after the event, as Apple does (version 5 does not believe an event_time beyond iat).
            var eventTime = time()
            if type.hasPrefix("account-delete") { eventTime = base.addingTimeInterval(360) }
            let pastTheWindow = !earlier.isEmpty && roll < 0.16
            // Past the dedupe window Apple signs the same jti again, with a later iat.
            let jti = pastTheWindow ? "j\(Int.random(in: 0..<index, using: &random))" : "j\(index)"
            var claims = TestSigning.apple.claims(
                type: type, subject: sub, audience: TestSigning.audience, email: email,
                isPrivateEmail: isPrivate,
                eventTime: eventTime, issuedAt: now.addingTimeInterval(Double(index - 120)), jti: jti)
            let eventsAsObject = Bool.random(using: &random)
            if eventsAsObject, let events = claims["events"] as? String {
                claims["events"] = try? JSONSerialization.jsonObject(with: Data(events.utf8))
            }
            guard let token = try? TestSigning.apple.sign(claims: claims) else {
                preconditionFailure("test signing failed")
            }
            deliveries.append(
                Delivery(
                    token: token, type: type, subject: sub, eventsAsObject: eventsAsObject,
                    pastTheWindow: pastTheWindow))
        }
        self.random = random
        self.setup = statements.joined(separator: "\n")
        self.deliveries = deliveries
        self.poison = poison
    }

    /// Whether a user whose hook raises has a known event (so that batches fall back).
    var fallsBack: Bool {
        deliveries.contains { delivery in
            !delivery.redelivery && !delivery.pastTheWindow && delivery.type != "brand-new-type"
                && (poison.contains(delivery.subject)
                    || (delivery.subject.hasPrefix("old-")
                        && poison.contains(String(delivery.subject.dropFirst("old-".count)))))
        }
    }

    /// The size of the worker's next batch: often small, so that batches split users' events.
    mutating func batchSize() -> Int { [1, 2, 5, 16, 64].randomElement(using: &random)! }
}
