public import Foundation

/// Runs the built `siwactl` with a clean environment (no SIWA_* variables from the caller) plus `extra`.
public func siwactl(
    _ arguments: [String], environment extra: [String: String] = [:], input: Data? = nil,
    executable: URL = ExecutableLocator.url(named: "siwactl")
) throws -> ExecutableLocator.Result {
    var environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") }
    environment.merge(extra) { $1 }
    return try ExecutableLocator.run(
        executable, arguments: arguments, environment: environment, input: input, timeout: .seconds(60))
}

/// Runs the openssl CLI (an implementation independent of the code under test); throws when it fails.
@discardableResult
public func openssl(_ arguments: [String]) throws -> ExecutableLocator.Result {
    let result = try Subprocess.run("/usr/bin/openssl", arguments, timeout: .seconds(30))
    guard result.status == 0 else {
        throw ExecutableError("openssl \(arguments.first ?? ""): \(result.standardError)")
    }
    return result
}

/// A scratch directory removed by the caller.
public func scratchDirectory() throws -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent(
        "siwactl-tests-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

/// Parses JSON lines into objects.
public func jsonLines(_ text: String) throws -> [[String: Any]] {
    try text.split(separator: "\n").map {
        guard let object = try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] else {
            throw ExecutableError("not a JSON object: \($0)")
        }
        return object
    }
}

/// TEST ONLY: a throwaway CA (`ca.pem`, `ca.key`) and a certificate for "localhost" that it signed
/// (`server.pem`, `server.key`; a DNS name only, no IP address), made by the openssl CLI in `directory`.
public func makeLocalhostCertificate(in directory: URL) throws {
    let script = """
        set -e
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 -subj /CN=test-ca \
          2>/dev/null
        openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost 2>/dev/null
        printf 'subjectAltName=DNS:localhost\\n' > san.ext
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
          -extfile san.ext -out server.pem 2>/dev/null
        """
    let made = try Subprocess.run("/bin/sh", ["-c", script], workingDirectory: directory.path)
    guard made.status == 0 else { throw ExecutableError("openssl: \(made.standardError)") }
}
