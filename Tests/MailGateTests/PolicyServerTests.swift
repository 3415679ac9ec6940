import Dispatch
import Foundation
import MailGate
import ServiceSupport
import Synchronization
import TestSupport
import Testing

@Suite("PolicyServer: the policy delegation protocol on TCP")
struct PolicyServerTests {
    /// A started server on a kernel-chosen port answering `answer`; shut down by the caller.
    func server(
        maximumConnections: Int = 512, metrics: MailGateMetrics = MailGateMetrics(),
        answer: @escaping PolicyServer.Answer = { "DUNNO \($0.protocolState) \($0.recipient)" }
    ) throws -> PolicyServer {
        let server = PolicyServer(
            configuration: .init(port: 0, maximumConnections: maximumConnections), metrics: metrics,
            logger: quietLogger, answer: answer)
        try server.start()
        return server
    }

    @Test("many requests on one connection are answered in order, one action line and an empty line each")
    func severalPerConnection() throws {
        let server = try server()
        defer { server.shutdown() }
        let client = try PolicyClient(try #require(server.address))
        for index in 0..<5 {
            #expect(try client.ask(recipient: "u\(index)@x") == "DUNNO RCPT u\(index)@x")
        }
        // Two requests in one write: two answers.
        try client.send(
            PolicyClient.request(recipient: "a@x") + PolicyClient.request(state: "DATA", recipient: "b@x"))
        #expect(try client.answer() == "DUNNO RCPT a@x")
        #expect(try client.answer() == "DUNNO DATA b@x")
    }

    /// The refused inputs, by name (the name, not the text, is the test's argument: it is printed).
    static let refused: [String: (reason: String, text: String)] = [
        "a line without =": ("malformed", "protocol_state=RCPT\nthis line has no equals sign\n\n"),
        "70,000 bytes": ("oversized", "recipient=" + String(repeating: "a", count: 70_000) + "\n\n"),
        "250 attributes": ("oversized", (0..<250).map { "n\($0)=v\n" }.joined() + "\n"),
    ]

    @Test(
        "a malformed or oversized request is not answered: the connection is closed, the refusal counted",
        arguments: ["a line without =", "70,000 bytes", "250 attributes"])
    func refusals(input: String) throws {
        let (reason, text) = try #require(Self.refused[input])
        let metrics = MailGateMetrics()
        let server = try server(metrics: metrics)
        defer { server.shutdown() }
        let client = try PolicyClient(try #require(server.address))
        #expect(try client.ask(recipient: "first@x") == "DUNNO RCPT first@x")
        try? client.send(text)  // the service may close before all of an oversized request is sent
        #expect(try client.answer() == nil)
        #expect(
            metrics.registry.render().contains("siwa_mailgate_policy_refused_total{reason=\"\(reason)\"} 1"))
    }

    @Test("connections over the bound are closed at once; those within it are served")
    func connectionBound() throws {
        let metrics = MailGateMetrics()
        let server = try server(maximumConnections: 2, metrics: metrics)
        defer { server.shutdown() }
        let address = try #require(server.address)
        let first = try PolicyClient(address)
        let second = try PolicyClient(address)
        #expect(try first.ask(recipient: "a@x") != nil)
        #expect(try second.ask(recipient: "b@x") != nil)
        let third = try PolicyClient(address)
        #expect((try? third.ask(recipient: "c@x")) ?? nil == nil)
        #expect(
            metrics.registry.render().contains(
                "siwa_mailgate_policy_refused_total{reason=\"connection_limit\"} 1"))
        #expect(try first.ask(recipient: "d@x") != nil)
    }

    @Test("shutdown answers the request in flight, closes idle connections, and stops listening")
    func shutdownFinishesInFlight() throws {
        let entered = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let server = try server { request in
            if request.recipient == "slow@x" {
                entered.signal()
                release.wait()
            }
            return "DUNNO"
        }
        let address = try #require(server.address)
        let idle = try PolicyClient(address)
        #expect(try idle.ask(recipient: "a@x") == "DUNNO")
        let busy = try PolicyClient(address)
        try busy.send(PolicyClient.request(recipient: "slow@x"))
        entered.wait()
        let stopped = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            server.shutdown()
            stopped.signal()
        }
        #expect(try idle.answer() == nil)  // idle: closed at once
        #expect(stopped.wait(timeout: .now() + 0.2) == .timedOut)  // still waiting for the request in flight
        release.signal()
        #expect(try busy.answer() == "DUNNO")
        #expect(try busy.answer() == nil)
        #expect(stopped.wait(timeout: .now() + 10) == .success)
        #expect(throws: (any Error).self) { try PolicyClient(address) }
    }
}
