import AuthPlatforms
import Foundation
import Postgres
import TestSupport
import Testing

/// The real Django peer (Tests/Fixtures/django-project): Django 5.2, django-allauth and
/// python-social-auth from PyPI in .build/django-venv, driven through `drive.py`.
///
/// One `migrate` and one seeding per run, into a template database; each test works on a copy
/// (`CREATE DATABASE … TEMPLATE`). In the template, per library: user A (sub `<n>.a`) signs in only with
/// Apple and has two sessions; user B (`<n>.b`) has another way to sign in and one session.
struct DjangoPeer: Sendable {
    struct PeerError: Error, CustomStringConvertible {
        var description: String
    }

    /// A seeded user.
    struct Seeded: Sendable {
        var sub: String
        var userID: Int
        var sessions: [String]
    }

    /// The template database's name and the seeded users, by sub.
    let template: String
    let users: [String: Seeded]

    static let root = RepositoryRoot.url
    static let python = root.appendingPathComponent(".build/django-venv/bin/python").path
    static let drivePath = root.appendingPathComponent("Tests/Fixtures/django-project/drive.py").path

    /// Made once per test process; a missing venv fails every test with the way to make it.
    static let shared: Result<DjangoPeer, PeerError> = {
        do {
            return .success(try DjangoPeer.make())
        } catch let error as PeerError {
            return .failure(error)
        } catch {
            return .failure(PeerError(description: "cannot make the Django template database: \(error)"))
        }
    }()

    /// `drive.py` with `arguments` against `url`: its one JSON object.
    static func drive(_ arguments: [String], url: String) throws -> [String: Any] {
        guard FileManager.default.isExecutableFile(atPath: python) else {
            throw PeerError(
                description:
                    "the Django peer's venv is missing (\(python)): run `make django-venv` (scripts/django-venv)"
            )
        }
        let directory = try scratchDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let out = directory.appendingPathComponent("stdout").path
        let err = directory.appendingPathComponent("stderr").path
        var environment = ProcessInfo.processInfo.environment
        environment["SIWA_DJANGO_DATABASE_URL"] = url
        environment["PYTHONDONTWRITEBYTECODE"] = "1"
        let process = try Subprocess(
            python, [drivePath] + arguments, environment: environment, standardOutput: out, standardError: err
        )
        guard let termination = process.wait(timeout: .seconds(300)) else {
            process.send(SIGKILL)
            throw PeerError(description: "drive.py \(arguments.first ?? "") did not finish in 300 s")
        }
        let text = (try? String(contentsOfFile: out, encoding: .utf8)) ?? ""
        let line = text.split(separator: "\n").last.map(String.init) ?? ""
        let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
        guard termination == .exited(0), let object else {
            let stderr = (try? String(contentsOfFile: err, encoding: .utf8)) ?? ""
            throw PeerError(
                description:
                    "drive.py \(arguments.joined(separator: " ")): \(termination): \(line)\n\(stderr.suffix(2000))"
            )
        }
        return object
    }

