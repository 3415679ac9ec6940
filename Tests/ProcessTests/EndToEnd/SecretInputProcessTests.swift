import Foundation
import Postgres
import TestSupport
import Testing

/// No secret has to be on a command line (where `ps` shows it to every user of the machine): a webhook
/// secret and a database URL are read from a file, standard input or the environment; given as an
/// argument they still work, with a warning on standard error.
@Suite("Secrets: from a file, stdin or the environment, never needed on a command line")
struct SecretInputProcessTests {
    static let first = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    static let second = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
    static let third = "whsec_dGhpcmQgc2VjcmV0IG9mIDI0IGJ5dGVzISE="

    static func siwactl(
        _ arguments: [String], _ database: TestDatabase, environment: [String: String] = [:],
        input: String? = nil
    ) throws -> ExecutableLocator.Result {
        var merged = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }
        merged["SIWA_DATABASE_URL"] = database.url
        merged.merge(environment) { $1 }
        return try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwactl"), arguments: arguments, environment: merged,
            input: input.map { Data($0.utf8) })
    }

    static func secrets(_ database: TestDatabase) throws -> [String] {
        try database.query("SELECT secret FROM siwa.webhook_secrets ORDER BY id").map {
            try $0[0, as: String.self]
        }
    }

    @Test("webhooks add and rotate-secret take the secret from SIWA_WEBHOOK_SECRET, stdin or a file")
    func webhookSecretWithoutTheCommandLine() throws {
        let database = try TestDatabase()
        // The environment: used, not ignored (and not printed: it is the caller's).
        var result = try Self.siwactl(
            ["webhooks", "add", "--url", "https://hooks.example.com/siwa"], database,
            environment: ["SIWA_WEBHOOK_SECRET": Self.first])
        #expect(result.status == 0, "\(result.standardError)")
        #expect(!result.standardOutput.contains("secret:"), "\(result.standardOutput)")
        #expect(!result.standardError.contains("warning"), "\(result.standardError)")
        #expect(try Self.secrets(database) == [Self.first])

        // Standard input, with its trailing newline.
        result = try Self.siwactl(
            ["webhooks", "rotate-secret", "--endpoint", "1", "--secret-file", "-", "--overlap", "1h"],
            database,
            input: Self.second + "\n")
        #expect(result.status == 0, "\(result.standardError)")
        #expect(!result.standardOutput.contains("secret:"), "\(result.standardOutput)")
        #expect(try Self.secrets(database) == [Self.first, Self.second])

        // A file named by SIWA_WEBHOOK_SECRET_FILE.
        let file = FileManager.default.temporaryDirectory.appendingPathComponent(
            "secret-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: file) }
        try Data((Self.third + "\n").utf8).write(to: file)
        // Refused while others may read it (naming the file and the fix, quoting nothing), read once not.
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: file.path)
        result = try Self.siwactl(
            ["webhooks", "rotate-secret", "--endpoint", "1", "--overlap", "1h"], database,
            environment: ["SIWA_WEBHOOK_SECRET_FILE": file.path])
        #expect(result.status == 2 && result.standardError.contains("chmod 600"), "\(result.standardError)")
        #expect(!result.standardError.contains(Self.third))
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: file.path)
        result = try Self.siwactl(
            ["webhooks", "rotate-secret", "--endpoint", "1", "--overlap", "1h"], database,
            environment: ["SIWA_WEBHOOK_SECRET_FILE": file.path])
        #expect(result.status == 0, "\(result.standardError)")
        #expect(try Self.secrets(database) == [Self.first, Self.second, Self.third])

        // An empty file is refused, naming the option and not quoting anything.
        let empty = FileManager.default.temporaryDirectory.appendingPathComponent(
            "empty-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: empty) }
        try Data("\n".utf8).write(to: empty)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: empty.path)
        result = try Self.siwactl(
            ["webhooks", "add", "--url", "https://hooks.example.com/b", "--secret-file", empty.path], database
        )
        #expect(result.status == 2)
        #expect(result.standardError.contains("--secret-file"), "\(result.standardError)")
    }

    @Test("--secret on the command line still works, with a warning that names the alternatives")
    func secretOnTheCommandLineWarns() throws {
        let database = try TestDatabase()
        let result = try Self.siwactl(
            ["webhooks", "add", "--url", "https://hooks.example.com/siwa", "--secret", Self.first], database)
        #expect(result.status == 0, "\(result.standardError)")
        #expect(try Self.secrets(database) == [Self.first])
        #expect(
            result.standardError.contains("warning: --secret on the command line")
                && result.standardError.contains("--secret-file FILE")
                && result.standardError.contains("SIWA_WEBHOOK_SECRET"), "\(result.standardError)")
        #expect(!result.standardError.contains(Self.first), "\(result.standardError)")
    }

    @Test("--help shows each secret's file form")
    func helpShowsTheFileForms() throws {
        let database = try TestDatabase()
        for command in [
            ["webhooks", "add"], ["webhooks", "rotate-secret"], ["webhooks", "listen"], ["migrate"],
        ] {
            let result = try Self.siwactl(command + ["--help"], database)
            #expect(result.status == 0)
            let name = command == ["migrate"] ? "--database-url-file FILE" : "--secret-file FILE"
            #expect(result.standardOutput.contains(name), "\(command): \(result.standardOutput)")
        }
    }

    @Test("the database URL from --database-url-file or SIWA_DATABASE_URL_FILE; one with a password warns")
    func databaseURLFromAFile() throws {
        let database = try TestDatabase()
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("url-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: file) }
        try Data((database.url + "\n").utf8).write(to: file)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: file.path)
        let plain = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }
        var result = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwactl"), arguments: ["stats", "--database-url-file", file.path],
            environment: plain)
        #expect(result.status == 0, "\(result.standardError)")
        result = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwa-worker"), arguments: ["--once"],
            environment: plain.merging(["SIWA_DATABASE_URL_FILE": file.path]) { $1 })
        #expect(result.status == 0, "\(result.standardError)")
        #expect(!result.standardError.contains("on the command line"), "\(result.standardError)")
        // A password in a URL on the command line: a warning (the connection itself fails here).
        result = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwactl"),
            arguments: ["stats", "--database-url", "postgresql://someone:hunter2@127.0.0.1:1/none"],
            environment: plain)
        #expect(result.standardError.contains("warning: --database-url on the command line puts a password"))
        #expect(!result.standardError.contains("hunter2"), "\(result.standardError)")
    }
}
