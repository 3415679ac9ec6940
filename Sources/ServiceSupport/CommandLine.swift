import Foundation

/// A small declarative command-line parser shared by the executables.
///
/// Supports `--name value`, `--name=value`, boolean flags, positional arguments, `--` to end
/// options, `-h`/`--help`, and `SIWA_*` environment variable equivalents. The environment is a
/// parameter so libraries never read it themselves; the command line wins over the environment.

/// An option taking a value, e.g. `--audience AUD`.
public struct CommandOption: Sendable {
    /// The long name without dashes (`audience` for `--audience`).
    public var name: String
    /// The placeholder shown in help (`AUD`).
    public var valueName: String
    /// One line of help.
    public var help: String
    /// Whether the option may be given several times; from the environment it is comma-separated.
    public var isRepeatable: Bool
    /// Whether parsing fails when the option has no value from any source.
    public var isRequired: Bool
    /// An environment variable supplying the value when the option is absent (e.g. `SIWA_AUDIENCE`).
    public var environmentVariable: String?
    /// The value used when neither the command line nor the environment gives one.
    public var defaultValue: String?
    /// Old names of the option (without dashes), still accepted: a value given under one counts as
    /// given under ``name``. Shown in help as old names.
    public var aliases: [String]
    /// Whether the value is (or may hold) a secret; see ``Secrecy``.
    public var secrecy: Secrecy = .none

    /// Whether an option's value is a secret. A secret option is also read from a file — `--NAME-file
    /// PATH` (`-`: standard input) or the environment variable `<environmentVariable>_FILE` — so that it
    /// never has to be on a command line, where `ps` and `/proc/PID/cmdline` show it to every user of
    /// the machine; given on the command line itself it still works, and ``CommandSpec/warnings(for:)``
    /// says why not.
    public enum Secrecy: Sendable, Equatable {
        /// Not a secret.
        case none
        /// Always a secret (a signing secret).
        case secret
        /// A connection string that may carry a password (`postgresql://user:PASSWORD@…`, `password=…`):
        /// a warning only when it does.
        case connectionString
    }

    /// Declares an option.
    public init(
        _ name: String, valueName: String = "VALUE", help: String, isRepeatable: Bool = false,
        isRequired: Bool = false, environmentVariable: String? = nil, defaultValue: String? = nil,
        aliases: [String] = []
    ) {
        self.name = name
        self.aliases = aliases
        self.valueName = valueName
        self.help = help
        self.isRepeatable = isRepeatable
        self.isRequired = isRequired
        self.environmentVariable = environmentVariable
        self.defaultValue = defaultValue
    }
}

/// A boolean flag, e.g. `--verbose`.
public struct CommandFlag: Sendable {
    /// The long name without dashes.
    public var name: String
    /// One line of help.
    public var help: String
    /// An environment variable (`1`/`true`/`yes` or `0`/`false`/`no`) used when the flag is absent.
    public var environmentVariable: String?

    /// Declares a flag.
    public init(_ name: String, help: String, environmentVariable: String? = nil) {
        self.name = name
        self.help = help
        self.environmentVariable = environmentVariable
    }
}

/// A positional argument.
public struct CommandPositional: Sendable {
    /// The placeholder shown in usage (`TOKEN`).
    public var name: String
    /// One line of help.
    public var help: String
    /// Whether it may be omitted.
    public var isOptional: Bool

    /// Declares a positional argument.
    public init(_ name: String, help: String, isOptional: Bool = false) {
        self.name = name
        self.help = help
        self.isOptional = isOptional
    }
}

/// A usage error: unknown or missing option, missing value, too many arguments.
public struct CommandLineError: Error, Sendable, CustomStringConvertible {
    /// Machine-readable reason.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// A short snake_case label.
        public let rawValue: String
        private init(_ rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }
        /// An option or flag that was not declared.
        public static let unknownOption = Code("unknown_option")
        /// An option given without its value.
        public static let missingValue = Code("missing_value")
        /// A required option or positional argument is absent.
        public static let missingArgument = Code("missing_argument")
        /// More positional arguments than declared, or a single-valued option given twice.
        public static let unexpectedArgument = Code("unexpected_argument")
        /// A value that cannot be interpreted (e.g. a flag's environment variable).
        public static let invalidValue = Code("invalid_value")
    }

    /// The reason.
    public var code: Code
    /// A one-line message for the user.
    public var message: String

    /// Creates an error.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }
}

