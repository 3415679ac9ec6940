public import Foundation
public import Postgres

/// The operator's calls on webhook endpoints and deliveries (`siwactl webhooks`), each a `siwa.*`
/// function or an admin view, with typed rows. Never prints or reads the environment.
public struct WebhookAdministration {
    /// The connection every call runs on (one thread at a time, like every `PostgresConnection`).
    public let connection: PostgresConnection

    public init(_ connection: PostgresConnection) {
        self.connection = connection
    }

    // MARK: Endpoints

    /// Adds an endpoint (`siwa.add_webhook_endpoint`); `types` nil: every change type. Returns its id.
    public func addEndpoint(
        url: String, secret: String, types: [String]?, maxInFlight: Int, publicKey: String?
    ) throws(PostgresError) -> Int {
        try connection.value(
            "SELECT siwa.add_webhook_endpoint($1, $2, $3::text[], $4::integer, $5)",
            [
                .text(url), .text(secret), types.map(Self.textArray), .int(Int64(maxInFlight)),
                publicKey.map { .text($0) },
            ], as: Int.self
        )
    }

    /// Every endpoint of `siwa.webhook_endpoint_overview`, by id (never a secret).
    public func endpoints() throws(PostgresError) -> [Endpoint] {
        try connection.rows(Endpoint.self)
    }

    /// One row of `siwa.webhook_endpoint_overview`.
    public struct Endpoint: PostgresRowDecodable, Equatable {
        public static let statement = """
            SELECT id, url, coalesce(array_to_string(types, ','), 'all') AS types, enabled, max_in_flight,
                   live_secrets, pending, dead, last_delivered_at, disabled_reason, disabled_at
              FROM siwa.webhook_endpoint_overview ORDER BY id
            """
        public static let columns: PostgresColumns = """
            id bigint, url text, types text, enabled boolean, max_in_flight integer, live_secrets bigint, \
            pending bigint, dead bigint, last_delivered_at timestamp with time zone, disabled_reason text, \
            disabled_at timestamp with time zone
            """
        public var id: Int
        public var url: String
        /// The change types, comma-separated, or `all`.
        public var types: String
        public var enabled: Bool
        public var maxInFlight: Int
        /// Signing keys that still sign.
        public var liveSecrets: Int
        public var pending: Int
        public var dead: Int
        public var lastDeliveredAt: Date?
        /// Why it was disabled automatically (nil: enabled, or disabled by an operator).
        public var disabledReason: String?
        public var disabledAt: Date?

        public init(row: PostgresRow) throws(PostgresError) {
            id = try row["id"]
            url = try row["url"]
            types = try row["types"]
            enabled = try row["enabled"]
            maxInFlight = try row["max_in_flight"]
            liveSecrets = try row["live_secrets"]
            pending = try row["pending"]
            dead = try row["dead"]
            lastDeliveredAt = try row["last_delivered_at"]
            disabledReason = try row["disabled_reason"]
            disabledAt = try row["disabled_at"]
        }
    }

    /// Enables or disables an endpoint (`siwa.set_webhook_endpoint_enabled`); false: no such endpoint.
    public func setEnabled(endpoint: Int64, _ enabled: Bool) throws(PostgresError) -> Bool {
        try connection.value(
            "SELECT siwa.set_webhook_endpoint_enabled($1::bigint, $2::boolean)",
            [.int(endpoint), .bool(enabled)], as: Bool.self
        )
    }

    /// Whether an endpoint with this id exists.
    public func endpointExists(_ endpoint: Int64) throws(PostgresError) -> Bool {
        try connection.query("SELECT 1 FROM siwa.webhook_endpoints WHERE id = $1", [.int(endpoint)]).count
            == 1
    }

    /// The deliveries an endpoint has pending, or nil when there is no such endpoint.
    public func pendingDeliveries(endpoint: Int64) throws(PostgresError) -> Int? {
        try connection.firstValue(
            "SELECT pending FROM siwa.webhook_endpoint_overview WHERE id = $1", [.int(endpoint)], as: Int.self
        )
    }

    // MARK: Signing keys

    /// The signature scheme of the endpoint's current key (the newest live one without an end), or
    /// nil when it has none.
    public func currentScheme(endpoint: Int64) throws(PostgresError) -> SignatureScheme? {
        try connection.firstValue(
            """
            SELECT scheme FROM siwa.webhook_signing_keys
             WHERE endpoint_id = $1 AND live ORDER BY expires_at IS NULL DESC, id DESC LIMIT 1
            """, [.int(endpoint)], as: String.self
        ).flatMap(SignatureScheme.init(rawValue:))
    }

    /// A Standard Webhooks signature scheme as `siwa.webhook_signing_keys.scheme` names it.
    public enum SignatureScheme: String, Sendable {
        /// HMAC-SHA256 with a `whsec_` secret.
        case v1
        /// ed25519 with a `whsk_` key.
        case v1a
    }

    /// Adds a signing key that signs now (`siwa.rotate_webhook_secret`); the current one keeps signing
    /// for `overlap` seconds. False: no such endpoint.
    public func rotateSecret(
        endpoint: Int64, secret: String, overlap: Double, publicKey: String?
    ) throws(PostgresError) -> Bool {
        try connection.value(
            "SELECT siwa.rotate_webhook_secret($1::bigint, $2, make_interval(secs => $3), $4)",
            [.int(endpoint), .text(secret), .double(overlap), publicKey.map { .text($0) }], as: Bool.self
        )
    }

