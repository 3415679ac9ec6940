import ServiceSupport
import Testing

@Suite("Command-line parsing")
struct CommandLineTests {
    static let spec = CommandSpec(
        name: "tool", abstract: "Does things.",
        options: [
            CommandOption(
                "database-url", valueName: "URL", help: "Where.", isRequired: true,
                environmentVariable: "SIWA_DATABASE_URL"),
            CommandOption(
                "audience", valueName: "ID", help: "Who.", isRepeatable: true,
                environmentVariable: "SIWA_AUDIENCES"),
            CommandOption("listen", valueName: "HOST:PORT", help: "Here.", defaultValue: "127.0.0.1:8080"),
            CommandOption("count", valueName: "N", help: "How many."),
            CommandOption("delay", valueName: "SECONDS", help: "How long."),
        ],
        flags: [CommandFlag("once", help: "Once.", environmentVariable: "SIWA_ONCE")],
        positionals: [CommandPositional("TOKEN", help: "A token.", isOptional: true)])

    @Test("options, repeated options, flags, = syntax and positionals are read")
    func parsesEverything() throws {
        let parsed = try Self.spec.parse([
            "--database-url", "postgresql:///x", "--audience=a", "--audience", "b", "--once", "tok",
        ])
        #expect(parsed.value("database-url") == "postgresql:///x")
        #expect(parsed.values("audience") == ["a", "b"])
        #expect(parsed.flag("once"))
        #expect(parsed.positionals == ["tok"])
        #expect(parsed.value("listen") == "127.0.0.1:8080")
    }

    @Test("the environment fills what the command line leaves out, and loses to it")
    func environment() throws {
        let environment = ["SIWA_DATABASE_URL": "from-env", "SIWA_AUDIENCES": "a,b", "SIWA_ONCE": "true"]
        let fromEnvironment = try Self.spec.parse([], environment: environment)
        #expect(fromEnvironment.value("database-url") == "from-env")
        #expect(fromEnvironment.values("audience") == ["a", "b"])
        #expect(fromEnvironment.flag("once"))
        let overridden = try Self.spec.parse(["--database-url", "from-flag"], environment: environment)
        #expect(overridden.value("database-url") == "from-flag")
    }

    @Test(
        "mistakes are reported with a code and a message naming the option",
        arguments: [
            (["--nope"], CommandLineError.Code.unknownOption, "--nope"),
            (["--database-url"], .missingValue, "--database-url"),
            ([], .missingArgument, "SIWA_DATABASE_URL"),
            (["--database-url", "x", "--once=yes"], .invalidValue, "--once"),
            (["--database-url", "x", "a", "b"], .unexpectedArgument, "unexpected"),
        ])
    func mistakes(arguments: [String], code: CommandLineError.Code, mentions: String) {
        #expect {
            try Self.spec.parse(arguments)
        } throws: { error in
            guard let error = error as? CommandLineError else { return false }
            return error.code == code && error.message.contains(mentions)
        }
    }

    @Test("--help is recognised and the help text lists every option with its variable and default")
    func help() throws {
        #expect(try Self.spec.parse(["--help"]).helpRequested)
        let text = Self.spec.helpText()
        for fragment in [
            "--database-url URL", "SIWA_DATABASE_URL", "--audience ID", "[default: 127.0.0.1:8080]", "--once",
        ] {
            #expect(text.contains(fragment), "help lacks \(fragment)")
        }
    }

    @Test("typed values: whole numbers in range, seconds, listen addresses")
    func typedValues() throws {
        let parsed = try Self.spec.parse([
            "--database-url", "x", "--count", "7", "--delay", "0.25", "--listen", "[::1]:9",
        ])
        #expect(try parsed.integer("count", in: 1...10) == 7)
        #expect(try parsed.seconds("delay") == .milliseconds(250))
        #expect(try parsed.listenAddress("listen") == ListenAddress(host: "::1", port: 9))
        #expect(try parsed.integer("missing", in: 1...10) == nil)
        #expect(throws: CommandLineError.self) { try parsed.integer("count", in: 8...10) }
        let bad = try Self.spec.parse([
            "--database-url", "x", "--delay", "-1", "--count", "x", "--listen", "nope",
        ])
        #expect(throws: CommandLineError.self) { try bad.seconds("delay") }
        #expect(throws: CommandLineError.self) { try bad.number("count") }
        #expect(throws: CommandLineError.self) { try bad.listenAddress("listen") }
    }

    @Test(
        "listen addresses: host:port, [IPv6]:port and :port parse; anything else does not",
        arguments: [
            ("127.0.0.1:8080", ListenAddress(host: "127.0.0.1", port: 8080)),
            ("localhost:0", ListenAddress(host: "localhost", port: 0)),
            ("[::1]:443", ListenAddress(host: "::1", port: 443)),
            (":9090", ListenAddress(host: "0.0.0.0", port: 9090)),
            ("::1:80", nil), ("host", nil), ("host:70000", nil), ("[::1]80", nil), ("host:-1", nil),
        ])
    func listenAddresses(text: String, expected: ListenAddress?) {
        #expect(ListenAddress(parsing: text) == expected)
    }
}
