import Foundation
import HTTPServer
public import Postgres
import QueueConsumer
import ServiceSupport
import Synchronization
public import WebhookDelivery
public import Webhooks

/// The webhook tests' name for TestSupport's `TestDatabase` (schema.sql, connected as the owner).
public typealias WebhookDatabase = TestDatabase

/// Endpoints and changes added the way siwactl and the worker add them.
extension TestDatabase {
    /// Adds an endpoint signing v1a with `key` (siwa.add_webhook_endpoint with its public key, as siwactl
    /// webhooks add --scheme ed25519 does); returns its id.
    @discardableResult
    public func addEndpoint(
        url: String, ed25519 key: StandardWebhooks.Ed25519SigningKey, maxInFlight: Int = 4
    ) throws -> Int {
        let rows = try connection.query(
            "SELECT siwa.add_webhook_endpoint($1, $2, NULL, $3::integer, $4)",
            [.text(url), .text(key.text), .int(Int64(maxInFlight)), .text(key.publicKey.text)])
        return try rows[0][0, as: Int.self]
    }

    /// Adds an endpoint (siwa.add_webhook_endpoint, as siwactl webhooks add does); returns its id.
    @discardableResult
    public func addEndpoint(
        url: String, secret: StandardWebhooks.Secret, types: [String]? = nil, maxInFlight: Int = 4
    ) throws -> Int {
        try connection.query(
            "SELECT siwa.add_webhook_endpoint($1, $2, $3::text[], $4::integer)",
            [
                .text(url), .text(secret.text), types.map { .text("{" + $0.joined(separator: ",") + "}") },
                .int(Int64(maxInFlight)),
            ])[0][0, as: Int.self]
    }

    /// Inserts one change as the worker would (the provisional siwa.changes); returns its id.
    @discardableResult
    public func insertChange(
        type: String = "siwa.consent_revoked", sub: String, email: String? = nil
    ) throws -> Int {
        try connection.query(
            """
            INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti, audience, email, is_private_email,
                                      sessions_revoked)
            VALUES ($1, $2, now() - interval '1 minute', now(), gen_random_uuid()::text, 'com.example.app', $3::text,
                    CASE WHEN $3::text IS NOT NULL THEN true END, 1)
            RETURNING id
            """, [.text(type), .text(sub), email.map { .text($0) }])[0][0, as: Int.self]
    }

    /// Inserts `count` changes for each of `subs`, interleaved, in one statement per round (as the
    /// worker's batch does); returns their ids in insertion order.
    public func insertChanges(subs: [String], count: Int) throws -> [Int] {
        var ids: [Int] = []
        for _ in 0..<count {
            ids += try connection.query(
                """
                INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti)
                SELECT 'siwa.consent_revoked', s, now(), now(), gen_random_uuid()::text
                  FROM unnest($1::text[]) WITH ORDINALITY AS u(s, n) ORDER BY n
                RETURNING id
                """, [.text("{" + subs.joined(separator: ",") + "}")]
            ).map { try $0[0, as: Int.self] }
        }
        return ids
    }

    /// How many deliveries are in `state`.
    public func count(_ state: String) throws -> Int {
        try value("SELECT count(*)::int FROM siwa.webhook_deliveries WHERE state = $1", [.text(state)])
    }

    /// A dispatcher with a test-short schedule.
    public func dispatcher(
        concurrency: Int = 4, batchSize: Int = 16, timeout: Duration = .seconds(5),
        retryBaseDelay: Duration = .milliseconds(50),
        maxRetryDelay: Duration = .milliseconds(200), giveUpAfter: Duration = .seconds(60),
        configuration: PostgresConfiguration? = nil
    ) throws -> WebhookDispatcher {
        WebhookDispatcher(
            configuration: try WebhookDispatcher.Configuration(
                database: configuration ?? self.configuration, concurrency: concurrency, batchSize: batchSize,
                timeout: timeout,
                retryBaseDelay: retryBaseDelay, maxRetryDelay: maxRetryDelay, giveUpAfter: giveUpAfter,
                pollInterval: .milliseconds(100)),
            logger: quietLogger)
    }
}

/// A dispatcher's `run()` on a thread of its own, stopped and joined by ``stop()``.
public final class RunningDispatcher: Sendable {
    /// The dispatcher that runs.
    public let dispatcher: WebhookDispatcher
    private let done = DispatchSemaphore(value: 0)

    /// Starts `dispatcher.run()` on a new thread.
    public init(_ dispatcher: WebhookDispatcher) {
        self.dispatcher = dispatcher
        let thread = Thread { [dispatcher, done] in
            dispatcher.run()
            done.signal()
        }
        thread.start()
    }

    /// Stops the dispatcher and waits for its run to return.
    public func stop() {
        dispatcher.stop()
        done.wait()
    }
}

/// One request a ``WebhookReceiver`` got.
public struct ReceivedDelivery: Sendable {
    /// Its `webhook-id` header.
    public var id: String?
    /// Its `webhook-timestamp` header.
    public var timestamp: String?
    /// Its `webhook-signature` header.
    public var signature: String?
    /// The body as sent.
    public var body: [UInt8]
    /// The status it was answered with.
    public var status: Int
    /// When it arrived.
    public var at: ContinuousClock.Instant

    /// A delivery as received (or made up to be checked, e.g. one signed in a test).
    public init(
        id: String?, timestamp: String?, signature: String?, body: [UInt8], status: Int,
        at: ContinuousClock.Instant
    ) {
        self.id = id
        self.timestamp = timestamp
        self.signature = signature
        self.body = body
        self.status = status
        self.at = at
    }

