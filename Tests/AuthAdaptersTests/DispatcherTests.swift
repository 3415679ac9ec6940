import AuthAdapters
import AuthPlatforms
import Foundation
import Postgres
import QueueConsumer
import ServiceSupport
import TestSupport
import Testing

extension AdapterFixture {
    func dispatcher(maxAttempts: Int = 30) throws -> AuthAdapterDispatcher {
        let database = try siwa.configuration(asMemberOf: "siwa_worker")
        return AuthAdapterDispatcher(
            configuration: try AuthAdapterDispatcher.Configuration(
                database: database, adapters: try AuthAdapterDispatcher.adapters(in: database),
                timeout: .seconds(5), retryBaseDelay: .milliseconds(10), maxRetryDelay: .milliseconds(20),
                maxAttempts: maxAttempts),
            logger: quietLogger)
    }
}

@Suite("Auth adapters: Apple's changes applied in the auth system's own database")
struct DispatcherTests {
    @Test(
        "consent revoked ends the user's sessions there; the other user's stay; the row is done with its counts"
    )
    func consentRevoked() throws {
        let fixture = try AdapterFixture()
        try fixture.insertChanges([("siwa.consent_revoked", "001.a", nil)])
        let outcomes = try fixture.dispatcher().drainOnce()
        #expect(outcomes.map(\.state) == ["done"])
        #expect(try fixture.sessions(of: AdapterFixture.userA) == 0)
        #expect(try fixture.sessions(of: AdapterFixture.userB) == 1)
        let row = try #require(try fixture.rows().first)
        #expect(row.state == "done")
        #expect(row.result?.contains("\"sessions_ended\": 1") == true, "\(row.result ?? "")")
    }

    @Test("a sub that links no user there is no_user, finished, not retried")
    func noUser() throws {
        let fixture = try AdapterFixture()
        try fixture.insertChanges([("siwa.consent_revoked", "001.nobody", nil)])
        #expect(try fixture.dispatcher().drainOnce().map(\.state) == ["no_user"])
        #expect(try fixture.dispatcher().drainOnce().isEmpty)
        #expect(try fixture.rows().map(\.state) == ["no_user"])
    }

    @Test(
        "a team transfer then the account's deletion, in order: the identity moves to the new sub, then is unlinked"
    )
    func transferThenDeletion() throws {
        let fixture = try AdapterFixture()
        try fixture.insertChanges([
            ("siwa.sub_transferred", "002.a", "001.a"), ("siwa.account_deleted", "002.a", nil),
        ])
        // One row per user per claim: the deletion waits for the transfer.
        let dispatcher = try fixture.dispatcher()
        #expect(try dispatcher.drainOnce().map(\.state) == ["done", "done"])
        #expect(try fixture.linkedUser(sub: "001.a") == nil)
        #expect(try fixture.linkedUser(sub: "002.a") == nil)
        // A had no other login: unlinking it bans the user (when_unlink_leaves_no_login disable).
        #expect(
            try fixture.auth.value(
                "SELECT banned_until > now() FROM auth.users WHERE id = $1::uuid",
                [.text(AdapterFixture.userA)],
                as: Bool.self))
        #expect(try fixture.linkedUser(sub: "001.b") == AdapterFixture.userB)
    }

    @Test(
        "an auth database that cannot be reached: retried with the cause named, no URL in the error; applied once it is back"
    )
    func unreachable() throws {
        let fixture = try AdapterFixture()
        try fixture.write(url: "postgresql://nobody:secret-password@/no_such_database?host=/nonexistent")
        try fixture.insertChanges([("siwa.consent_revoked", "001.a", nil)])
        let dispatcher = try fixture.dispatcher()
        #expect(try dispatcher.drainOnce().map(\.state) == ["retry"])
        let failed = try #require(try fixture.rows().first)
        #expect(failed.state == "pending")
        #expect(
            failed.error?.contains("cannot connect to the auth database") == true, "\(failed.error ?? "")")
        #expect(failed.error?.contains("secret-password") == false)
        #expect(try fixture.sessions(of: AdapterFixture.userA) == 1)
        // The last attempt's failure is dead, as the metric and the outcome say.
        let lastAttempt = try fixture.dispatcher(maxAttempts: 2)
        #expect(waitUntil(timeout: .seconds(10)) { (try? lastAttempt.drainOnce().map(\.state)) == ["dead"] })
        #expect(try fixture.rows().first?.state == "dead")
        _ = try fixture.siwa.value(
            "SELECT siwa.retry_auth_adapter_events((SELECT id FROM siwa.auth_adapters))", as: Int.self)
        try fixture.write(url: fixture.auth.url)
        #expect(waitUntil(timeout: .seconds(10)) { (try? dispatcher.drainOnce().map(\.state)) == ["done"] })
        #expect(try fixture.sessions(of: AdapterFixture.userA) == 0)
    }

    @Test("a connection file readable by others is refused before anything is read from it")
    func worldReadableFile() throws {
        let fixture = try AdapterFixture()
        try FileManager.default.setAttributes(
            [.posixPermissions: 0o644], ofItemAtPath: fixture.connectionFile)
        try fixture.insertChanges([("siwa.consent_revoked", "001.a", nil)])
        #expect(try fixture.dispatcher().drainOnce().map(\.state) == ["retry"])
        let error = try fixture.rows().first?.error ?? ""
        #expect(error.contains("chmod 600"), "\(error)")
        #expect(try fixture.sessions(of: AdapterFixture.userA) == 1)
    }
}

