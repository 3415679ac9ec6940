import Foundation
import Postgres
import RelayMail
import ServiceSupport

/// `siwactl mail check`: a list of addresses through the relay-mail gate before a campaign.
enum MailVerb {
    static let checkSpec = CommandSpec(
        name: "siwactl mail check",
        abstract: """
            Asks the relay-mail gate (siwa.relay_mail_decisions, 10,000 addresses per call) about a list
            of addresses, one per line or one column of a CSV file with a header, from --input or
            standard input. Writes the allowed ones, one per line, to standard output or --allowed; the
            blocked and unknown ones as CSV (address,decision,reason,since) to --rejected. Prints one
            summary line of counts to standard error, never an address. Connect as a member of siwa_mail.
            """,
        options: [
            .databaseURL,
            CommandOption(
                "input", valueName: "FILE", help: "The list (default or '-': standard input).",
                environmentVariable: "SIWA_MAIL_CHECK_INPUT"),
            CommandOption(
                "csv-column", valueName: "N|NAME",
                help: "Read the list as CSV with a header: the column at position N (from 1) or named NAME.",
                environmentVariable: "SIWA_MAIL_CHECK_CSV_COLUMN"),
            CommandOption(
                "allowed", valueName: "FILE",
                help: "Write the allowed addresses here instead of standard output.",
                environmentVariable: "SIWA_MAIL_CHECK_ALLOWED"),
            CommandOption(
                "rejected", valueName: "FILE",
                help:
                    "Write the blocked and unknown addresses here, as CSV (without it they are only counted).",
                environmentVariable: "SIWA_MAIL_CHECK_REJECTED"),
        ])

    static let verb = Verb(
        name: "mail",
        abstract:
            "The relay-mail gate: check a list of addresses before mailing it; record bounces; the ESP suppression outbox.",
        subverbs: [
            .parsing("check", checkSpec) { parsed, _ in try check(parsed) }, MailBounceVerb.verb,
            MailSuppressionsVerb.verb,
        ])

    static func check(_ parsed: ParsedCommand) throws {
        let addresses = try readList(parsed)
        let allowed = try Output(path: parsed.value("allowed"), what: "--allowed")
        let rejected = try parsed.value("rejected").map { try Output(path: $0, what: "--rejected") }
        try rejected?.write("address,decision,reason,since\n")
        let connection = try connect(parsed)
        defer { connection.close() }
        var counts: [RelayMailAnswer.Decision: Int] = [:]
        try database("asking siwa.relay_mail_decisions") {
            _ = try RelayMailGate(connection).decisions(addresses) { rows in
                var allowedText = ""
                var rejectedText = ""
                for row in rows {
                    counts[row.answer.decision, default: 0] += 1
                    if row.answer.decision == .allow {
                        allowedText += (row.address ?? "") + "\n"
                    } else {
                        rejectedText += rejectedLine(row)
                    }
                }
                try allowed.write(allowedText)
                try rejected?.write(rejectedText)
            }
        }
        try allowed.close()
        try rejected?.close()
        writeStandardError(
            "siwactl mail check: \(addresses.count) addresses: \(counts[.allow, default: 0]) allowed, "
                + "\(counts[.block, default: 0]) blocked, \(counts[.unknown, default: 0]) unknown\n")
    }

    /// The list from --input or standard input, as lines or as the --csv-column of a CSV.
    static func readList(_ parsed: ParsedCommand) throws -> [String?] {
        let data: Data
        if let path = parsed.value("input"), path != "-" {
            guard let contents = FileManager.default.contents(atPath: path) else {
                throw ToolFailure("cannot read --input \(path)")
            }
            data = contents
        } else {
            data = FileHandle.standardInput.readDataToEndOfFile()
        }
        let text = String(decoding: data, as: UTF8.self)
        guard let column = parsed.value("csv-column") else { return AddressList.lines(text) }
        do {
            return try AddressList.csv(text, column: AddressList.Column(column))
        } catch {
            throw UsageError("--csv-column \(column): \(error.description)")
        }
    }

    /// One CSV record of a rejected address: the address as given (quoted when it must be), the
    /// decision, the reason and since (ISO 8601, empty when none).
    static func rejectedLine(_ row: RelayMailDecision) -> String {
        let address = row.address ?? ""
        let field =
            address.contains(where: { $0 == "," || $0 == "\"" || $0.isNewline })
            ? "\"" + address.replacingOccurrences(of: "\"", with: "\"\"") + "\"" : address
        let since =
            row.answer.since.map { $0.formatted(Date.ISO8601FormatStyle(includingFractionalSeconds: true)) }
            ?? ""
        return "\(field),\(row.answer.decision.rawValue),\(row.answer.reason.rawValue),\(since)\n"
    }

    /// Standard output, or a file created (or truncated) before the database is asked.
    final class Output {
        private let handle: FileHandle
        private let isFile: Bool

        init(path: String?, what: String) throws {
            guard let path, path != "-" else {
                handle = FileHandle.standardOutput
                isFile = false
                return
            }
            guard FileManager.default.createFile(atPath: path, contents: nil),
                let handle = FileHandle(forWritingAtPath: path)
            else {
                throw ToolFailure("cannot create \(what) \(path)")
            }
            self.handle = handle
            isFile = true
        }

        func write(_ text: String) throws {
            guard !text.isEmpty else { return }
            try handle.write(contentsOf: Data(text.utf8))
        }

        func close() throws {
            if isFile { try handle.close() }
        }
    }
}
