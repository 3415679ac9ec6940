import Foundation
public import Postgres
public import ServiceSupport

/// The auth database an adapter's `connection_ref` names: the one reading of its file and the one way to
/// connect to it, for the worker's lanes and `siwactl adapters test`.
public enum AuthDatabase {
    /// The URL in the file of `reference` (``connectionFile(_:)``).
    public static func url(_ reference: String) throws(ConfigurationError) -> String {
        try connectionFile(reference)
    }

    /// The content of an adapter's connection file — a database URL, or a hosted platform's credentials —
    /// from its `reference` (`file:` and an absolute path, owner-only, not empty), trimmed. The error names
    /// the file and the cause, never its content.
    public static func connectionFile(_ reference: String) throws(ConfigurationError) -> String {
        guard reference.hasPrefix("file:") else {
            throw ConfigurationError("the connection is a file: reference (file:PATH), never the URL itself")
        }
        let path = String(reference.dropFirst(5))
        guard path.hasPrefix("/") else {
            throw ConfigurationError("the connection file \(path) is not an absolute path")
        }
        let text = String(decoding: try SecretFile.read(path, setting: "the connection file"), as: UTF8.self)
            .trimmingCharacters(in: .whitespacesAndNewlines)
        guard !text.isEmpty else {
            throw ConfigurationError(
                "the connection file \(path) is empty: put the auth database's URL (or the platform's credentials) in it"
            )
        }
        return text
    }

    /// A connection to `url` as `applicationName`, its statements not cached (the auth database's schema
    /// is not ours), each statement and lock wait bounded by `timeout`.
    public static func connect(_ url: String, applicationName: String, timeout: Duration)
        throws(PostgresError)
        -> PostgresConnection
    {
        var configuration = try PostgresConfiguration(url, applicationName: applicationName)
        configuration.statementCacheCapacity = 0
        let connection = try PostgresConnection(configuration: configuration)
        let milliseconds = "\(Int(timeout.inSeconds * 1000))ms"
        do {
            _ = try connection.query(
                "SELECT set_config('statement_timeout', $1, false), set_config('lock_timeout', $2, false)",
                [.text(milliseconds), .text(milliseconds)])
        } catch {
            connection.close()
            throw error
        }
        return connection
    }
}
