/// One Postfix policy delegation request (SMTPD_POLICY_README): its `name=value` attributes.
public struct PolicyRequest: Sendable, Equatable {
    /// The attributes by name; a name given twice keeps its last value.
    public var attributes: [String: String]

    public init(attributes: [String: String]) { self.attributes = attributes }

    /// `protocol_state` (`RCPT`, `DATA`, …), empty when absent.
    public var protocolState: String { attributes["protocol_state"] ?? "" }
    /// `recipient`, empty when absent.
    public var recipient: String { attributes["recipient"] ?? "" }
}

/// Why a connection's input is refused: the request is answered with nothing and the connection closed
/// (the README's rule for a client that does not speak the protocol).
public enum PolicyRefusal: String, Error, Sendable, Equatable {
    /// A line that is not `name=value` (no `=`, an empty name, a NUL byte, not UTF-8).
    case malformed
    /// A request over the byte or attribute bound.
    case oversized
}

/// Splits a connection's bytes into policy requests: attribute lines ending in an empty line.
///
/// A value, not I/O: ``feed(_:)`` appends what was read, ``next()`` returns the next complete request,
/// `nil` when more bytes are needed, or a refusal after which the connection must be closed.
public struct PolicyReader: Sendable {
    /// The most bytes one request may take, its empty line included.
    public let maximumBytes: Int
    /// The most attribute lines one request may have.
    public let maximumAttributes: Int

    private var buffer: [UInt8] = []
    /// Where scanning for the next line starts (bytes before it are complete lines of this request).
    private var scanned = 0
    private var lineStart = 0
    private var attributes: [String: String] = [:]
    private var lines = 0

    public init(maximumBytes: Int = 64 * 1024, maximumAttributes: Int = 200) {
        self.maximumBytes = maximumBytes
        self.maximumAttributes = maximumAttributes
    }

    /// Whether nothing of a next request has arrived yet (a connection may be closed here without loss).
    public var isIdle: Bool { buffer.isEmpty }

    /// Appends bytes read from the connection.
    public mutating func feed(_ bytes: some Collection<UInt8>) { buffer.append(contentsOf: bytes) }

    /// The next complete request, `nil` when it has not fully arrived, or the refusal.
    public mutating func next() -> Result<PolicyRequest, PolicyRefusal>? {
        while let newline = buffer[scanned...].firstIndex(of: UInt8(ascii: "\n")) {
            let line = buffer[lineStart..<newline]
            scanned = newline + 1
            lineStart = scanned
            if line.isEmpty {
                let request = PolicyRequest(attributes: attributes)
                buffer.removeFirst(scanned)
                scanned = 0
                lineStart = 0
                attributes = [:]
                lines = 0
                return .success(request)
            }
            lines += 1
            guard lines <= maximumAttributes else { return .failure(.oversized) }
            guard let equals = line.firstIndex(of: UInt8(ascii: "=")), equals > line.startIndex,
                !line.contains(0), let name = String(validating: line[..<equals], as: UTF8.self),
                let value = String(validating: line[(equals + 1)...], as: UTF8.self)
            else { return .failure(.malformed) }
            attributes[name] = value
            guard scanned <= maximumBytes else { return .failure(.oversized) }
        }
        scanned = buffer.count
        guard buffer.count <= maximumBytes else { return .failure(.oversized) }
        return nil
    }
}
