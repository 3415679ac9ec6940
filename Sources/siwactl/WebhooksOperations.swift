import Foundation
import Postgres
import ServiceSupport
import WebhookAdministration

// ==== operations (retry) ====
extension WebhooksVerb {
    static let retrySpec = CommandSpec(
        name: "siwactl webhooks retry",
        abstract: """
            Attempt pending deliveries now: one --delivery, or every pending delivery of one --endpoint
            (after an outage is fixed). Their backoff starts again; this is not an attempt, and the 26 h
            give-up window keeps running (replay starts it again). Delivered and dead ones are left alone
            (replay them). Prints how many are due now.
            """,
        options: [
            .databaseURL,
            CommandOption("delivery", valueName: "ID", help: "A delivery (siwa.webhook_delivery_status.id)."),
            CommandOption("endpoint", valueName: "ID", help: "An endpoint: all its pending deliveries."),
        ])

    static func retry(_ parsed: ParsedCommand) throws {
        func id(_ name: String) throws -> Int64? {
            guard let text = parsed.value(name) else { return nil }
            guard let value = Int64(text), value > 0 else { throw UsageError("--\(name) must be an id") }
            return value
        }
        let delivery = try id("delivery")
        let endpoint = try id("endpoint")
        guard (delivery == nil) != (endpoint == nil) else {
            throw UsageError("give exactly one of --delivery or --endpoint")
        }
        let connection = try connect(parsed)
        defer { connection.close() }
        let webhooks = WebhookAdministration(connection)
        let count = try database("retrying") { try webhooks.retry(delivery: delivery, endpoint: endpoint) }
        if let delivery, count == 0 {
            let found = try database("reading the delivery") { try webhooks.delivery(delivery) }
            guard let found else { throw ToolFailure("no delivery \(delivery)") }
            guard found.state != .pending || !found.leased else {
                writeStandardOutput("delivery \(delivery) is being attempted now: nothing to retry\n")
                return
            }
            throw ToolFailure(
                "delivery \(delivery) is \(found.state.rawValue), not pending: siwactl webhooks replay --delivery \(delivery)"
            )
        }
        if let endpoint, count == 0 {
            let known = try database("reading the endpoint") { try webhooks.endpointExists(endpoint) }
            guard known else { throw ToolFailure("no endpoint \(endpoint)") }
        }
        writeStandardOutput("due now: \(count) deliver\(count == 1 ? "y" : "ies")\n")
    }
}
// ==== end operations ====

// ==== replay with a state selector ====
extension WebhooksVerb {
    /// Why `replay --delivery` queued nothing: an unknown delivery fails; a pending one is said (stderr).
    static func explainNotReplayed(
        _ delivery: Int64, state: WebhookAdministration.ReplayChoice, on webhooks: WebhookAdministration
    ) throws {
        let found = try database("reading the delivery") { try webhooks.delivery(delivery) }
        guard let found else { throw ToolFailure("no delivery \(delivery)") }
        let why: String
        if found.state != .pending {
            why = "it is \(found.state.rawValue) (--state \(state.rawValue) does not choose it)"
        } else if found.leased {
            why = "it is pending and being attempted now"
        } else if found.attempts == 0 {
            why = "it is pending and not yet attempted: it waits behind an earlier change of its user"
        } else {
            why =
                "it is pending in backoff (--state dead does not choose it): siwactl webhooks retry --delivery"
        }
        writeErrorLine("siwactl webhooks replay", "nothing queued: \(why)")
    }
}
// ==== end replay with a state selector ====

// ==== remove an endpoint ====
extension WebhooksVerb {
    static let removeSpec = CommandSpec(
        name: "siwactl webhooks remove",
        abstract: """
            Remove an endpoint with its secrets, deliveries and attempt history. Refused while it has
            pending deliveries unless --force (they are deleted, never sent). It is disabled first, so
            that no change fans out to it meanwhile.
            """,
        options: [
            .databaseURL,
            CommandOption("endpoint", valueName: "ID", help: "The endpoint's id (siwactl webhooks list)."),
        ],
        flags: [CommandFlag("force", help: "Remove it even with pending deliveries (they are deleted).")],
        positionals: [
            CommandPositional(
                "ENDPOINT", help: "Deprecated: the id as an argument (use --endpoint ID).", isOptional: true)
        ])

    static func remove(_ parsed: ParsedCommand) throws {
        // The argument form stays for one release beside --endpoint, with a warning.
        let id: Int64
        switch (parsed.value("endpoint"), parsed.positionals.first) {
        case (.some, .some): throw UsageError("give the endpoint once: --endpoint ID")
        case (.none, .none): throw UsageError("missing --endpoint ID")
        case (.some, .none): id = Int64(try endpointID(parsed))
        case (.none, .some(let text)):
            guard let value = Int64(text), value > 0 else {
                throw UsageError("--endpoint must be an endpoint id")
            }
            writeErrorLine(
                "siwactl webhooks remove", "warning: 'remove ID' is deprecated, use 'remove --endpoint ID'")
            id = value
        }
        let connection = try connect(parsed)
        defer { connection.close() }
        let webhooks = WebhookAdministration(connection)
        let pending = try database("reading the endpoint") { try webhooks.pendingDeliveries(endpoint: id) }
        guard let pending else { throw ToolFailure("no endpoint \(id)") }
        let force = parsed.flag("force")
        if pending > 0, !force {
            throw ToolFailure(
                "endpoint \(id) has \(pending) pending deliver\(pending == 1 ? "y" : "ies"): kept; remove it with"
                    + " --force (they are deleted, never sent)")
        }
        // Its own transaction: once committed, no new change fans out to it (the fan-out reads enabled).
        try database("disabling the endpoint") { _ = try webhooks.setEnabled(endpoint: id, false) }
        let dropped: Int
        switch try database("removing the endpoint", { try webhooks.remove(endpoint: id, force: force) }) {
        case .removed(let deletedPending): dropped = deletedPending
        case .notFound: throw ToolFailure("no endpoint \(id)")
        case .keptWithPending:
            throw ToolFailure(
                "endpoint \(id) got pending deliveries meanwhile: it is disabled and kept; remove it with --force"
                    + " or enable it again")
        }
        writeStandardOutput(
            "endpoint \(id) removed"
                + (dropped > 0 ? " with \(dropped) pending deliver\(dropped == 1 ? "y" : "ies") deleted" : "")
                + "\n")
    }
}
// ==== end remove an endpoint ====
