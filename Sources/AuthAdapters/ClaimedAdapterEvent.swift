public import AuthPlatforms
import Foundation
public import HostedPlatforms
public import Postgres

/// A row `siwa.claim_auth_adapter_events` leased to a lane: the event, its user's `sub`, and its
/// adapter as configured.
public struct ClaimedAdapterEvent: PostgresRowDecodable, Sendable {
    /// The row's id.
    public var id: Int
    /// This attempt's number (1 for the first).
    public var attempt: Int
    /// The event, as the platforms take it.
    public var event: AuthEvent
    /// The user's `sub` as the auth system knows it at this point of the user's queue (the new one for a
    /// transfer).
    public var sub: String
    /// The adapter.
    public var adapter: AdapterSettings

    public static let statement = """
        SELECT id, type, sub, old_sub, attempts, platform, provider, connection_ref, options::text,
               on_consent_revoked, on_account_deleted, when_unlink_leaves_no_login, on_forwarding_change,
               on_sub_transferred
          FROM siwa.claim_auth_adapter_events($1, $2::float8 * interval '1 second', $3::integer, $4::bigint, $5)
        """
    public static let columns: PostgresColumns = """
        id bigint, type text, sub text, old_sub text, attempts integer, platform text, provider text, \
        connection_ref text, options text, on_consent_revoked text, on_account_deleted text, \
        when_unlink_leaves_no_login text, on_forwarding_change text, on_sub_transferred text
        """

    public init(row: PostgresRow) throws(PostgresError) {
        id = try row[0, as: Int.self]
        let type = try row[1, as: String.self]
        sub = try row[2, as: String.self]
        let oldSub = try row[3, as: String?.self]
        attempt = try row[4, as: Int.self]
        switch type {
        case "siwa.consent_revoked": event = .consentRevoked
        case "siwa.account_deleted": event = .accountDeleted
        case "siwa.email_disabled": event = .forwardingChanged(on: false)
        case "siwa.email_enabled": event = .forwardingChanged(on: true)
        case "siwa.sub_transferred": event = .subTransferred(from: oldSub ?? "")
        default: event = .personalDataErased
        }
        adapter = AdapterSettings(
            platform: try row[5, as: String.self], provider: try row[6, as: String.self],
            connectionReference: try row[7, as: String.self], options: try row[8, as: String.self],
            policy: AuthPolicy(
                onConsentRevoked: .init(rawValue: try row[9, as: String.self]) ?? .endSessions,
                onAccountDeleted: .init(rawValue: try row[10, as: String.self]) ?? .unlink,
                whenUnlinkLeavesNoLogin: .init(rawValue: try row[11, as: String.self]) ?? .disable,
                onForwardingChange: .init(rawValue: try row[12, as: String.self]) ?? .ignore,
                onSubTransferred: .init(rawValue: try row[13, as: String.self]) ?? .move))
    }
}

/// An adapter as `siwa.auth_adapters` configures it: which platform, its name for Apple, where its
/// connection URL is, its options and its policy.
public struct AdapterSettings: Sendable, Hashable {
    /// `supabase`, `better-auth`, `authjs`, `authjs-prisma`, … (the table's check lists them).
    public var platform: String
    /// The platform's name for Apple in its identity tables.
    public var provider: String
    /// `file:PATH` of the file holding the auth database's URL, or a hosted platform's credentials.
    public var connectionReference: String
    /// The options as JSON: `schema` (every platform but Supabase), Better Auth's `ban` (true: the admin
    /// plugin is installed), Django's `user_table`, `sessions` (``DjangoSessionLookup``) and
    /// `also_delete` (the app's tables a delete may clear).
    public var options: String
    /// One choice per event.
    public var policy: AuthPolicy

    /// An adapter's settings.
    public init(
        platform: String, provider: String, connectionReference: String, options: String, policy: AuthPolicy
    ) {
        self.platform = platform
        self.provider = provider
        self.connectionReference = connectionReference
        self.options = options
        self.policy = policy
    }

    /// The hosted platforms (reached through their admin API; the connection file holds credentials).
    public static let hostedPlatforms: Set<String> = ["auth0", "clerk", "firebase", "keycloak"]

    /// Whether the platform is hosted: its connection file holds the admin API's credentials (JSON), not
    /// a database URL.
    public var isHosted: Bool { Self.hostedPlatforms.contains(platform) }

    /// The hosted platform that applies this adapter's events, with `credentials` (the connection
    /// file's JSON); throws for a platform this worker cannot apply or a field missing.
    public func makeHostedPlatform(credentials text: String) throws -> any HostedPlatform {
        let credentials = try HostedCredentials(text, platform: platform)
        switch platform {
        case "auth0":
            return try Auth0(provider: provider, credentials: credentials)
        case "clerk":
            return try Clerk(provider: provider, credentials: credentials)
        case "firebase":
            return try FirebaseAuth(provider: provider, credentials: credentials)
        case "keycloak":
            return try Keycloak(provider: provider, credentials: credentials)
        default:
            throw AuthPlatformError(
                .policyNotSupported, platform: platform,
                cause: "this siwa-worker cannot apply events in \(platform)")
        }
    }

    /// The platform that applies this adapter's events; throws for a platform this worker cannot apply
    /// (named) or an option it cannot use.
    public func makePlatform() throws -> any AuthPlatform {
        let options =
            (try? JSONSerialization.jsonObject(with: Data(self.options.utf8)) as? [String: Any]) ?? [:]
        let schema = options["schema"] as? String ?? "public"
        switch platform {
        case "supabase":
            return SupabaseAuth(provider: provider)
        case "better-auth":
            var naming = BetterAuth.Naming(ban: options["ban"] as? Bool == true ? .init() : nil)
            naming.schema = schema
            return try BetterAuth(provider: provider, naming: naming)
        case "authjs":
            return try AuthJS(provider: provider, schema: schema)
        case "authjs-prisma":
            return try AuthJSPrisma(provider: provider, schema: schema)
        case "django-allauth", "django-social-auth":
            let userTable = options["user_table"] as? String ?? "auth_user"
            let sessions =
                (options["sessions"] as? String).flatMap(DjangoSessionLookup.init(rawValue:))
                ?? .userSessionsAndSessionData
            let alsoDelete = options["also_delete"] as? [String] ?? []
            return platform == "django-allauth"
                ? try DjangoAllauth(
                    provider: provider, schema: schema, userTable: userTable, sessions: sessions,
                    alsoDelete: alsoDelete)
                : try DjangoSocialAuth(
                    provider: provider, schema: schema, userTable: userTable, sessions: sessions,
                    alsoDelete: alsoDelete)
        default:
            throw AuthPlatformError(
                .policyNotSupported, platform: platform,
                cause: "this siwa-worker cannot apply events in \(platform)")
        }
    }
}
