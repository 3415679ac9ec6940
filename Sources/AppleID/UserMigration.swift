import Foundation

/// Apple's user migration for an app transfer between developer teams (`/auth/usermigrationinfo`):
/// the old team turns each of its subs into a transfer identifier for the recipient team; the
/// recipient exchanges each transfer identifier for its own sub. Both sides first get an access token
/// with their client credentials (scope `user.migration`, valid one hour, usable many times).
extension AppleIDClient {
    /// An access token for `/auth/usermigrationinfo`. Its `description` never shows the token.
    public struct MigrationToken: Sendable, CustomStringConvertible {
        /// The bearer token. Secret.
        public var accessToken: String
        /// Seconds it is valid (Apple: 3600).
        public var expiresIn: Int
        /// A token.
        public init(accessToken: String, expiresIn: Int) {
            self.accessToken = accessToken
            self.expiresIn = expiresIn
        }
        public var description: String { "MigrationToken(expires in \(expiresIn) s)" }
    }

    /// What the recipient team learns for one transfer identifier.
    public struct MigratedUser: Sendable, Equatable {
        /// The user's sub in the recipient team.
        public var sub: String
        /// The user's email for the recipient team (a new relay address for a private one), if any.
        public var email: String?
        /// Whether `email` is a private relay address.
        public var isPrivateEmail: Bool?
        /// A user.
        public init(sub: String, email: String?, isPrivateEmail: Bool?) {
            self.sub = sub
            self.email = email
            self.isPrivateEmail = isPrivateEmail
        }
    }

    /// `POST /auth/token` with `grant_type=client_credentials` and `scope=user.migration`.
    public func migrationToken(timeout: Duration? = nil) throws(AppleIDError) -> MigrationToken {
        let body = try call(
            "/auth/token", [("grant_type", "client_credentials"), ("scope", "user.migration")],
            timeout: timeout)
        guard let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any],
            let token = object["access_token"] as? String, !token.isEmpty
        else {
            throw AppleIDError(.malformedResponse, status: 200, "the token answer lacks access_token")
        }
        return MigrationToken(
            accessToken: token, expiresIn: (object["expires_in"] as? NSNumber)?.intValue ?? 3600)
    }

    /// The old team's side: the transfer identifier of `sub` for the team `targetTeam`.
    public func transferIdentifier(
        sub: String, targetTeam: String, token: MigrationToken, timeout: Duration? = nil
    )
        throws(AppleIDError) -> String
    {
        let body = try call(
            "/auth/usermigrationinfo", [("sub", sub), ("target", targetTeam)], bearer: token.accessToken,
            timeout: timeout)
        guard let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any],
            let transferSub = object["transfer_sub"] as? String, !transferSub.isEmpty
        else {
            throw AppleIDError(.malformedResponse, status: 200, "the answer lacks transfer_sub")
        }
        return transferSub
    }

    /// The recipient team's side: the user's sub (and email) in this team for a transfer identifier.
    public func exchange(transferSub: String, token: MigrationToken, timeout: Duration? = nil)
        throws(AppleIDError) -> MigratedUser
    {
        let body = try call(
            "/auth/usermigrationinfo", [("transfer_sub", transferSub)], bearer: token.accessToken,
            timeout: timeout)
        guard let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any],
            let sub = object["sub"] as? String, !sub.isEmpty
        else {
            throw AppleIDError(.malformedResponse, status: 200, "the answer lacks sub")
        }
        // Apple writes booleans as JSON booleans or as the strings "true" / "false".
        let flag: Bool? =
            switch object["is_private_email"] {
            case let value as Bool: value
            case let value as String: value == "true" ? true : value == "false" ? false : nil
            default: nil
            }
        return MigratedUser(sub: sub, email: object["email"] as? String, isPrivateEmail: flag)
    }
}
