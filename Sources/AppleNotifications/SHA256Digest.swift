public import Foundation

/// SHA-256 for other modules (OpenSSL's one-shot digest; nothing hand-rolled).
public enum SHA256Digest {
    /// The 32-byte SHA-256 of `data`.
    public static func hash(_ data: Data) -> Data { sha256(data) }

    /// The SHA-256 of `text`'s UTF-8 bytes, as 64 lower-case hex digits (what `sha256sum` prints).
    public static func hex(_ text: String) -> String {
        sha256(Data(text.utf8)).map { String(format: "%02x", $0) }.joined()
    }
}
