import AuthPlatforms
import Postgres
import TestSupport
import Testing

extension AuthPlatformsTests {
    /// Each event under each platform's policy, against the platform's real table layout: the exact rows
    /// left for the user, the other user untouched.
    @Suite("every platform: each event, the rows left")
    struct PlatformEventTests {
        @Test("consent revoked ends A's sessions only; B is untouched", arguments: PlatformCase.all)
        func consentRevoked(platform: PlatformCase) throws {
            let database = try platform.database()
            let before = try platform.counts(database, of: platform.a)
            let other = try platform.snapshot(database, of: platform.b)
            let change = try platform.adapter.apply(
                .consentRevoked, sub: "001.a", policy: platform.policy, on: database.connection)
            #expect(change.counts.sessionsEnded == 2)
            #expect(change.counts.identitiesUnlinked == 0 && change.counts.usersDeleted == 0)
            var expected = before
            expected[platform.sessions] = 0
            if platform.description == "Supabase Auth" {
                // The sessions' tokens went with them (ON DELETE CASCADE); the one without a session is revoked.
                expected["auth.refresh_tokens"] = 1
                expected["auth.mfa_amr_claims"] = 0
                #expect(change.counts.refreshTokensRevoked == 3)
            }
            #expect(try platform.counts(database, of: platform.a) == expected)
            #expect(try platform.linkedUser(database, sub: "001.a") == platform.a)
            #expect(try platform.snapshot(database, of: platform.b) == other)
        }

        @Test("consent revoked with policy none changes nothing", arguments: PlatformCase.all)
        func consentRevokedNone(platform: PlatformCase) throws {
            let database = try platform.database()
            let before = try platform.snapshot(database, of: platform.a)
            var policy = platform.policy
            policy.onConsentRevoked = .none
            let change = try platform.adapter.apply(
                .consentRevoked, sub: "001.a", policy: policy, on: database.connection)
            #expect(change == .applied(AuthCounts()))
            #expect(try platform.snapshot(database, of: platform.a) == before)
        }

