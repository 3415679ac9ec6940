import AppleNotifications
import Foundation
import TestSupport

/// A fixed instant so time checks do not depend on the clock.
let fixedNow = Date(timeIntervalSince1970: 1_700_000_000)

/// The package root, found from this file's path (Tests/AppleNotificationsTests/Helpers.swift).
let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()

let fixturesDirectory = packageRoot.appendingPathComponent("Tests/Fixtures")

/// Apple-shaped claims from the shared test signer, as of ``fixedNow``.
func appleClaims(
    type: String = "consent-revoked", subject: String = "001234.abcdef.0001", email: String? = nil,
    isPrivateEmail: Bool? = nil, jti: String = "jti-1"
) -> [String: Any] {
    TestSigning.apple.claims(
        type: type, subject: subject, audience: TestSigning.audience, email: email,
        isPrivateEmail: isPrivateEmail,
        eventTime: fixedNow.addingTimeInterval(-5), issuedAt: fixedNow, jti: jti)
}

/// Signs with the shared Apple test key; `header` defaults to Apple's.
func appleToken(header: [String: Any]? = nil, claims: [String: Any] = appleClaims()) -> String {
    try! TestSigning.apple.sign(header: header, claims: claims)
}

/// The header Apple sends, for tests that alter it.
var appleHeader: [String: Any] { ["kid": TestSigning.apple.keyID, "alg": "RS256"] }

/// Verifies with the shared verifier and key set as of ``fixedNow``.
func verify(_ token: String, keys: JSONWebKeySet = TestSigning.appleKeySet, now: Date = fixedNow)
    throws(NotificationError) -> ServerNotification
{
    try TestSigning.verifier.verify(token: token, keys: keys, now: now)
}

/// The error verification throws, or nil if it succeeds.
func rejection(_ token: String, keys: JSONWebKeySet = TestSigning.appleKeySet, now: Date = fixedNow)
    -> NotificationError?
{
    do {
        _ = try verify(token, keys: keys, now: now)
        return nil
    } catch {
        return error
    }
}

/// Claims JSON → bytes, for raw signing.
func json(_ object: Any) -> Data {
    try! JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])
}

/// A JSON fragment (`"x"`, `42`, `null`) as a JSONSerialization value.
func fragment(_ text: String) -> Any {
    try! JSONSerialization.jsonObject(with: Data(text.utf8), options: .fragmentsAllowed)
}

/// The result of running a child process.
struct ProcessResult {
    var status: Int32
    var stdout: String
    var stderr: String
}

/// Runs an executable with optional stdin, waiting at most `timeout` seconds for it to exit.
func runProcess(
    _ executable: URL, _ arguments: [String], stdin: Data? = nil, environment: [String: String]? = nil,
    timeout: TimeInterval = 60
) throws -> ProcessResult {
    let result = try Subprocess.run(
        executable.path, arguments, environment: environment, input: stdin, timeout: .seconds(timeout))
    return ProcessResult(status: result.status, stdout: result.standardOutput, stderr: result.standardError)
}
