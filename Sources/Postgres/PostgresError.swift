/// An error from the PostgreSQL client: a stable `code` to branch on, the server's SQLSTATE when there
/// is one, and a message that never contains parameter values.
public struct PostgresError: Error, Sendable, CustomStringConvertible {
    /// What kind of failure this is. New codes may be added; match the ones you care about.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }

        public var description: String { name }

        /// Could not open a connection (server down, refused, bad credentials, bad configuration).
        public static let connectionFailed = Code("connectionFailed")
        /// An established connection broke (server restart, admin shutdown, network failure).
        public static let connectionLost = Code("connectionLost")
        /// The connection was closed by this process and cannot be used any more.
        public static let connectionClosed = Code("connectionClosed")
        /// The connection string or another setting is invalid.
        public static let invalidConfiguration = Code("invalidConfiguration")
        /// SQLSTATE 23505: a unique or primary key constraint rejected the row.
        public static let uniqueViolation = Code("uniqueViolation")
        /// SQLSTATE 23503: a foreign key constraint rejected the change.
        public static let foreignKeyViolation = Code("foreignKeyViolation")
        /// Another integrity constraint (class 23: not null, check, exclusion) rejected the change.
        public static let constraintViolation = Code("constraintViolation")
        /// SQLSTATE 40001: a serializable transaction could not be serialized; retry it.
        public static let serializationFailure = Code("serializationFailure")
        /// SQLSTATE 40P01: the transaction was chosen as a deadlock victim; retry it.
        public static let deadlock = Code("deadlock")
        /// Any other error reported by the server for a statement (syntax, missing table, …).
        public static let queryFailed = Code("queryFailed")
        /// A value in a result could not be decoded as the requested Swift type.
        public static let decoding = Code("decoding")
        /// A wait ran out of time, or the server cancelled a statement (SQLSTATE 57014).
        public static let timeout = Code("timeout")
        /// No pooled connection became free before the acquisition timeout.
        public static let poolExhausted = Code("poolExhausted")
        /// The pool was closed.
        public static let poolClosed = Code("poolClosed")
        /// The server answered with something this library does not support (e.g. COPY).
        public static let unsupported = Code("unsupported")
    }

    /// The kind of failure.
    public var code: Code
    /// The five-character SQLSTATE reported by the server, if any (e.g. `"23505"`).
    public var sqlState: String?
    /// A human-readable message. It never contains statement parameter values.
    public var message: String
    /// The name of the violated constraint, for integrity errors.
    public var constraintName: String?

    /// Creates an error; used by this module and by tests that need to fake one.
    public init(code: Code, message: String, sqlState: String? = nil, constraintName: String? = nil) {
        self.code = code
        self.message = message
        self.sqlState = sqlState
        self.constraintName = constraintName
    }

    /// True when the connection this came from can no longer be used.
    public var isConnectionError: Bool {
        code == .connectionFailed || code == .connectionLost || code == .connectionClosed
    }

    /// True when running the same work again (on a fresh connection or transaction) may succeed.
    public var isRetryable: Bool {
        isConnectionError || code == .serializationFailure || code == .deadlock
            || code == .poolExhausted || sqlState == "55P03"
    }

    public var description: String {
        var text = "PostgresError(\(code)"
        if let sqlState { text += ", sqlState: \(sqlState)" }
        if let constraintName { text += ", constraint: \(constraintName)" }
        return text + "): " + message
    }
}

extension PostgresError {
    /// Maps a server SQLSTATE to a code. Connection classes map to `.connectionLost`.
    static func code(forSQLState state: String?) -> Code {
        guard let state else { return .queryFailed }
        switch state {
        case "23505": return .uniqueViolation
        case "23503": return .foreignKeyViolation
        case "40001": return .serializationFailure
        case "40P01": return .deadlock
        case "57014": return .timeout
        case "57P01", "57P02", "57P03": return .connectionLost
        default:
            if state.hasPrefix("08") { return .connectionLost }
            if state.hasPrefix("23") { return .constraintViolation }
            return .queryFailed
        }
    }

    /// Server messages for data exceptions (class 22) quote the offending input, which may be a token
    /// or an e-mail address: replace quoted text with an ellipsis.
    static func redacted(_ message: String, sqlState: String?) -> String {
        guard let sqlState, sqlState.hasPrefix("22") else { return message }
        var result = ""
        var inQuote = false
        for character in message {
            if character == "\"" {
                if inQuote { result += "…\"" } else { result.append(character) }
                inQuote.toggle()
            } else if !inQuote {
                result.append(character)
            }
        }
        if inQuote { result += "…" }
        return result
    }
}