/// The result of parsing: option values, flags and positionals.
public struct ParsedCommand: Sendable {
    /// Whether `-h` or `--help` was given (nothing else is validated then).
    public var helpRequested: Bool
    /// Whether `--version` was given to a command that offers it (``CommandSpec/offersVersion``;
    /// nothing else is validated then).
    public var versionRequested: Bool = false
    /// Values per option name, in order given (or from the environment, or the default).
    public var options: [String: [String]]
    /// Flags that are set.
    public var flags: Set<String>
    /// Positional arguments, in order.
    public var positionals: [String]
    /// The secret options (``CommandOption/secrecy``) whose value was given on the command line itself
    /// rather than from a file or the environment.
    public var secretsOnCommandLine: Set<String> = []

    /// The (last) value of an option.
    public func value(_ name: String) -> String? { options[name]?.last }
    /// All values of a repeatable option.
    public func values(_ name: String) -> [String] { options[name] ?? [] }
    /// Whether a flag is set.
    public func flag(_ name: String) -> Bool { flags.contains(name) }
}

/// A command's declaration: name, summary, options, flags and positionals.
public struct CommandSpec: Sendable {
    /// The command as typed (`siwactl verify`).
    public var name: String
    /// One or two lines saying what it does.
    public var abstract: String
    /// Declared options.
    public var options: [CommandOption]
    /// Declared flags.
    public var flags: [CommandFlag]
    /// Declared positionals, in order; optional ones must come last.
    public var positionals: [CommandPositional]
    /// Whether `--version` is accepted (an executable's own command, not a verb): parsing then stops
    /// with ``ParsedCommand/versionRequested`` set.
    public var offersVersion: Bool

    /// Declares a command.
    public init(
        name: String, abstract: String, options: [CommandOption] = [], flags: [CommandFlag] = [],
        positionals: [CommandPositional] = [], offersVersion: Bool = false
    ) {
        self.name = name
        self.abstract = abstract
        self.options = options
        self.flags = flags
        self.positionals = positionals
        self.offersVersion = offersVersion
    }