    // MARK: Deliveries

    /// Which deliveries a window replay chooses (`siwa.replay_webhook_deliveries`'s state).
    public enum ReplayChoice: String, Sendable, CaseIterable {
        /// Dead ones.
        case dead
        /// Dead ones, and pending ones in backoff.
        case failed
        /// Every one, delivered too (with an endpoint: creating those it never had).
        case all
    }

    /// Queues deliveries again (`siwa.replay_webhook_deliveries`): one delivery, every delivery of one
    /// change, or a window of changes, to one endpoint or all. Returns how many were queued.
    public func replay(
        delivery: Int64?, change: Int64?, endpoint: Int64?, since: Date?, until: Date?,
        choosing choice: ReplayChoice
    ) throws(PostgresError) -> Int {
        try connection.value(
            "SELECT siwa.replay_webhook_deliveries($1::bigint, $2::bigint, $3::bigint, $4::timestamptz, $5::timestamptz, $6)",
            [
                delivery.map { .int($0) }, change.map { .int($0) }, endpoint.map { .int($0) },
                since.map { .date($0) }, until.map { .date($0) }, .text(choice.rawValue),
            ], as: Int.self
        )
    }

    /// Makes pending deliveries due now (`siwa.retry_webhook_deliveries`): one delivery, or every
    /// pending one of an endpoint. Returns how many.
    public func retry(delivery: Int64?, endpoint: Int64?) throws(PostgresError) -> Int {
        try connection.value(
            "SELECT siwa.retry_webhook_deliveries($1::bigint, $2::bigint)",
            [delivery.map { .int($0) }, endpoint.map { .int($0) }], as: Int.self
        )
    }

    /// One delivery's state, or nil when there is no such delivery.
    public func delivery(_ id: Int64) throws(PostgresError) -> Delivery? {
        try connection.rows(Delivery.self, [.int(id)]).first
    }

    /// A delivery's state in `siwa.webhook_deliveries`.
    public struct Delivery: PostgresRowDecodable, Equatable {
        public static let statement = """
            SELECT state, attempts, coalesce(lease_expires_at > clock_timestamp(), false) AS leased
              FROM siwa.webhook_deliveries WHERE id = $1
            """
        public static let columns: PostgresColumns = "state text, attempts integer, leased boolean"
        /// `pending`, `delivered` or `dead`.
        public enum State: String, Sendable {
            case pending, delivered, dead
        }

        public var state: State
        /// Attempts made so far.
        public var attempts: Int
        /// Whether a worker holds its lease (an attempt is under way).
        public var leased: Bool

        public init(row: PostgresRow) throws(PostgresError) {
            let text: String = try row["state"]
            guard let state = State(rawValue: text) else {
                throw PostgresError(code: .decoding, message: "unknown delivery state")
            }
            self.state = state
            attempts = try row["attempts"]
            leased = try row["leased"]
        }
    }

    /// What removing an endpoint did.
    public enum Removal: Sendable, Equatable {
        /// Removed, with this many pending deliveries deleted unsent.
        case removed(deletedPending: Int)
        /// There is no such endpoint.
        case notFound
        /// It got pending deliveries (refused without `force`): kept.
        case keptWithPending
    }

    /// Removes an endpoint with its keys, deliveries and attempts (`siwa.remove_webhook_endpoint`);
    /// with pending deliveries only when `force` (they are deleted). Disable it first.
    public func remove(endpoint: Int64, force: Bool) throws(PostgresError) -> Removal {
        do {
            let dropped = try connection.value(
                "SELECT siwa.remove_webhook_endpoint($1::bigint, $2::boolean)",
                [.int(endpoint), .bool(force)], as: Int?.self
            )
            return dropped.map { .removed(deletedPending: $0) } ?? .notFound
        } catch  where error.sqlState == "55006" {
            return .keptWithPending
        }
    }

    // MARK: Temporary endpoints (`siwactl webhooks listen --forward-to`)

    /// Registers an endpoint that ends by itself after `lifetime` seconds unless renewed. Returns its id.
    public func addTemporaryEndpoint(url: String, secret: String, types: [String]?, lifetime: Double)
        throws(PostgresError) -> Int
    {
        try connection.value(
            "SELECT siwa.add_temporary_webhook_endpoint($1, $2, $3::text[], make_interval(secs => $4))",
            [.text(url), .text(secret), types.map(Self.textArray), .double(lifetime)], as: Int.self
        )
    }

    /// Extends a temporary endpoint's life to `lifetime` seconds from now.
    public func renewTemporaryEndpoint(_ endpoint: Int64, lifetime: Double) throws(PostgresError) {
        try connection.query(
            "SELECT siwa.renew_temporary_webhook_endpoint($1::bigint, make_interval(secs => $2))",
            [.int(endpoint), .double(lifetime)])
    }

    /// Removes a temporary endpoint.
    public func removeTemporaryEndpoint(_ endpoint: Int64) throws(PostgresError) {
        try connection.query("SELECT siwa.remove_temporary_webhook_endpoint($1::bigint)", [.int(endpoint)])
    }

    /// A text[] literal of `values` (change type names: no commas, quotes or braces).
    static func textArray(_ values: [String]) -> PostgresData {
        .text("{" + values.joined(separator: ",") + "}")
    }
}
