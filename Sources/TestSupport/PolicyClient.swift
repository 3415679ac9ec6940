import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// What smtpd does to a policy service (Postfix's SMTPD_POLICY_README), for tests: one TCP connection,
/// requests of `name=value` lines ending in an empty line, each answered by an `action=` line and an
/// empty line. Not thread-safe; the socket is closed when the value goes away.
public final class PolicyClient {
    private let fd: Int32
    private var buffered: [UInt8] = []

    /// Connects to `address` (`HOST:PORT`, IPv4); reads time out after `timeout`.
    public init(_ address: String, timeout: Duration = .seconds(10)) throws {
        guard let colon = address.lastIndex(of: ":"),
            let port = UInt16(address[address.index(after: colon)...])
        else { throw ExecutableError("not HOST:PORT: \(address)") }
        // The descriptor becomes the object's only once connected: a failed init must not leave deinit a
        // descriptor it already closed (closing it twice could close another test's socket).
        let socketFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard socketFD >= 0 else { throw ExecutableError("socket() failed") }
        let (seconds, attoseconds) = timeout.components
        var interval = timeval(tv_sec: Int(seconds), tv_usec: Int(attoseconds / 1_000_000_000_000))
        _ = setsockopt(socketFD, SOL_SOCKET, SO_RCVTIMEO, &interval, socklen_t(MemoryLayout<timeval>.size))
        var target = sockaddr_in()
        target.sin_family = sa_family_t(AF_INET)
        target.sin_port = port.bigEndian
        target.sin_addr.s_addr = inet_addr(String(address[..<colon]))
        let connected = withUnsafePointer(to: &target) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(socketFD, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
        guard connected else {
            let reason = String(cString: strerror(errno))
            close(socketFD)
            throw ExecutableError("connect to \(address): \(reason)")
        }
        fd = socketFD
    }

    deinit { close(fd) }

    /// The text of a request: `request=smtpd_access_policy`, `protocol_state`, `recipient` and `extra`
    /// attributes, then the empty line.
    public static func request(state: String = "RCPT", recipient: String, extra: [(String, String)] = [])
        -> String
    {
        var lines = [
            "request=smtpd_access_policy", "protocol_state=\(state)", "protocol_name=ESMTP",
            "client_address=192.0.2.1", "client_name=mail.example.net", "helo_name=mail.example.net",
            "sender=news@example.com", "recipient=\(recipient)", "recipient_count=0",
        ]
        lines += extra.map { "\($0.0)=\($0.1)" }
        return lines.joined(separator: "\n") + "\n\n"
    }

    /// Sends `text` as it is.
    public func send(_ text: String) throws {
        var bytes = Array(text.utf8)[...]
        while !bytes.isEmpty {
            let written = bytes.withUnsafeBytes {
                Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            guard written > 0 else { throw ExecutableError("send: \(String(cString: strerror(errno)))") }
            bytes = bytes.dropFirst(written)
        }
    }

    /// The next answer's `action=` value, or nil when the service closed the connection first.
    /// - Throws: when the read times out, or the answer is not `action=…` and an empty line.
    public func answer() throws -> String? {
        while true {
            if let end = Self.find([10, 10], in: buffered) {
                let text = String(decoding: buffered[..<end], as: UTF8.self)
                buffered.removeFirst(end + 2)
                guard text.hasPrefix("action="), !text.contains("\n") else {
                    throw ExecutableError("not one action line: \(text)")
                }
                return String(text.dropFirst("action=".count))
            }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let count = recv(fd, &chunk, chunk.count, 0)
            if count == 0 {
                guard buffered.isEmpty else { throw ExecutableError("closed inside an answer") }
                return nil
            }
            guard count > 0 else { throw ExecutableError("recv: \(String(cString: strerror(errno)))") }
            buffered += chunk[0..<count]
        }
    }

    /// Sends one request for `recipient` and returns its action.
    public func ask(state: String = "RCPT", recipient: String) throws -> String? {
        try send(Self.request(state: state, recipient: recipient))
        return try answer()
    }

    private static func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        for start in 0...(haystack.count - needle.count) where haystack[start] == needle[0] {
            if Array(haystack[start..<(start + needle.count)]) == needle { return start }
        }
        return nil
    }
}
