import Foundation
import Postgres
import TestSupport
import Testing

@Suite("LISTEN/NOTIFY")
struct NotificationTests {
    @Test("a notification from another connection wakes the waiter well before the timeout")
    func wakesPromptly() throws {
        let listener = try freshConnection()
        try listener.listen("siwa events")  // Needs quoting: contains a space.
        let configuration = listener.configuration
        let sent = DispatchSemaphore(value: 0)
        Thread {
            defer { sent.signal() }
            guard let sender = try? PostgresConnection(configuration: configuration) else { return }
            try? sender.notify("siwa events", payload: "jti-1")
        }.start()
        let started = ContinuousClock.now
        let notifications = try listener.waitForNotifications(timeout: .seconds(20))
        #expect(ContinuousClock.now - started < .seconds(10))
        #expect(notifications.map(\.channel) == ["siwa events"])
        #expect(notifications.map(\.payload) == ["jti-1"])
        #expect(sent.wait(timeout: .now() + 10) == .success)
    }

    @Test("waiting returns an empty list when nothing arrives before the timeout")
    func timesOut() throws {
        let listener = try freshConnection()
        try listener.listen("quiet")
        let started = ContinuousClock.now
        let notifications = try listener.waitForNotifications(timeout: .milliseconds(300))
        let elapsed = ContinuousClock.now - started
        #expect(notifications.isEmpty)
        #expect(elapsed >= .milliseconds(300))
        #expect(elapsed < .seconds(5))
    }

    @Test("notifications that arrived earlier are returned at once, all of them")
    func queued() throws {
        let listener = try freshConnection()
        try listener.listen("q")
        let sender = try PostgresConnection(configuration: listener.configuration)
        try sender.notify("q", payload: "a")
        try sender.notify("q", payload: "b")
        var payloads: [String] = []
        let deadline = ContinuousClock.now + .seconds(10)
        while payloads.count < 2 && ContinuousClock.now < deadline {
            payloads += try listener.waitForNotifications(timeout: .seconds(5)).map(\.payload)
        }
        #expect(payloads == ["a", "b"])
        try listener.unlisten("q")
        try sender.notify("q", payload: "c")
        #expect(try listener.waitForNotifications(timeout: .milliseconds(200)).isEmpty)
    }

    @Test("a waiter whose backend is terminated throws connectionLost")
    func connectionLost() throws {
        let listener = try freshConnection()
        try listener.listen("doomed")
        let admin = try PostgresConnection(configuration: listener.configuration)
        #expect(
            try admin.query("SELECT pg_terminate_backend($1::int)", [.int(Int64(listener.backendProcessID))])[
                0][0, as: Bool.self])
        let error = postgresError { _ = try listener.waitForNotifications(timeout: .seconds(10)) }
        #expect(error?.code == .connectionLost)
        #expect(!listener.isHealthy)
    }
}
