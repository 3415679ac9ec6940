import Postgres
import Testing

@Suite("PostgresConfiguration")
struct ConfigurationTests {
    @Test(
        "accepts URL and conninfo forms and reads their parts",
        arguments: [
            (
                "postgresql://app:secret@/siwa?host=/run/postgresql&port=5433", "app", "siwa",
                "/run/postgresql", "5433"
            ),
            ("postgres://app:secret@db.internal:6543/siwa", "app", "siwa", "db.internal", "6543"),
            (
                "host=/run/postgresql port=5433 dbname=siwa user=app password=secret", "app", "siwa",
                "/run/postgresql", "5433"
            ),
        ])
    func parses(url: String, user: String, database: String, host: String, port: String) throws {
        let configuration = try PostgresConfiguration(url)
        #expect(configuration.user == user)
        #expect(configuration.database == database)
        #expect(configuration.host == host)
        #expect(configuration.port == port)
    }

    @Test("never shows the password in its description")
    func descriptionHidesPassword() throws {
        for text in [
            "postgresql://app:hunter2@/siwa?host=/run/postgresql",
            "host=localhost password=hunter2 dbname=siwa",
        ] {
            let configuration = try PostgresConfiguration(text)
            #expect(!configuration.description.contains("hunter2"))
            #expect(!"\(configuration)".contains("hunter2"))
            #expect(configuration.description.contains("siwa"))
        }
    }

    @Test(
        "describes several hosts host by host, with target_session_attrs, never the password",
        arguments: [
            (
                "postgresql://app:hunter2@db-a:5432,db-b:5433/siwa?target_session_attrs=read-write",
                "postgresql://app@db-a:5432,db-b:5433/siwa?target_session_attrs=read-write"
            ),
            (
                "host=db-a,db-b port=6432 dbname=siwa user=app password=hunter2 target_session_attrs=read-write",
                "postgresql://app@db-a:6432,db-b:6432/siwa?target_session_attrs=read-write"
            ),
            (
                "postgresql://app:hunter2@/siwa?host=/run/a,/run/b&port=5432,5433&target_session_attrs=read-write",
                "postgresql://app@/siwa?host=/run/a,/run/b&port=5432,5433&target_session_attrs=read-write"
            ),
            ("postgresql://app:hunter2@db.internal:6543/siwa", "postgresql://app@db.internal:6543/siwa"),
        ])
    func describesSeveralHosts(url: String, expected: String) throws {
        let configuration = try PostgresConfiguration(url)
        #expect(configuration.description == expected)
        #expect(!configuration.description.contains("hunter2"))
    }

    @Test("rejects a malformed connection string without connecting")
    func rejectsGarbage() {
        let error = postgresError { _ = try PostgresConfiguration("host=a port") }
        #expect(error?.code == .invalidConfiguration)
        let badURL = postgresError { _ = try PostgresConfiguration("postgresql://a/b?nosuchoption=1") }
        #expect(badURL?.code == .invalidConfiguration)
    }
}

@Suite("PostgresError")
struct ErrorClassificationTests {
    @Test("classifies retryable and connection-level errors")
    func flags() {
        #expect(PostgresError(code: .serializationFailure, message: "").isRetryable)
        #expect(PostgresError(code: .deadlock, message: "").isRetryable)
        #expect(PostgresError(code: .connectionLost, message: "").isConnectionError)
        #expect(!PostgresError(code: .uniqueViolation, message: "").isRetryable)
        #expect(!PostgresError(code: .queryFailed, message: "").isConnectionError)
    }
}