        @Test(
            "account deleted, unlink, Apple the only login: unlinked, sessions ended, disabled where the platform can",
            arguments: PlatformCase.all)
        func unlinkOnlyLogin(platform: PlatformCase) throws {
            let database = try platform.database()
            let users = try platform.userCount(database)
            let other = try platform.snapshot(database, of: platform.b)
            let change = try platform.adapter.apply(
                .accountDeleted, sub: "001.a", policy: platform.policy, on: database.connection)
            #expect(change.counts.identitiesUnlinked == 1)
            #expect(change.counts.sessionsEnded == 2)
            #expect(change.counts.usersDisabled == (platform.canDisable ? 1 : 0))
            #expect(change.counts.usersDeleted == 0)
            #expect(try platform.linkedUser(database, sub: "001.a") == nil)
            #expect(try platform.userCount(database) == users)
            if platform.canDisable { #expect(try platform.isDisabled(database, user: platform.a) == true) }
            #expect(try platform.counts(database, of: platform.a)[platform.sessions] == 0)
            #expect(try platform.snapshot(database, of: platform.b) == other)
        }

        @Test("account deleted, unlink, keep: unlinked and not disabled", arguments: PlatformCase.all)
        func unlinkKeep(platform: PlatformCase) throws {
            let database = try platform.database()
            var policy = platform.policy
            policy.whenUnlinkLeavesNoLogin = .keep
            let change = try platform.adapter.apply(
                .accountDeleted, sub: "001.a", policy: policy, on: database.connection)
            #expect(change.counts.identitiesUnlinked == 1 && change.counts.usersDisabled == 0)
            #expect(try platform.linkedUser(database, sub: "001.a") == nil)
            if platform.canDisable { #expect(try platform.isDisabled(database, user: platform.a) == false) }
        }

        @Test(
            "account deleted, unlink, with another login (B): unlinked, never disabled, the other login kept",
            arguments: PlatformCase.all)
        func unlinkOtherLogin(platform: PlatformCase) throws {
            let database = try platform.database()
            let before = try platform.counts(database, of: platform.b)
            let other = try platform.snapshot(database, of: platform.a)
            let change = try platform.adapter.apply(
                .accountDeleted, sub: "001.b", policy: platform.policy, on: database.connection)
            #expect(change.counts.identitiesUnlinked == 1)
            #expect(change.counts.sessionsEnded == 1)
            #expect(change.counts.usersDisabled == 0)
            if platform.canDisable { #expect(try platform.isDisabled(database, user: platform.b) == false) }
            let after = try platform.counts(database, of: platform.b)
            // One identity (account) fewer, the other one left.
            let identities =
                platform.rows[1].table == platform.sessions ? platform.rows[2].table : platform.rows[1].table
            let accountsTable = platform.description == "Better Auth" ? "account" : identities
            #expect(after[accountsTable] == before[accountsTable]! - 1)
            #expect(after[accountsTable]! >= 1)
            #expect(try platform.snapshot(database, of: platform.a) == other)
        }

        @Test(
            "account deleted, delete: no row of A left in any table of the fixture; B untouched",
            arguments: PlatformCase.all)
        func delete(platform: PlatformCase) throws {
            let database = try platform.database()
            let before = try platform.counts(database, of: platform.a)
            #expect(before.values.reduce(0, +) > before.count - 2)  // the seed gave A rows nearly everywhere
            let other = try platform.snapshot(database, of: platform.b)
            var policy = platform.policy
            policy.onAccountDeleted = .delete
            let change = try platform.adapter.apply(
                .accountDeleted, sub: "001.a", policy: policy, on: database.connection)
            #expect(change.counts.usersDeleted == 1)
            #expect(change.counts.sessionsEnded == 2)
            #expect(change.counts.identitiesUnlinked == 1)
            let left = try platform.counts(database, of: platform.a).filter { $0.value != 0 }
            #expect(left.isEmpty, "orphans: \(left)")
            #expect(try platform.snapshot(database, of: platform.b) == other)
            #expect(try platform.userCount(database) == 1)
        }

        @Test("account deleted, sessions-only: sessions ended, identity kept", arguments: PlatformCase.all)
        func sessionsOnly(platform: PlatformCase) throws {
            let database = try platform.database()
            var policy = platform.policy
            policy.onAccountDeleted = .sessionsOnly
            let change = try platform.adapter.apply(
                .accountDeleted, sub: "001.a", policy: policy, on: database.connection)
            #expect(change.counts.sessionsEnded == 2)
            #expect(change.counts.identitiesUnlinked == 0 && change.counts.usersDisabled == 0)
            #expect(try platform.linkedUser(database, sub: "001.a") == platform.a)
            #expect(try platform.counts(database, of: platform.a)[platform.sessions] == 0)
        }

        @Test("an unknown sub is noUser and changes nothing", arguments: PlatformCase.all)
        func noUser(platform: PlatformCase) throws {
            let database = try platform.database()
            let a = try platform.snapshot(database, of: platform.a)
            let b = try platform.snapshot(database, of: platform.b)
            for event in [AuthEvent.consentRevoked, .accountDeleted, .subTransferred(from: "001.unknown")] {
                let change = try platform.adapter.apply(
                    event, sub: "001.unknown", policy: platform.policy, on: database.connection)
                #expect(change == .noUser)
            }
            #expect(try platform.snapshot(database, of: platform.a) == a)
            #expect(try platform.snapshot(database, of: platform.b) == b)
        }

        @Test(
            "a transfer moves the identity: the old sub no longer matches, the new one finds the same user",
            arguments: PlatformCase.all)
        func transfer(platform: PlatformCase) throws {
            let database = try platform.database()
            let users = try platform.userCount(database)
            let sessions = try platform.counts(database, of: platform.a)[platform.sessions]
            let change = try platform.adapter.apply(
                .subTransferred(from: "001.a"), sub: "002.a", policy: platform.policy, on: database.connection
            )
            #expect(
                change
                    == .applied(
                        {
                            var c = AuthCounts(); c.identitiesMoved = 1; return c
                        }()))
            #expect(try platform.linkedUser(database, sub: "001.a") == nil)
            #expect(try platform.linkedUser(database, sub: "002.a") == platform.a)
            #expect(try platform.userCount(database) == users)
            #expect(try platform.counts(database, of: platform.a)[platform.sessions] == sessions)
            // Delivered again: nothing left to move, and not noUser.
            let again = try platform.adapter.apply(
                .subTransferred(from: "001.a"), sub: "002.a", policy: platform.policy, on: database.connection
            )
            #expect(again == .applied(AuthCounts()))
            // Events now come with the new sub.
            let revoked = try platform.adapter.apply(
                .consentRevoked, sub: "002.a", policy: platform.policy, on: database.connection)
            #expect(revoked.counts.sessionsEnded == 2)
        }

        @Test(
            "a transfer onto a sub another user holds is refused and changes nothing",
            arguments: PlatformCase.all)
        func transferConflict(platform: PlatformCase) throws {
            let database = try platform.database()
            let a = try platform.snapshot(database, of: platform.a)
            let error = #expect(throws: AuthPlatformError.self) {
                try platform.adapter.apply(
                    .subTransferred(from: "001.a"), sub: "001.b", policy: platform.policy,
                    on: database.connection)
            }
            #expect(error?.kind == .conflict)
            #expect(error?.description.contains("001.") == false)
            #expect(try platform.snapshot(database, of: platform.a) == a)
            #expect(try platform.linkedUser(database, sub: "001.a") == platform.a)
        }

        @Test(
            "transfer ignored, forwarding ignored, data erased: nothing changes", arguments: PlatformCase.all)
        func ignored(platform: PlatformCase) throws {
            let database = try platform.database()
            let a = try platform.snapshot(database, of: platform.a)
            var policy = platform.policy
            policy.onSubTransferred = .ignore
            for (event, sub) in [
                (AuthEvent.subTransferred(from: "001.a"), "002.a"), (.forwardingChanged(on: false), "001.a"),
                (.personalDataErased, "001.a"),
            ] {
                #expect(
                    try platform.adapter.apply(event, sub: sub, policy: policy, on: database.connection)
                        == .applied(AuthCounts()))
            }
            #expect(try platform.snapshot(database, of: platform.a) == a)
        }

