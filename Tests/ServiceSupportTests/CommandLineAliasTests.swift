import ServiceSupport
import Testing

@Suite("Command-line parsing: old option names as aliases")
struct CommandLineAliasTests {
    static let spec = CommandSpec(
        name: "tool", abstract: "Does things.",
        options: [
            CommandOption(
                "audience", valueName: "ID", help: "Who.", isRepeatable: true,
                environmentVariable: "SIWA_AUDIENCES", aliases: ["client-id"]),
            CommandOption("apple-team-id", valueName: "ID", help: "Team.", aliases: ["team-id"]),
        ])

    @Test("a value given under an old name counts as given under the option's name")
    func aliasIsTheOption() throws {
        let parsed = try Self.spec.parse(["--client-id", "a", "--audience=b", "--team-id=T1"])
        #expect(parsed.values("audience") == ["a", "b"])
        #expect(parsed.values("client-id").isEmpty)
        #expect(parsed.value("apple-team-id") == "T1")
    }

    @Test("a single-valued option given under both names is given twice")
    func bothNames() {
        #expect {
            try Self.spec.parse(["--team-id", "T1", "--apple-team-id", "T2"])
        } throws: { error in
            (error as? CommandLineError)?.code == .unexpectedArgument
                && (error as? CommandLineError)?.message.contains("--apple-team-id") == true
        }
    }

    @Test("help names the old names as such")
    func help() {
        let help = Self.spec.helpText()
        #expect(help.contains("--audience ID"))
        #expect(help.contains("(old name: --client-id)"))
        #expect(help.contains("(old name: --team-id)"))
        #expect(!help.contains("--client-id ID"))
        // The environment variable is still shown in the form scripts/validate-deploy reads.
        #expect(help.contains("[env: SIWA_AUDIENCES]"))
    }

    @Test("requiring() and aliased(_:) copy an option")
    func copies() throws {
        let option = CommandOption("apple-key-file", help: "Key.").requiring().aliased("key")
        #expect(option.isRequired)
        #expect(option.aliases == ["key"])
        let spec = CommandSpec(name: "tool", abstract: "x", options: [option])
        #expect(try spec.parse(["--key", "k.p8"]).value("apple-key-file") == "k.p8")
        #expect(throws: CommandLineError.self) { try spec.parse([]) }
    }
}
