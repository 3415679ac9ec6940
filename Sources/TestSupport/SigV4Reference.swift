public import Foundation
import Synchronization

/// The independent SigV4 signer: botocore's `SigV4Auth` (PyPI) in .build/sigv4-venv (made by
/// scripts/sigv4-venv, which `make test` runs; made here too when missing), run by scripts/sigv4-sign.py.
public enum SigV4Reference {
    /// One request to sign, as sent: its `X-Amz-Date` among `headers`.
    public struct Request: Sendable {
        public var method: String
        public var url: String
        public var headers: [(String, String)]
        public var body: [UInt8]

        public init(method: String, url: String, headers: [(String, String)], body: [UInt8]) {
            self.method = method
            self.url = url
            self.headers = headers
            self.body = body
        }
    }

    /// botocore could not run.
    public struct Missing: Error, CustomStringConvertible {
        public var description: String
    }

    private static let prepared = Mutex(false)

    /// The `Authorization` header botocore computes for each request.
    public static func authorizations(
        _ requests: [Request], accessKeyID: String, secretAccessKey: String, sessionToken: String?,
        region: String, service: String
    ) throws -> [String] {
        let root = RepositoryRoot.url
        try prepared.withLock { (ready: inout Bool) throws(Missing) in
            if ready { return }
            let made = try? Subprocess.run(
                root.appendingPathComponent("scripts/sigv4-venv").path, [], timeout: .seconds(300))
            guard let made, made.status == 0 else {
                throw Missing(
                    description:
                        "the botocore venv is missing and scripts/sigv4-venv failed (run make sigv4-venv): \(made?.standardError ?? "did not run")"
                )
            }
            ready = true
        }
        var input = ""
        for request in requests {
            let object: [String: Any] = [
                "method": request.method, "url": request.url,
                "headers": request.headers.map { [$0.0, $0.1] },
                "body_base64": Data(request.body).base64EncodedString(), "access_key": accessKeyID,
                "secret_key": secretAccessKey, "session_token": sessionToken ?? NSNull(), "region": region,
                "service": service,
            ]
            input +=
                String(decoding: try JSONSerialization.data(withJSONObject: object), as: UTF8.self) + "\n"
        }
        let result = try Subprocess.run(
            root.appendingPathComponent(".build/sigv4-venv/bin/python").path,
            [root.appendingPathComponent("scripts/sigv4-sign.py").path], input: Data(input.utf8),
            timeout: .seconds(60))
        guard result.status == 0 else {
            throw Missing(description: "sigv4-sign.py failed: \(result.standardError)")
        }
        return result.standardOutput.split(separator: "\n").map(String.init)
    }
}
