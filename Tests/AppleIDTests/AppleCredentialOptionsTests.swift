import AppleID
import ServiceSupport
import Testing

@Suite("The Apple credential options: one declaration, old names as aliases")
struct AppleCredentialOptionsTests {
    static let spec = CommandSpec(
        name: "service", abstract: "x",
        options: AppleCredentialOptions.credentials() + [AppleCredentialOptions.audiences(required: false)])

    @Test("--client-id (siwa-worker's old name) and --audience are one setting, read from SIWA_AUDIENCES")
    func audiences() throws {
        let parsed = try Self.spec.parse(["--client-id", "com.a", "--audience", "com.b, com.c"])
        #expect(AppleCredentialOptions.audiences(parsed) == ["com.a", "com.b", "com.c"])
        let fromEnvironment = try Self.spec.parse([], environment: ["SIWA_AUDIENCES": "com.a,com.b"])
        #expect(AppleCredentialOptions.audiences(fromEnvironment) == ["com.a", "com.b"])
    }

    @Test("--team-id and --key-id (siwactl's old names) fill --apple-team-id and --apple-key-id")
    func oldNames() throws {
        let parsed = try Self.spec.parse(["--team-id", "TEAM123456", "--key-id", "KEY1234567"])
        #expect(parsed.value("apple-team-id") == "TEAM123456")
        #expect(parsed.value("apple-key-id") == "KEY1234567")
        #expect(parsed.value("apple-url") == "https://appleid.apple.com")
    }

    @Test("a missing credential is named, with what needs it")
    func missing() throws {
        let parsed = try Self.spec.parse(["--apple-team-id", "TEAM123456", "--apple-key-file", "k.p8"])
        #expect(throws: ConfigurationError("--signin-listen needs --apple-key-id")) {
            try AppleCredentials(parsed, neededBy: "--signin-listen")
        }
        let complete = try AppleCredentials(
            Self.spec.parse(
                ["--apple-team-id", "TEAM123456", "--apple-key-id", "KEY1234567", "--apple-key-file", "k.p8"]
            ),
            neededBy: "--signin-listen")
        #expect(complete.keyFile == "k.p8")
    }

    @Test("credentials(required: true) makes the three without a default required")
    func required() {
        let options = AppleCredentialOptions.credentials(required: true)
        #expect(
            options.filter(\.isRequired).map(\.name) == ["apple-team-id", "apple-key-id", "apple-key-file"])
    }
}
