import Bounces
import Foundation
import Postgres
import ServiceSupport

/// `siwactl mail bounce`: one delivery status notification classified and recorded, as Postfix's pipe
/// transport for the bounce address runs it.
enum MailBounceVerb {
    /// sysexits.h, as Postfix's pipe(8) reads them: 75 defers and retries; other failures bounce.
    enum Exit {
        static let ok: Int32 = 0
        static let usage: Int32 = 64
        static let dataError: Int32 = 65
        static let noInput: Int32 = 66
        static let temporaryFailure: Int32 = 75
        static let configuration: Int32 = 78
    }

    static let spec = CommandSpec(
        name: "siwactl mail bounce",
        abstract: """
            Records one bounce report (an RFC 3464 multipart/report, as Postfix writes them). Reads it from
            --input or standard input, classifies each recipient (sender_unauthorized, relay_address_dead,
            forwarding_off, auth_failure, transient, other) and records the relay addresses among them
            through siwa.record_relay_bounce, the address kept only as the gate's keyed hash. Prints one
            line per recipient (class, whether recorded, the gate's reason, the sending domain), never an
            address. Exit codes as Postfix's pipe transport expects (sysexits): 0 recorded or not a
            relay address, 65 not a bounce report, 66 --input unreadable, 75 the database unreachable
            (Postfix retries), 64 usage, 78 configuration. Connect as a member of siwa_bounce.
            """,
        options: [
            .databaseURL,
            CommandOption(
                "input", valueName: "FILE", help: "The report (default or '-': standard input).",
                environmentVariable: "SIWA_MAIL_BOUNCE_INPUT"),
        ])

    static let verb = Verb(name: "bounce", abstract: Verb.firstSentence(spec.abstract)) {
        arguments, environment in
        switch parse(spec, arguments, environment) {
        case .failure(let exit): return exit.status == ExitStatus.usage ? Exit.usage : exit.status
        case .success(let parsed): return run(parsed)
        }
    }

    /// A failure with the sysexits status it exits with.
    struct Failure: Error {
        var status: Int32
        var message: String
    }

    static func run(_ parsed: ParsedCommand) -> Int32 {
        do {
            let report = try read(parsed)
            let lines = try record(report, parsed)
            writeStandardOutput(lines.joined(separator: "\n") + "\n")
            return Exit.ok
        } catch {
            writeErrorLine(spec.name, error.message)
            return error.status
        }
    }

    static func read(_ parsed: ParsedCommand) throws(Failure) -> DeliveryStatusReport {
        let data: Data
        if let path = parsed.value("input"), path != "-" {
            guard let contents = FileManager.default.contents(atPath: path) else {
                throw Failure(status: Exit.noInput, message: "cannot read --input \(path)")
            }
            data = contents
        } else {
            // Read until end of input, or one byte past the bound (enough to refuse a report too large).
            var input = Data()
            while input.count <= DeliveryStatusReport.maximumSize {
                let chunk = FileHandle.standardInput.availableData
                if chunk.isEmpty { break }
                input.append(chunk)
            }
            data = input
        }
        do {
            return try DeliveryStatusReport(parsing: data)
        } catch {
            throw Failure(status: Exit.dataError, message: "not a bounce report: \(error.description)")
        }
    }

    /// Classifies and records every recipient in one transaction; one output line each.
    static func record(_ report: DeliveryStatusReport, _ parsed: ParsedCommand) throws(Failure) -> [String] {
        let connection: PostgresConnection
        do {
            connection = try connect(parsed)
        } catch let error as ToolFailure {
            let status =
                error.description.hasPrefix("invalid --database-url")
                ? Exit.configuration : Exit.temporaryFailure
            throw Failure(status: status, message: error.description)
        } catch {
            throw Failure(status: Exit.temporaryFailure, message: "\(error)")
        }
        defer { connection.close() }
        let sendingDomain = report.envelopeSender.flatMap(BounceClassifier.domain(of:))
        do {
            return try connection.transaction { connection in
                try report.recipients.map { recipient in
                    let bounceClass = BounceClassifier.classify(recipient)
                    let row = try connection.query(
                        "SELECT recorded, gate_reason, account_matched FROM siwa.record_relay_bounce($1, $2, $3, $4, $5, $6)",
                        [
                            .text(bounceClass.rawValue), .text(recipient.finalRecipient),
                            sendingDomain.map { .text($0) },
                            .text(recipient.status), .text(recipient.action),
                            recipient.remoteMTA.map { .text(String($0.prefix(255))) },
                        ])[0]
                    let recorded = try row[0, as: Bool.self]
                    let reason = try row[1, as: String?.self] ?? "none"
                    let account = try row[2, as: Bool.self] ? "matched" : "none"
                    return "class=\(bounceClass.rawValue) recorded=\(recorded) gate_reason=\(reason) "
                        + "account=\(account) status=\(recipient.status) sending_domain=\(sendingDomain ?? "-")"
                }
            }
        } catch let error as PostgresError {
            throw Failure(
                status: Exit.temporaryFailure, message: "recording the bounce failed: \(error.message)")
        } catch {
            throw Failure(status: Exit.temporaryFailure, message: "recording the bounce failed: \(error)")
        }
    }
}
