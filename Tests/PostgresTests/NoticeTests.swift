import Postgres
import TestSupport
import Testing

/// The library prints nothing: what the server sends besides errors is collected for the caller
/// (`siwactl migrate` prints it).
@Suite("Notices and warnings are collected, never printed")
struct NoticeTests {
    @Test("RAISE WARNING and RAISE NOTICE arrive in order with SQLSTATE, detail and hint; taken once")
    func collected() throws {
        let connection = try freshConnection()
        defer { connection.close() }
        try connection.simpleQuery("SET client_min_messages = notice")
        _ = connection.takeNotices()
        try connection.simpleQuery(
            """
            DO $$ BEGIN
                RAISE NOTICE 'first';
                RAISE WARNING 'role % is missing', 'siwa_x' USING DETAIL = 'no CREATEROLE', HINT = 'create it';
            END $$
            """)
        let notices = connection.takeNotices()
        #expect(notices.map(\.severity) == ["NOTICE", "WARNING"])
        #expect(notices.map(\.message) == ["first", "role siwa_x is missing"])
        #expect(notices[1].sqlState == "01000")
        #expect(
            notices[1].description
                == "WARNING: role siwa_x is missing\nDETAIL: no CREATEROLE\nHINT: create it")
        #expect(connection.takeNotices().isEmpty)
        // The connection is still fine (a warning is not the session's end).
        #expect(connection.isHealthy)
    }
}
