public import Foundation
import SignIn

/// What the sign-in API's tests configure it with, shared by the in-process fixture and the tests that run
/// siwa-receiver as a child process.
public enum SignInCredentials {
    /// The bearer token the app presents to the sign-in API in tests.
    public static let bearer = "test-bearer-token-0123456789abcdefghijklmnop"
}

/// A raw nonce and what the app sends Apple (its SHA-256 hex).
public struct Nonce: Sendable {
    /// The nonce the app keeps and sends the sign-in API.
    public let raw = "raw-nonce-\(UUID().uuidString)"
    /// What the app sends Apple.
    public var hashed: String { IdentityTokenVerifier.nonceHash(raw) }

    /// A fresh random nonce.
    public init() {}
}

/// A key file with `keys` (id, 32 random bytes), the first encrypting; owner-only. Returns its path.
public func writeKeyFile(_ keys: [(String, [UInt8])], in directory: URL) throws -> String {
    let path = directory.appendingPathComponent("token-keys-\(UUID().uuidString)").path
    let text = keys.map { "\($0.0) \(Data($0.1).base64EncodedString())" }.joined(separator: "\n") + "\n"
    _ = FileManager.default.createFile(
        atPath: path, contents: Data(("# test keys\n" + text).utf8), attributes: [.posixPermissions: 0o600])
    return path
}

/// 32 random bytes: one token key.
public func randomKey() -> [UInt8] { (0..<32).map { _ in UInt8.random(in: 0...255) } }