@Suite("Auth adapters: each platform of siwa.auth_adapters made from its row")
struct AdapterSettingsTests {
    @Test(
        "each platform this worker applies is made with its provider and options",
        arguments: [
            ("supabase", "{}", "supabase-auth"), ("better-auth", #"{"ban": true}"#, "better-auth"),
            ("authjs", #"{"schema": "auth_js"}"#, "authjs-pg"), ("authjs-prisma", "{}", "authjs-prisma"),
            ("django-allauth", #"{"sessions": "usersessions-only"}"#, "django-allauth"),
            ("django-social-auth", #"{"also_delete": ["app_profile"]}"#, "django-social-auth"),
        ])
    func platforms(platform: String, options: String, name: String) throws {
        let settings = AdapterSettings(
            platform: platform, provider: "apple", connectionReference: "file:/nonexistent", options: options,
            policy: AuthPolicy())
        let made = try settings.makePlatform()
        #expect(made.name == name)
        #expect(made.provider == "apple")
    }

    @Test("a hosted platform is no database platform: makePlatform's error names it")
    func hosted() throws {
        let settings = AdapterSettings(
            platform: "firebase", provider: "apple.com", connectionReference: "file:/nonexistent",
            options: "{}",
            policy: AuthPolicy())
        #expect(throws: AuthPlatformError.self) { try settings.makePlatform() }
        do {
            _ = try settings.makePlatform()
        } catch {
            #expect("\(error)".contains("firebase"))
        }
    }

    @Test("a configured name that is not a plain identifier is refused")
    func badName() throws {
        let settings = AdapterSettings(
            platform: "authjs", provider: "apple", connectionReference: "file:/nonexistent",
            options: #"{"schema": "public; DROP TABLE users"}"#, policy: AuthPolicy())
        #expect(throws: AuthPlatformError.self) { try settings.makePlatform() }
    }
}

@Suite("Auth adapters: the connection file")
struct ConnectionFileTests {
    @Test("an empty connection file is refused, not taken for libpq's defaults (the worker's own server)")
    func emptyFile() throws {
        let fixture = try AdapterFixture()
        try fixture.write(url: "")
        try fixture.insertChanges([("siwa.consent_revoked", "001.a", nil)])
        #expect(try fixture.dispatcher().drainOnce().map(\.state) == ["retry"])
        let error = try fixture.rows().first?.error ?? ""
        #expect(error.contains("is empty"), "\(error)")
        #expect(try fixture.sessions(of: AdapterFixture.userA) == 1)
    }
}
