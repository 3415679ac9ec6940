import Foundation
import Postgres
import TestSupport
import Testing

/// The executables refuse a secret file (the `.p8`, the token key file, the bearer-token file) that
/// group or others may read: before they start, naming the setting, the file and its mode, never its
/// content.
@Suite("Secret files with the executables: a key others may read is refused")
struct SecretFileProcessTests {
    /// A copy of the local Apple's `.p8` with `mode`.
    private func teamKey(_ apple: LocalApple, mode: mode_t) throws -> String {
        let path = apple.directory.appendingPathComponent("AuthKey_copy-\(String(mode, radix: 8)).p8").path
        try FileManager.default.copyItem(atPath: apple.teamKeyFile.path, toPath: path)
        #expect(chmod(path, mode) == 0)
        return path
    }

    private func environment() -> [String: String] {
        ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }
    }

    /// The key's base64 body lines: none of them may appear in what a refusal prints.
    private func keyMaterial(_ path: String) throws -> [String] {
        try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n")
            .filter { !$0.hasPrefix("-----") }.map(String.init)
    }

    private func expectRefused(
        _ result: ExecutableLocator.Result, status: Int32, setting: String, path: String, mode: String,
        secret: [String]
    ) {
        let output = result.standardError + result.standardOutput
        #expect(result.status == status, "\(output)")
        #expect(output.contains(setting), "\(output)")
        #expect(output.contains(path), "\(output)")
        #expect(output.contains("mode \(mode)"), "\(output)")
        #expect(output.contains("chmod 600"), "\(output)")
        for line in secret { #expect(!output.contains(line)) }
        #expect(!output.contains("PRIVATE KEY"))
    }

    @Test(
        "siwa-worker's revoker refuses a group- or world-readable --apple-key-file",
        arguments: [0o644, 0o640])
    func workerRefusesReadableAppleKey(mode: Int) throws {
        let apple = try LocalApple()
        let key = try teamKey(apple, mode: mode_t(mode))
        let tokenKeys = try writeKeyFile([("k1", randomKey())], in: apple.directory)
        let database = try PostgresCluster.shared.createSchemaDatabase()
        let result = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwa-worker"),
            arguments: [
                "--database-url", try PostgresCluster.shared.url(database: database.database ?? ""),
                "--apple-key-file", key, "--apple-team-id", LocalApple.teamID, "--apple-key-id",
                LocalApple.keyID, "--audience", LocalApple.clientID, "--token-key-file", tokenKeys,
                "--apple-url", apple.baseURL,
            ], environment: environment(), timeout: .seconds(30))
        expectRefused(
            result, status: 2, setting: "--apple-key-file", path: key, mode: "0" + String(mode, radix: 8),
            secret: try keyMaterial(key))
    }

    @Test("siwa-receiver's sign-in API refuses a world-readable --apple-key-file")
    func receiverRefusesReadableAppleKey() throws {
        let apple = try LocalApple()
        let key = try teamKey(apple, mode: 0o644)
        let tokenKeys = try writeKeyFile([("k1", randomKey())], in: apple.directory)
        let tokenFile = apple.directory.appendingPathComponent("bearer").path
        FileManager.default.createFile(
            atPath: tokenFile, contents: Data((SignInCredentials.bearer + "\n").utf8),
            attributes: [.posixPermissions: 0o600])
        let database = try PostgresCluster.shared.createSchemaDatabase()
        let url = try PostgresCluster.shared.url(database: database.database ?? "")
        let result = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwa-receiver"),
            arguments: [
                "--database-url", url, "--signin-database-url", url,
                "--audience", LocalApple.clientID, "--listen", "127.0.0.1:0", "--signin-listen",
                "127.0.0.1:0",
                "--signin-token-file", tokenFile, "--token-key-file", tokenKeys, "--apple-key-file", key,
                "--apple-team-id", LocalApple.teamID, "--apple-key-id", LocalApple.keyID, "--apple-url",
                apple.baseURL, "--jwks-url", apple.baseURL + "/auth/keys",
            ], environment: environment(), timeout: .seconds(30))
        expectRefused(
            result, status: 2, setting: "--apple-key-file", path: key, mode: "0644",
            secret: try keyMaterial(key))
    }

    @Test("siwa-worker refuses a group-readable --token-key-file, naming it and its mode")
    func workerRefusesReadableTokenKeys() throws {
        let apple = try LocalApple()
        let tokenKeys = try writeKeyFile([("k1", randomKey())], in: apple.directory)
        #expect(chmod(tokenKeys, 0o640) == 0)
        let database = try PostgresCluster.shared.createSchemaDatabase()
        let result = try ExecutableLocator.run(
            ExecutableLocator.url(named: "siwa-worker"),
            arguments: [
                "--database-url", try PostgresCluster.shared.url(database: database.database ?? ""),
                "--apple-key-file", apple.teamKeyFile.path, "--apple-team-id", LocalApple.teamID,
                "--apple-key-id", LocalApple.keyID, "--audience", LocalApple.clientID, "--token-key-file",
                tokenKeys, "--apple-url", apple.baseURL,
            ], environment: environment(), timeout: .seconds(30))
        expectRefused(
            result, status: 2, setting: "--token-key-file", path: tokenKeys, mode: "0640",
            secret: try keyMaterial(tokenKeys).filter { !$0.hasPrefix("#") })
    }

    @Test("siwactl client-secret mints nothing from a world-readable .p8, and mints from a private one")
    func clientSecretRefusesReadableKey() throws {
        let apple = try LocalApple()
        let readable = try teamKey(apple, mode: 0o644)
        let arguments = [
            "client-secret", "--apple-team-id", LocalApple.teamID, "--apple-key-id", LocalApple.keyID,
            "--client-id", LocalApple.clientID, "--days", "1", "--apple-key-file",
        ]
        let siwactl = ExecutableLocator.url(named: "siwactl")
        let refused = try ExecutableLocator.run(
            siwactl, arguments: arguments + [readable], environment: environment())
        expectRefused(
            refused, status: 1, setting: "--apple-key-file", path: readable, mode: "0644",
            secret: try keyMaterial(readable))
        #expect(!refused.standardOutput.contains("eyJ"), "no client secret may be printed")
        // The same key, owner-only, mints a client secret.
        #expect(chmod(readable, 0o600) == 0)
        let minted = try ExecutableLocator.run(
            siwactl, arguments: arguments + [readable], environment: environment())
        #expect(minted.status == 0, "\(minted.standardError)")
        #expect(minted.standardOutput.hasPrefix("eyJ"))
    }
}
