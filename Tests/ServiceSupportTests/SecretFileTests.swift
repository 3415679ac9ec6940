import Foundation
import ServiceSupport
import Testing

@Suite("Secret files: readable by their owner only")
struct SecretFileTests {
    private func file(mode: mode_t, content: String = "s3cr3t-content\n") throws -> (URL, String) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "secret-file-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let path = directory.appendingPathComponent("secret").path
        #expect(FileManager.default.createFile(atPath: path, contents: Data(content.utf8)))
        #expect(chmod(path, mode) == 0)
        return (directory, path)
    }

    @Test("an owner-only file is read", arguments: [0o600, 0o400])
    func ownerOnly(mode: Int) throws {
        let (directory, path) = try file(mode: mode_t(mode))
        defer { try? FileManager.default.removeItem(at: directory) }
        #expect(try SecretFile.read(path, setting: "--some-file") == Data("s3cr3t-content\n".utf8))
    }

    @Test(
        "a file group or others may read, write or run is refused, naming the setting, the file and its mode",
        arguments: [0o644, 0o640, 0o604, 0o660, 0o620, 0o602, 0o610, 0o601])
    func refused(mode: Int) throws {
        let (directory, path) = try file(mode: mode_t(mode))
        defer { try? FileManager.default.removeItem(at: directory) }
        do {
            _ = try SecretFile.read(path, setting: "--some-file")
            Issue.record("mode \(String(mode, radix: 8)) was accepted")
        } catch {
            #expect(error.message.contains("--some-file \(path)"))
            #expect(error.message.contains("mode 0\(String(mode, radix: 8))"))
            #expect(error.message.contains("chmod 600"))
            #expect(!error.message.contains("s3cr3t"))
        }
    }

    @Test("a missing file, a directory and a link to a readable file are refused")
    func notAFile() throws {
        let (directory, path) = try file(mode: 0o644)
        defer { try? FileManager.default.removeItem(at: directory) }
        #expect(throws: ConfigurationError.self) {
            try SecretFile.read(directory.appendingPathComponent("missing").path, setting: "--x")
        }
        #expect(throws: ConfigurationError("--x \(directory.path) is not a regular file")) {
            try SecretFile.read(directory.path, setting: "--x")
        }
        let link = directory.appendingPathComponent("link").path
        #expect(symlink(path, link) == 0)
        #expect(throws: ConfigurationError.self) { try SecretFile.read(link, setting: "--x") }
        #expect(chmod(path, 0o600) == 0)
        #expect(try SecretFile.read(link, setting: "--x") == Data("s3cr3t-content\n".utf8))
    }
}
