import Foundation
import Synchronization

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// Where Apple's signing keys come from: an HTTPS URL (Apple's, by default).
///
/// Certificates are checked by the platform's TLS stack; plain `http` is accepted only for loopback
/// hosts (a local stand-in such as `siwactl fake-apple`), so a network attacker can never supply keys.
public struct JWKSSource: Sendable, CustomStringConvertible {
    /// Apple's published key set.
    public static let appleURL = URL(string: "https://appleid.apple.com/auth/keys")!

    /// The key set's URL.
    public let url: URL
    /// How long one fetch may take.
    public var timeout: TimeInterval
    /// The largest key set accepted, in bytes.
    public var maxBytes: Int

    /// Validates the URL: `https`, or `http` to a loopback address.
    public init(url: URL = JWKSSource.appleURL, timeout: TimeInterval = 10, maxBytes: Int = 1 << 20) throws {
        guard let scheme = url.scheme?.lowercased(), let host = url.host?.lowercased(), !host.isEmpty else {
            throw ConfigurationError("JWKS URL must be absolute: \(url.absoluteString)")
        }
        let loopback = host == "localhost" || host == "::1" || host == "[::1]" || host.hasPrefix("127.")
        guard scheme == "https" || (scheme == "http" && loopback) else {
            throw ConfigurationError(
                "JWKS URL must use https (http only for loopback hosts): \(url.absoluteString)")
        }
        self.url = url
        self.timeout = timeout
        self.maxBytes = maxBytes
    }

    public var description: String { url.absoluteString }

    /// Fetches the key set's bytes, blocking the calling thread for at most ``timeout``.
    public func fetch() throws -> Data {
        var request = URLRequest(
            url: url, cachePolicy: .reloadIgnoringLocalCacheData, timeoutInterval: timeout)
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        let outcome = Mutex<Result<(Data, Int), any Error>?>(nil)
        let done = DispatchSemaphore(value: 0)
        let task = Self.session.dataTask(with: request) { data, response, error in
            let result: Result<(Data, Int), any Error>
            if let error {
                result = .failure(error)
            } else {
                result = .success((data ?? Data(), (response as? HTTPURLResponse)?.statusCode ?? 0))
            }
            outcome.withLock { $0 = result }
            done.signal()
        }
        task.resume()
        if done.wait(timeout: .now() + timeout + 1) == .timedOut {
            task.cancel()
            throw JWKSFetchError("timed out after \(Int(timeout)) s")
        }
        switch outcome.withLock({ $0 })! {
        case .failure(let error):
            throw JWKSFetchError("request failed: \(error.localizedDescription)")
        case .success(let (data, status)):
            guard status == 200 else { throw JWKSFetchError("HTTP status \(status)") }
            guard data.count <= maxBytes else {
                throw JWKSFetchError("key set larger than \(maxBytes) bytes")
            }
            return data
        }
    }

    private static let session: URLSession = {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.urlCache = nil
        configuration.httpCookieStorage = nil
        return URLSession(configuration: configuration)
    }()
}

/// A key set could not be fetched; the message says why (never containing key material).
public struct JWKSFetchError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// A configuration value is invalid; the message names it.
public struct ConfigurationError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
