import Foundation
import Postgres
import TestSupport
import Testing

/// `siwactl adapters` as a process against a TestDatabase (as a siwa_admin member), and `test` against a
/// Supabase Auth fixture database.
@Suite("siwactl adapters", .serialized)
struct AdaptersProcessTests {
    /// A password that must never show in output or errors.
    static let password = "n0t-in-any-output"

    func run(_ arguments: [String], _ database: TestDatabase) throws -> ExecutableLocator.Result {
        try siwactl(
            ["adapters"] + arguments + ["--database-url", try database.url(asMemberOf: "siwa_admin")])
    }

    /// An owner-only (or `mode`) connection file holding `url`, in a scratch directory.
    func connectionFile(_ url: String, mode: Int = 0o600) throws -> String {
        let path = try scratchDirectory().appendingPathComponent("auth-url").path
        #expect(
            FileManager.default.createFile(
                atPath: path, contents: Data((url + "\n").utf8), attributes: [.posixPermissions: mode]))
        return path
    }

    func count(_ database: TestDatabase) throws -> Int {
        try database.value("SELECT count(*)::integer FROM siwa.auth_adapters", as: Int.self)
    }

    func noSecret(_ result: ExecutableLocator.Result) {
        #expect(!result.standardOutput.contains(Self.password), "\(result.standardOutput)")
        #expect(!result.standardError.contains(Self.password), "\(result.standardError)")
    }

    @Test("add, list --json (the file: reference, never the URL), remove; a second remove says no adapter")
    func addListRemove() throws {
        let database = try TestDatabase()
        let file = try connectionFile("postgresql://auth:\(Self.password)@db.example/auth")
        let added = try run(["add", "main", "--platform", "supabase", "--connection-file", file], database)
        #expect(added.status == 0, "\(added.standardError)")
        #expect(added.standardOutput.contains("adapter main (id "), "\(added.standardOutput)")
        noSecret(added)
        let ban = try run(
            [
                "add", "ba", "--platform", "better-auth", "--connection-file", file, "--option", "ban=true",
                "--option", "schema=auth", "--on-account-deleted", "disable",
            ], database)
        #expect(ban.status == 0, "\(ban.standardError)")

        let listed = try run(["list", "--json"], database)
        #expect(listed.status == 0, "\(listed.standardError)")
        noSecret(listed)
        let rows = try jsonLines(listed.standardOutput)
        try #require(rows.map { $0["name"] as? String } == ["ba", "main"])
        let main = rows[1]
        #expect(main["platform"] as? String == "supabase")
        #expect(main["provider"] as? String == "apple")
        #expect(main["connection"] as? String == "file:" + file)
        #expect(main["on_account_deleted"] as? String == "unlink")
        #expect(main["when_unlink_leaves_no_login"] as? String == "disable")
        #expect(main["enabled"] as? Bool == true)
        #expect(main["pending"] as? Int == 0 && main["dead"] as? Int == 0 && main["no_user"] as? Int == 0)
        let options = rows[0]["options"] as? [String: Any]
        #expect(options?["ban"] as? Bool == true && options?["schema"] as? String == "auth")
        #expect(rows[0]["on_account_deleted"] as? String == "disable")
        #expect(rows[0]["on_forwarding_change"] as? String == "ignore")
        let table = try run(["list"], database)
        #expect(table.standardOutput.contains("file:" + file), "\(table.standardOutput)")

        let removed = try run(["remove", "main"], database)
        #expect(removed.status == 0 && removed.standardOutput == "adapter main: removed\n")
        #expect(
            try jsonLines(try run(["list", "--json"], database).standardOutput).map { $0["name"] as? String }
                == ["ba"])
        let again = try run(["remove", "main"], database)
        #expect(
            again.status == 1 && again.standardError.contains("no adapter main"), "\(again.standardError)")
    }

    @Test(
        "refusals change nothing: unknown platform, relative or missing file, world-readable file, a policy the platform cannot express, the database's 22023, a taken name"
    )
    func refusals() throws {
        let database = try TestDatabase()
        let file = try connectionFile("postgresql://auth:\(Self.password)@db.example/auth")
        func refused(_ arguments: [String], status: Int32, _ words: String) throws {
            let result = try run(["add", "x"] + arguments, database)
            #expect(result.status == status, "\(arguments): \(result.standardError)")
            #expect(result.standardError.contains(words), "\(arguments): \(result.standardError)")
            noSecret(result)
            #expect(try count(database) == 0)
        }
        try refused(["--platform", "okta", "--connection-file", file], status: 2, "unknown platform okta")
        try refused(
            ["--platform", "supabase", "--connection-file", "auth-url"], status: 2, "not an absolute path")
        try refused(
            ["--platform", "supabase", "--connection-file", file + ".missing"], status: 2, "cannot read")
        let open = try connectionFile("postgresql://auth:\(Self.password)@db.example/auth", mode: 0o644)
        try refused(["--platform", "supabase", "--connection-file", open], status: 2, "chmod 600 \(open)")
        try refused(
            ["--platform", "authjs", "--connection-file", file, "--on-account-deleted", "disable"], status: 2,
            "--on-account-deleted disable")
        try refused(
            ["--platform", "authjs", "--connection-file", file, "--when-unlink-leaves-no-login", "disable"],
            status: 2, "--when-unlink-leaves-no-login disable")
        try refused(
            ["--platform", "better-auth", "--connection-file", file, "--on-account-deleted", "disable"],
            status: 2,
            "--on-account-deleted disable")
        try refused(
            [
                "--platform", "better-auth", "--connection-file", file, "--on-forwarding-change", "record",
                "--when-unlink-leaves-no-login", "keep",
            ], status: 2, "--on-forwarding-change record")
        try refused(
            ["--platform", "supabase", "--connection-file", file, "--on-consent-revoked", "maybe"], status: 2,
            "--on-consent-revoked is end-sessions, none")
        // Past siwactl's own checks, the database's (22023) are usage errors too.
        try refused(
            ["--platform", "supabase", "--connection-file", file, "--provider", "apple id"], status: 2,
            "refused: the provider is the platform's name for Apple")
        let first = try run(["add", "x", "--platform", "authjs", "--connection-file", file], database)
        #expect(first.status == 0, "\(first.standardError)")  // Auth.js: keep is its default fallback
        let taken = try run(["add", "x", "--platform", "supabase", "--connection-file", file], database)
        #expect(taken.status == 1 && taken.standardError.contains("an adapter named x exists"))
        #expect(try count(database) == 1)
        let badName = try run(
            ["add", "Bad_Name", "--platform", "supabase", "--connection-file", file], database)
        #expect(badName.status == 2)
        #expect(try count(database) == 1)
    }

    @Test("retry NAME: dead rows due now; --id one row; an unknown adapter or a row not dead says so")
    func retry() throws {
        let database = try TestDatabase()
        let file = try connectionFile("postgresql://auth@db.example/auth")
        #expect(
            try run(["add", "main", "--platform", "supabase", "--connection-file", file], database).status
                == 0)
        let id =
            try database.value(
                """
                INSERT INTO siwa.auth_adapter_events (change_id, adapter_id, type, sub, event_time, state, attempts,
                                                      finished_at, last_error)
                SELECT g, a.id, 'siwa.consent_revoked', '001.' || g, now(), 'dead', 30, now(), 'supabase: auth.sessions: gone'
                  FROM siwa.auth_adapters a, generate_series(1, 2) g
                RETURNING id::integer
                """, as: Int?.self) ?? 0
        _ = id
        let ids = try database.query("SELECT id::integer FROM siwa.auth_adapter_events ORDER BY id").map {
            try $0[0, as: Int.self]
        }
        let one = try run(["retry", "main", "--id", String(ids[0])], database)
        #expect(one.status == 0 && one.standardOutput == "due now: 1 row\n", "\(one.standardError)")
        let notDead = try run(["retry", "main", "--id", String(ids[0])], database)
        #expect(
            notDead.status == 1 && notDead.standardError.contains("not a dead row"),
            "\(notDead.standardError)")
        let all = try run(["retry", "main"], database)
        #expect(all.status == 0 && all.standardOutput == "due now: 1 row\n", "\(all.standardError)")
        #expect(
            try database.value(
                "SELECT count(*)::integer FROM siwa.auth_adapter_events WHERE state = 'pending' AND attempts = 0",
                as: Int.self) == 2)
        let unknown = try run(["retry", "other"], database)
        #expect(unknown.status == 1 && unknown.standardError.contains("no adapter other"))
    }

    @Test("test NAME --sub: check ok and each event's dry run as counts; the auth database unchanged")
    func dryRun() throws {
        let database = try TestDatabase()
        let auth = try SupabaseAuthFixture.database()
        let file = try connectionFile(auth.url)
        #expect(
            try run(["add", "supa", "--platform", "supabase", "--connection-file", file], database).status
                == 0)
        let before = try SupabaseAuthFixture.snapshot(auth)
        #expect(before.count == 8)

        let result = try run(["test", "supa", "--sub", "001.a", "--new-sub", "001.z"], database)
        #expect(result.status == 0, "\(result.standardOutput)\(result.standardError)")
        let output = result.standardOutput
        #expect(output.contains("check: ok"), "\(output)")
        #expect(
            output.contains("consent revoked (end-sessions): sessions_ended=1 refresh_tokens_revoked=1\n"),
            "\(output)")
        #expect(
            output.contains(
                "account deleted (unlink, when it leaves no login: disable): users_disabled=1 identities_unlinked=1"
                    + " sessions_ended=1 refresh_tokens_revoked=1\n"),
            "\(output)")
        #expect(output.contains("identities_unlinked=1"), "\(output)")
        #expect(output.contains("forwarding off (ignore): none"), "\(output)")
        #expect(output.contains("sub transferred (move): identities_moved=1"), "\(output)")
        #expect(!output.contains(auth.url) && !result.standardError.contains(auth.url))
        #expect(try SupabaseAuthFixture.snapshot(auth) == before)

        let nobody = try run(["test", "supa", "--sub", "001.nobody"], database)
        #expect(nobody.status == 0, "\(nobody.standardError)")
        #expect(nobody.standardOutput.contains("consent revoked (end-sessions): no user linked to this sub"))
        #expect(!nobody.standardOutput.contains("sub transferred"))
        #expect(try SupabaseAuthFixture.snapshot(auth) == before)
    }

    @Test("test with a login short of grants: each problem printed, exit 1, nothing changed")
    func shortGrants() throws {
        let database = try TestDatabase()
        let auth = try SupabaseAuthFixture.database()
        let file = try connectionFile(try auth.url(asMemberOf: nil))
        #expect(
            try run(["add", "supa", "--platform", "supabase", "--connection-file", file], database).status
                == 0)
        let before = try SupabaseAuthFixture.snapshot(auth)
        let result = try run(["test", "supa", "--sub", "001.a"], database)
        #expect(result.status == 1, "\(result.standardOutput)")
        #expect(result.standardOutput.contains("problem: auth."), "\(result.standardOutput)")
        #expect(result.standardError.contains("supa: the adapter is not ready"), "\(result.standardError)")
        #expect(try SupabaseAuthFixture.snapshot(auth) == before)

        let missing = try run(["test", "nope", "--sub", "001.a"], database)
        #expect(missing.status == 1 && missing.standardError.contains("no adapter nope"))
        let usage = try run(["test", "supa"], database)
        #expect(usage.status == 2)
    }

    @Test(
        "a hosted platform (Keycloak): add checks the credentials file's fields; test gets a token and dry-runs each event, changing nothing; a wrong secret fails naming the token endpoint, never the secret"
    )
    func hostedDryRun() throws {
        let database = try TestDatabase()
        let fake = try HostedPlatformFake("keycloak")
        try fake.seed(email: "x@example.com", appleSub: "kc.a", sessions: 2)
        func credentials(_ fields: [String: String]) throws -> String {
            try connectionFile(
                String(decoding: try JSONSerialization.data(withJSONObject: fields), as: UTF8.self))
        }
        let missing = try run(
            [
                "add", "kc", "--platform", "keycloak", "--connection-file",
                try credentials(fake.credentials.filter { $0.key != "realm" }),
            ], database)
        #expect(
            missing.status == 2 && missing.standardError.contains("has no \"realm\""),
            "\(missing.standardError)")
        #expect(try count(database) == 0)
        let file = try credentials(fake.credentials)
        let added = try run(["add", "kc", "--platform", "keycloak", "--connection-file", file], database)
        #expect(added.status == 0, "\(added.standardError)")
        let before = try fake.users() as NSArray
        let result = try run(["test", "kc", "--sub", "kc.a", "--new-sub", "kc.b"], database)
        #expect(result.status == 0, "\(result.standardOutput)\(result.standardError)")
        #expect(
            result.standardOutput.contains("check: ok (a token from the credentials)"),
            "\(result.standardOutput)")
        #expect(result.standardOutput.contains("consent revoked (end-sessions): sessions_ended=2\n"))
        #expect(
            result.standardOutput.contains(
                "account deleted (unlink, when it leaves no login: disable): users_disabled=1 identities_unlinked=1 sessions_ended=2\n"
            ), "\(result.standardOutput)")
        #expect(result.standardOutput.contains("sub transferred (move): identities_moved=1"))
        #expect((try fake.users() as NSArray).isEqual(to: before as! [Any]))
        var wrong = fake.credentials
        wrong["client_secret"] = Self.password
        try JSONSerialization.data(withJSONObject: wrong).write(to: URL(fileURLWithPath: file))
        let refused = try run(["test", "kc", "--sub", "kc.a"], database)
        #expect(
            refused.status == 1 && refused.standardError.contains("openid-connect/token"),
            "\(refused.standardError)")
        noSecret(refused)
    }

    @Test(
        "test on each hosted platform: a token from the credentials file, each event's lookups, no change sent",
        arguments: ["firebase", "auth0", "clerk"])
    func hostedPlatformsDryRun(platform: String) throws {
        let database = try TestDatabase()
        let fake = try HostedPlatformFake(platform)
        try fake.seed(email: "x@example.com", appleSub: "s.a", sessions: 2)
        let file = try connectionFile(String(decoding: try fake.adapterCredentials(), as: UTF8.self))
        let added = try run(["add", "hosted", "--platform", platform, "--connection-file", file], database)
        #expect(added.status == 0, "\(added.standardError)")
        let before = try fake.users() as NSArray
        let result = try run(["test", "hosted", "--sub", "s.a", "--new-sub", "s.b"], database)
        let output = result.standardOutput
        #expect(result.status == 0, "\(output)\(result.standardError)")
        #expect(output.contains("check: ok (a token from the credentials)"), "\(output)")
        #expect(output.contains("dry run (lookups only, no change sent):"), "\(output)")
        #expect(
            output.contains("account deleted (unlink, when it leaves no login: disable): users_disabled=1"),
            "\(output)")
        #expect(!output.contains("FAILED") && !output.contains("no user linked"), "\(output)")
        #expect((try fake.users() as NSArray).isEqual(to: before as! [Any]))
    }
}