    static func make() throws -> DjangoPeer {
        let cluster = try PostgresCluster.shared
        let configuration = try cluster.createDatabase()
        let name = configuration.database ?? ""
        let url = cluster.url(database: name)
        _ = try drive(["migrate"], url: url)
        var users: [String: Seeded] = [:]
        func seed(_ sub: String, _ library: String, sessions: Int) throws {
            let answer = try drive(
                [
                    "seed", "--sub", sub, "--email", "\(sub)@privaterelay.appleid.com", "--with", library,
                    "--sessions", String(sessions),
                ], url: url)
            let user = answer["user"] as? [String: Any]
            users[sub] = Seeded(
                sub: sub, userID: (user?["id"] as? Int) ?? -1,
                sessions: (answer["session_keys"] as? [String]) ?? [])
        }
        try seed("001.a", "allauth", sessions: 2)
        try seed("002.a", "social", sessions: 2)
        // B of python-social-auth has a usable password, set before signing in (the session's hash
        // derives from it).
        try seed("002.b", "social", sessions: 0)
        let connection = try PostgresConnection(configuration: configuration)
        try connection.query(
            "UPDATE auth_user SET password = 'md5$siwa$0123456789abcdef0123456789abcdef' WHERE id = $1",
            [.int(Int64(users["002.b"]!.userID))])
        try seed("002.b", "social", sessions: 1)
        try seed("001.b", "allauth", sessions: 1)
        // B of allauth has a second social account (Google); A has an allauth token and a pending
        // email confirmation, both rows one level down from the user.
        try connection.simpleQuery(
            """
            INSERT INTO socialaccount_socialaccount (provider, uid, user_id, last_login, date_joined, extra_data)
                 SELECT 'google', 'g-001.b', user_id, now(), now(), '{}' FROM socialaccount_socialaccount
                  WHERE provider = 'apple' AND uid = '001.b';
            INSERT INTO socialaccount_socialtoken (token, token_secret, account_id)
                 SELECT 'apple-token', 'apple-refresh', id FROM socialaccount_socialaccount
                  WHERE provider = 'apple' AND uid = '001.a';
            INSERT INTO account_emailconfirmation (created, sent, key, email_address_id)
                 SELECT now(), now(), 'confirmation-key-001a', e.id FROM account_emailaddress e
                   JOIN socialaccount_socialaccount s ON s.user_id = e.user_id
                  WHERE s.provider = 'apple' AND s.uid = '001.a';
            """)
        connection.close()
        return DjangoPeer(template: name, users: users)
    }

    /// A copy of the template: its URL and the owner's connection.
    final class Copy: Sendable {
        let name: String
        let url: String
        let connection: PostgresConnection
        init(name: String, url: String, connection: PostgresConnection) {
            self.name = name
            self.url = url
            self.connection = connection
        }
        deinit { connection.close() }

        func drive(_ arguments: [String]) throws -> [String: Any] {
            try DjangoPeer.drive(arguments, url: url)
        }

        /// Whether the session cookie `key` authenticates a user, asked through Django's middleware.
        func authenticates(_ key: String) throws -> Bool {
            try drive(["check", "--session", key])["authenticated"] as? Bool == true
        }

        /// Each key's answer, in one Django process per key.
        func authenticated(_ keys: [String]) throws -> [Bool] { try keys.map(authenticates) }

        /// `drive.py state --sub` for `library` (`allauth` or `social`).
        func state(_ sub: String, _ library: String) throws -> [String: Any] {
            (try drive(["state", "--sub", sub])[library] as? [String: Any]) ?? [:]
        }

        func isActive(_ user: Int) throws -> Bool? {
            try connection.firstValue(
                "SELECT is_active FROM auth_user WHERE id = $1", [.int(Int64(user))], as: Bool.self)
        }

        /// Rows referencing `user`, per table that references auth_user (from Django's foreign keys),
        /// and the rows one level down; only tables with rows are listed.
        func referencingRows(_ user: Int) throws -> [String: Int] {
            let keys = (try drive(["foreign-keys"])["references_auth_user"] as? [[String: Any]]) ?? []
            var found: [String: Int] = [:]
            for key in keys {
                guard let table = key["table"] as? String, let column = key["column"] as? String else {
                    continue
                }
                let count =
                    try connection.firstValue(
                        "SELECT count(*) FROM \(table) WHERE \(column) = $1", [.int(Int64(user))],
                        as: Int.self) ?? 0
                if count > 0 { found[table] = count }
            }
            for (table, sql) in [
                (
                    "socialaccount_socialtoken",
                    "SELECT count(*) FROM socialaccount_socialtoken t"
                        + " WHERE NOT EXISTS (SELECT 1 FROM socialaccount_socialaccount s WHERE s.id = t.account_id)"
                ),
                (
                    "account_emailconfirmation",
                    "SELECT count(*) FROM account_emailconfirmation c"
                        + " WHERE NOT EXISTS (SELECT 1 FROM account_emailaddress e WHERE e.id = c.email_address_id)"
                ),
            ] {
                let count = try connection.firstValue(sql, [], as: Int.self) ?? 0
                if count > 0 { found[table + " (orphans)"] = count }
            }
            return found
        }
    }