    /// The parsed body.
    public var json: [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any] ?? [:]
    }
    /// `data.change_id` of the body.
    public var changeID: Int { (json["data"] as? [String: Any])?["change_id"] as? Int ?? -1 }
    /// `data.sub` of the body.
    public var sub: String { (json["data"] as? [String: Any])?["sub"] as? String ?? "" }
}

/// A real local HTTP endpoint (HTTPServer on 127.0.0.1) that records every request and answers what
/// `answer` says (a status, after an optional delay).
public final class WebhookReceiver: Sendable {
    private let server: HTTPServer
    private final class Log: Sendable {
        let list = Mutex<[ReceivedDelivery]>([])
    }
    private let received = Log()
    /// The port it listens on (127.0.0.1).
    public let port: Int

    /// Starts an endpoint answering what `answer` says for each delivery (`seen`: how many with its id came before).
    public init(
        threads: Int = 8,
        answer:
            @escaping @Sendable (_ delivery: ReceivedDelivery, _ seen: Int) -> (status: Int, delay: Duration) =
            {
                _, _ in (204, .zero)
            }
    ) throws {
        let received = self.received
        server = HTTPServer(
            configuration: HTTPServer.Configuration(host: "127.0.0.1", port: 0, threadCount: threads)
        ) { request in
            var delivery = ReceivedDelivery(
                id: request.headers["webhook-id"], timestamp: request.headers["webhook-timestamp"],
                signature: request.headers["webhook-signature"], body: request.body, status: 0, at: .now)
            let seen = received.list.withLock { list in list.filter { $0.id == delivery.id }.count }
            let (status, delay) = answer(delivery, seen)
            if delay > .zero { Thread.sleep(forTimeInterval: delay.inSeconds) }
            delivery.status = status
            received.list.withLock { $0.append(delivery) }
            return HTTPResponse(status: status)
        }
        try server.start()
        port = server.port ?? 0
    }

    deinit { server.shutdown(gracePeriod: .zero) }

    /// The endpoint's URL.
    public var url: String { "http://127.0.0.1:\(port)/hooks" }

    /// Everything received so far, in arrival order.
    public var deliveries: [ReceivedDelivery] { received.list.withLock { $0 } }

    /// Those answered 2xx.
    public var accepted: [ReceivedDelivery] { deliveries.filter { (200...299).contains($0.status) } }
}

/// The independent verifier: the PyPI package `standardwebhooks` in .build/webhooks-venv (made by
/// scripts/webhooks-venv, which `make test` runs; made here too when missing).
public enum ReferenceVerifier {
    /// The venv's python.
    public static let python = RepositoryRoot.url.appendingPathComponent(".build/webhooks-venv/bin/python")
        .path
    /// The verifying script.
    public static let script = RepositoryRoot.url.appendingPathComponent("scripts/webhooks-verify.py").path

    /// The verifier could not run.
    public struct Missing: Error, CustomStringConvertible {
        public var description: String
    }

    private static let prepared = Mutex(false)

    /// `ok` or `fail: …` for each delivery checked against `secret` (v1, by `standardwebhooks`).
    public static func verify(_ deliveries: [ReceivedDelivery], secret: StandardWebhooks.Secret) throws
        -> [String]
    {
        try verify(deliveries, key: ["secret": secret.text])
    }

    /// `ok` or `fail: …` for each delivery's v1a signatures checked against `publicKey` (by pyca
    /// `cryptography`'s Ed25519, following the specification's text).
    public static func verify(_ deliveries: [ReceivedDelivery], publicKey: StandardWebhooks.Ed25519PublicKey)
        throws -> [String]
    {
        try verify(deliveries, key: ["public_key": publicKey.text])
    }

    private static func verify(_ deliveries: [ReceivedDelivery], key: [String: String]) throws -> [String] {
        // Made once per test process, one test at a time (tests verifying in parallel would otherwise
        // build the venv over each other); the script returns at once when the venv is ready.
        try prepared.withLock { (ready: inout Bool) throws(Missing) in
            if ready { return }
            let made = try? Subprocess.run(
                RepositoryRoot.url.appendingPathComponent("scripts/webhooks-venv").path, [],
                timeout: .seconds(300))
            guard let made, made.status == 0 else {
                throw Missing(
                    description:
                        "the standardwebhooks venv is missing and scripts/webhooks-venv failed (run make webhooks-venv): \(made?.standardError ?? "did not run")"
                )
            }
            ready = true
        }
        var input = ""
        for delivery in deliveries {
            var headers: [String: String] = [:]
            headers["webhook-id"] = delivery.id
            headers["webhook-timestamp"] = delivery.timestamp
            headers["webhook-signature"] = delivery.signature
            var object: [String: Any] = [
                "headers": headers, "body_base64": Data(delivery.body).base64EncodedString(),
            ]
            for (name, value) in key { object[name] = value }
            input +=
                String(decoding: try JSONSerialization.data(withJSONObject: object), as: UTF8.self) + "\n"
        }
        let result = try Subprocess.run(python, [script], input: Data(input.utf8), timeout: .seconds(60))
        guard result.status == 0 else {
            throw Missing(description: "webhooks-verify.py failed: \(result.standardError)")
        }
        return result.standardOutput.split(separator: "\n").map(String.init)
    }
}

/// Whether, per sub, the change ids of `deliveries` (in arrival order) never go down.
public func inOrderPerSub(_ deliveries: [ReceivedDelivery]) -> Bool {
    var last: [String: Int] = [:]
    for delivery in deliveries {
        if let previous = last[delivery.sub], delivery.changeID < previous { return false }
        last[delivery.sub] = delivery.changeID
    }
    return true
}
