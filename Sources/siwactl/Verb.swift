import Foundation
import ServiceSupport

/// One `siwactl` verb: its name, a one-line summary and its entry point.
struct Verb: Sendable {
    var name: String
    var abstract: String
    var run: @Sendable (_ arguments: [String], _ environment: [String: String]) async -> Int32
}

/// Process exit statuses shared by all verbs.
enum ExitStatus {
    static let success: Int32 = 0
    static let failure: Int32 = 1
    static let usage: Int32 = 2
}

/// A failure to report on one line of stderr, with exit status 1.
struct ToolFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Parses a verb's arguments, or prints help / a usage error and returns the exit status.
func parse(_ spec: CommandSpec, _ arguments: [String], _ environment: [String: String]) -> ParseOutcome {
    do {
        let parsed = try spec.parse(arguments, environment: environment)
        if parsed.helpRequested {
            writeStandardOutput(spec.helpText())
            return .failure(EarlyExit(ExitStatus.success))
        }
        for warning in spec.warnings(for: parsed) { writeErrorLine(spec.name, warning) }
        return .success(parsed)
    } catch {
        writeErrorLine(spec.name, "\(error.message)")
        return .failure(EarlyExit(ExitStatus.usage))
    }
}

/// Parsed arguments, or the status to exit with at once (after `--help` or a usage error).
typealias ParseOutcome = Result<ParsedCommand, EarlyExit>

/// An exit status carried through `Result` when a verb stops before running.
struct EarlyExit: Error {
    var status: Int32
    init(_ status: Int32) { self.status = status }
}

/// Runs a verb body, mapping its errors to one stderr line and exit status 1.
func runReportingFailure(_ name: String, _ body: () async throws -> Void) async -> Int32 {
    do {
        try await body()
        return ExitStatus.success
    } catch {
        writeErrorLine(name, "\(error)")
        return ExitStatus.failure
    }
}

/// Reads a file holding a secret (a `.p8` key) through ``SecretFile``: refused, naming `setting`, the
/// path and its mode, when group or others may read it.
func readSecretText(path: String, setting: String) throws -> String {
    String(decoding: try SecretFile.read(path, setting: setting), as: UTF8.self)
}

/// Reads a whole file as text, with a one-line error naming the path.
func readText(path: String) throws -> String {
    do {
        return try String(contentsOfFile: path, encoding: .utf8)
    } catch {
        throw ToolFailure("cannot read \(path)")
    }
}
