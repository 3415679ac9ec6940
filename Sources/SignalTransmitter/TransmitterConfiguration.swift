public import Foundation
public import HTTPServer
public import Postgres
public import ServiceSupport
public import SharedSignals

/// The transmitter API's settings, built once by the executable.
public struct TransmitterConfiguration: Sendable {
    /// Which subjects a new stream carries before any is added or removed (SSF 1.0 `default_subjects`).
    public enum DefaultSubjects: String, Sendable {
        /// Every subject but those removed.
        case all = "ALL"
        /// Only the subjects added.
        case none = "NONE"
    }

    /// Where the API listens (its own listener) and its limits.
    public var http: HTTPServer.Configuration
    /// The database, as a login of its own that is a member of `siwa_ssf` only.
    public var database: PostgresConfiguration
    /// Database connections.
    public var poolSize: Int
    /// The `iss` of every SET and the base of every endpoint URL in the metadata (no trailing slash).
    public let issuer: String
    /// The key that signs polled SETs (the one siwa-worker pushes with) and whose JWKS is published.
    public let key: SETSigningKey
    /// Keys published in the JWKS beside ``key`` that sign nothing here: for a rotation, the next key
    /// (published before it signs) and the previous one (kept while its SETs may still be verified).
    public var publishedKeys: [SETSigningKey]
    /// How long an access token of `POST /ssf/token` is valid.
    public var tokenLifetime: Duration
    /// `default_subjects` of the metadata and of every new stream.
    public var defaultSubjects: DefaultSubjects
    /// A new stream's `min_verification_interval` (seconds).
    public var minVerificationInterval: Int
    /// The longest a poll without `returnImmediately` waits for a SET.
    public var longPollLimit: Duration
    /// How long a polled SET stays leased before it is served again unacknowledged.
    public var pollLease: Duration
    /// Where a push stream's `authorization_header` is written (one file per stream, mode 0600), for
    /// siwa-worker to read; nil: push streams with an authorization header are refused.
    public var authorizationDirectory: String?

    /// - Throws: ``ConfigurationError`` for an issuer that is not an https URL (http only on loopback), a
    ///   listen address that is not loopback while `tlsTerminatedInFront` is false, or bounds out of range.
    public init(
        http: HTTPServer.Configuration, database: PostgresConfiguration, issuer: String, key: SETSigningKey,
        poolSize: Int = 8, tokenLifetime: Duration = .seconds(3600), defaultSubjects: DefaultSubjects = .all,
        minVerificationInterval: Int = 30, longPollLimit: Duration = .seconds(30),
        pollLease: Duration = .seconds(60), authorizationDirectory: String? = nil,
        publishedKeys: [SETSigningKey] = [], tlsTerminatedInFront: Bool = false
    ) throws {
        let trimmed = issuer.hasSuffix("/") ? String(issuer.dropLast()) : issuer
        guard let url = URL(string: trimmed), let host = url.host, url.query == nil, url.fragment == nil,
            url.scheme == "https" || (url.scheme == "http" && ListenAddress(host: host, port: 0).isLoopback)
        else {
            throw ConfigurationError("--ssf-issuer must be an https URL (http only to a loopback host)")
        }
        guard tlsTerminatedInFront || ListenAddress(host: http.host, port: 0).isLoopback else {
            throw ConfigurationError(
                "the Shared Signals API speaks plain HTTP (bearer tokens and client secrets in clear): listen on a loopback address, or terminate TLS in front of it and say so with --ssf-tls-terminated-in-front"
            )
        }
        guard tokenLifetime >= .seconds(60), tokenLifetime <= .seconds(86_400), minVerificationInterval >= 0,
            longPollLimit > .zero, longPollLimit <= .seconds(300), pollLease >= .seconds(1), poolSize >= 1
        else {
            throw ConfigurationError(
                "the Shared Signals API's bounds: token lifetime 60 s–1 day, long poll up to 300 s, lease ≥ 1 s"
            )
        }
        if let directory = authorizationDirectory, !directory.hasPrefix("/") {
            throw ConfigurationError("--ssf-authorization-dir must be an absolute path")
        }
        self.http = http
        self.database = database
        self.poolSize = poolSize
        self.issuer = trimmed
        self.key = key
        self.tokenLifetime = tokenLifetime
        self.defaultSubjects = defaultSubjects
        self.minVerificationInterval = minVerificationInterval
        self.longPollLimit = longPollLimit
        self.pollLease = pollLease
        self.authorizationDirectory = authorizationDirectory
        self.publishedKeys = publishedKeys
    }
}
