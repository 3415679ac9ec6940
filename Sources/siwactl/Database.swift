import Foundation
import Postgres
import ServiceSupport

/// Opens one connection from `--database-url`; failures become one line without the password.
func connect(_ parsed: ParsedCommand) throws -> PostgresConnection {
    let configuration: PostgresConfiguration
    do {
        configuration = try PostgresConfiguration(
            parsed.value("database-url") ?? "", applicationName: "siwactl")
    } catch {
        throw ToolFailure("invalid --database-url: \(error.message)")
    }
    do {
        return try PostgresConnection(configuration: configuration)
    } catch {
        throw ToolFailure("cannot connect to \(configuration): \(error.message)")
    }
}

/// Runs `body`, turning database errors into one line naming what was being done.
@discardableResult
func database<T>(_ what: String, _ body: () throws -> T) throws -> T {
    do {
        return try body()
    } catch let error as PostgresError {
        throw ToolFailure("\(what) failed: \(error.message)")
    }
}

/// Parses `--since`: an ISO 8601 date-time or date, or a relative age such as `90s`, `15m`, `2h`,
/// `3d`, `1w` (that long before `now`).
func parseSince(_ text: String, now: Date = Date()) -> Date? {
    let trimmed = text.trimmingCharacters(in: .whitespaces)
    if let unit = trimmed.last, let count = Double(trimmed.dropLast()), count.isFinite, count >= 0 {
        let seconds: Double? =
            switch unit {
            case "s": 1
            case "m": 60
            case "h": 3600
            case "d": 86400
            case "w": 7 * 86400
            default: nil
            }
        if let seconds { return now.addingTimeInterval(-count * seconds) }
    }
    if let date = VerifyVerb.parseISO8601(trimmed) { return date }
    let dateOnly = ISO8601DateFormatter()
    dateOnly.formatOptions = [.withFullDate]
    return dateOnly.date(from: trimmed)
}

/// Left-aligned columns separated by two spaces, with a header row. Cells come from the database:
/// each is escaped (``TerminalText``), so a value cannot add a row or steer the terminal.
func renderTable(header: [String], rows unescaped: [[String]]) -> String {
    let rows = unescaped.map { $0.map(TerminalText.escaped) }
    var widths = header.map(\.count)
    for row in rows {
        for (index, cell) in row.enumerated() { widths[index] = max(widths[index], cell.count) }
    }
    func line(_ cells: [String]) -> String {
        var text = ""
        for (index, cell) in cells.enumerated() {
            if index == cells.count - 1 {
                text += cell
            } else {
                text += cell + String(repeating: " ", count: widths[index] - cell.count + 2)
            }
        }
        return text.trimmingTrailingSpaces() + "\n"
    }
    return ([header] + rows).map(line).joined()
}

extension String {
    fileprivate func trimmingTrailingSpaces() -> String {
        var copy = self
        while copy.last == " " { copy.removeLast() }
        return copy
    }
}
