import Foundation

/// A list of addresses to ask the gate about: one per line, or one column of a CSV file with a header.
public enum AddressList {
    /// Which CSV column holds the addresses: its position from 1, or its header's name.
    public enum Column: Sendable, Equatable {
        case position(Int)
        case name(String)

        /// `N` (a position from 1) or a header name.
        public init(_ text: String) {
            if let position = Int(text), position > 0 {
                self = .position(position)
            } else {
                self = .name(text)
            }
        }
    }

    /// Why a list cannot be read (never carries an address).
    public struct ListError: Error, Equatable, CustomStringConvertible {
        public var description: String
    }

    /// One address per line, white space around it dropped; empty lines are skipped.
    public static func lines(_ text: String) -> [String] {
        withoutByteOrderMark(text).split(omittingEmptySubsequences: false, whereSeparator: \.isNewline)
            .map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
    }

    /// The `column` of each record of a CSV text (RFC 4180: commas, double quotes, "" inside quotes,
    /// CRLF or LF) after its header line; white space around a value dropped, empty records skipped. A
    /// record without that column gives nil (the gate answers malformed).
    public static func csv(_ text: String, column: Column) throws(ListError) -> [String?] {
        var records = try parseCSV(withoutByteOrderMark(text))
        guard !records.isEmpty else { return [] }
        let header = records.removeFirst().map { $0.trimmingCharacters(in: .whitespaces) }
        let index: Int
        switch column {
        case .position(let position):
            guard position <= header.count else {
                throw ListError(description: "the CSV header has \(header.count) columns, not \(position)")
            }
            index = position - 1
        case .name(let name):
            guard let found = header.firstIndex(of: name) else {
                throw ListError(description: "no CSV column is named '\(name)' in the header")
            }
            index = found
        }
        return records.filter { !($0.count == 1 && $0[0].trimmingCharacters(in: .whitespaces).isEmpty) }
            .map { $0.indices.contains(index) ? $0[index].trimmingCharacters(in: .whitespaces) : nil }
    }

    /// `text` without the byte order mark spreadsheets put before a UTF-8 export.
    static func withoutByteOrderMark(_ text: String) -> Substring {
        text.first == "\u{FEFF}" ? text.dropFirst() : text[...]
    }

    /// Records of fields; a quote left open is an error (it would swallow the rest of the file).
    static func parseCSV(_ text: Substring) throws(ListError) -> [[String]] {
        var records: [[String]] = []
        var record: [String] = []
        var field = ""
        var quoted = false
        var characters = text.makeIterator()
        var pending: Character? = nil
        while let character = pending ?? characters.next() {
            pending = nil
            if quoted {
                if character == "\"" {
                    let next = characters.next()
                    if next == "\"" {
                        field.append("\"")
                    } else {
                        quoted = false
                        pending = next
                    }
                } else {
                    field.append(character)
                }
                continue
            }
            switch character {
            case "\"" where field.isEmpty: quoted = true
            case ",":
                record.append(field)
                field = ""
            case "\n", "\r\n", "\r":
                record.append(field)
                records.append(record)
                record = []
                field = ""
            default: field.append(character)
            }
        }
        if quoted { throw ListError(description: "the CSV ends inside a quoted field") }
        if !field.isEmpty || !record.isEmpty {
            record.append(field)
            records.append(record)
        }
        return records
    }
}
