import AppleID
import Foundation
import Postgres
import QueueConsumer
import Revoker
import ServiceSupport
import TestSupport
import Testing
import TokenVault

/// Apple: "You may verify the refresh token up to once a day … Apple's servers may throttle your call if
/// you attempt to verify a user's Apple ID more than once a day." The refresh check's interval therefore
/// has a floor of a day; a shorter one is raised to it, with a warning naming the setting.
@Suite("Refresh-check pacing: each token at most once a day")
struct RefreshCheckPacingTests {
    /// Apple's answers to `/auth/token` so far (the sign-in's exchange and every refresh).
    private func tokenCalls(_ fixture: SignInFixture) -> Int {
        fixture.apple.log.components(separatedBy: "POST /auth/token 200").count - 1
    }

    @Test("an interval shorter than a day is raised to a day; a day or longer is kept")
    func floor() throws {
        let apple = try LocalApple()
        for (given, used) in [
            (1, 86400), (2, 86400), (3600, 86400), (86399, 86400), (86400, 86400), (604800, 604800),
        ] {
            let configuration = try Revoker.Configuration(
                database: try PostgresConfiguration("host=/nonexistent dbname=x"),
                clients: [LocalApple.clientID: try apple.client()],
                cipher: try TokenCipher(current: TokenCipher.Key(id: "k1", bytes: randomKey())),
                refreshCheckInterval: .seconds(given))
            #expect(configuration.refreshCheckInterval == .seconds(used), "given \(given) s")
        }
    }

    @Test(
        "with a 2 s interval, the running revoker refreshes a token once and not again within three intervals, and warns"
    )
    func runningRevokerRefreshesOnce() throws {
        let fixture = try SignInFixture(notify: false)
        #expect(try fixture.post("/v1/sign-ins", fixture.signInBody(sub: "001.paced")).status == 200)
        let exchanged = tokenCalls(fixture)
        let logs = LogCapture()
        let revoker = Revoker(
            configuration: try Revoker.Configuration(
                database: try fixture.login("worker_test_login"),
                clients: [LocalApple.clientID: try fixture.apple.client()], cipher: fixture.cipher,
                pollInterval: .milliseconds(100), refreshCheckInterval: .seconds(2)),
            logger: logs.logger())
        let thread = JoinableThread(name: "paced-revoker") { revoker.run() }
        defer {
            revoker.stop()
            thread.join()
        }
        // The first pass refreshes the token once.
        #expect(
            waitUntil(timeout: .seconds(30)) { tokenCalls(fixture) == exchanged + 1 }, "\(fixture.apple.log)")
        #expect(
            waitUntil(timeout: .seconds(30)) {
                (try? fixture.count("SELECT count(*) FROM siwa.refresh_token_checks WHERE outcome = 'valid'"))
                    == 1
            })
        // Measured over a bounded window of three requested intervals: no second refresh.
        #expect(
            !waitUntil(timeout: .seconds(6)) { tokenCalls(fixture) > exchanged + 1 }, "\(fixture.apple.log)")
        #expect(logs.all.contains("refresh-check-interval"), "\(logs.all)")
        #expect(logs.all.contains("86400"))
    }
}
