import Postgres
import SiwaSchema

/// The schema every test database holds: schema.sql as embedded at build time (`SiwaSchema`), the
/// same text `siwactl migrate` applies. Tests load it only through here, so none can quietly run
/// against a missing or empty schema.
public enum TestSchema {
    /// schema.sql, embedded at build time.
    public static var sql: String { SiwaSchema.sql }

    /// The version schema.sql records in `siwa.schema_version`.
    public static var version: Int { SiwaSchema.version }

    /// Applies schema.sql on `connection`, then checks that it recorded its version: fails loudly
    /// (throws) when the schema did not apply, instead of leaving a half-empty database behind.
    public static func apply(on connection: PostgresConnection) throws {
        guard sql.contains("CREATE SCHEMA"), version >= 1 else {
            throw PostgresCluster.ClusterError(
                description: "the embedded schema.sql is empty or not the schema (\(sql.utf8.count) bytes)")
        }
        try connection.simpleQuery(sql)
        let recorded = try connection.query("SELECT max(version) FROM siwa.schema_version")
        guard let row = recorded.first, (try? row[0, as: Int.self]) == version else {
            throw PostgresCluster.ClusterError(
                description: "schema.sql applied but siwa.schema_version does not record version \(version)")
        }
    }
}

extension PostgresCluster {
    /// Creates a fresh database holding schema.sql (``TestSchema``) and returns a configuration for it.
    /// Throws when the schema does not apply. Safe to call from parallel tests.
    public func createSchemaDatabase() throws -> PostgresConfiguration {
        let configuration = try createDatabase()
        let connection = try PostgresConnection(configuration: configuration)
        defer { connection.close() }
        try TestSchema.apply(on: connection)
        return configuration
    }
}
