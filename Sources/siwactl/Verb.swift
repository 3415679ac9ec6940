import Foundation
import ServiceSupport

/// One `siwactl` verb: its name, a one-line summary, its subverbs (`webhooks add`) and its entry point.
struct Verb: Sendable {
    typealias Run = @Sendable (_ arguments: [String], _ environment: [String: String]) async -> Int32

    var name: String
    var abstract: String
    /// Chosen by the first argument before ``run`` is considered.
    var subverbs: [Verb]
    /// The text of `--help` for a verb of subverbs only, when it is not the list of them.
    var help: (@Sendable () -> String)?
    /// Runs the verb when no subverb is named (nil: one must be).
    var run: Run?

    init(name: String, abstract: String, subverbs: [Verb] = [], run: Run?) {
        self.name = name
        self.abstract = abstract
        self.subverbs = subverbs
        self.run = run
    }

    /// A verb of subverbs only; `help`, when given, replaces the list of them.
    init(name: String, abstract: String, subverbs: [Verb], help: (@Sendable () -> String)? = nil) {
        self.name = name
        self.abstract = abstract
        self.subverbs = subverbs
        self.help = help
    }

    /// A verb that parses `spec` and runs `body`, its summary the first sentence of the spec's abstract:
    /// a ``UsageError`` exits with status 2, any other error with 1, each as one stderr line.
    static func parsing(
        _ name: String, _ spec: CommandSpec,
        _ body: @escaping @Sendable (ParsedCommand, _ environment: [String: String]) async throws -> Void
    ) -> Verb {
        Verb(name: name, abstract: firstSentence(spec.abstract)) { arguments, environment in
            switch parse(spec, arguments, environment) {
            case .failure(let exit): return exit.status
            case .success(let parsed):
                do {
                    try await body(parsed, environment)
                    return ExitStatus.success
                } catch let error as UsageError {
                    writeErrorLine(spec.name, error.message)
                    return ExitStatus.usage
                } catch {
                    writeErrorLine(spec.name, "\(error)")
                    return ExitStatus.failure
                }
            }
        }
    }

    /// siwactl's one dispatcher: runs the subverb the first argument names, else this verb's ``run``;
    /// a verb of subverbs only prints its help for `--help` and refuses anything else (exit 2).
    func dispatch(_ arguments: [String], _ environment: [String: String], path: String) async -> Int32 {
        if let first = arguments.first, let subverb = subverbs.first(where: { $0.name == first }) {
            return await subverb.dispatch(
                Array(arguments.dropFirst()), environment, path: path + " " + subverb.name)
        }
        if let run { return await run(arguments, environment) }
        if let first = arguments.first, ["--help", "-h", "help"].contains(first) {
            writeStandardOutput(help?() ?? helpText(path: path))
            return ExitStatus.success
        }
        let names = subverbs.map { "'\($0.name)'" }
        let expected =
            names.count > 1 ? names.dropLast().joined(separator: ", ") + " or " + names.last! : names.joined()
        writeErrorLine(path, "expected \(expected) (see \(path) --help)")
        return ExitStatus.usage
    }

    /// The usage line, the summary and one line per subverb; `footnote` ends the last sentence.
    func helpText(path: String, footnote: String = "") -> String {
        var text = "usage: \(path) VERB [OPTIONS]\n\n\(abstract)\n\nverbs:\n"
        let width = subverbs.map(\.name.count).max() ?? 0
        for verb in subverbs {
            text +=
                "  \(verb.name)" + String(repeating: " ", count: width - verb.name.count + 2) + verb.abstract
                + "\n"
        }
        return text + "\nRun '\(path) VERB --help' for a verb's options\(footnote).\n"
    }

    /// The abstract's first sentence on one line (the abstracts are wrapped in the source: their first
    /// line is not a sentence).
    static func firstSentence(_ text: String) -> String {
        let joined = text.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }
            .joined(separator: " ")
        guard let end = joined.range(of: ". ") else { return joined }
        return String(joined[..<end.lowerBound]) + "."
    }
}

/// A usage error found after parsing (exit status 2).
struct UsageError: Error {
    var message: String
    init(_ message: String) { self.message = message }
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
