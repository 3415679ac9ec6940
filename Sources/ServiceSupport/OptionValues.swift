import Foundation

/// A `HOST:PORT` listen address, as given to `--listen` and `--metrics-listen`.
public struct ListenAddress: Sendable, Equatable, CustomStringConvertible {
    /// The host: an IPv4 or IPv6 literal (without brackets) or a name such as `localhost`.
    public var host: String
    /// The port, 0–65535 (0: any free port).
    public var port: Int

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// Parses `HOST:PORT`, `[IPv6]:PORT` or `:PORT` (all interfaces).
    public init?(parsing text: String) {
        let hostPart: Substring
        let portPart: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":")
            else {
                return nil
            }
            hostPart = text[text.index(after: text.startIndex)..<close]
            portPart = text[text.index(close, offsetBy: 2)...]
        } else {
            guard let colon = text.lastIndex(of: ":") else { return nil }
            hostPart = text[..<colon]
            portPart = text[text.index(after: colon)...]
            if hostPart.contains(":") { return nil }  // IPv6 needs brackets
        }
        guard let port = Int(portPart), (0...65535).contains(port) else { return nil }
        self.host = hostPart.isEmpty ? "0.0.0.0" : String(hostPart)
        self.port = port
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }

    /// Whether the host names this machine's loopback interface only: `localhost`, 127.0.0.0/8 or `::1`.
    public var isLoopback: Bool {
        if host == "localhost" || host == "::1" { return true }
        var address = in_addr()
        guard inet_pton(AF_INET, host, &address) == 1 else {
            var address6 = in6_addr()
            guard inet_pton(AF_INET6, host, &address6) == 1 else { return false }
            return withUnsafeBytes(of: &address6) { $0.elementsEqual([UInt8](repeating: 0, count: 15) + [1]) }
        }
        return UInt32(bigEndian: address.s_addr) >> 24 == 127
    }
}

/// Parses a number of seconds (fractional allowed) into a `Duration`; nil unless finite and ≥ 0.
public func parseSeconds(_ text: String) -> Duration? {
    guard let value = Double(text), value.isFinite, value >= 0, value < 1e9 else { return nil }
    return .nanoseconds(Int64((value * 1e9).rounded()))
}

extension ParsedCommand {
    /// The whole number given for option `name`, or nil when it has no value.
    /// - Throws: `invalidValue` when the value is not a whole number within `range`.
    public func integer(_ name: String, in range: ClosedRange<Int>) throws(CommandLineError) -> Int? {
        guard let text = value(name) else { return nil }
        guard let number = Int(text), range.contains(number) else {
            throw CommandLineError(
                .invalidValue,
                "--\(name) must be a whole number from \(range.lowerBound) to \(range.upperBound), not '\(text)'"
            )
        }
        return number
    }

    /// The finite, non-negative number given for option `name`, or nil when it has no value.
    /// - Throws: `invalidValue` otherwise.
    public func number(_ name: String) throws(CommandLineError) -> Double? {
        guard let text = value(name) else { return nil }
        guard let number = Double(text), number.isFinite, number >= 0 else {
            throw CommandLineError(.invalidValue, "--\(name) must be a non-negative number, not '\(text)'")
        }
        return number
    }

    /// The number of seconds (fractional allowed) given for option `name`, or nil when it has no value.
    /// - Throws: `invalidValue` when the value is not a finite number ≥ 0 (> 0 when `positive`).
    public func seconds(_ name: String, positive: Bool = false) throws(CommandLineError) -> Duration? {
        guard let text = value(name) else { return nil }
        guard let duration = parseSeconds(text), !positive || duration > .zero else {
            throw CommandLineError(
                .invalidValue,
                "--\(name) must be a \(positive ? "positive" : "non-negative") number of seconds, not '\(text)'"
            )
        }
        return duration
    }

    /// The `HOST:PORT` given for option `name`, or nil when it has no value.
    /// - Throws: `invalidValue` when the value is not `HOST:PORT` or `[IPv6]:PORT`.
    public func listenAddress(_ name: String) throws(CommandLineError) -> ListenAddress? {
        guard let text = value(name) else { return nil }
        guard let address = ListenAddress(parsing: text) else {
            throw CommandLineError(.invalidValue, "--\(name) must be HOST:PORT, not '\(text)'")
        }
        return address
    }
}