    static func copy() throws -> (DjangoPeer, Copy) {
        let peer = try shared.get()
        let cluster = try PostgresCluster.shared
        let name = "django_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "")
        let admin = try PostgresConnection(configuration: try cluster.configuration(database: "postgres"))
        defer { admin.close() }
        try admin.simpleQuery("CREATE DATABASE \(name) TEMPLATE \(peer.template)")
        let connection = try PostgresConnection(configuration: try cluster.configuration(database: name))
        return (peer, Copy(name: name, url: cluster.url(database: name), connection: connection))
    }
}

/// One Django library under test: its adapter and its two users' subs.
struct DjangoCase: Sendable, CustomStringConvertible {
    var description: String
    /// `allauth` or `social`, as `drive.py state` names it.
    var library: String
    var adapter: any AuthPlatform
    var a: String
    var b: String

    static let allauth = DjangoCase(
        description: "django-allauth", library: "allauth", adapter: try! DjangoAllauth(), a: "001.a",
        b: "001.b")
    static let social = DjangoCase(
        description: "python-social-auth", library: "social", adapter: try! DjangoSocialAuth(), a: "002.a",
        b: "002.b")
    static let all = [allauth, social]
}

extension AuthPlatformsTests {
    /// Each event applied by the Django adapters to a database Django itself migrated and seeded, and
    /// the outcome asked of Django: the old session cookie, the social account, the user.
    @Suite("Django: allauth and python-social-auth, asserted through Django")
    struct DjangoTests {
        @Test(
            "consent revoked: A's cookies no longer authenticate, B's still does", arguments: DjangoCase.all)
        func consentRevoked(platform: DjangoCase) throws {
            let (peer, copy) = try DjangoPeer.copy()
            let a = peer.users[platform.a]!, b = peer.users[platform.b]!
            let change = try platform.adapter.apply(
                .consentRevoked, sub: platform.a, policy: AuthPolicy(), on: copy.connection)
            #expect(change.counts.sessionsEnded == 2)
            #expect(try copy.authenticated(a.sessions + b.sessions) == [false, false, true])
            let state = try copy.state(platform.a, platform.library)
            #expect(state["exists"] as? Bool == true && state["is_active"] as? Bool == true)
        }

        @Test(
            "sessions found by decoding session_data when allauth's user sessions did not record them",
            arguments: DjangoCase.all)
        func decodedSessions(platform: DjangoCase) throws {
            let (peer, copy) = try DjangoPeer.copy()
            let a = peer.users[platform.a]!
            try copy.connection.simpleQuery("DELETE FROM usersessions_usersession")
            // usersessions-only cannot find them: the documented limitation.
            let only: any AuthPlatform =
                platform.library == "allauth"
                ? try DjangoAllauth(sessions: .userSessionsOnly)
                : try DjangoSocialAuth(sessions: .userSessionsOnly)
            #expect(
                try only.apply(.consentRevoked, sub: platform.a, policy: AuthPolicy(), on: copy.connection)
                    .counts.sessionsEnded == 0)
            let change = try platform.adapter.apply(
                .consentRevoked, sub: platform.a, policy: AuthPolicy(), on: copy.connection)
            #expect(change.counts.sessionsEnded == 2)
            #expect(try copy.authenticated(a.sessions) == [false, false])
        }

