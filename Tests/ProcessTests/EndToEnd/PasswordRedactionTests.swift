import Foundation
import Postgres
import TestSupport
import Testing

/// A malformed database URL must never have its password echoed: libpq's parse errors quote the
/// offending token or the whole URL, so neither the library's error nor any executable may show them.
@Suite("Malformed database URLs never show their password")
struct PasswordRedactionTests {
    /// Each holds the password `Sup3rS3cret` (or a part of it) where libpq's message would quote it.
    static let malformed = [
        "postgresql://app:Sup3rS3cret%zz@db.example/siwa",
        "postgresql://app:Sup3rS3cret%00@db.example/siwa",
        "postgresql://app:Sup3rS3cret@[::1/siwa",
        "postgresql://app:Sup3rS3cret@[]/siwa",
        "postgresql://app:Sup3rS3cret@db.example/siwa?sslmode",
        "postgresql://app:Sup3rS3cret@db.example/siwa?sslmode=a=b",
        "postgresql://app:Sup3rS3cret@db.example/siwa?Sup3rS3cret=1",
        "host=db.example password=Sup3r S3cret dbname=siwa",
        "host=db.example password='Sup3rS3cret dbname=siwa",
        "host=db.example Sup3rS3cret=1",
    ]

    static let fragments = ["Sup3r", "S3cret", "%zz", "%00"]

    static func leaks(_ text: String) -> [String] { fragments.filter { text.contains($0) } }

    @Test("the library's error names the problem but quotes nothing from the URL", arguments: malformed)
    func libraryError(url: String) throws {
        let error = try #require(throws: PostgresError.self) { try PostgresConfiguration(url) }
        #expect(error.code == .invalidConfiguration)
        #expect(Self.leaks(error.message).isEmpty, "\(error.message)")
        #expect(Self.leaks(String(describing: error)).isEmpty, "\(error)")
        #expect(error.message.hasPrefix("invalid connection string: "))
    }

    @Test("the percent-encoding error says what is wrong")
    func percentEncodingReason() throws {
        let error = try #require(throws: PostgresError.self) {
            try PostgresConfiguration("postgresql://app:Sup3rS3cret%zz@db.example/siwa")
        }
        #expect(error.message.contains("%-escape"), "\(error.message)")
    }

    @Test(
        "siwa-receiver, siwa-worker and siwactl print no part of the password",
        arguments: ["siwa-receiver", "siwa-worker", "siwactl"])
    func executables(name: String) throws {
        let executable = ExecutableLocator.url(named: name)
        var environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }
        environment["SIWA_AUDIENCES"] = "com.example.app"
        for url in Self.malformed {
            let arguments =
                name == "siwactl" ? ["stats", "--database-url", url] : ["--database-url", url]
            let result = try ExecutableLocator.run(
                executable, arguments: arguments, environment: environment, timeout: .seconds(30))
            let output = result.standardOutput + result.standardError
            #expect(result.status != 0, "\(name) accepted \(url)")
            #expect(Self.leaks(output).isEmpty, "\(name) printed: \(output)")
            // One shared option and one wording in all three (ServiceSupport's CommandOption.databaseURL).
            #expect(output.hasPrefix(name), "\(name) printed: \(output)")
            #expect(
                output.contains(": invalid --database-url: invalid connection string: "),
                "\(name) printed: \(output)")
        }
    }
}
