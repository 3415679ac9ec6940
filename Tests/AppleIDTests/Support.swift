import AppleID
import AppleNotifications
import Foundation
import TestSupport

/// Signs `signingInput` with ES256 using the openssl CLI (independent of the code under test) and
/// returns the compact JWS: the DER signature converted to JOSE's `r||s`.
func es256(_ signingInput: String, key: URL) throws -> String {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
        "es256-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let input = directory.appendingPathComponent("input")
    let output = directory.appendingPathComponent("signature")
    try Data(signingInput.utf8).write(to: input)
    try openssl(["dgst", "-sha256", "-sign", key.path, "-out", output.path, input.path])
    let der = [UInt8](try Data(contentsOf: output))
    // SEQUENCE { INTEGER r, INTEGER s }, short form lengths (P-256 signatures are < 128 bytes).
    var index = 2
    func integer() -> [UInt8] {
        let length = Int(der[index + 1])
        var value = Array(der[(index + 2)..<(index + 2 + length)])
        index += 2 + length
        while value.count > 32, value.first == 0 { value.removeFirst() }
        return [UInt8](repeating: 0, count: 32 - value.count) + value
    }
    let raw = integer() + integer()
    return signingInput + "." + Base64URL.encode(raw)
}
