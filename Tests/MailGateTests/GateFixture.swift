import Foundation
import HTTPServer
import MailGate
import Postgres
import ServiceSupport
import Synchronization
import TestSupport

/// The addresses of the seeded users and what the gate must answer for each.
enum Mailbox {
    static let on = "on.1@privaterelay.appleid.com"
    static let off = "off.1@privaterelay.appleid.com"
    static let gone = "gone.1@privaterelay.appleid.com"
    static let stranger = "stranger@private.icloud.com"
    static let elsewhere = "someone@example.org"
}

/// A database with the seeded users and a started gate on it (policy, HTTP check, no metrics listener),
/// connected as a member of siwa_mail; its log lines are kept.
final class GateFixture: Sendable {
    static let token = "test-token-0123456789abcdefghijklmnopqrstuvwxyz"
    let database: TestDatabase
    let gate: MailGateService
    private let lines = LogLines()

    init(
        choices: PolicyChoices = PolicyChoices(), decisionTimeout: Duration = .milliseconds(500),
        cacheTTL: Duration = .zero, poolSize: Int = 4, maximumConnections: Int = 512,
        database configured: PostgresConfiguration? = nil, seed: Bool = true
    ) throws {
        database = try TestDatabase()
        if seed { try Self.seed(database) }
        var configuration = MailGateConfiguration(
            policy: .init(port: 0, maximumConnections: maximumConnections),
            database: try configured ?? database.configuration(asMemberOf: "siwa_mail"), poolSize: poolSize,
            decisionTimeout: decisionTimeout, cacheTTL: cacheTTL, choices: choices)
        var http = HTTPServer.Configuration(port: 0, threadCount: 4)
        http.maxBodyBytes = 4 << 20
        configuration.http = (http, Self.token)
        let lines = lines
        let logger = Logger(label: "test", level: .debug) { line in lines.append(line) }
        gate = MailGateService(configuration: configuration, logger: logger)
        try gate.start()
    }

    deinit { gate.shutdown() }

    var policyAddress: String { gate.addresses.first { $0.name == "policy" }!.address }
    var httpURL: String { "http://" + gate.addresses.first { $0.name == "http" }!.address }
    var log: String { lines.text }
    var metrics: String { gate.metrics.registry.render() }

    /// Stores `type` for `sub` as the receiver does and applies every due notification as the worker does.
    static func apply(_ database: TestDatabase, _ type: String, sub: String, email: String? = nil) throws {
        let connection = try database.connect()
        defer { connection.close() }
        try connection.storeAsReceiver(
            SeededNotification(jti: "\(type)-\(sub)-\(UUID().uuidString)", type: type, sub: sub, email: email)
        )
        _ = try connection.query("SELECT * FROM siwa.process_due_notifications(64, 20, interval '1 second')")
    }

    /// on: forwarding on; off: turned off after being on; gone: account deleted.
    static func seed(_ database: TestDatabase) throws {
        try apply(database, "email-enabled", sub: "001.on", email: Mailbox.on)
        try apply(database, "email-enabled", sub: "001.off", email: Mailbox.off)
        try apply(database, "email-disabled", sub: "001.off", email: Mailbox.off)
        try apply(database, "email-enabled", sub: "001.gone", email: Mailbox.gone)
        try apply(database, "account-delete", sub: "001.gone")
    }

    /// Calls the HTTP check with the token (or `authorization` as the header, nil: none).
    func call(
        _ method: String, _ path: String, body: [UInt8]? = nil,
        authorization: String? = "Bearer \(GateFixture.token)"
    ) throws -> TestHTTPResponse {
        var headers: [(String, String)] = []
        if let authorization { headers.append(("Authorization", authorization)) }
        if body != nil { headers.append(("Content-Type", "application/json")) }
        // A generous bound: 10,000 addresses in a debug build on a loaded 2-core machine took over 10 s.
        return try TestHTTPClient.request(
            method: method, url: httpURL + path, headers: headers, body: body, timeout: .seconds(60))
    }
}

extension TestHTTPResponse {
    var object: [String: Any] { (try? JSONSerialization.jsonObject(with: data) as? [String: Any]) ?? [:] }
}

/// Log lines kept for a test to read.
final class LogLines: Sendable {
    private let lines = Mutex<[String]>([])
    func append(_ line: String) { lines.withLock { $0.append(line) } }
    var text: String { lines.withLock { $0.joined() } }
}
