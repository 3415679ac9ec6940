import Foundation
import TestSupport
import Testing

@Suite("Test subprocesses")
struct SubprocessTests {
    @Test("a child inherits only standard input, output and error, not files the tests have open")
    func inheritsOnlyStandardDescriptors() throws {
        // Opened without O_CLOEXEC, like a file being copied by another test at the moment of a spawn.
        let path = FileManager.default.temporaryDirectory.appendingPathComponent(
            "siwa-fd-\(UUID().uuidString)"
        ).path
        let descriptor = open(path, O_WRONLY | O_CREAT, 0o600)
        #expect(descriptor > 2)
        defer {
            close(descriptor)
            unlink(path)
        }
        let result = try Subprocess.run("/bin/sh", ["-c", "ls /proc/$$/fd"])
        #expect(
            result.standardOutput.split(separator: "\n").sorted() == ["0", "1", "2"],
            "\(result.standardOutput)")
    }
}
