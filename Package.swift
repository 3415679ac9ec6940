// swift-tools-version:6.0
import PackageDescription

/// Sign in with Apple server-to-server notifications: receiver, worker and operator tool.
///
/// No package dependencies: SwiftPM cannot fetch here. C libraries come from Debian and are bridged
/// by the `.systemLibrary` targets below; what does not import into Swift lives in `CHTTPShim`
/// (libmicrohttpd) and `CCurlShim` (libcurl).
let package = Package(
    name: "siwa-notifications",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "siwa-receiver", targets: ["siwa-receiver"]),
        .executable(name: "siwa-worker", targets: ["siwa-worker"]),
        .executable(name: "siwactl", targets: ["siwactl"]),
        .executable(name: "siwa-mailgate", targets: ["siwa-mailgate"]),
        .library(name: "AppleNotifications", targets: ["AppleNotifications"]),
        // Apple's /auth/token, /auth/revoke and the ES256 client secret, for Swift apps (docs/operations.md).
        .library(name: "AppleID", targets: ["AppleID"]),
    ],
    targets: [
        // C bridges: thin, at the edge.
        .systemLibrary(
            name: "CLibPQ", pkgConfig: "libpq", providers: [.apt(["libpq-dev"])]),
        .systemLibrary(
            name: "COpenSSL", pkgConfig: "libcrypto", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(
            name: "CMicroHTTPD", pkgConfig: "libmicrohttpd", providers: [.apt(["libmicrohttpd-dev"])]),
        .target(name: "CHTTPShim", dependencies: ["CMicroHTTPD"]),
        .systemLibrary(
            name: "CCurl", pkgConfig: "libcurl", providers: [.apt(["libcurl4-openssl-dev"])]),
        .target(name: "CCurlShim", dependencies: ["CCurl"]),

        // Libraries.
        // The one Swift module over OpenSSL: digests, HMAC, RSA, ECDSA P-256, Ed25519, AES-GCM, random bytes,
        // as small Swift APIs that never expose a C pointer.
        .target(name: "Crypto", dependencies: ["COpenSSL"]),
        .target(name: "AppleNotifications", dependencies: ["Crypto"]),
        .target(name: "Postgres", dependencies: ["CLibPQ"]),
        .target(name: "HTTPServer", dependencies: ["CHTTPShim", "ServiceSupport"]),
        // Outbound HTTP (key sets, and later Apple's token endpoints and webhooks): libcurl under a policy.
        .target(name: "HTTPClient", dependencies: ["CCurl", "CCurlShim"]),
        .target(name: "ServiceSupport"),
        // Apple's Sign in with Apple REST API (/auth/token, /auth/revoke) on HTTPClient, the ES256 client
        // secret (made and checked with Crypto's P-256), and the one declaration of the Apple credential
        // options every executable shares.
        .target(
            name: "AppleID", dependencies: ["AppleNotifications", "Crypto", "HTTPClient", "ServiceSupport"]),
        // A team transfer (Apple's /auth/usermigrationinfo): export and import runs, paced and resumable;
        // every change to the progress tables is a siwa.* function. Never prints or reads the environment.
        .target(
            name: "TeamTransfer",
            dependencies: ["AppleID", "AppleNotifications", "Postgres", "ServiceSupport"]),
        // The local Apple (siwactl fake-apple, and tests in process): JWKS, /auth/token, /auth/revoke,
        // /auth/usermigrationinfo, faults on demand. Loopback only; never prints or reads the environment.
        .target(
            name: "FakeApple",
            dependencies: ["AppleID", "AppleNotifications", "HTTPClient", "HTTPServer", "ServiceSupport"]),
        // `siwactl doctor`: a deployed endpoint checked as Apple reaches it, and what the database knows
        // (heartbeats, client IDs in use). Findings go to a callback; never prints or reads the environment.
        .target(
            name: "Doctor",
            dependencies: ["AppleNotifications", "HTTPClient", "Postgres", "ServiceSupport", "SiwaSchema"]),
        // `siwactl migrate`: the embedded schema applied one migration at a time, with the search_path
        // pinned; returns a report (versions, notices, warnings, role gaps). Never prints or reads the environment.
        .target(name: "Migrator", dependencies: ["Postgres", "SiwaSchema"]),
        // Apple's signing keys: `KeyStore` (cached by kid, refetched with a cooldown), `JWKSSource` (the
        // fetch under the outbound policy) and `KeySetOptions`, the one declaration of their settings.
        .target(name: "AppleKeys", dependencies: ["AppleNotifications", "HTTPClient", "ServiceSupport"]),
        .target(
            name: "Receiver",
            dependencies: ["AppleKeys", "AppleNotifications", "Postgres", "HTTPServer", "ServiceSupport"]),
        // The core every queue consumer shares: the listening loop, the lease rule (`CallLease`), one
        // `RetrySchedule`, and periodic tasks run between drains.
        .target(name: "QueueConsumer", dependencies: ["Postgres", "ServiceSupport"]),
        // The notification lanes (claim, verify each stored token again, apply in one transaction) and
        // the notification maintenance (partitions, erasure, retention) as periodic tasks.
        .target(
            name: "Worker",
            dependencies: ["AppleNotifications", "Postgres", "QueueConsumer", "ServiceSupport"]),
        // The revocation outbox's consumer and the refresh checks, at Apple through AppleID, with the
        // refresh tokens decrypted by TokenVault; sign-in code pruning as its periodic task.
        .target(
            name: "Revoker",
            dependencies: ["AppleID", "Postgres", "QueueConsumer", "ServiceSupport", "TokenVault"]),
        // Webhook delivery: the dispatcher's lanes (signed by Webhooks, sent by HTTPClient), the endpoint
        // gauges, and lane 0's maintenance (`ready` repair, expired endpoints) as periodic tasks.
        .target(
            name: "WebhookDelivery",
            dependencies: [
                "HTTPClient", "Postgres", "QueueConsumer", "ServiceSupport", "WebhookAdministration",
                "Webhooks",
            ]),
        // ESP suppression lists in step with the relay events: the provider adapters (SendGrid, Postmark,
        // Mailgun, SES v2 with its SigV4 signer over Crypto's SHA-256 and HMAC) and the dispatcher's
        // lanes, one per provider, over siwa.suppression_outbox.
        .target(
            name: "Suppressions",
            dependencies: ["Crypto", "HTTPClient", "Postgres", "QueueConsumer", "ServiceSupport"]),
        // Standard Webhooks: whsec_ secrets, v1 signatures (Crypto's HMAC), whsk_/whpk_ keys and v1a
        // signatures (Crypto's ed25519), endpoint URL policy.
        .target(name: "Webhooks", dependencies: ["Crypto"]),
        // Shared Signals: Security Event Tokens (RFC 8417, SSF/CAEP/RISC 1.0) signed RS256 with the
        // transmitter's own key, and its JWKS. Never sends anything or touches the database.
        .target(name: "SharedSignals", dependencies: ["AppleNotifications"]),
        // The SSF push lanes of siwa-worker (RFC 8935): siwa.ssf_events claimed under a lease, signed by
        // SharedSignals, POSTed by HTTPClient. Never holds a transaction across a POST.
        .target(
            name: "SignalDelivery",
            dependencies: ["HTTPClient", "Postgres", "QueueConsumer", "ServiceSupport", "SharedSignals"]),
        // The Shared Signals transmitter's HTTP API hosted by siwa-receiver (SSF 1.0): metadata, OAuth client
        // credentials, stream management, status, subjects, verification, poll (RFC 8936).
        .target(
            name: "SignalTransmitter",
            dependencies: ["HTTPServer", "Postgres", "ServiceSupport", "SharedSignals"]),
        // The operator's calls on webhook endpoints and deliveries (siwactl webhooks, stats), with typed rows.
        // Never prints or reads the environment.
        .target(name: "WebhookAdministration", dependencies: ["Postgres"]),
        // The operator's calls on the Shared Signals receivers and streams (siwactl ssf), each write a siwa.*
        // function, with typed rows. Never prints or reads the environment.
        .target(name: "SharedSignalsAdministration", dependencies: ["Postgres"]),
        // The relay-mail gate's calls (siwa.relay_mail_decision(s)) with typed rows, and the address lists
        // siwactl mail check reads. Never prints or reads the environment.
        .target(name: "RelayMail", dependencies: ["Postgres"]),
        // Bounces from Apple's relay: the RFC 3464 report parser, the ESPs' bounce events and their
        // authentication (Crypto), and the classifier. Never prints, reads the environment, touches the
        // database or the network.
        .target(name: "Bounces", dependencies: ["Crypto", "ServiceSupport"]),
        // The ESPs' bounce events over HTTP (siwa-mailgate --esp-events-listen): routes, authentication by
        // Bounces, siwa.record_relay_bounce as siwa_bounce, metrics.
        .target(
            name: "BounceEvents",
            dependencies: ["Bounces", "HTTPClient", "HTTPServer", "Postgres", "ServiceSupport"]),
        // Heartbeats in siwa.service_heartbeats and the database's health gauges on /metrics.
        .target(
            name: "ServiceHealth", dependencies: ["Postgres", "QueueConsumer", "ServiceSupport"]),
        // Refresh tokens encrypted at rest (AES-256-GCM, rotating keys), for the sign-in API and the revoker.
        .target(name: "TokenVault", dependencies: ["Crypto", "ServiceSupport"]),
        // The internal sign-in API hosted by siwa-receiver: code exchange, id_token checks, revocation requests.
        .target(
            name: "SignIn",
            dependencies: [
                "AppleID", "AppleNotifications", "Crypto", "HTTPServer", "Postgres", "ServiceSupport",
                "TokenVault",
            ]),
        // The relay-mail gate: the Postfix policy service (`PolicyServer`, `PolicyReader`), the HTTP check
        // (`DecisionAPI`), and the lookups behind both (`VerdictResolver`, `VerdictCache`) through RelayMail's typed
        // rows. Never prints or reads the environment.
        .target(name: "MailGate", dependencies: ["HTTPServer", "Postgres", "RelayMail", "ServiceSupport"]),
        // Apple's events applied inside an auth platform's own database (Supabase Auth, Better Auth, Auth.js
        // with its pg and Prisma adapters): one transaction per event under a policy, counts of what changed,
        // a dry run. Never prints, reads the environment, or knows the outbox that calls it.
        .target(name: "AuthPlatforms", dependencies: ["Postgres", "ServiceSupport"]),
        // Apple's events applied in hosted auth platforms through their admin APIs (issue 48): Keycloak, …
        .target(name: "HostedPlatforms", dependencies: ["AuthPlatforms", "Crypto", "HTTPClient"]),
        // The auth adapter outbox's consumer: one lane per adapter applying siwa.auth_adapter_events through
        // AuthPlatforms in each auth system's own database.
        .target(
            name: "AuthAdapters",
            dependencies: ["AuthPlatforms", "HostedPlatforms", "Postgres", "QueueConsumer", "ServiceSupport"]),
        // The operator's calls on the auth adapters (siwactl adapters): add (validated by AuthPlatforms before
        // the siwa.* function writes), list, remove, retry, and test (a dry run in the auth database, changing
        // nothing), with typed rows. Never prints or reads the environment.
        .target(
            name: "AuthAdapterAdministration",
            dependencies: ["AuthAdapters", "AuthPlatforms", "HostedPlatforms", "Postgres", "ServiceSupport"]),

        // schema.sql embedded as a Swift constant at build time (the only file embedded and applied). It is
        // generated from schema/ by `make schema`; the plugin fails the build while it is stale.
        .target(name: "SiwaSchema", plugins: ["EmbedSchema"]),
        .plugin(name: "EmbedSchema", capability: .buildTool(), dependencies: ["embed-schema"]),
        .executableTarget(name: "embed-schema"),

        // Executables: parse configuration, wire, run.
        .executableTarget(
            name: "siwa-receiver",
            dependencies: [
                "Receiver", "AppleKeys", "Postgres", "HTTPServer", "ServiceSupport", "SignIn", "AppleID",
                "AppleNotifications",
                "TokenVault", "ServiceHealth", "SiwaSchema", "SharedSignals", "SignalTransmitter",
            ]),
        .executableTarget(
            name: "siwa-worker",
            dependencies: [
                "Worker", "Revoker", "WebhookDelivery", "Suppressions", "AppleKeys", "Postgres", "HTTPServer",
                "QueueConsumer", "ServiceSupport",
                "AppleID", "AppleNotifications", "TokenVault", "ServiceHealth", "SiwaSchema", "SharedSignals",
                "SignalDelivery", "AuthAdapters",
            ]),
        .executableTarget(
            name: "siwactl",
            dependencies: [
                "AppleNotifications", "AppleID", "HTTPClient", "Postgres", "ServiceSupport", "HTTPServer",
                "SiwaSchema", "AppleKeys", "Webhooks", "TeamTransfer", "FakeApple", "Doctor", "Migrator",
                "WebhookAdministration", "ServiceHealth", "RelayMail", "Bounces", "SharedSignals",
                "SharedSignalsAdministration", "Suppressions", "AuthAdapterAdministration", "AuthAdapters",
                "AuthPlatforms",
            ]),
        .executableTarget(
            name: "siwa-mailgate",
            dependencies: [
                "BounceEvents", "Bounces", "HTTPClient", "MailGate", "HTTPServer", "Postgres",
                "ServiceSupport",
                "SiwaSchema",
            ]),
        .executableTarget(name: "siwa-bench", dependencies: ["AppleNotifications"]),

        // Shared test fixtures: a throwaway PostgreSQL cluster, the schema, a local JWKS server, a signer,
        // an in-process receiver, the local Apple, a webhook endpoint, the executables as child processes.
        .target(
            name: "TestSupport",
            dependencies: [
                "AppleID", "AppleKeys", "AppleNotifications", "FakeApple", "Postgres", "HTTPServer",
                "Receiver",
                "QueueConsumer", "ServiceSupport", "SignIn", "SiwaSchema", "Suppressions", "TokenVault",
                "WebhookDelivery", "Webhooks",
            ]),

        // The Crypto primitives against known-answer vectors.
        .testTarget(name: "CryptoTests", dependencies: ["Crypto"]),
        .testTarget(name: "AppleNotificationsTests", dependencies: ["AppleNotifications", "TestSupport"]),
        .testTarget(name: "PostgresTests", dependencies: ["Postgres", "TestSupport"]),
        .testTarget(name: "HTTPServerTests", dependencies: ["HTTPServer", "TestSupport"]),
        .testTarget(name: "HTTPClientTests", dependencies: ["HTTPClient", "HTTPServer", "TestSupport"]),
        .testTarget(
            name: "AppleKeysTests", dependencies: ["AppleKeys", "AppleNotifications", "TestSupport"]),
        .testTarget(name: "ReceiverTests", dependencies: ["Receiver", "TestSupport"]),
        .testTarget(
            name: "WorkerTests",
            dependencies: ["Worker", "Receiver", "AppleNotifications", "Postgres", "TestSupport"]),
        .testTarget(
            name: "RevokerTests",
            dependencies: [
                "Revoker", "QueueConsumer", "SignIn", "TokenVault", "AppleID", "Postgres", "ServiceSupport",
                "TestSupport",
            ]),
        .testTarget(
            name: "WebhookDeliveryTests",
            dependencies: [
                "WebhookDelivery", "Webhooks", "QueueConsumer", "Postgres", "HTTPServer", "HTTPClient",
                "ServiceSupport", "TestSupport",
            ]),
        .testTarget(
            name: "SuppressionsTests",
            dependencies: [
                "Suppressions", "QueueConsumer", "TestSupport", "Postgres", "HTTPClient", "HTTPServer",
                "ServiceSupport",
            ]),
        // The Webhooks signing library.
        .testTarget(name: "WebhookTests", dependencies: ["Webhooks", "TestSupport"]),
        .testTarget(
            name: "SharedSignalsTests", dependencies: ["SharedSignals", "AppleNotifications", "TestSupport"]),
        .testTarget(
            name: "SignalDeliveryTests",
            dependencies: [
                "SignalDelivery", "SharedSignals", "AppleNotifications", "Postgres", "QueueConsumer",
                "TestSupport",
            ]),
        .testTarget(
            name: "SignalTransmitterTests",
            dependencies: [
                "SignalTransmitter", "SignalDelivery", "SharedSignals", "SharedSignalsAdministration",
                "AppleNotifications", "HTTPServer", "Postgres", "ServiceSupport", "QueueConsumer",
                "TestSupport",
            ]),
        .testTarget(name: "ServiceSupportTests", dependencies: ["ServiceSupport"]),
        .testTarget(name: "QueueConsumerTests", dependencies: ["QueueConsumer", "ServiceSupport"]),
        .testTarget(
            name: "AdminSQLTests",
            dependencies: [
                "AuthAdapterAdministration", "AuthAdapters", "Doctor", "Postgres", "QueueConsumer",
                "Receiver", "RelayMail", "Revoker",
                "ServiceHealth",
                "SharedSignalsAdministration", "SignIn", "SignalDelivery", "Suppressions", "TestSupport",
                "WebhookAdministration",
                "WebhookDelivery",
                "Worker",
            ]),
        .testTarget(
            name: "SiwactlTests",
            dependencies: [
                "SiwaSchema", "TestSupport", "TeamTransfer", "AppleID", "RelayMail", "Suppressions",
                "Postgres",
            ]),
        .testTarget(
            name: "MigratorTests", dependencies: ["Migrator", "Postgres", "SiwaSchema", "TestSupport"]),
        .testTarget(
            name: "WebhookAdministrationTests",
            dependencies: ["WebhookAdministration", "Postgres", "ServiceHealth", "TestSupport", "Webhooks"]),
        .testTarget(name: "AppleIDTests", dependencies: ["AppleID", "ServiceSupport", "TestSupport"]),
        .testTarget(name: "BouncesTests", dependencies: ["Bounces"]),
        .testTarget(name: "AuthPlatformsTests", dependencies: ["AuthPlatforms", "Postgres", "TestSupport"]),
        .testTarget(
            name: "AuthAdaptersTests",
            dependencies: [
                "AuthAdapters", "AuthPlatforms", "Crypto", "HostedPlatforms", "HTTPClient", "Postgres",
                "QueueConsumer", "ServiceSupport", "TestSupport",
            ]),
        .testTarget(
            name: "BounceEventsTests",
            dependencies: [
                "BounceEvents", "Bounces", "HTTPClient", "Postgres", "ServiceSupport", "TestSupport",
            ]),
        .testTarget(
            name: "MailGateTests",
            dependencies: [
                "MailGate", "AppleNotifications", "Postgres", "RelayMail", "ServiceSupport", "TestSupport",
            ]),
        .testTarget(
            name: "SignInTests",
            dependencies: [
                "SignIn", "TokenVault", "AppleID", "AppleNotifications", "Postgres", "TestSupport",
            ]),
        // The executables as child processes (refusals, signals, restarts, start → traffic → SIGTERM cycles,
        // end to end, every siwactl suite that runs the binary): slow, so apart from the unit targets;
        // `swift test` runs them with the rest.
        .testTarget(
            name: "ProcessTests",
            dependencies: [
                "AppleID", "AppleNotifications", "HTTPClient", "Postgres", "QueueConsumer", "ServiceSupport",
                "SharedSignals", "SiwaSchema", "TestSupport", "WebhookDelivery", "Webhooks",
            ]),
    ]
)

// One place for language settings: strict concurrency everywhere Swift is compiled.
let cTargets: Set<String> = ["CHTTPShim", "CCurlShim"]
for target in package.targets
where target.type != .system && target.type != .plugin && !cTargets.contains(target.name) {
    var settings = target.swiftSettings ?? []
    settings.append(.swiftLanguageMode(.v6))
    settings.append(.enableUpcomingFeature("ExistentialAny"))
    settings.append(.enableUpcomingFeature("InternalImportsByDefault"))
    settings.append(.enableUpcomingFeature("MemberImportVisibility"))
    target.swiftSettings = settings
}
