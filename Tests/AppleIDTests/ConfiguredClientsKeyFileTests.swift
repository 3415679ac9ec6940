import AppleID
import Foundation
import ServiceSupport
import TestSupport
import Testing

@Suite("The .p8 the Apple clients mint from is a secret file")
struct ConfiguredClientsKeyFileTests {
    @Test("a .p8 group or others may read is refused, naming --apple-key-file, the file and its mode")
    func readableKeyRefused() throws {
        let apple = try LocalApple()
        let key = apple.directory.appendingPathComponent("AuthKey_readable.p8").path
        try FileManager.default.copyItem(atPath: apple.teamKeyFile.path, toPath: key)
        #expect(chmod(key, 0o644) == 0)
        let make = {
            try ConfiguredClients(
                keyFile: key, teamID: LocalApple.teamID, keyID: LocalApple.keyID,
                clientIDs: [LocalApple.clientID], baseURL: apple.baseURL, environment: [:])
        }
        do {
            _ = try make()
            Issue.record("a world-readable .p8 was accepted")
        } catch let error as ConfigurationError {
            #expect(error.message.hasPrefix("--apple-key-file \(key) has mode 0644"))
            #expect(!error.message.contains("PRIVATE KEY"))
        }
        #expect(chmod(key, 0o600) == 0)
        #expect(try make().clients.keys.sorted() == [LocalApple.clientID])
    }
}
