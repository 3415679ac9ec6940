public import Postgres
import SiwaSchema
import Synchronization

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
    ///
    /// schema.sql is applied once per cluster, into a template database; every call copies it
    /// (`CREATE DATABASE … TEMPLATE`), which costs what creating an empty database costs. A copy holds
    /// what a fresh installation holds: the objects, their grants and comments, the rows schema.sql
    /// inserts (its versions are stamped as applied now, when the copy is made). The roles schema.sql
    /// creates are the cluster's, as they are for a second fresh installation in the same cluster. Tests
    /// that apply schema.sql on purpose (migrations, released schemas) use ``TestSchema/apply(on:)``.
    public func createSchemaDatabase() throws -> PostgresConfiguration {
        let (configuration, connection) = try createConnectedSchemaDatabase()
        connection.close()
        return configuration
    }

    /// ``createSchemaDatabase()``, plus the owner's connection that stamped the copy.
    func createConnectedSchemaDatabase() throws -> (PostgresConfiguration, PostgresConnection) {
        let configuration = try createDatabase(copying: try schemaTemplateName())
        let connection = try PostgresConnection(configuration: configuration)
        do {
            try TestSchema.stampCopy(on: connection)
        } catch {
            connection.close()
            throw error
        }
        return (configuration, connection)
    }

    /// The template: an empty database, schema.sql applied and checked, then closed to connections.
    private func schemaTemplateName() throws -> String {
        try schemaTemplate.withLock { cached in
            if let cached { return try cached.get() }
            let result = Result { () throws -> String in
                let configuration = try createDatabase()
                let name = configuration.database ?? ""
                let connection = try PostgresConnection(configuration: configuration)
                do {
                    try TestSchema.apply(on: connection)
                    connection.close()
                } catch {
                    connection.close()
                    throw error
                }
                // A database with a session in it cannot be copied: nobody may connect to the template.
                let admin = try PostgresConnection(configuration: self.configuration(database: "postgres"))
                defer { admin.close() }
                try admin.simpleQuery("ALTER DATABASE \(name) WITH IS_TEMPLATE true ALLOW_CONNECTIONS false")
                return name
            }
            cached = result
            return try result.get()
        }
    }
}

extension TestSchema {
    /// Marks a copy of the template as installed now (schema.sql records when each version was applied,
    /// e.g. for the health gauges' `installed_at`) and checks that it holds this schema's version.
    static func stampCopy(on connection: PostgresConnection) throws {
        let versions = try connection.query(
            "UPDATE siwa.schema_version SET applied_at = now() RETURNING version")
        guard (try versions.map { try $0[0, as: Int.self] }.max()) == version else {
            throw PostgresCluster.ClusterError(
                description: "the schema template does not record schema version \(version)")
        }
    }
}
