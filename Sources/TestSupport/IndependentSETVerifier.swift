public import Foundation
import Synchronization

/// PyJWT with pyca `cryptography` in .build/ssf-venv (scripts/ssf-venv, run by `make test`; made here
/// when missing), for the Shared Signals test targets: verifies each SET against the published JWKS and returns its header and claims.
public enum IndependentVerifier {
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    /// What PyJWT made of one token: the verified header and claims, or its reason for refusing.
    public struct Outcome {
        public var header: [String: Any]
        public var claims: [String: Any]
        public var failure: String?
    }

    private static let prepared = Mutex(false)
    private static let python = RepositoryRoot.url.appendingPathComponent(".build/ssf-venv/bin/python").path
    private static let script = RepositoryRoot.url.appendingPathComponent("scripts/ssf-verify.py").path

    public static func verify(_ tokens: [String], jwks: Data, issuer: String, audience: String) throws
        -> [Outcome]
    {
        try prepared.withLock { (ready: inout Bool) throws(Failure) in
            if ready { return }
            let made = try? Subprocess.run(
                RepositoryRoot.url.appendingPathComponent("scripts/ssf-venv").path, [], timeout: .seconds(300)
            )
            guard let made, made.status == 0 else {
                throw Failure(description: "scripts/ssf-venv failed: \(made?.standardError ?? "did not run")")
            }
            ready = true
        }
        let keySet = try JSONSerialization.jsonObject(with: jwks)
        var input = ""
        for token in tokens {
            let request: [String: Any] = [
                "token": token, "jwks": keySet, "issuer": issuer, "audience": audience,
            ]
            input +=
                String(decoding: try JSONSerialization.data(withJSONObject: request), as: UTF8.self) + "\n"
        }
        let result = try Subprocess.run(python, [script], input: Data(input.utf8), timeout: .seconds(60))
        guard result.status == 0 else { throw Failure(description: "ssf-verify.py: \(result.standardError)") }
        return try result.standardOutput.split(separator: "\n").map { line in
            let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] ?? [:]
            return Outcome(
                header: object["header"] as? [String: Any] ?? [:],
                claims: object["claims"] as? [String: Any] ?? [:],
                failure: object["fail"] as? String)
        }
    }
}
