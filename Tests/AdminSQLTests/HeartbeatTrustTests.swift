import Foundation
import Postgres
import TestSupport
import Testing

/// Heartbeats cannot lie to the doctor: as a login that is a member of siwa_receiver only (the credential
/// of the process the internet reaches), a heartbeat dated in the future or at infinity, or carrying
/// control characters a terminal would obey, is refused by the table's CHECK constraints; what a real
/// process writes (`siwa.record_heartbeat`) still passes.
@Suite("Heartbeats: forged times and text are refused")
struct HeartbeatTrustTests {
    static let insert = """
        INSERT INTO siwa.service_heartbeats
               (kind, host, pid, version, product_version, build_commit, audiences, started_at, last_seen)
        VALUES ('receiver', $1, 7, $2, $3, 'abc123', $4::text[], $5::timestamptz, $6::timestamptz)
        """
    static let checkViolation = "23514"

    /// One row as the receiver's login; the defaults are what a real receiver writes.
    static func store(
        _ connection: PostgresConnection, host: String = "web-1", version: String = "schema 5",
        productVersion: String = "5.0.0", audiences: [String] = ["com.example.app"],
        startedAt: String = "now", lastSeen: String = "now"
    ) throws {
        try connection.query(
            insert,
            [
                .text(host), .text(version), .text(productVersion),
                .array(audiences.map { .text($0) }), .text(startedAt), .text(lastSeen),
            ])
        try connection.query("DELETE FROM siwa.service_heartbeats")
    }

    @Test("as siwa_receiver: future, infinite and control-character heartbeats are refused; real ones pass")
    func forgedRowsRefused() throws {
        let database = try TestDatabase()
        let receiver = try database.connect(asMemberOf: "siwa_receiver")
        defer { receiver.close() }

        // What a receiver writes passes, a minute of clock skew included.
        try Self.store(receiver)
        try Self.store(receiver, startedAt: "\(Self.iso(Date().addingTimeInterval(60)))")
        try receiver.query(
            """
            SELECT siwa.record_heartbeat('receiver', 'web-1', 8, 5, '5.0.0', 'abc123', '{com.example.app}',
                                         now(), interval '1 day')
            """)

        let tenYears = Self.iso(Date().addingTimeInterval(10 * 365 * 86_400))
        let forged: [(String, () throws -> Void)] = [
            ("last_seen 10 years ahead", { try Self.store(receiver, lastSeen: tenYears) }),
            ("last_seen an hour ahead", { try Self.store(receiver, lastSeen: Self.iso(Date() + 3600)) }),
            ("last_seen infinity", { try Self.store(receiver, lastSeen: "infinity") }),
            ("last_seen -infinity", { try Self.store(receiver, lastSeen: "-infinity") }),
            ("started_at infinity", { try Self.store(receiver, startedAt: "infinity") }),
            ("started_at a day ahead", { try Self.store(receiver, startedAt: Self.iso(Date() + 86_400)) }),
            ("ESC in host", { try Self.store(receiver, host: "web-1\u{1B}[2K\rok workers") }),
            (
                "newline in host",
                { try Self.store(receiver, host: "web-1\nok    workers     2 worker(s) alive") }
            ),
            ("DEL in version", { try Self.store(receiver, version: "schema 5\u{7F}") }),
            ("C1 CSI in product_version", { try Self.store(receiver, productVersion: "5.0.0\u{9B}2K") }),
            ("newline in an audience", { try Self.store(receiver, audiences: ["com.example.app\nok"]) }),
            ("ESC in an audience", { try Self.store(receiver, audiences: ["a", "b\u{1B}]0;x\u{07}"]) }),
            ("an empty audience", { try Self.store(receiver, audiences: ["com.example.app", ""]) }),
            (
                "a 256-character audience",
                { try Self.store(receiver, audiences: [String(repeating: "a", count: 256)]) }
            ),
        ]
        for (name, attempt) in forged {
            #expect(sqlState(attempt) == Self.checkViolation, "\(name)")
        }
        // An UPDATE cannot make a real row lie either.
        try receiver.query(
            Self.insert,
            [.text("web-2"), .text("schema 5"), .text("5.0.0"), .array([]), .text("now"), .text("now")])
        #expect(
            sqlState { try receiver.query("UPDATE siwa.service_heartbeats SET last_seen = 'infinity'") }
                == Self.checkViolation)
        #expect(
            sqlState { try receiver.query("UPDATE siwa.service_heartbeats SET host = E'x\\u001b[1m'") }
                == Self.checkViolation)
    }

    static func iso(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        return formatter.string(from: date)
    }

    @Test("the upgrade from version 4 deletes the heartbeats it let through that lie, and keeps the rest")
    func upgradeDropsForgedRows() throws {
        let database = try TestDatabase(.empty)
        let connection = try database.connect()
        defer { connection.close() }
        let released = RepositoryRoot.url.appendingPathComponent(
            "Tests/Fixtures/released-schemas/schema-v4.sql")
        try connection.simpleQuery(try String(contentsOf: released, encoding: .utf8))
        try connection.query(Self.forgedV4)
        try TestSchema.apply(on: connection)
        #expect(
            try connection.query("SELECT host FROM siwa.service_heartbeats ORDER BY host").map {
                try $0[0, as: String.self]
            } == ["real"])
    }

    /// Rows a released schema let through: three lie, one is real.
    static let forgedV4 = """
        INSERT INTO siwa.service_heartbeats (kind, host, pid, version, started_at, last_seen)
        VALUES ('worker', E'evil\\u001b[2K', 1, 'schema 4', now(), now()),
               ('worker', 'future', 2, 'schema 4', now(), now() + interval '10 years'),
               ('worker', 'infinite', 3, 'schema 4', now(), 'infinity'),
               ('worker', 'real', 4, 'schema 4', now(), now())
        """
}
