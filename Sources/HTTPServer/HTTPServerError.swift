#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Why the HTTP server could not start.
public struct HTTPServerError: Error, CustomStringConvertible, Sendable {
    /// What went wrong, as an open set of values that can grow without breaking callers.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// A short snake_case label, fit for logs and metrics.
        public let rawValue: String
        private init(_ rawValue: String) { self.rawValue = rawValue }

        /// The configuration is not usable (bad host, port out of range, non-positive limits).
        public static let invalidConfiguration = Code("invalid_configuration")
        /// Another socket is already bound to the address and port.
        public static let addressInUse = Code("address_in_use")
        /// The listen socket could not be created, bound or put into listening state.
        public static let listenFailed = Code("listen_failed")
        /// libmicrohttpd refused to start (e.g. out of threads or memory).
        public static let startFailed = Code("start_failed")
        /// `start()` was called on a server that is running or has been shut down.
        public static let invalidState = Code("invalid_state")

        public var description: String { rawValue }
    }

    /// The kind of failure.
    public let code: Code
    /// A human-readable explanation (never contains request data).
    public let message: String

    /// Creates an error; the server creates these.
    public init(code: Code, message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "HTTPServerError.\(code): \(message)" }

    static func systemMessage(_ number: Int32) -> String {
        guard let text = strerror(number) else { return "errno \(number)" }
        return String(cString: text)
    }
}
