public import Foundation

/// A fake hosted auth platform (Tests/Fixtures/hosted-platforms, Python, stdlib only) running on
/// loopback port 0: the vendor's admin API at `url`, and the control API of fakebase.py (seed users,
/// read the neutral state, inject faults, count calls). Stopped by `stop()` or when the test process exits.
public final class HostedPlatformFake: Sendable {
    /// The fake could not start or answered its control API unexpectedly.
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    /// The platform's name as serve.py takes it: firebase, auth0, clerk or keycloak.
    public let platform: String
    /// The base URL of the vendor API, http://127.0.0.1:port.
    public let url: String
    /// The credentials a client of the fake uses (platform-specific keys, fakebase.py `credentials`).
    public let credentials: [String: String]
    private let process: Subprocess
    private let directory: URL

    /// The Python that runs the fakes and the vendor SDKs: .build/platforms-venv (`make platforms-venv`);
    /// the fakes themselves need only the standard library.
    public static var python: String {
        let venv = RepositoryRoot.url.appendingPathComponent(".build/platforms-venv/bin/python").path
        return FileManager.default.isExecutableFile(atPath: venv) ? venv : "/usr/bin/python3"
    }

    /// The directory of the fakes and their SDK checks.
    public static var fixtures: URL {
        RepositoryRoot.url.appendingPathComponent("Tests/Fixtures/hosted-platforms")
    }

    /// Starts the fake `platform` and waits for its address.
    public init(_ platform: String) throws {
        self.platform = platform
        directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "siwa-fake-\(platform)-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let output = directory.appendingPathComponent("stdout").path
        let errors = directory.appendingPathComponent("stderr").path
        let process = try Subprocess(
            Self.python, [Self.fixtures.appendingPathComponent("serve.py").path, platform],
            standardOutput: output, standardError: errors)
        self.process = process
        var first: [String: Any]?
        _ = waitUntil(timeout: .seconds(30)) {
            guard let text = try? String(contentsOfFile: output, encoding: .utf8),
                let line = text.split(separator: "\n").first
            else { return process.wait(timeout: .zero) != nil }
            first = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            return true
        }
        guard let first, let url = first["url"] as? String else {
            process.send(SIGKILL)
            process.wait()
            let stderr = (try? String(contentsOfFile: errors, encoding: .utf8)) ?? ""
            throw Failure(description: "the fake \(platform) did not start: \(stderr)")
        }
        self.url = url
        credentials = (first["credentials"] as? [String: Any] ?? [:]).compactMapValues { "\($0)" }
    }

    deinit { stop() }

    /// The credentials file of an adapter on this fake, as JSON: what the fake printed, with the fake's
    /// URL where the platform's file names its API (Firebase's service-account key file and `api_url`,
    /// Auth0's `base_url`), and `extra` fields over them.
    public func adapterCredentials(_ extra: [String: String] = [:]) throws -> Data {
        var fields: [String: Any] = credentials
        switch platform {
        case "firebase":
            fields =
                try JSONSerialization.jsonObject(
                    with: Data((credentials["service_account_json"] ?? "{}").utf8))
                as? [String: Any] ?? [:]
            fields["api_url"] = url
        case "auth0":
            fields["base_url"] = url
        default:
            break
        }
        return try JSONSerialization.data(withJSONObject: fields.merging(extra) { $1 })
    }

    /// Stops the fake and removes its files.
    public func stop() {
        process.send(SIGTERM)
        if process.wait(timeout: .seconds(5)) == nil {
            process.send(SIGKILL)
            process.wait()
        }
        try? FileManager.default.removeItem(at: directory)
    }

    /// Adds a user (fakebase.py's neutral spec) and returns it in the neutral shape.
    @discardableResult
    public func seed(
        email: String, appleSub: String?, otherProviders: [String] = [], password: Bool = false,
        sessions: Int = 1
    ) throws -> [String: Any] {
        var spec: [String: Any] = [
            "email": email, "other_providers": otherProviders, "password": password, "sessions": sessions,
        ]
        if let appleSub { spec["apple_sub"] = appleSub }
        return try control("POST", "users", spec)
    }

    /// Every user in the neutral shape, sorted by id.
    public func users() throws -> [[String: Any]] {
        try control("GET", "state", nil)["users"] as? [[String: Any]] ?? []
    }

    /// The user with the identity (`provider`, `userID`) in the neutral shape, if any.
    public func user(withIdentity provider: String, _ userID: String) throws -> [String: Any]? {
        try users().first { user in
            (user["identities"] as? [[String: Any]] ?? []).contains {
                $0["provider"] as? String == provider && $0["user_id"] as? String == userID
            }
        }
    }

    /// Injects faults: the next `rateLimit` calls answer 429, the next `outage` 503; every call hangs
    /// `hang` seconds; `revokeCredentials` makes every token (old and new) fail as the vendor does.
    public func faults(
        rateLimit: Int? = nil, outage: Int? = nil, hang: Double? = nil, revokeCredentials: Bool? = nil
    )
        throws
    {
        var spec: [String: Any] = [:]
        if let rateLimit { spec["rate_limit"] = rateLimit }
        if let outage { spec["outage"] = outage }
        if let hang { spec["hang"] = hang }
        if let revokeCredentials { spec["revoke_credentials"] = revokeCredentials }
        _ = try control("POST", "faults", spec)
    }

    /// The vendor API calls answered so far (not 429/503 faults), by "METHOD /path-template".
    public func calls() throws -> (byEndpoint: [String: Int], total: Int) {
        let answer = try control("GET", "calls", nil)
        return ((answer["calls"] as? [String: Int]) ?? [:], answer["total"] as? Int ?? 0)
    }

    /// Runs Tests/Fixtures/hosted-platforms/`script` with the platforms venv's Python (the vendor SDKs),
    /// and returns its exit status and output.
    public static func runCheck(_ script: String, _ arguments: [String] = []) throws
        -> ExecutableLocator.Result
    {
        guard FileManager.default.isExecutableFile(atPath: python),
            python.hasSuffix("platforms-venv/bin/python")
        else { throw Failure(description: "the vendor SDKs are missing: run make platforms-venv") }
        return try Subprocess.run(
            python, [fixtures.appendingPathComponent(script).path] + arguments, timeout: .seconds(120))
    }

    private func control(_ method: String, _ path: String, _ body: [String: Any]?) throws -> [String: Any] {
        let response = try TestHTTPClient.request(
            method: method, url: "\(url)/_fake/\(path)", headers: [("Content-Type", "application/json")],
            body: try body.map { [UInt8](try JSONSerialization.data(withJSONObject: $0)) })
        guard response.status == 200,
            let object = try JSONSerialization.jsonObject(with: response.data) as? [String: Any]
        else { throw Failure(description: "\(method) /_fake/\(path): \(response.status) \(response.text)") }
        return object
    }
}
