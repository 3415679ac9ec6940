import Foundation
import Synchronization
import Testing

@testable import ServiceSupport

/// The one JSON string escaper and the one terminal escaper: every control character (C0, DEL, C1)
/// escaped, so a logged or printed value can neither forge a line nor steer a terminal.
@Suite("Escaping: JSON log lines and terminal text")
struct EscapingTests {
    /// Every control a terminal or a log reader obeys.
    static let controls: [Unicode.Scalar] =
        (0x01...0x1F).map { Unicode.Scalar($0)! } + [Unicode.Scalar(0x7F)!]
        + (0x80...0x9F).map { Unicode.Scalar($0)! } + ["\u{2028}", "\u{2029}"]

    @Test("the JSON logger escapes C0, DEL, C1 and the line separators in messages, keys and values")
    func loggerEscapesEveryControl() throws {
        let lines = Mutex<[String]>([])
        let logger = Logger(label: "test") { line in lines.withLock { $0.append(line) } }
        var hostile = "a"
        for scalar in Self.controls { hostile.unicodeScalars.append(scalar) }
        hostile += "\u{1B}[2J\u{9B}31m\u{85}forged\u{7F}é→"
        logger.info(hostile, [hostile: .string(hostile)])
        let line = try #require(lines.withLock { $0 }.first)
        #expect(line.hasSuffix("}\n"))
        let body = line.dropLast()
        for scalar in body.unicodeScalars {
            #expect(
                scalar.value >= 0x20 && !(0x7F...0x9F).contains(scalar.value),
                "raw U+\(String(scalar.value, radix: 16))")
            #expect(scalar != "\u{2028}" && scalar != "\u{2029}")
        }
        #expect(body.contains(#"\u001b[2J\u009b31m\u0085forged\u007fé→"#), "\(line)")
        // Still JSON, and it says exactly what was logged.
        let object = try #require(try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any])
        #expect(object["msg"] as? String == hostile)
        #expect(object[hostile] as? String == hostile)
    }

    @Test("JSONText.line escapes what Foundation leaves raw (DEL, C1, U+2028) and stays valid JSON")
    func foundationLinesEscaped() throws {
        let value = "id\u{7F}\u{9B}2J\u{2028}x\u{1B}"
        let line = JSONText.line(["webhook_id": value, "n": 1])
        #expect(line.hasSuffix("\n"))
        #expect(
            !line.dropLast().unicodeScalars.contains { $0.value < 0x20 || (0x7F...0x9F).contains($0.value) })
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(object["webhook_id"] as? String == value)
    }

    @Test("terminal text: one line, every control and bidi override escaped, the rest as it was")
    func terminalText() {
        #expect(TerminalText.escaped("web-1 pid 7 · café") == "web-1 pid 7 · café")
        #expect(TerminalText.escaped("a\nok workers\r\t\\") == #"a\nok workers\r\t\\"#)
        #expect(TerminalText.escaped("\u{1B}]0;pwned\u{07}\u{7F}") == #"\x1b]0;pwned\x07\x7f"#)
        #expect(
            TerminalText.escaped("\u{9B}2K\u{85}\u{202E}gpj.exe\u{2028}")
                == #"\u009b2K\u0085\u202egpj.exe\u2028"#)
        for scalar in Self.controls {
            let escaped = TerminalText.escaped("x" + String(Character(scalar)) + "y")
            #expect(
                escaped.unicodeScalars.allSatisfy { $0.value >= 0x20 && $0.value < 0x7F }, "U+\(scalar.value)"
            )
        }
    }

    @Test("writeErrorLine escapes its message: a quoted argument cannot add a line")
    func errorLinesAreOneLine() {
        // The escaping function writeErrorLine applies, on what a usage error quotes.
        let message = "unknown option '--x\nsiwactl: all good\u{1B}[2K'"
        #expect(!TerminalText.escaped(message).contains("\n"))
        #expect(!TerminalText.escaped(message).unicodeScalars.contains("\u{1B}"))
    }
}

/// Secret options: a file, standard input or `<VARIABLE>_FILE` instead of the command line.
@Suite("Command line: secret options")
struct SecretOptionTests {
    static let spec = CommandSpec(
        name: "tool", abstract: "A tool.",
        options: [
            CommandOption("secret", help: "A secret.", environmentVariable: "TOOL_SECRET").secret(),
            CommandOption("keys", help: "Keys.", isRepeatable: true, environmentVariable: "TOOL_KEYS")
                .secret(),
            .databaseURL.requiring(),
        ])

