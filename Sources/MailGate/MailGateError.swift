/// A failure of the gate: a listener that cannot be opened, a database answer that breaks the contract.
/// ``description`` is safe to log: it never carries an address or the server's text.
public struct MailGateError: Error, Sendable, CustomStringConvertible {
    /// Machine-readable reason.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let rawValue: String
        private init(_ rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }
        /// The policy listener cannot be bound or listen.
        public static let listenFailed = Code("listen_failed")
        /// The database answered something other than the contract's rows.
        public static let databaseAnswer = Code("database_answer")
    }

    public let code: Code
    public let message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "MailGateError.\(code): \(message)" }
}