    /// Parses arguments (without the program name) with the given environment as fallback.
    public func parse(_ arguments: [String], environment: [String: String] = [:]) throws(CommandLineError)
        -> ParsedCommand
    {
        var parsed = ParsedCommand(helpRequested: false, options: [:], flags: [], positionals: [])
        var index = 0
        var optionsEnded = false
        while index < arguments.count {
            let argument = arguments[index]
            index += 1
            if optionsEnded || argument == "-" || !argument.hasPrefix("-") {
                parsed.positionals.append(argument)
                continue
            }
            if argument == "--" {
                optionsEnded = true
                continue
            }
            if argument == "-h" || argument == "--help" {
                parsed.helpRequested = true
                return parsed
            }
            if offersVersion && argument == "--version" {
                parsed.versionRequested = true
                return parsed
            }
            guard argument.hasPrefix("--") else {
                throw CommandLineError(.unknownOption, "unknown option '\(argument)' (see --help)")
            }
            var name = String(argument.dropFirst(2))
            var inlineValue: String?
            if let equals = name.firstIndex(of: "=") {
                inlineValue = String(name[name.index(after: equals)...])
                name = String(name[..<equals])
            }
            let fileOption = options.first { $0.secrecy != .none && name == $0.name + "-file" }
            if let option = fileOption
                ?? options.first(where: { $0.name == name || $0.aliases.contains(name) })
            {
                let value: String
                if let inlineValue {
                    value = inlineValue
                } else {
                    guard index < arguments.count else {
                        throw CommandLineError(
                            .missingValue,
                            "option --\(name) needs a \(fileOption == nil ? option.valueName : "FILE")")
                    }
                    value = arguments[index]
                    index += 1
                }
                if !option.isRepeatable, parsed.options[option.name] != nil {
                    throw CommandLineError(
                        .unexpectedArgument,
                        "option --\(option.name) given more than once"
                            + (option.secrecy == .none ? "" : " (or with --\(option.name)-file)"))
                }
                if fileOption != nil {
                    parsed.options[option.name, default: []] += try Self.readSecret(
                        from: value, for: option, naming: "--\(name)")
                } else {
                    if option.secrecy != .none { parsed.secretsOnCommandLine.insert(option.name) }
                    parsed.options[option.name, default: []].append(value)
                }
            } else if flags.contains(where: { $0.name == name }) {
                guard inlineValue == nil else {
                    throw CommandLineError(.invalidValue, "flag --\(name) takes no value")
                }
                parsed.flags.insert(name)
            } else {
                throw CommandLineError(.unknownOption, "unknown option '--\(name)' (see --help)")
            }
        }

        for option in options where parsed.options[option.name] == nil {
            if let variable = option.environmentVariable, let value = environment[variable], !value.isEmpty {
                parsed.options[option.name] =
                    option.isRepeatable
                    ? value.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
                        .filter { !$0.isEmpty }
                    : [value]
            } else if option.secrecy != .none,
                let variable = option.environmentVariable.map({ $0 + "_FILE" }),
                let path = environment[variable], !path.isEmpty
            {
                parsed.options[option.name] = try Self.readSecret(from: path, for: option, naming: variable)
            } else if let defaultValue = option.defaultValue {
                parsed.options[option.name] = [defaultValue]
            } else if option.isRequired {
                var message = "missing required option --\(option.name) \(option.valueName)"
                if let variable = option.environmentVariable { message += " (or \(variable))" }
                throw CommandLineError(.missingArgument, message)
            }
        }
        for flag in flags where !parsed.flags.contains(flag.name) {
            guard let variable = flag.environmentVariable, let value = environment[variable] else { continue }
            switch value.lowercased() {
            case "1", "true", "yes", "on": parsed.flags.insert(flag.name)
            case "", "0", "false", "no", "off": break
            default: throw CommandLineError(.invalidValue, "\(variable) must be true or false")
            }
        }

        let required = positionals.filter { !$0.isOptional }.count
        if parsed.positionals.count < required {
            let missing = positionals[parsed.positionals.count]
            throw CommandLineError(.missingArgument, "missing argument \(missing.name)")
        }
        if parsed.positionals.count > positionals.count {
            throw CommandLineError(.unexpectedArgument, "unexpected argument (see --help)")
        }
        return parsed
    }

