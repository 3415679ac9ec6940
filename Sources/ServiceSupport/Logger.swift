public import Foundation
import Synchronization

/// A structured logger that writes one JSON object per line.
///
/// Fields are typed so that nothing is stringly formatted by accident; callers decide what to log and
/// must never pass tokens or email addresses (the receiver and worker only log identifiers and codes).
public final class Logger: Sendable {
    /// Severity, in increasing order.
    public enum Level: Int, Sendable, Comparable, CustomStringConvertible {
        case debug, info, warning, error

        public static func < (lhs: Level, rhs: Level) -> Bool { lhs.rawValue < rhs.rawValue }

        public var description: String {
            switch self {
            case .debug: "debug"
            case .info: "info"
            case .warning: "warning"
            case .error: "error"
            }
        }

        /// Parses `debug`, `info`, `warning` (or `warn`) and `error`.
        public init?(name: String) {
            switch name.lowercased() {
            case "debug": self = .debug
            case "info": self = .info
            case "warning", "warn": self = .warning
            case "error": self = .error
            default: return nil
            }
        }
    }

    /// A field value.
    public enum Value: Sendable, ExpressibleByStringLiteral, ExpressibleByIntegerLiteral {
        case string(String)
        case int(Int)
        case double(Double)
        case bool(Bool)

        public init(stringLiteral value: String) { self = .string(value) }
        public init(integerLiteral value: Int) { self = .int(value) }
    }

    private let minimumLevel: Level
    private let label: String
    private let sink: @Sendable (String) -> Void
    private let lock = Mutex(())

    /// Creates a logger for a component (`label` appears as the `logger` field).
    /// - Parameter sink: where finished lines go; standard error by default.
    public init(
        label: String, level: Level = .info,
        sink: @escaping @Sendable (String) -> Void = { line in FileHandle.standardError.write(Data(line.utf8))
        }
    ) {
        self.label = label
        self.minimumLevel = level
        self.sink = sink
    }

    /// Whether a message at `level` would be written.
    public func isEnabled(_ level: Level) -> Bool { level >= minimumLevel }

    /// Writes one line: `time`, `level`, `logger`, `msg`, then `fields` in a stable (sorted) order.
    public func log(_ level: Level, _ message: String, _ fields: [String: Value] = [:]) {
        guard isEnabled(level) else { return }
        var line = "{\"time\":\"\(Self.timestamp())\",\"level\":\"\(level)\",\"logger\":"
        JSONText.appendString(label, to: &line)
        line += ",\"msg\":"
        JSONText.appendString(message, to: &line)
        for key in fields.keys.sorted() {
            line += ","
            JSONText.appendString(key, to: &line)
            line += ":"
            switch fields[key]! {
            case .string(let s): JSONText.appendString(s, to: &line)
            case .int(let i): line += String(i)
            case .double(let d): line += d.isFinite ? String(d) : "null"
            case .bool(let b): line += b ? "true" : "false"
            }
        }
        line += "}\n"
        lock.withLock { _ in sink(line) }
    }

    public func debug(_ message: String, _ fields: [String: Value] = [:]) { log(.debug, message, fields) }
    public func info(_ message: String, _ fields: [String: Value] = [:]) { log(.info, message, fields) }
    public func warning(_ message: String, _ fields: [String: Value] = [:]) { log(.warning, message, fields) }
    public func error(_ message: String, _ fields: [String: Value] = [:]) { log(.error, message, fields) }

    private static func timestamp() -> String {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        var t = time_t(ts.tv_sec)
        var parts = tm()
        gmtime_r(&t, &parts)
        let millis = Int(ts.tv_nsec) / 1_000_000
        return String(
            format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1,
            Int(parts.tm_mday), Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec), millis)
    }
}

/// JSON text: the one JSON string escaper, for hand-built output on hot paths (the log) and for lines
/// serialized by Foundation.
///
/// Every control character is escaped — C0 (as `\n`, `\r`, `\t` or `\u00XX`), DEL and C1 (`\u007f`,
/// `\u0085`, `\u009b` …) — and so are U+2028 and U+2029: a line of JSON read on a terminal, by `tail`, by
/// a log shipper or by JavaScript is one line of text that steers nothing.
public enum JSONText {
    /// Appends `value` as a JSON string literal (quoted and escaped) to `output`.
    public static func appendString(_ value: String, to output: inout String) {
        output.append("\"")
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\"": output.append("\\\"")
            case "\\": output.append("\\\\")
            case "\n": output.append("\\n")
            case "\r": output.append("\\r")
            case "\t": output.append("\\t")
            case _ where isEscapedControl(scalar): appendEscape(scalar, to: &output)
            default: output.unicodeScalars.append(scalar)
            }
        }
        output.append("\"")
    }

    /// `value` as a JSON string literal.
    public static func quoted(_ value: String) -> String {
        var out = ""
        appendString(value, to: &out)
        return out
    }

    /// One JSON object per line (keys sorted, slashes unescaped, then a newline), serialized by
    /// Foundation and with the controls it leaves as they are (DEL, C1, U+2028, U+2029) escaped too.
    public static func line(_ object: [String: Any]) -> String {
        let data =
            (try? JSONSerialization.data(
                withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes]))
            ?? Data("{}".utf8)
        return escapingControls(String(decoding: data, as: UTF8.self)) + "\n"
    }

    /// Serialized JSON with every control character still raw written as `\u00XX`. Valid JSON in, valid
    /// JSON out: outside strings JSON holds only ASCII structure and whitespace, and the whitespace
    /// (space, tab, newline, return) is left as it is.
    public static func escapingControls(_ json: String) -> String {
        guard json.unicodeScalars.contains(where: isEscapedControl) else { return json }
        var output = ""
        output.reserveCapacity(json.utf8.count + 16)
        for scalar in json.unicodeScalars {
            if isEscapedControl(scalar) {
                appendEscape(scalar, to: &output)
            } else {
                output.unicodeScalars.append(scalar)
            }
        }
        return output
    }

    /// C0 other than tab, newline and return (handled by the callers), DEL, C1, U+2028 and U+2029.
    static func isEscapedControl(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x09, 0x0A, 0x0D: false
        case 0x00...0x1F, 0x7F...0x9F, 0x2028, 0x2029: true
        default: false
        }
    }

    static func appendEscape(_ scalar: Unicode.Scalar, to output: inout String) {
        output.append("\\u" + TerminalText.hex(scalar.value, digits: 4))
    }
}
