#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Why the HTTP server could not start.
public struct HTTPServerError: Error, CustomStringConvertible, Sendable {
    /// What went wrong, as an open set of values that can grow without breaking callers.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }

        /// The configuration is not usable (bad host, port out of range, non-positive limits).
        public static let invalidConfiguration = Code("invalidConfiguration")
        /// Another socket is already bound to the address and port.
        public static let addressInUse = Code("addressInUse")
        /// The listen socket could not be created, bound or put into listening state.
        public static let listenFailed = Code("listenFailed")
        /// libmicrohttpd refused to start (e.g. out of threads or memory).
        public static let startFailed = Code("startFailed")
        /// `start()` was called on a server that is running or has been shut down.
        public static let invalidState = Code("invalidState")

        public var description: String { name }
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
