import AppleNotifications
import Foundation
import TestSupport
import Testing

/// `siwactl doctor --database-url`: a line per auth adapter (siwa.auth_adapter_overview).
extension DoctorTests {
    @Test("auth adapters: none, no line; dead rows warn naming the retry; an overdue row warns; healthy ok")
    func authAdapters() throws {
        let database = try TestDatabase()
        let jwks = try JWKSTestServer(body: TestSigning.apple.jwksJSON())
        defer { jwks.stop() }
        let receiver = try ServiceProcess.receiver(database, audiences: [TestSigning.audience], jwks: jwks)
        var result = try Self.doctor(receiver, database: database, audience: TestSigning.audience)
        #expect(Self.line(result, "adapters") == nil, "\(result.standardOutput)")

        _ = try database.value(
            "SELECT siwa.add_auth_adapter('main', 'supabase', 'apple', 'file:/etc/siwa/auth-url')",
            as: Int.self)
        result = try Self.doctor(receiver, database: database, audience: TestSigning.audience)
        var line = Self.line(result, "adapters") ?? ""
        #expect(
            line.hasPrefix("ok") && line.contains("main (supabase), 0 pending"), "\(result.standardOutput)")

        try database.query(
            """
            INSERT INTO siwa.auth_adapter_events (change_id, adapter_id, type, sub, event_time, state, attempts,
                                                  finished_at, last_attempt_at, last_error)
            SELECT 1, id, 'siwa.consent_revoked', '001.a', now(), 'dead', 30, now(), now(),
                   'supabase: auth.sessions: permission denied (42501)'
              FROM siwa.auth_adapters
            """)
        result = try Self.doctor(receiver, database: database, audience: TestSigning.audience)
        line = Self.line(result, "adapters") ?? ""
        #expect(line.hasPrefix("warn") && line.contains("1 dead"), "\(result.standardOutput)")
        #expect(line.contains("last error: supabase: auth.sessions: permission denied"), "\(line)")
        #expect(result.standardOutput.contains("siwactl adapters retry main"), "\(result.standardOutput)")

        try database.query("DELETE FROM siwa.auth_adapter_events")
        try database.query(
            """
            INSERT INTO siwa.auth_adapter_events (change_id, adapter_id, type, sub, event_time, next_attempt_at)
            SELECT 2, id, 'siwa.account_deleted', '001.b', now(), now() - interval '2 hours' FROM siwa.auth_adapters
            """)
        result = try Self.doctor(receiver, database: database, audience: TestSigning.audience)
        line = Self.line(result, "adapters") ?? ""
        #expect(
            line.hasPrefix("warn") && line.contains("1 pending, the oldest due 2"), "\(result.standardOutput)"
        )
        #expect(result.standardOutput.contains("--auth-adapters on"), "\(result.standardOutput)")
    }
}
