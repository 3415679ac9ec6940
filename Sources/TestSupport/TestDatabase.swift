public import Postgres

/// A fresh database of a test cluster, and the owner's connection to it: the one database type of the
/// tests, with several setups (as HummingbirdTesting has one harness with a `.router` and a `.live`
/// setup):
/// - ``Setup/schema``: schema.sql, copied from the cluster's template (``PostgresCluster/createSchemaDatabase()``).
/// - ``Setup/empty``: nothing in it, for what installs the schema itself (`siwactl migrate`, a released
///   schema applied on purpose).
/// - ``Setup/applying(_:)``: an empty database and then the given SQL.
///
/// Tests reach it as the owner (a superuser: ``connection``, ``connect()``, ``query(_:_:)``) and as a login
/// role of a group role (``configuration(asMemberOf:)``), which proves that the group's grants suffice.
public final class TestDatabase: Sendable {
    /// What a new database holds.
    public struct Setup: Sendable, CustomStringConvertible {
        let sql: String?
        let schema: Bool
        public let description: String

        /// schema.sql, as a fresh installation holds it.
        public static let schema = Setup(sql: nil, schema: true, description: "schema")
        /// Nothing.
        public static let empty = Setup(sql: nil, schema: false, description: "empty")
        /// `sql`, run in an empty database (a simple query: several statements are fine).
        public static func applying(_ sql: String) -> Setup {
            Setup(sql: sql, schema: false, description: "applying SQL")
        }
    }

    /// The cluster the database is in.
    public let cluster: PostgresCluster
    /// The owner's (the superuser's) configuration, over the unix socket.
    public let configuration: PostgresConfiguration
    /// A connection as the owner, open while this value lives, for the test's own SQL. Like every
    /// `PostgresConnection` it serves one thread at a time: threads of a test connect on their own
    /// (``connect()``).
    public let connection: PostgresConnection

    /// Creates a database in `cluster` (by default ``PostgresCluster/shared``) holding `setup`.
    public init(_ setup: Setup = .schema, cluster: PostgresCluster? = nil) throws {
        let cluster = try cluster ?? PostgresCluster.shared
        self.cluster = cluster
        if setup.schema {
            (configuration, connection) = try cluster.createConnectedSchemaDatabase()
        } else {
            configuration = try cluster.createDatabase(applying: setup.sql)
            connection = try PostgresConnection(configuration: configuration)
        }
    }

    deinit { connection.close() }

    /// The database's name.
    public var name: String { configuration.database ?? "" }

    /// The owner's URL over the unix socket (for the executables' `--database-url`).
    public var url: String { cluster.url(database: name) }

    /// A new connection as the owner; the caller closes it.
    public func connect() throws -> PostgresConnection {
        try PostgresConnection(configuration: configuration)
    }

    /// Runs `sql` with `parameters` on ``connection``.
    @discardableResult
    public func query(_ sql: String, _ parameters: [PostgresData?] = []) throws -> PostgresRows {
        try connection.query(sql, parameters)
    }

    /// The first column of the first row of `sql`, decoded as `T`; throws when there is no row.
    public func value<T: PostgresDecodable>(
        _ sql: String, _ parameters: [PostgresData?] = [], as type: T.Type = T.self
    ) throws -> T {
        guard let row = try connection.query(sql, parameters).first else {
            throw PostgresError(code: .decoding, message: "no row for: \(sql)")
        }
        return try row[0, as: T.self]
    }

    // MARK: Login roles

    /// The login role the tests use for `group` (nil: a login role in no group, which may do what
    /// PUBLIC may), created on first use; roles are the cluster's, so it serves every database there.
    public func loginRole(memberOf group: String?) throws -> String {
        try cluster.loginRole(memberOf: group)
    }

    /// A configuration of this database for ``loginRole(memberOf:)`` of `group`.
    public func configuration(asMemberOf group: String?) throws -> PostgresConfiguration {
        try PostgresConfiguration(
            "host=\(cluster.socketDirectory) port=\(cluster.port) dbname=\(name) "
                + "user=\(loginRole(memberOf: group))")
    }

    /// A URL of this database for ``loginRole(memberOf:)`` of `group` (for `--database-url`).
    public func url(asMemberOf group: String?) throws -> String {
        "postgresql://\(try loginRole(memberOf: group))@/\(name)?host=\(cluster.socketDirectory)"
            + "&port=\(cluster.port)"
    }

    /// A new connection as ``loginRole(memberOf:)`` of `group`; the caller closes it.
    public func connect(asMemberOf group: String?) throws -> PostgresConnection {
        try PostgresConnection(configuration: configuration(asMemberOf: group))
    }
}
