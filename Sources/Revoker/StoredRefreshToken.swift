import AppleID
import Foundation
import Postgres
import TokenVault

/// A refresh token as the revoker's claims return it: encrypted, with what its encryption is bound to.
struct StoredRefreshToken: Sendable {
    var id: Int
    /// The token's client ID; nil for a row the app stored without one.
    var clientID: String?
    var ciphertext: Data
    var sha256: Data?
    /// The account's current sub.
    var sub: String
    /// The subs a team transfer replaced with ``sub`` (format 1 may be bound to one of them).
    var formerSubs: [String]

    /// The token's client ID: its own, or the only configured one when the row has none.
    func resolvedClientID(among clients: [String: AppleIDClient]) -> String? {
        clientID ?? (clients.count == 1 ? clients.keys.first : nil)
    }

    /// The plain token, decrypted under `clientID`.
    func decrypt(with cipher: TokenCipher, clientID: String) throws(TokenCipherError) -> String {
        try cipher.decrypt(
            [UInt8](ciphertext),
            for: TokenCipher.Row(
                clientID: clientID, tokenSHA256: sha256.map { [UInt8]($0) }, subs: [sub] + formerSubs))
    }

    /// A text[] read as JSON (`array_to_json(…)::text`): subs may hold any character.
    static func subs(_ json: String?) -> [String] {
        guard let json, let subs = try? JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String]
        else { return [] }
        return subs
    }
}

/// One row of `siwa.claim_revocation`: the claim's outcome and, once claimed, one of the request's tokens.
struct RevocationClaim: PostgresRowDecodable {
    /// `claimed`, or the state the claim ended the request in (it had no tokens to revoke).
    var outcome: String
    var requestID: Int
    /// The attempt the claim counted (0 unless claimed).
    var attempt: Int
    /// One of the request's tokens (nil unless claimed).
    var token: StoredRefreshToken?
    /// Whether the row is in the service's format (else the app stored it).
    var serviceFormat: Bool

    static let statement = """
        SELECT outcome, request_id, sub, attempt, token_id, client_id, token_ciphertext, token_sha256,
               service_format, pg_catalog.array_to_json(former_subs)::text AS former_subs
          FROM siwa.claim_revocation($1, $2::float8 * interval '1 second', $3, $4::integer)
        """
    static let columns: PostgresColumns = """
        outcome text, request_id bigint, sub text, attempt integer, token_id bigint, client_id text, \
        token_ciphertext bytea, token_sha256 bytea, service_format boolean, former_subs text
        """

    init(row: PostgresRow) throws(PostgresError) {
        outcome = try row[0, as: String.self]
        requestID = try row[1, as: Int.self]
        guard outcome == "claimed" else {
            attempt = 0
            token = nil
            serviceFormat = false
            return
        }
        attempt = try row[3, as: Int.self]
        token = StoredRefreshToken(
            id: try row[4, as: Int.self], clientID: try row[5, as: String?.self],
            ciphertext: try row[6, as: Data.self], sha256: try row[7, as: Data?.self],
            sub: try row[2, as: String.self],
            formerSubs: StoredRefreshToken.subs(try row[9, as: String?.self]))
        serviceFormat = try row[8, as: Bool.self]
    }
}

/// The row of `siwa.claim_refresh_check`: one due token, leased for its check at Apple, or one whose
/// checks stopped the worker too often (`worker_stopped`, no ciphertext).
struct RefreshCheckClaim: PostgresRowDecodable {
    /// `claimed` or `worker_stopped`.
    var outcome: String
    var tokenID: Int
    /// The token to check (nil unless claimed).
    var token: StoredRefreshToken?

    static let statement = """
        SELECT outcome, token_id, sub, client_id, token_ciphertext, token_sha256,
               pg_catalog.array_to_json(former_subs)::text AS former_subs
          FROM siwa.claim_refresh_check(
                   $1::float8 * interval '1 second', $2::float8 * interval '1 second', $3::integer)
        """
    static let columns: PostgresColumns = """
        outcome text, token_id bigint, sub text, client_id text, token_ciphertext bytea, token_sha256 bytea, \
        former_subs text
        """

    init(row: PostgresRow) throws(PostgresError) {
        outcome = try row[0, as: String.self]
        tokenID = try row[1, as: Int.self]
        guard outcome == "claimed" else {
            token = nil
            return
        }
        token = StoredRefreshToken(
            id: tokenID, clientID: try row[3, as: String?.self],
            ciphertext: try row[4, as: Data.self], sha256: try row[5, as: Data?.self],
            sub: try row[2, as: String.self],
            formerSubs: StoredRefreshToken.subs(try row[6, as: String?.self]))
    }
}