    /// A secret option's value(s) from the file at `path` (`-`: standard input), read by the one rule
    /// for secret files (``SecretFile``: group and others may not read it): the text without
    /// surrounding whitespace, or for a repeatable option each non-empty line.
    static func readSecret(from path: String, for option: CommandOption, naming source: String)
        throws(CommandLineError) -> [String]
    {
        let data: Data
        if path == "-" {
            data = FileHandle.standardInput.readDataToEndOfFile()
        } else {
            do {
                data = try SecretFile.read(path, setting: source)
            } catch {
                throw CommandLineError(.invalidValue, error.message)
            }
        }
        let text = String(decoding: data, as: UTF8.self)
        let values =
            option.isRepeatable
            ? text.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }
                .filter { !$0.isEmpty }
            : [text.trimmingCharacters(in: .whitespacesAndNewlines)].filter { !$0.isEmpty }
        guard !values.isEmpty else {
            throw CommandLineError(
                .invalidValue, "\(source): \(path == "-" ? "standard input" : path) is empty")
        }
        return values
    }

    /// One warning per secret given on the command line itself (``ParsedCommand/secretsOnCommandLine``;
    /// a connection string only when it holds a password), saying where it belongs instead. For the
    /// executables to print on standard error; the value itself is never quoted.
    public func warnings(for parsed: ParsedCommand) -> [String] {
        options.filter { parsed.secretsOnCommandLine.contains($0.name) }.compactMap { option in
            if option.secrecy == .connectionString,
                !parsed.values(option.name).contains(where: Self.holdsPassword)
            {
                return nil
            }
            let what = option.secrecy == .connectionString ? "a password" : "a secret"
            var instead = "--\(option.name)-file FILE ('-': standard input)"
            if let variable = option.environmentVariable { instead += ", \(variable) or \(variable)_FILE" }
            if option.secrecy == .connectionString {
                instead += ", or a password file (PGPASSFILE, ~/.pgpass)"
            }
            return
                "warning: --\(option.name) on the command line puts \(what) where every user of this machine can read it (ps, /proc): use \(instead)"
        }
    }

    /// Whether a PostgreSQL URL or conninfo string carries a password (`scheme://user:PASSWORD@host`,
    /// `?password=…`, `password=…`).
    public static func holdsPassword(_ connection: String) -> Bool {
        if connection.range(of: #"(^|[\s?&])password\s*="#, options: [.regularExpression, .caseInsensitive])
            != nil
        {
            return true
        }
        guard let scheme = connection.range(of: "://") else { return false }
        let rest = connection[scheme.upperBound...]
        let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        guard let at = authority.lastIndex(of: "@") else { return false }
        return authority[..<at].contains(":")
    }

    /// The `--help` text: usage line, summary, then every option, flag and positional.
    public func helpText() -> String {
        var usage = "usage: \(name)"
        for option in options {
            var part = "--\(option.name) \(option.valueName)"
            if option.isRepeatable { part += " ..." }
            usage += option.isRequired ? " \(part)" : " [\(part)]"
        }
        for flag in flags { usage += " [--\(flag.name)]" }
        for positional in positionals {
            usage += positional.isOptional ? " [\(positional.name)]" : " \(positional.name)"
        }
        var lines = [usage, "", abstract]
        var rows: [(String, String)] = []
        for positional in positionals { rows.append((positional.name, positional.help)) }
        for option in options {
            var help = option.help
            if option.isRepeatable { help += " (repeatable)" }
            if let variable = option.environmentVariable { help += " [env: \(variable)]" }
            if let defaultValue = option.defaultValue { help += " [default: \(defaultValue)]" }
            if !option.aliases.isEmpty {
                help +=
                    " (old name\(option.aliases.count > 1 ? "s" : ""): "
                    + option.aliases.map { "--" + $0 }.joined(separator: ", ") + ")"
            }
            if option.secrecy == .secret {
                help += " Discouraged on a command line (ps shows it): use --\(option.name)-file."
            }
            rows.append(("--\(option.name) \(option.valueName)", help))
            if option.secrecy != .none {
                var fileHelp = "Read --\(option.name) from FILE ('-': standard input)"
                fileHelp += option.isRepeatable ? ", one per line." : "."
                if let variable = option.environmentVariable { fileHelp += " [env: \(variable)_FILE]" }
                rows.append(("--\(option.name)-file FILE", fileHelp))
            }
        }
        for flag in flags {
            var help = flag.help
            if let variable = flag.environmentVariable { help += " [env: \(variable)]" }
            rows.append(("--\(flag.name)", help))
        }
        if offersVersion {
            rows.append(("--version", "Print the version, the commit and the schema version."))
        }
        rows.append(("-h, --help", "Show this help."))
        let width = rows.map(\.0.count).max() ?? 0
        lines.append("")
        for (left, right) in rows {
            lines.append("  " + left + String(repeating: " ", count: width - left.count + 2) + right)
        }
        return lines.joined(separator: "\n") + "\n"
    }
}

extension CommandOption {
    /// The same option, required.
    public func requiring() -> CommandOption {
        var copy = self
        copy.isRequired = true
        return copy
    }

    /// The same option as a secret (``Secrecy``): also read from `--NAME-file` and `<VARIABLE>_FILE`.
    public func secret(_ secrecy: Secrecy = .secret) -> CommandOption {
        var copy = self
        copy.secrecy = secrecy
        return copy
    }

    /// The same option with one more old name (without dashes) accepted for it.
    public func aliased(_ name: String) -> CommandOption {
        var copy = self
        copy.aliases.append(name)
        return copy
    }
}
