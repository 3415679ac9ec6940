/// An error from the PostgreSQL client: a stable `code` to branch on, the server's SQLSTATE when there
/// is one, and a message that never contains parameter values.
///
/// As postgres-nio's `PSQLError`: ``description`` (what `"\(error)"` and loggers show) is generic and
/// safe to log — the code, the SQLSTATE and the constraint name, never the server's message, which can
/// quote the data a statement was given. The details are in ``message`` and ``debugDescription``
/// (`String(reflecting: error)`), redacted: a data exception's quoted input is removed.
public struct PostgresError: Error, Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    /// What kind of failure this is. New codes may be added; match the ones you care about.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// A short snake_case label, fit for logs and metrics.
        public let rawValue: String
        private init(_ rawValue: String) { self.rawValue = rawValue }

        public var description: String { rawValue }

        /// Could not open a connection (server down, refused, bad credentials, bad configuration).
        public static let connectionFailed = Code("connection_failed")
        /// An established connection broke (server restart, admin shutdown, network failure).
        public static let connectionLost = Code("connection_lost")
        /// The connection was closed by this process and cannot be used any more.
        public static let connectionClosed = Code("connection_closed")
        /// The connection string or another setting is invalid.
        public static let invalidConfiguration = Code("invalid_configuration")
        /// SQLSTATE 23505: a unique or primary key constraint rejected the row.
        public static let uniqueViolation = Code("unique_violation")
        /// SQLSTATE 23503: a foreign key constraint rejected the change.
        public static let foreignKeyViolation = Code("foreign_key_violation")
        /// Another integrity constraint (class 23: not null, check, exclusion) rejected the change.
        public static let constraintViolation = Code("constraint_violation")
        /// SQLSTATE 40001: a serializable transaction could not be serialized; retry it.
        public static let serializationFailure = Code("serialization_failure")
        /// SQLSTATE 40P01: the transaction was chosen as a deadlock victim; retry it.
        public static let deadlock = Code("deadlock")
        /// Any other error reported by the server for a statement (syntax, missing table, …).
        public static let queryFailed = Code("query_failed")
        /// A value in a result could not be decoded as the requested Swift type.
        public static let decoding = Code("decoding")
        /// SQLSTATE 25006: the server accepts no writes — a hot standby (a failover or a connection string
        /// without `target_session_attrs=read-write` led here) or `default_transaction_read_only`. The
        /// connection is not reused: a new one may reach the read-write primary. Retry the work.
        public static let readOnly = Code("read_only")
        /// A wait ran out of time, or the server cancelled a statement (SQLSTATE 57014).
        public static let timeout = Code("timeout")
        /// No pooled connection became free before the acquisition timeout.
        public static let poolExhausted = Code("pool_exhausted")
        /// The pool was closed.
        public static let poolClosed = Code("pool_closed")
        /// The server answered with something this library does not support (e.g. COPY).
        public static let unsupported = Code("unsupported")
    }

    /// The kind of failure.
    public var code: Code
    /// The five-character SQLSTATE reported by the server, if any (e.g. `"23505"`).
    public var sqlState: String?
    /// Details for people: the server's primary message (a data exception's quoted input removed) or this
    /// library's own explanation. It never contains statement parameter values, but a server message can
    /// name objects or repeat what a function raised: it is not part of ``description``.
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

    /// True when the connection this came from can no longer be used (it broke, or it reaches a server
    /// that accepts no writes, ``Code/readOnly``): the work failed as a whole, not because of its data.
    public var isConnectionError: Bool {
        code == .connectionFailed || code == .connectionLost || code == .connectionClosed || code == .readOnly
    }

    /// True when running the same work again (on a fresh connection or transaction) may succeed.
    public var isRetryable: Bool {
        isConnectionError || code == .serializationFailure || code == .deadlock
            || code == .poolExhausted || sqlState == "55P03"
    }

    /// `PostgresError(code: …, sqlState: …, constraint: …)`: safe for logs, without the message —
    /// except for ``Code/connectionFailed``, whose message is libpq's reason with any password masked
    /// (``connectionFailureReason``): it names only the host, port, user and database and the server's
    /// reason, never data a statement carried, and without it a wrong password, a missing database or
    /// a missing pg_hba.conf entry would all look alike in the log.
    public var description: String {
        var text = "PostgresError(code: \(code)"
        if let sqlState { text += ", sqlState: \(sqlState)" }
        if let constraintName { text += ", constraint: \(constraintName)" }
        if let reason = connectionFailureReason { text += ", reason: \(reason.debugDescription)" }
        return text + ")"
    }

    /// For ``Code/connectionFailed``: why the connection could not be opened, as libpq says it
    /// (`connection to server at "db" (10.0.0.5), port 5432 failed: FATAL:  password authentication
    /// failed for user "siwa_worker_login"`), on one line, any password masked; `nil` for other codes.
    public var connectionFailureReason: String? {
        guard code == .connectionFailed, !message.isEmpty else { return nil }
        return message.split(whereSeparator: \.isNewline).map { String($0).trimmingWhitespace() }
            .filter { !$0.isEmpty }.joined(separator: "; ")
    }

    /// ``description`` followed by the (redacted) ``message``: for an operator's terminal or a debugger.
    public var debugDescription: String {
        String(description.dropLast()) + ", message: " + message.debugDescription + ")"
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
        case "25006": return .readOnly
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
