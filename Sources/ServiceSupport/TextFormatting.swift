public import Foundation

/// `2026-01-31 12:00:05Z`: second precision, for tables and one-line reports.
public func formatShort(_ date: Date) -> String {
    let formatter = ISO8601DateFormatter()
    formatter.formatOptions = [
        .withFullDate, .withTime, .withColonSeparatorInTime, .withSpaceBetweenDateAndTime,
    ]
    return formatter.string(from: date) + "Z"
}

/// A duration for people: `42s`, `3m 05s`, `2h 10m`, `3d 4h`.
public func formatAge(_ seconds: Double) -> String {
    let total = Int(seconds.rounded(.down))
    if total < 60 { return "\(total)s" }
    if total < 3600 { return "\(total / 60)m \(String(format: "%02d", total % 60))s" }
    if total < 86400 { return "\(total / 3600)h \(String(format: "%02d", total % 3600 / 60))m" }
    return "\(total / 86400)d \(total % 86400 / 3600)h"
}

/// Text from outside — a database row, a request's header or path, a URL, a server's error message —
/// made safe to print on a terminal or in a plain-text log line: the one escaping function for terminal
/// output.
///
/// Every control character (C0 including tab and newline, DEL, C1 such as the one-byte CSI U+009B), the
/// Unicode line and paragraph separators and the bidirectional overrides and isolates (which reorder what
/// a reader sees) are written as escapes, and a backslash as `\\`, so the result is one line that shows
/// exactly what was there: no escape sequence reaches the terminal and no text can start a line of its
/// own. Everything else, non-ASCII letters included, is left as it is.
public enum TerminalText {
    /// `text` with every character a terminal would obey written as an escape: `\n`, `\r`, `\t`, `\\`,
    /// `\x1b` (other C0 and DEL), `\u009b` (C1 and the format characters above).
    public static func escaped(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: needsEscape) else { return text }
        var output = ""
        output.reserveCapacity(text.utf8.count + 8)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\\": output += "\\\\"
            case "\n": output += "\\n"
            case "\r": output += "\\r"
            case "\t": output += "\\t"
            case _ where scalar.value < 0x20 || scalar.value == 0x7F:
                output += "\\x" + hex(scalar.value, digits: 2)
            case _ where needsEscape(scalar): output += "\\u" + hex(scalar.value, digits: 4)
            default: output.unicodeScalars.append(scalar)
            }
        }
        return output
    }

    /// Whether `scalar` is written as an escape by ``escaped(_:)``.
    static func needsEscape(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x00...0x1F, 0x5C, 0x7F...0x9F: true
        // ALM, LRM/RLM, line and paragraph separators, embeddings and overrides, isolates.
        case 0x061C, 0x200E, 0x200F, 0x2028, 0x2029, 0x202A...0x202E, 0x2066...0x2069: true
        default: false
        }
    }

    static func hex(_ value: UInt32, digits: Int) -> String {
        let text = String(value, radix: 16)
        return String(repeating: "0", count: max(0, digits - text.count)) + text
    }
}