        @Test("usersessions alone finds the sessions it recorded", arguments: DjangoCase.all)
        func userSessionsOnly(platform: DjangoCase) throws {
            let (peer, copy) = try DjangoPeer.copy()
            let a = peer.users[platform.a]!
            let only: any AuthPlatform =
                platform.library == "allauth"
                ? try DjangoAllauth(sessions: .userSessionsOnly)
                : try DjangoSocialAuth(sessions: .userSessionsOnly)
            let change = try only.apply(
                .consentRevoked, sub: platform.a, policy: AuthPolicy(), on: copy.connection)
            #expect(change.counts.sessionsEnded == 2)
            #expect(try copy.authenticated(a.sessions) == [false, false])
            #expect(
                try copy.connection.firstValue(
                    "SELECT count(*) FROM usersessions_usersession WHERE user_id = $1",
                    [.int(Int64(a.userID))],
                    as: Int.self) == 0)
        }

        @Test(
            "account deleted, unlink, Apple the only login: unlinked, inactive, logged out",
            arguments: DjangoCase.all)
        func unlinkOnlyLogin(platform: DjangoCase) throws {
            let (peer, copy) = try DjangoPeer.copy()
            let a = peer.users[platform.a]!, b = peer.users[platform.b]!
            let change = try platform.adapter.apply(
                .accountDeleted, sub: platform.a, policy: AuthPolicy(), on: copy.connection)
            #expect(change.counts.identitiesUnlinked == 1 && change.counts.usersDisabled == 1)
            #expect(change.counts.sessionsEnded == 2 && change.counts.usersDeleted == 0)
            #expect(try copy.state(platform.a, platform.library)["exists"] as? Bool == false)
            #expect(try copy.isActive(a.userID) == false)
            #expect(try copy.authenticated(a.sessions + b.sessions) == [false, false, true])
            if platform.library == "allauth" {
                #expect(try copy.referencingRows(a.userID)["socialaccount_socialtoken (orphans)"] == nil)
            }
        }

        @Test(
            "account deleted, unlink, B has another login: unlinked, still active", arguments: DjangoCase.all)
        func unlinkOtherLogin(platform: DjangoCase) throws {
            let (peer, copy) = try DjangoPeer.copy()
            let a = peer.users[platform.a]!, b = peer.users[platform.b]!
            let change = try platform.adapter.apply(
                .accountDeleted, sub: platform.b, policy: AuthPolicy(), on: copy.connection)
            #expect(change.counts.identitiesUnlinked == 1 && change.counts.usersDisabled == 0)
            #expect(try copy.state(platform.b, platform.library)["exists"] as? Bool == false)
            #expect(try copy.isActive(b.userID) == true)
            #expect(try copy.authenticated(b.sessions + a.sessions) == [false, true, true])
        }

        @Test(
            "account deleted, delete: the user and every referencing row gone, no orphan",
            arguments: DjangoCase.all)
        func delete(platform: DjangoCase) throws {
            let (peer, copy) = try DjangoPeer.copy()
            let a = peer.users[platform.a]!, b = peer.users[platform.b]!
            #expect(try !copy.referencingRows(a.userID).isEmpty)
            let change = try platform.adapter.apply(
                .accountDeleted, sub: platform.a, policy: AuthPolicy(onAccountDeleted: .delete),
                on: copy.connection)
            #expect(change.counts.usersDeleted == 1 && change.counts.identitiesUnlinked == 1)
            #expect(change.counts.sessionsEnded == 2)
            #expect(try copy.isActive(a.userID) == nil)
            #expect(try copy.referencingRows(a.userID) == [:])
            #expect(try copy.state(platform.a, platform.library)["exists"] as? Bool == false)
            #expect(try copy.authenticated(a.sessions + b.sessions) == [false, false, true])
            #expect(try copy.isActive(b.userID) == true)
        }

        @Test("delete refuses when an app table Django does not own references the user")
        func deleteAppTable() throws {
            let (peer, copy) = try DjangoPeer.copy()
            let a = peer.users["001.a"]!
            try copy.connection.simpleQuery(
                """
                CREATE TABLE shop_order (id bigserial PRIMARY KEY, user_id integer NOT NULL
                    REFERENCES auth_user (id) DEFERRABLE INITIALLY DEFERRED);
                INSERT INTO shop_order (user_id) VALUES (\(a.userID));
                """)
            let policy = AuthPolicy(onAccountDeleted: .delete)
            #expect(throws: AuthPlatformError.self) {
                try DjangoAllauth().apply(.accountDeleted, sub: "001.a", policy: policy, on: copy.connection)
            }
            #expect(try copy.isActive(a.userID) == true)
            let change = try DjangoAllauth(alsoDelete: ["shop_order"]).apply(
                .accountDeleted, sub: "001.a", policy: policy, on: copy.connection)
            #expect(change.counts.usersDeleted == 1)
            #expect(try copy.referencingRows(a.userID) == [:])
        }

        @Test("account deleted, disable: inactive, logged out, still linked", arguments: DjangoCase.all)
        func disable(platform: DjangoCase) throws {
            let (peer, copy) = try DjangoPeer.copy()
            let a = peer.users[platform.a]!, b = peer.users[platform.b]!
            let change = try platform.adapter.apply(
                .accountDeleted, sub: platform.a, policy: AuthPolicy(onAccountDeleted: .disable),
                on: copy.connection)
            #expect(change.counts.usersDisabled == 1 && change.counts.sessionsEnded == 2)
            let state = try copy.state(platform.a, platform.library)
            #expect(state["exists"] as? Bool == true && state["is_active"] as? Bool == false)
            #expect(try copy.authenticated(a.sessions + b.sessions) == [false, false, true])
        }

        @Test("account deleted, sessions-only: logged out, linked and active", arguments: DjangoCase.all)
        func sessionsOnly(platform: DjangoCase) throws {
            let (peer, copy) = try DjangoPeer.copy()
            let a = peer.users[platform.a]!
            let change = try platform.adapter.apply(
                .accountDeleted, sub: platform.a, policy: AuthPolicy(onAccountDeleted: .sessionsOnly),
                on: copy.connection)
            #expect(change.counts.sessionsEnded == 2 && change.counts.identitiesUnlinked == 0)
            let state = try copy.state(platform.a, platform.library)
            #expect(state["exists"] as? Bool == true && state["is_active"] as? Bool == true)
            #expect(try copy.authenticated(a.sessions) == [false, false])
        }

        @Test(
            "team transfer: the new sub finds the same user, the old one none; replay changes nothing",
            arguments: DjangoCase.all)
        func transfer(platform: DjangoCase) throws {
            let (peer, copy) = try DjangoPeer.copy()
            let a = peer.users[platform.a]!
            let new = platform.a + ".new"
            let change = try platform.adapter.apply(
                .subTransferred(from: platform.a), sub: new, policy: AuthPolicy(), on: copy.connection)
            #expect(change.counts.identitiesMoved == 1)
            let state = try copy.drive(["state", "--sub", new])[platform.library] as? [String: Any] ?? [:]
            #expect(state["exists"] as? Bool == true)
            #expect((state["user"] as? [String: Any])?["id"] as? Int == a.userID)
            #expect(try copy.state(platform.a, platform.library)["exists"] as? Bool == false)
            #expect(
                try platform.adapter.apply(
                    .subTransferred(from: platform.a), sub: new, policy: AuthPolicy(), on: copy.connection)
                    == .applied(AuthCounts()))
            if platform.library == "allauth" {
                #expect(
                    try copy.connection.firstValue(
                        "SELECT extra_data->>'sub' FROM socialaccount_socialaccount WHERE uid = $1",
                        [.text(new)],
                        as: String.self) == new)
            }
        }

        @Test(
            "no user, refused record, check names a missing column and short grants",
            arguments: DjangoCase.all)
        func refusalsAndCheck(platform: DjangoCase) throws {
            let (_, copy) = try DjangoPeer.copy()
            #expect(
                try platform.adapter.apply(
                    .consentRevoked, sub: "999.x", policy: AuthPolicy(), on: copy.connection)
                    == .noUser)
            #expect(throws: AuthPlatformError.self) {
                try platform.adapter.validate(AuthPolicy(onForwardingChange: .record))
            }
            let delete = AuthPolicy(onAccountDeleted: .delete)
            #expect(try platform.adapter.check(on: copy.connection, policy: delete) == [])
            // A login with no grants at all: every table and privilege named.
            let login = try PostgresConnection(
                configuration: try PostgresConfiguration(
                    "host=\(try PostgresCluster.shared.socketDirectory) port=\(try PostgresCluster.shared.port)"
                        + " dbname=\(copy.name) user=\(try PostgresCluster.shared.loginRole(memberOf: nil))"))
            defer { login.close() }
            let problems = try platform.adapter.check(on: login, policy: AuthPolicy())
            #expect(
                problems.contains(
                    AuthPlatformProblem(.missingPrivilege, table: "public.auth_user", detail: "UPDATE")))
            #expect(
                problems.contains(
                    AuthPlatformProblem(.missingPrivilege, table: "public.django_session", detail: "DELETE")))
            #expect(
                problems.contains(
                    AuthPlatformProblem(
                        .missingPrivilege, table: "public.usersessions_usersession", detail: "DELETE")))
            let identities =
                platform.library == "allauth" ? "socialaccount_socialaccount" : "social_auth_usersocialauth"
            try copy.connection.simpleQuery("ALTER TABLE \(identities) DROP COLUMN uid CASCADE")
            #expect(
                try platform.adapter.check(on: copy.connection, policy: AuthPolicy()) == [
                    AuthPlatformProblem(.missingColumn, table: "public.\(identities)", detail: "uid")
                ])
            #expect(throws: AuthPlatformError.self) {
                try platform.adapter.apply(
                    .consentRevoked, sub: platform.a, policy: AuthPolicy(), on: copy.connection)
            }
        }

        @Test("the documented grants suffice: a login with only them applies unlink, transfer and delete")
        func leastPrivilege() throws {
            let (peer, copy) = try DjangoPeer.copy()
            let group = "authplatforms_django_adapter"
            try copy.connection.simpleQuery(
                """
                DO $$ BEGIN CREATE ROLE \(group) NOLOGIN;
                EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
                GRANT SELECT, UPDATE, DELETE ON auth_user TO \(group);
                GRANT SELECT, UPDATE, DELETE ON socialaccount_socialaccount TO \(group);
                GRANT SELECT, DELETE ON socialaccount_socialtoken, django_session, usersessions_usersession,
                    account_emailaddress, account_emailconfirmation, auth_user_groups, auth_user_user_permissions,
                    social_auth_usersocialauth TO \(group);
                """)
            let cluster = try PostgresCluster.shared
            let login = try PostgresConnection(
                configuration: try PostgresConfiguration(
                    "host=\(cluster.socketDirectory) port=\(cluster.port) dbname=\(copy.name)"
                        + " user=\(try cluster.loginRole(memberOf: group))"))
            defer { login.close() }
            let delete = AuthPolicy(onAccountDeleted: .delete)
            #expect(try DjangoAllauth().check(on: login, policy: delete) == [])
            #expect(try DjangoAllauth().check(on: login) == [])
            let moved = try DjangoAllauth().apply(
                .subTransferred(from: "001.b"), sub: "001.b.new", policy: AuthPolicy(), on: login)
            #expect(moved.counts.identitiesMoved == 1)
            let unlinked = try DjangoAllauth().apply(
                .accountDeleted, sub: "001.b.new", policy: AuthPolicy(), on: login)
            #expect(unlinked.counts.identitiesUnlinked == 1)
            let deleted = try DjangoAllauth().apply(.accountDeleted, sub: "001.a", policy: delete, on: login)
            #expect(deleted.counts.usersDeleted == 1)
            #expect(try copy.referencingRows(peer.users["001.a"]!.userID) == [:])
            try copy.connection.simpleQuery("REVOKE DELETE ON django_session FROM \(group)")
            #expect(
                try DjangoAllauth().check(on: login) == [
                    AuthPlatformProblem(.missingPrivilege, table: "public.django_session", detail: "DELETE")
                ])
        }

        @Test("Django's session_data decodes to the user id without the secret, compressed or not")
        func sessionData() throws {
            // Made by Django 5.2's signing.dumps(…, salt="django.contrib.sessions.SessionStore",
            // compress=True), as SessionStore.encode does: the first zlib-compressed ("." prefix), the
            // second too short to compress.
            let compressed =
                ".eJyrVopPLC3JiC8tTi2Kz0xRslIyMVLSQRZMSkzOTs0DySTm5ICE9RKTk_NL80r0wGqg0sV6jkBeal5JZnJi"
                + "SWZ-nhNUF4pRGYnFGUBzDNIog0q1AAjrPbY:1xZrWp:GbpD9w6IK2lCRuq3JAnBz_8Umi1oswhGHCX9IHHyu1w"
            #expect(DjangoSessionData.userID(compressed) == "42")
            let plain = "eyJfYXV0aF91c2VyX2lkIjoiNyJ9:1xZrWi:Au-fK09u44OrY66s5x8QQf5ArTXKJ3inaDsZ-LeG0WQ"
            #expect(DjangoSessionData.userID(plain) == "7")
            #expect(DjangoSessionData.userID("garbage") == nil)
            #expect(DjangoSessionData.userID(".!!!:x:y") == nil)
        }
    }
}
