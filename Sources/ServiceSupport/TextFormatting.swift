import Foundation

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
