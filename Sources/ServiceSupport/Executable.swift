import Foundation

// The plumbing the three executables share: the database option, writing to the standard streams, and
// the error for an unusable setting. Libraries do not print; these are for the executables (and for the
// libraries' configuration validation, which throws ``ConfigurationError``).

/// A setting is unusable; ``message`` names it and says what is wrong.
///
/// The message is written by our own code and never quotes a secret (a database password, a token):
/// it is printed on one line of standard error by the executables, and logged.
public struct ConfigurationError: Error, Sendable, CustomStringConvertible, Equatable {
    /// One line for people, naming the setting.
    public let message: String

    /// Creates an error; `message` must not contain secrets or personal data.
    public init(_ message: String) { self.message = message }

    public var description: String { message }
}

extension CommandOption {
    /// `--database-url URL` (`SIWA_DATABASE_URL`), required: the PostgreSQL database holding schema.sql,
    /// as a URL or a conninfo string. One declaration for every executable and verb that connects. It may
    /// carry a password, so it is also read from `--database-url-file` or `SIWA_DATABASE_URL_FILE`
    /// (``CommandOption/Secrecy/connectionString``).
    public static let databaseURL = CommandOption(
        "database-url", valueName: "URL", help: "PostgreSQL URL or conninfo string (schema.sql applied).",
        isRequired: true, environmentVariable: "SIWA_DATABASE_URL"
    ).secret(.connectionString)

    /// `--log-level LEVEL` (`SIWA_LOG_LEVEL`, default info): the services' log threshold, read by
    /// ``ParsedCommand/logger(label:)``.
    public static let logLevel = CommandOption(
        "log-level", valueName: "LEVEL", help: "debug, info, warning or error.",
        environmentVariable: "SIWA_LOG_LEVEL", defaultValue: "info")
}

extension ParsedCommand {
    /// A logger named `label` at the level `--log-level` gives (``CommandOption/logLevel``).
    /// - Throws: ``ConfigurationError`` when that is not debug, info, warning or error.
    public func logger(label: String) throws(ConfigurationError) -> Logger {
        guard let level = Logger.Level(name: value("log-level") ?? "info") else {
            throw ConfigurationError("--log-level must be debug, info, warning or error")
        }
        return Logger(label: label, level: level)
    }
}

/// Writes `text` to standard output as it is (unbuffered).
public func writeStandardOutput(_ text: String) {
    FileHandle.standardOutput.write(Data(text.utf8))
}

/// Writes `text` to standard error as it is (unbuffered).
public func writeStandardError(_ text: String) {
    FileHandle.standardError.write(Data(text.utf8))
}

/// Writes `command: message` as one line to standard error: how the executables report a usage or
/// configuration error, a failure, or a local tool's log line. The message is escaped
/// (``TerminalText/escaped(_:)``): whatever it quotes from outside — an argument, a request's header or
/// path, a server's error — can neither steer the terminal nor start a line of its own.
public func writeErrorLine(_ command: String, _ message: String) {
    writeStandardError("\(command): \(TerminalText.escaped(message))\n")
}
