import Foundation
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

/// Minimal JSON text helpers for hand-built output on hot paths.
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
            case _ where scalar.value < 0x20:
                output.append(String(format: "\\u%04x", scalar.value))
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
}