        @Test("the dry run returns the counts of apply and changes nothing", arguments: PlatformCase.all)
        func dryRun(platform: PlatformCase) throws {
            let database = try platform.database()
            let a = try platform.snapshot(database, of: platform.a)
            let b = try platform.snapshot(database, of: platform.b)
            var policy = platform.policy
            policy.onAccountDeleted = .delete
            let dry = try platform.adapter.dryRun(
                .accountDeleted, sub: "001.a", policy: policy, on: database.connection)
            #expect(dry.counts.usersDeleted == 1)
            #expect(try platform.snapshot(database, of: platform.a) == a)
            #expect(try platform.snapshot(database, of: platform.b) == b)
            let unlinkDry = try platform.adapter.dryRun(
                .accountDeleted, sub: "001.a", policy: platform.policy, on: database.connection)
            #expect(try platform.snapshot(database, of: platform.a) == a)
            #expect(
                try platform.adapter.dryRun(
                    .consentRevoked, sub: "001.unknown", policy: policy, on: database.connection) == .noUser)
            // The same statements, committed, change what the dry run counted.
            #expect(
                try platform.adapter.apply(
                    .accountDeleted, sub: "001.a", policy: platform.policy, on: database.connection)
                    == unlinkDry)
        }

        @Test("check is empty for the owner, and names a missing column", arguments: PlatformCase.all)
        func checkNamesMissingColumn(platform: PlatformCase) throws {
            let database = try platform.database()
            #expect(try platform.adapter.check(on: database.connection, policy: platform.policy) == [])
            try database.query(platform.droppedColumn.drop)
            let problems = try platform.adapter.check(on: database.connection, policy: platform.policy)
            #expect(
                problems == [
                    AuthPlatformProblem(
                        .missingColumn, table: platform.droppedColumn.table,
                        detail: platform.droppedColumn.column)
                ])
            #expect(problems.first?.description.contains(platform.droppedColumn.column) == true)
        }
    }
}