    static func file(_ text: String, mode: Int = 0o600) throws -> String {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("secret-\(UUID().uuidString)")
        try Data(text.utf8).write(to: url)
        try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: url.path)
        return url.path
    }

    @Test(
        "a secret file that group or others may read is refused, from --NAME-file and VARIABLE_FILE alike",
        arguments: [0o644, 0o640, 0o604, 0o660])
    func openFileRefused(mode: Int) throws {
        let secret = try Self.file("s3cret-value\n", mode: mode)
        defer { try? FileManager.default.removeItem(atPath: secret) }
        for (arguments, environment) in [
            (["--secret-file", secret, "--database-url", "x"], [String: String]()),
            (["--database-url", "x"], ["TOOL_SECRET_FILE": secret]),
            (["--secret", "a", "--database-url-file", secret], [:]),
        ] {
            do {
                _ = try Self.spec.parse(arguments, environment: environment)
                Issue.record("\(arguments) \(environment) was accepted")
            } catch {
                #expect(error.message.contains("chmod 600"), "\(error.message)")
                #expect(!error.message.contains("s3cret-value"))
            }
        }
    }

    @Test("--NAME-file and VARIABLE_FILE read the value; on the command line it is flagged for a warning")
    func sources() throws {
        let secret = try Self.file("s3cret\n")
        let keys = try Self.file("k1\n\n  k2  \n")
        let url = try Self.file("postgresql:///db\n")
        defer { for path in [secret, keys, url] { try? FileManager.default.removeItem(atPath: path) } }
        var parsed = try Self.spec.parse([
            "--secret-file", secret, "--keys-file", keys, "--database-url-file", url,
        ])
        #expect(parsed.value("secret") == "s3cret")
        #expect(parsed.values("keys") == ["k1", "k2"])
        #expect(parsed.value("database-url") == "postgresql:///db")
        #expect(parsed.secretsOnCommandLine.isEmpty)
        #expect(Self.spec.warnings(for: parsed).isEmpty)

        parsed = try Self.spec.parse(
            [], environment: ["TOOL_SECRET_FILE": secret, "SIWA_DATABASE_URL_FILE": url])
        #expect(parsed.value("secret") == "s3cret")
        #expect(parsed.value("database-url") == "postgresql:///db")

        parsed = try Self.spec.parse(["--secret", "s3cret", "--database-url", "postgresql://u:pw@h/db"])
        #expect(parsed.secretsOnCommandLine == ["secret", "database-url"])
        let warnings = Self.spec.warnings(for: parsed)
        #expect(warnings.count == 2)
        #expect(!warnings.joined().contains("s3cret") && !warnings.joined().contains("pw@"))
        // A URL without a password is no secret: no warning.
        parsed = try Self.spec.parse(["--secret-file", secret, "--database-url", "postgresql://u@h/db"])
        #expect(Self.spec.warnings(for: parsed).isEmpty)

        #expect(throws: CommandLineError.self) {
            try Self.spec.parse(["--secret", "a", "--secret-file", secret, "--database-url", "x"])
        }
        #expect(throws: CommandLineError.self) {
            try Self.spec.parse(["--secret-file", "/nonexistent/secret", "--database-url", "x"])
        }
        #expect(Self.spec.helpText().contains("--secret-file FILE"))
        #expect(Self.spec.helpText().contains("TOOL_SECRET_FILE"))
    }

    @Test("which connection strings hold a password")
    func passwords() {
        for text in [
            "postgresql://u:pw@host/db", "postgres://u:pw@[::1]:5432/db", "host=h password=pw",
            "postgresql:///db?password=pw", "dbname=x PASSWORD = pw",
        ] {
            #expect(CommandSpec.holdsPassword(text), "\(text)")
        }
        for text in [
            "postgresql://u@host/db", "postgresql:///db?host=/tmp&port=5432", "host=h user=u",
            "postgresql://u@h/db?passfile=/x", "postgresql://h/db:x@y",
        ] {
            #expect(!CommandSpec.holdsPassword(text), "\(text)")
        }
    }
}
