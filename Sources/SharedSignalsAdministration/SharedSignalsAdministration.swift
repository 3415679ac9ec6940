public import Foundation
public import Postgres

/// The operator's calls on the Shared Signals tables (`siwactl ssf receivers`, `siwactl ssf streams`): every
/// write a `siwa.*` function, every read an admin view or a typed row. Never prints or reads the environment.
public struct SharedSignalsAdministration {
    /// The connection every call runs on (one thread at a time, like every `PostgresConnection`).
    public let connection: PostgresConnection

    public init(_ connection: PostgresConnection) {
        self.connection = connection
    }

    // MARK: Receivers

    /// Registers a receiver of the SSF API (`siwa.add_ssf_receiver`): its client_id, the salted SHA-256 of
    /// its secret (never the secret), its scopes and the `aud` of its streams' SETs. Returns its id.
    @discardableResult
    public func addReceiver(
        name: String, clientID: String, salt: Data, secretHash: Data, scopes: [String], audience: String
    ) throws(PostgresError) -> Int {
        try connection.value(
            "SELECT siwa.add_ssf_receiver($1, $2, $3, $4, $5::text[], $6)",
            [
                .text(name), .text(clientID), .bytes(salt), .bytes(secretHash),
                .array(scopes.map { .text($0) }),
                .text(audience),
            ], as: Int.self
        )
    }

    /// Every receiver, by name (never a secret or its hash).
    public func receivers() throws(PostgresError) -> [ReceiverOverview] {
        try connection.rows(ReceiverOverview.self)
    }

    /// One receiver of the SSF API with its counts.
    public struct ReceiverOverview: PostgresRowDecodable, Equatable {
        public static let statement = """
            SELECT r.name, r.client_id, array_to_string(r.scopes, ',') AS scopes, r.audience,
                   (SELECT count(*) FROM siwa.ssf_streams s WHERE s.receiver_id = r.id) AS streams,
                   (SELECT count(*) FROM siwa.ssf_access_tokens t
                     WHERE t.receiver_id = r.id AND t.expires_at > now()) AS live_tokens
              FROM siwa.ssf_receivers r ORDER BY r.name
            """
        public static let columns: PostgresColumns = """
            name text, client_id text, scopes text, audience text, streams bigint, live_tokens bigint
            """
        /// The operator's name for it (`siwactl ssf receivers remove NAME`).
        public var name: String
        /// Its OAuth 2.0 client_id.
        public var clientID: String
        /// Its scopes, comma-separated (`ssf.manage`, `ssf.read`).
        public var scopes: String
        /// The `aud` of its streams' SETs.
        public var audience: String
        /// The streams it owns.
        public var streams: Int
        /// Its access tokens not yet expired.
        public var liveTokens: Int

        public init(row: PostgresRow) throws(PostgresError) {
            name = try row["name"]
            clientID = try row["client_id"]
            scopes = try row["scopes"]
            audience = try row["audience"]
            streams = try row["streams"]
            liveTokens = try row["live_tokens"]
        }
    }

    /// Removes a receiver with its tokens, streams and their SETs (`siwa.remove_ssf_receiver`); false: no
    /// receiver of that name.
    public func removeReceiver(name: String) throws(PostgresError) -> Bool {
        try connection.value("SELECT siwa.remove_ssf_receiver($1)", [.text(name)], as: Bool.self)
    }

    // MARK: Streams

    /// Adds a push stream (`siwa.add_ssf_stream`): SETs for `audience` POSTed to `endpointURL`, with the
    /// Authorization header read from `authorizationReference` (`file:PATH`) at send time; `events` nil:
    /// every event type. Returns its id.
    public func addStream(
        receiver: String, audience: String, endpointURL: String, authorizationReference: String?,
        events: [String]?
    ) throws(PostgresError) -> Int {
        try connection.value(
            "SELECT siwa.add_ssf_stream($1, $2, $3, $4, $5::text[])",
            [
                .text(receiver), .text(audience), .text(endpointURL),
                authorizationReference.map { .text($0) },
                events.map { .text("{" + $0.joined(separator: ",") + "}") },
            ], as: Int.self
        )
    }

    /// Every stream of `siwa.ssf_stream_overview`, by id (never an Authorization header).
    public func streams() throws(PostgresError) -> [StreamOverview] {
        try connection.rows(StreamOverview.self)
    }

    /// One row of `siwa.ssf_stream_overview`.
    public struct StreamOverview: PostgresRowDecodable, Equatable {
        public static let statement = """
            SELECT id, receiver, audience, endpoint_url, status, has_authorization, pending, delivered, failed
              FROM siwa.ssf_stream_overview ORDER BY id
            """
        public static let columns: PostgresColumns = """
            id bigint, receiver text, audience text, endpoint_url text, status text, has_authorization boolean, \
            pending bigint, delivered bigint, failed bigint
            """
        /// The stream's id (`--stream ID`).
        public var id: Int
        /// The receiver's name, the operator's label.
        public var receiver: String
        /// The SETs' `aud`.
        public var audience: String
        /// Where SETs are POSTed (a poll stream: its poll URL).
        public var endpointURL: String
        /// `enabled`, `paused` or `disabled`.
        public var status: String
        /// Whether an Authorization header is sent (its value is never read here).
        public var hasAuthorization: Bool
        /// SETs waiting or in flight.
        public var pending: Int
        /// SETs delivered.
        public var delivered: Int
        /// SETs refused for good or dead.
        public var failed: Int

        public init(row: PostgresRow) throws(PostgresError) {
            id = try row["id"]
            receiver = try row["receiver"]
            audience = try row["audience"]
            endpointURL = try row["endpoint_url"]
            status = try row["status"]
            hasAuthorization = try row["has_authorization"]
            pending = try row["pending"]
            delivered = try row["delivered"]
            failed = try row["failed"]
        }
    }

    /// A stream's status as `siwa.set_ssf_stream_status` sets it.
    public enum StreamStatus: String, Sendable, CaseIterable {
        /// Pushed (enabling wakes the SSF lanes).
        case enabled
        /// New SETs kept, in order, and pushed after resume.
        case paused
        /// No new SETs; pending ones wait.
        case disabled
    }

    /// Sets a stream's status (`siwa.set_ssf_stream_status`); false: no such stream.
    public func setStatus(stream: Int64, _ status: StreamStatus) throws(PostgresError) -> Bool {
        try connection.value(
            "SELECT siwa.set_ssf_stream_status($1, $2)", [.int(stream), .text(status.rawValue)], as: Bool.self
        )
    }

    /// Removes a stream, its SETs and subjects (`siwa.remove_ssf_stream`); false: no such stream.
    public func removeStream(_ stream: Int64) throws(PostgresError) -> Bool {
        try connection.value("SELECT siwa.remove_ssf_stream($1::bigint)", [.int(stream)], as: Bool.self)
    }
}
