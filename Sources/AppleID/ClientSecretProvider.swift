public import Foundation
public import ServiceSupport
import Synchronization

/// The `client_secret` sent with every call to Apple: minted from the `.p8` key and renewed well
/// before it expires (never stored), or a fixed one made earlier by `siwactl client-secret`.
public final class ClientSecretProvider: Sendable {
    /// Where the secret comes from. Options are static factories so more can be added.
    public struct Source: Sendable {
        enum Kind: Sendable {
            case mint(
                signer: ClientSecretSigner, teamID: String, keyID: String, clientID: String,
                lifetime: TimeInterval, renewalMargin: TimeInterval)
            case fixed(token: String, claims: ClientSecretClaims)
        }
        let kind: Kind

        /// Mints secrets with `signer` (the `.p8` key), each valid for `lifetime` seconds (at most
        /// Apple's ``ClientSecretSigner/maximumLifetime``), and mints a new one once fewer than
        /// `renewalMargin` seconds remain (default: half the lifetime).
        public static func mint(
            signer: ClientSecretSigner, teamID: String, keyID: String, clientID: String,
            lifetime: TimeInterval = 86400, renewalMargin: TimeInterval? = nil
        ) throws(AppleIDError) -> Source {
            guard lifetime > 60, lifetime <= ClientSecretSigner.maximumLifetime else {
                throw AppleIDError(
                    .configuration,
                    "the client secret lifetime must be 61 to \(Int(ClientSecretSigner.maximumLifetime)) seconds"
                )
            }
            let margin = renewalMargin ?? lifetime / 2
            guard margin >= 0, margin < lifetime else {
                throw AppleIDError(.configuration, "the renewal margin must be shorter than the lifetime")
            }
            guard !teamID.isEmpty, !keyID.isEmpty, !clientID.isEmpty else {
                throw AppleIDError(.configuration, "team ID, key ID and client ID must not be empty")
            }
            return Source(
                kind: .mint(
                    signer: signer, teamID: teamID, keyID: keyID, clientID: clientID, lifetime: lifetime,
                    renewalMargin: margin))
        }

        /// A secret made elsewhere, used as it is until it expires (watch
        /// ``ClientSecretProvider/secondsUntilExpiry(now:)``).
        public static func fixed(_ token: String) throws(AppleIDError) -> Source {
            let trimmed = token.trimmingCharacters(in: .whitespacesAndNewlines)
            do {
                return Source(kind: .fixed(token: trimmed, claims: try ClientSecretClaims(decoding: trimmed)))
            } catch {
                throw AppleIDError(.configuration, "the client secret is not a JWT: \(error.detail)")
            }
        }
    }

    private struct Current {
        var token: String
        var expiresAt: Date
    }

    private let source: Source
    private let cached = Mutex<Current?>(nil)

    /// A provider for `source`.
    public init(_ source: Source) {
        self.source = source
        if case .fixed(let token, let claims) = source.kind {
            cached.withLock { $0 = Current(token: token, expiresAt: claims.expiresAt) }
        }
    }

    /// The client ID the secret is for (its `sub`).
    public var clientID: String {
        switch source.kind {
        case .mint(_, _, _, let clientID, _, _): clientID
        case .fixed(_, let claims): claims.clientID
        }
    }

    /// The secret to send now: the cached one, or a fresh one when it is within its renewal margin.
    public func current(now: Date = Date()) throws(AppleIDError) -> String {
        switch source.kind {
        case .fixed(let token, _):
            return token
        case .mint(let signer, let teamID, let keyID, let clientID, let lifetime, let margin):
            let result: Result<String, AppleIDError> = cached.withLock { cached in
                if let current = cached, current.expiresAt.timeIntervalSince(now) > margin {
                    return .success(current.token)
                }
                do {
                    let token = try signer.sign(
                        teamID: teamID, keyID: keyID, clientID: clientID, issuedAt: now, lifetime: lifetime)
                    let iat = now.timeIntervalSince1970.rounded(.down)
                    cached = Current(
                        token: token, expiresAt: Date(timeIntervalSince1970: iat + lifetime.rounded(.down)))
                    return .success(token)
                } catch {
                    return .failure(AppleIDError(.configuration, "cannot mint the client secret: \(error)"))
                }
            }
            return try result.get()
        }
    }

    /// Seconds until the secret in use expires (negative once it has): for a metric such as
    /// `siwa_apple_client_secret_expiry_seconds`, alerting well before it reaches zero. A minting
    /// provider with no secret yet mints one first; if that fails, the answer is 0.
    public func secondsUntilExpiry(now: Date = Date()) -> Double {
        if case .mint = source.kind { _ = try? current(now: now) }  // renews when due, as a call would
        return cached.withLock { $0 }?.expiresAt.timeIntervalSince(now) ?? 0
    }

    /// Registers a gauge in `registry` reading ``secondsUntilExpiry(now:)`` at each scrape.
    public func registerExpiryGauge(
        in registry: MetricsRegistry, name: String = "siwa_apple_client_secret_expiry_seconds"
    ) {
        registry.computedGauge(
            name, help: "Seconds until the client secret for Apple's token API expires (negative: expired)."
        ) { [self] in secondsUntilExpiry() }
    }
}
